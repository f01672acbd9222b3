"""Open an etcd v3 client from the addresses and credentials of cdc.yaml.

Used for the metastore and for reading the source Milvus's metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import etcd3
import grpc

from metastore.etcd_addresses import parse_etcd_address
from metastore.etcd_login import EtcdLogin


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd: the CA its certificate chains to (empty: the system's) and, for mutual
    TLS, the client's certificate and key, as PEM files."""

    ca_cert_path: str = ""
    cert_path: str = ""
    key_path: str = ""


def connect_etcd(
    addresses: list[str],
    *,
    username: str = "",
    password: str = "",
    tls: EtcdTls | None = None,
    timeout: float = 5.0,
    password_source: Callable[[], str] | None = None,
) -> etcd3.MultiEndpointEtcd3Client:
    """``password_source``: where the password is read again when etcd refuses it
    (metastore/etcd_login.py)."""
    if not addresses:
        raise ValueError("no etcd address given")
    creds = None
    if tls is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(tls.ca_cert_path),
            private_key=_read(tls.key_path),
            certificate_chain=_read(tls.cert_path),
        )
    endpoints = []
    for address in addresses:
        host, port, secure = parse_etcd_address(address)
        secure = secure or tls is not None
        if secure and creds is None:  # an https:// address without TLS files: the system's CAs
            creds = grpc.ssl_channel_credentials()
        # time_retry: the client shuns an endpoint that failed once for this long (its default,
        # 300 s, would keep the daemon away from an etcd that came back after a blip).
        endpoints.append(
            etcd3.Endpoint(
                host, port, secure=secure, creds=creds if secure else None, time_retry=1.0
            )
        )
    if username or password:
        # logged in here rather than by the client, which would log in once for its life
        # (metastore/etcd_login.py); a wrong password raises etcd's grpc.RpcError here
        login = EtcdLogin(username, password, timeout, password_source)
        login.log_in_first([endpoint.channel for endpoint in endpoints])
        for endpoint in endpoints:
            endpoint.channel = login.intercept(endpoint.channel)
    # failover=True even for one endpoint: with it, "every endpoint failed" is raised as the
    # client's NoServerAvailableError rather than a bare ValueError.
    return etcd3.MultiEndpointEtcd3Client(endpoints=endpoints, timeout=timeout, failover=True)


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None
