"""Real etcd and MariaDB servers that want TLS, client certificates and passwords, for the
secure-connection tests: started on free loopback ports by tests/harness/services.py, with the
certificates of tests/harness/tls.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.services import (
    EtcdService,
    MariaDBService,
    ServerTls,
    etcd_server,
    free_port,
    mariadb_server,
)
from harness.tls import Pki

ETCD_USER = "root"  # etcd's auth needs a root user; the daemon logs in as it
MYSQL_TLS_USER = "cdc_tls"  # REQUIRE SSL
MYSQL_X509_USER = "cdc_x509"  # REQUIRE X509: a client certificate of the test CA


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
    token_ttl: int = 300,
) -> Iterator[SecureEtcd]:
    """An etcd with TLS (``cert``: the server's certificate and key, by default the good
    one); ``mutual``: client certificates of the test CA required; ``password``: auth on,
    its tokens forgotten after ``token_ttl`` seconds unused (etcd's default: 300)."""
    cert_file, key_file = cert or (pki.server_cert, pki.server_key)
    tls = ServerTls(cert_file, key_file, pki.ca_file if mutual else None)
    plain_port = free_port()
    ttl = ["--auth-token-ttl", str(token_ttl)]
    with etcd_server(workdir, tls=tls, plain_port=plain_port, extra_args=ttl) as service:
        if password:
            enable_etcd_auth(service.endpoint, pki, password)
        plain = f"http://127.0.0.1:{plain_port}"
        yield SecureEtcd(service, service.endpoint, plain, password)


@dataclass(frozen=True)
class SecureMariaDB:
    """A MariaDB offering TLS, with a user that must use it and one that must also show a
    client certificate (both with ``password``), and its certificate files to swap."""

    service: MariaDBService
    password: str
    cert_file: Path
    key_file: Path

    def url(self, user: str, **query: str) -> str:
        """A SQLAlchemy URL of ``user`` with ``query`` (``ssl_ca=...``)."""
        import urllib.parse

        base = f"mysql+pymysql://{user}:{self.password}@127.0.0.1:{self.service.port}"
        params = urllib.parse.urlencode(query, safe="/")
        return f"{base}/{self.service.database}" + (f"?{params}" if params else "")

    def serve_certificate(self, cert: Path, key: Path) -> None:
        """Make the server present ``cert`` to new connections (MariaDB's ``FLUSH SSL``)."""
        import shutil

        shutil.copyfile(cert, self.cert_file)
        shutil.copyfile(key, self.key_file)
        self.as_root("FLUSH SSL")

    def as_root(self, *statements: str) -> list[tuple]:
        """Run ``statements`` as root; the rows the last one answered."""
        import pymysql

        conn = pymysql.connect(
            unix_socket=str(self.service.unix_socket),
            user="root",
            password=self.service.password,
            connect_timeout=5,
        )
        rows: list[tuple] = []
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                    rows = list(cur.fetchall())
            conn.commit()
        finally:
            conn.close()
        return rows

    def kill_connections(self, user: str) -> None:
        """End every connection of ``user`` (as a server restart does): its clients connect
        again."""
        rows = self.as_root(f"SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{user}'")
        for (connection,) in rows:
            self.as_root(f"KILL {int(connection)}")


@contextlib.contextmanager
def secure_mariadb(workdir: Path, pki: Pki, password: str) -> Iterator[SecureMariaDB]:
    """A MariaDB with the good server certificate (a copy, which ``serve_certificate``
    replaces) and the test CA for client certificates."""
    import shutil

    workdir.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = workdir / "server.pem", workdir / "server.key"
    shutil.copyfile(pki.server_cert, cert_file)
    shutil.copyfile(pki.server_key, key_file)
    tls = ServerTls(cert_file, key_file, pki.ca_file)
    with mariadb_server(workdir, tls=tls) as service:
        db = SecureMariaDB(service, password, cert_file, key_file)
        statements = []
        for user, requirement in ((MYSQL_TLS_USER, "SSL"), (MYSQL_X509_USER, "X509")):
            statements += [
                f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}' "
                f"REQUIRE {requirement}",
                f"GRANT ALL PRIVILEGES ON `{service.database}`.* TO '{user}'@'127.0.0.1'",
            ]
        db.as_root(*statements)
        yield db
