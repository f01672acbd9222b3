"""Connecting to the SQL metastore's database: its URL (a path, a Go DSN) and a tuned engine."""

from __future__ import annotations

import math
import re
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from sqlalchemy import Engine, create_engine, event

_GO_DSN = re.compile(
    r"^(?P<user>[^:@/]*)(?::(?P<password>.*))?@tcp\((?P<host>[^:)]+)(?::(?P<port>\d+))?\)"
    r"/(?P<db>[^?]*)(?:\?(?P<params>.*))?$"
)


_SSL_SOURCE_LINE = re.compile(r" \(_ssl\.c:\d+\)")

# TLS in a URL's query, as SQLAlchemy hands them to PyMySQL's ``ssl``: PEM files
TLS_FILE_PARAMS = ("ssl_ca", "ssl_cert", "ssl_key")
TLS_PARAMS = (*TLS_FILE_PARAMS, "ssl_capath", "ssl_check_hostname")


def mysql_url_from_source(source: str) -> str:
    """Accept both the Go tool's DSN (``user:pw@tcp(host:port)/db?charset=utf8``) and a
    SQLAlchemy URL (``mysql+pymysql://...``); return a SQLAlchemy URL for PyMySQL.

    TLS: the URL's ``ssl_ca``, ``ssl_cert``, ``ssl_key`` and ``ssl_check_hostname`` (as
    SQLAlchemy reads them); the DSN's ``tls`` (``true``: the system's CAs, ``skip-verify``,
    ``preferred``, ``false``) and, ours, the same ``ssl_*`` files."""
    if "://" in source:
        scheme, rest = source.split("://", 1)
        if scheme not in ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql"):
            raise ValueError(f"mysqlSourceUrl: unsupported scheme {scheme!r}, use mysql+pymysql")
        _check_tls_files(parse_qs(urlsplit(source).query))
        return f"mysql+pymysql://{rest}"
    m = _GO_DSN.match(source)
    if m is None:
        raise ValueError(
            "mysqlSourceUrl: expected user:password@tcp(host:port)/database or "
            "mysql+pymysql://user:password@host:port/database"
        )
    user = quote(m["user"] or "", safe="")
    password = m["password"]
    auth = user if password is None else f"{user}:{quote(password, safe='')}"
    port = f":{m['port']}" if m["port"] else ""
    params = {}
    for part in (m["params"] or "").split("&"):
        if "=" in part:
            key, value = part.split("=", 1)
            if key == "charset":
                params["charset"] = "utf8mb4" if value in ("utf8", "utf8mb4") else value
            elif key == "tls":
                params.update(_go_tls(value))
            elif key in TLS_PARAMS:  # ours: the Go driver takes its files in code
                params[key] = quote(unquote(value), safe="/")
    _check_tls_files({k: [unquote(v)] for k, v in params.items()})
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return f"mysql+pymysql://{auth}@{m['host']}{port}/{m['db']}{query}"


def _go_tls(value: str) -> dict[str, str]:
    """The Go MySQL driver's ``tls`` DSN parameter, as PyMySQL's ``ssl`` settings."""
    if value == "true":  # verified against the system's CAs (PyMySQL verifies only with a CA)
        paths = ssl.get_default_verify_paths()
        return {"ssl_capath": quote(paths.capath or paths.openssl_capath, safe="/")}
    if value == "skip-verify":  # TLS without checking the server's certificate
        return {"ssl_check_hostname": "false"}
    if value == "false":
        return {"ssl_disabled": "true"}
    if value == "preferred":  # PyMySQL's own default: TLS when the server offers it
        return {}
    raise ValueError(
        f"mysqlSourceUrl: tls={value} names a TLS configuration the Go driver registers in "
        "code; give its files as ssl_ca, ssl_cert and ssl_key"
    )


def _check_tls_files(query: dict[str, list[str]]) -> None:
    for key in TLS_FILE_PARAMS:
        for path in query.get(key, []):
            if not Path(path).is_file():
                raise ValueError(f"mysqlSourceUrl: {key}: no such file: {path}")
    if bool(query.get("ssl_cert")) != bool(query.get("ssl_key")):
        raise ValueError("mysqlSourceUrl: ssl_cert and ssl_key go together (mutual TLS)")


def mysql_where(url: str) -> str:
    """Where a SQL metastore is, for messages: ``mysql://host:port/db`` (no user, no
    password), or the SQLite file."""
    if url.startswith("sqlite"):
        return url.removeprefix("sqlite:///")
    parts = urlsplit(url)
    tls = (
        " (TLS)"
        if {"ssl_ca", "ssl_capath", "ssl_check_hostname"} & set(parse_qs(parts.query))
        else ""
    )
    return f"mysql://{parts.netloc.rpartition('@')[2]}{parts.path}{tls}"


def sqlite_url(path: str) -> str:
    Path(path).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(path).expanduser().resolve()}"


def make_engine(
    url: str, connect_timeout: float, session_timeout: float | None, pool_size: int = 5
) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_pre_ping=False,
            pool_size=pool_size,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    # read and write timeouts: a server that stops answering (a partition) fails the call
    # instead of hanging it, so a fleet member notices it cannot renew its leases
    timeout = max(1, int(connect_timeout))
    engine = create_engine(
        url,
        pool_pre_ping=True,
        pool_recycle=3600,
        pool_size=pool_size,
        connect_args={
            "connect_timeout": timeout,
            "read_timeout": 2 * timeout,
            "write_timeout": 2 * timeout,
        },
    )
    if session_timeout is not None:
        seconds = max(2, math.ceil(session_timeout))

        @event.listens_for(engine, "connect")
        def _session_timeouts(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute(
                f"SET SESSION wait_timeout = {seconds}, net_read_timeout = {seconds}, "
                f"net_write_timeout = {seconds}"
            )
            cursor.close()

    return engine


def brief_error(exc: BaseException) -> str:
    """The driver's message without the SQL text or connection URL (which may hold a password)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else type(exc).__name__).splitlines()[0]
    return _SSL_SOURCE_LINE.sub("", text)[:300]  # "(_ssl.c:1006)" tells an operator nothing


__all__ = ["brief_error", "make_engine", "mysql_url_from_source", "mysql_where", "sqlite_url"]
