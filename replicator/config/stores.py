"""Open the configured metastore: one opener per ``metaStoreConfig.storeType``."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from etcd3.exceptions import Etcd3Exception

from metastore import MetaStore, MetaStoreUnavailableError
from metastore.etcd_connect import EtcdTls, connect_etcd
from metastore.etcd_diagnosis import EtcdFailure, endpoint_urls, explain_etcd_failure
from metastore.etcd_reload import ReloadingEtcdClient
from metastore.tls_files import TlsFiles
from replicator.config.connections import EtcdSettings, MetaStoreSettings

log = logging.getLogger(__name__)


def _open_sqlite(config: MetaStoreSettings, _lease_seconds: float | None) -> MetaStore:
    from metastore.sql import SqlMetaStore
    from metastore.sql_urls import sqlite_url

    return SqlMetaStore(sqlite_url(config.sqlitePath), config.rootPath)


def _open_mysql(config: MetaStoreSettings, lease_seconds: float | None) -> MetaStore:
    from metastore.sql import SqlMetaStore
    from metastore.sql_urls import mysql_url_from_source, mysql_where, url_is_insecure

    url = mysql_url_from_source(config.mysqlSourceUrl.get_secret_value())
    if url_is_insecure(url):  # said at every start: an operator's choice, never a default
        log.warning(
            "metaStoreConfig.mysqlSourceUrl: insecure_skip_verify (or tls=skip-verify): the "
            "MySQL metastore %s is reached over TLS without verifying its certificate; "
            "whoever poses as it receives the password",
            mysql_where(url),
        )
    return SqlMetaStore(
        url,
        config.rootPath,
        session_timeout=lease_seconds,
        password_source=config.password_source,
    )


def etcd_tls_of(config: EtcdSettings) -> EtcdTls | None:
    """The TLS files of ``enableTLS`` (None: plain, unless an address says ``https://``)."""
    if not config.enableTLS:
        return None
    return EtcdTls(config.tlsCACertPath, config.tlsCertPath, config.tlsKeyPath)


def etcd_client_for(config: EtcdSettings, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    """A client of this etcd; with ``enableAuth`` it authenticates at once, so a wrong
    password raises here (a ``grpc.RpcError``: see ``explain_etcd``). Its TLS files are read
    again when they change (metastore/etcd_reload.py): a rotation needs no restart."""
    tls = etcd_tls_of(config)

    def connect():  # type: ignore[no-untyped-def]
        return connect_etcd(
            config.address,
            username=config.username if config.enableAuth else "",
            password=config.password.get_secret_value() if config.enableAuth else "",
            tls=tls,
            timeout=timeout,
            password_source=config.password_source,
        )

    files = TlsFiles(*((tls.ca_cert_path, tls.cert_path, tls.key_path) if tls else ()))
    where = ", ".join(endpoint_urls(config.address, tls))
    return ReloadingEtcdClient(connect, files, where)


def explain_etcd(config: EtcdSettings, exc: BaseException) -> EtcdFailure:
    """Why this etcd failed a call, naming its endpoints (never the password)."""
    return explain_etcd_failure(config.address, etcd_tls_of(config), exc)


def _open_etcd(config: MetaStoreSettings, _lease_seconds: float | None) -> MetaStore:
    from metastore.etcd import EtcdMetaStore

    try:
        return EtcdMetaStore(
            etcd_client_for(config.etcd),
            config.rootPath,
            explain=lambda exc: explain_etcd(config.etcd, exc).reason,
        )
    except (MetaStoreUnavailableError, Etcd3Exception, grpc.RpcError) as exc:
        reason = explain_etcd(config.etcd, exc)
        raise MetaStoreUnavailableError(f"etcd metastore unavailable: {reason}") from exc


OPENERS: dict[str, Callable[[MetaStoreSettings, float | None], MetaStore]] = {
    "sqlite": _open_sqlite,
    "mysql": _open_mysql,
    "etcd": _open_etcd,
}


def open_metastore(config: MetaStoreSettings, lease_seconds: float | None = None) -> MetaStore:
    """``lease_seconds``: the daemon's ``fleet.leaseSeconds`` (a MySQL store then bounds how
    long a connection cut off mid-transaction keeps its locks; see ``SqlMetaStore``)."""
    return OPENERS[config.storeType](config, lease_seconds)


def describe_metastore(config: MetaStoreSettings) -> str:
    """Where the store is, for logs (never the MySQL URL, which holds a password)."""
    if config.storeType == "sqlite":
        return f"sqlite at {config.sqlitePath} (rootPath {config.rootPath})"
    if config.storeType == "etcd":
        urls = endpoint_urls(config.etcd.address, etcd_tls_of(config.etcd))
        return f"etcd at {', '.join(urls)} (rootPath {config.rootPath})"
    from metastore.sql_urls import mysql_url_from_source, mysql_where

    url = mysql_url_from_source(config.mysqlSourceUrl.get_secret_value())
    return f"{mysql_where(url)} (rootPath {config.rootPath})"
