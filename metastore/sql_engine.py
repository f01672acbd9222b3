"""Connecting to the SQL metastore's database: its URL (a path, a Go DSN) and a tuned engine."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event

_GO_DSN = re.compile(
    r"^(?P<user>[^:@/]*)(?::(?P<password>.*))?@tcp\((?P<host>[^:)]+)(?::(?P<port>\d+))?\)"
    r"/(?P<db>[^?]*)(?:\?(?P<params>.*))?$"
)


def mysql_url_from_source(source: str) -> str:
    """Accept both the Go tool's DSN (``user:pw@tcp(host:port)/db?charset=utf8``) and a
    SQLAlchemy URL (``mysql+pymysql://...``); return a SQLAlchemy URL for PyMySQL."""
    if "://" in source:
        scheme, rest = source.split("://", 1)
        if scheme not in ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql"):
            raise ValueError(f"mysqlSourceUrl: unsupported scheme {scheme!r}, use mysql+pymysql")
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
            if key == "charset":  # the only Go DSN parameter that has a PyMySQL twin
                params["charset"] = "utf8mb4" if value in ("utf8", "utf8mb4") else value
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return f"mysql+pymysql://{auth}@{m['host']}{port}/{m['db']}{query}"


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
    return str(orig if orig is not None else type(exc).__name__).splitlines()[0][:300]


__all__ = ["brief_error", "make_engine", "mysql_url_from_source", "sqlite_url"]
