"""Connecting to the SQL metastore's database: a tuned engine (its URL: sql_urls.py)."""

from __future__ import annotations

import math
import re
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url

from metastore.sql_urls import INSECURE_PARAM

_SSL_SOURCE_LINE = re.compile(r" \(_ssl\.c:\d+\)")


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
    # ours, not PyMySQL's: without it the URL's TLS has no CA, which PyMySQL does not verify
    parsed = make_url(url).difference_update_query([INSECURE_PARAM])
    engine = create_engine(
        parsed,
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


__all__ = ["brief_error", "make_engine"]
