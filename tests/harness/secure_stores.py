"""Real etcd and MariaDB servers that want TLS, client certificates and passwords, for the
secure-connection tests: started on free loopback ports by tests/harness/services.py, with the
certificates of tests/harness/tls.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.services import EtcdService, ServerTls, etcd_server, free_port
from harness.tls import Pki

ETCD_USER = "root"  # etcd's auth needs a root user; the daemon logs in as it


@dataclass(frozen=True)
class SecureEtcd:
    """An etcd answering TLS clients at ``https`` (mutual TLS when started with a client CA)
    and, when ``password`` is set, only users who log in; ``plain``: an extra plain-HTTP
    listener of the same etcd (password alone)."""

    service: EtcdService
    https: str
    plain: str
    password: str


def enable_etcd_auth(endpoint: str, pki: Pki, password: str) -> None:
    """Add etcd's root user with ``password`` and turn authentication on (as ``etcdctl user
    add root`` + ``user grant-role root root`` + ``auth enable`` do)."""
    from etcd3 import etcdrpc

    from metastore.etcd_connect import EtcdTls, connect_etcd

    client = connect_etcd(
        [endpoint], tls=EtcdTls(str(pki.ca_file), str(pki.client_cert), str(pki.client_key))
    )
    try:
        auth = client.authstub
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name=ETCD_USER, password=password), 5)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=ETCD_USER, role="root"), 5)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), 5)
    finally:
        client.close()


@contextlib.contextmanager
def secure_etcd(
    workdir: Path,
    pki: Pki,
    *,
    cert: tuple[Path, Path] | None = None,
    mutual: bool = False,
    password: str = "",
) -> Iterator[SecureEtcd]:
    """An etcd with TLS (``cert``: the server's certificate and key, by default the good
    one); ``mutual``: client certificates of the test CA required; ``password``: auth on."""
    cert_file, key_file = cert or (pki.server_cert, pki.server_key)
    tls = ServerTls(cert_file, key_file, pki.ca_file if mutual else None)
    plain_port = free_port()
    with etcd_server(workdir, tls=tls, plain_port=plain_port) as service:
        if password:
            enable_etcd_auth(service.endpoint, pki, password)
        plain = f"http://127.0.0.1:{plain_port}"
        yield SecureEtcd(service, service.endpoint, plain, password)
