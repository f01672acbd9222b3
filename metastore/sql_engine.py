"""Connecting to the SQL metastore's database: a tuned engine (its URL: sql_urls.py)."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url

from metastore.sql_urls import INSECURE_PARAM

log = logging.getLogger(__name__)

_SSL_SOURCE_LINE = re.compile(r" \(_ssl\.c:\d+\)")


def make_engine(
    url: str,
    connect_timeout: float,
    session_timeout: float | None,
    pool_size: int = 5,
    password_source: Callable[[], str] | None = None,
) -> Engine:
    """``password_source`` (MySQL): where the password is read again when the server refuses
    the one in use (access denied: it was changed there); the new one serves every later
    connection."""
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
    if password_source is not None:
        _read_password_again(engine, password_source)
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


_ACCESS_DENIED = 1045  # MySQL's ER_ACCESS_DENIED_ERROR


def _read_password_again(engine: Engine, source: Callable[[], str]) -> None:
    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        try:
            return dialect.connect(*cargs, **cparams)
        except Exception as exc:
            if not exc.args or exc.args[0] != _ACCESS_DENIED:
                raise
            try:
                fresh = source()
            except Exception as failure:  # noqa: BLE001 - the configuration cannot be read
                log.warning("MySQL refused the password; configuration unreadable: %s", failure)
                raise exc from None
            if not fresh or fresh == cparams.get("password"):
                raise
            cparams["password"] = fresh  # kept: the engine's later connections use it too
            connection = dialect.connect(*cargs, **cparams)
            log.info("MySQL: the password was changed; connected with the configuration's new one")
            return connection


def brief_error(exc: BaseException) -> str:
    """The driver's message without the SQL text or connection URL (which may hold a password)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else type(exc).__name__).splitlines()[0]
    return _SSL_SOURCE_LINE.sub("", text)[:300]  # "(_ssl.c:1006)" tells an operator nothing


__all__ = ["brief_error", "make_engine"]
