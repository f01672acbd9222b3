"""What every part of the SQL metastore (:mod:`metastore.sql`) stands on: the engines (one for
the fleet's calls), transactions that turn a lost connection into ``MetaStoreUnavailableError``,
the task row's lock, the database server's clock and the lease check a write under a lease
makes in its own transaction."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, and_, bindparam, func, select
from sqlalchemy.exc import InterfaceError as SAInterfaceError
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from metastore.base import Lease
from metastore.errors import FencedError, MetaStoreUnavailableError, TaskNotFoundError
from metastore.sql_engine import brief_error, make_engine
from metastore.sql_schema import create_schema, leases_table, tasks_table
from metastore.sql_urls import mysql_where

# The statements every write runs, built once with their values as parameters: built at every
# call (their clauses, their cache keys) they were most of a save's CPU, 582 µs a save on
# SQLite against 147 once built, where SQLite itself takes about 20 (bench/metastore_writes.py);
# by whether the database is MySQL, whose variants lock the rows read (FOR UPDATE).
_TASK_ROW = select(tasks_table.c.revision).where(
    tasks_table.c.root_path == bindparam("root_path"),
    tasks_table.c.task_id == bindparam("task_id"),
)
_LEASE_ROW = select(leases_table).where(
    leases_table.c.root_path == bindparam("root_path"),
    leases_table.c.task_id == bindparam("task_id"),
)
_TASK_ROWS = {False: _TASK_ROW, True: _TASK_ROW.with_for_update()}
_LEASE_ROWS = {False: _LEASE_ROW, True: _LEASE_ROW.with_for_update()}


class SqlPlumbing:
    """The engines and the transactions of one SQL metastore; SQLite and MySQL alike."""

    def __init__(
        self,
        url: str,
        root_path: str,
        *,
        connect_timeout: float = 5.0,
        session_timeout: float | None = None,
        password_source: Callable[[], str] | None = None,
    ) -> None:
        """``session_timeout`` (MySQL): the server closes a connection of this store that says
        nothing for that long, rolling its transaction back. A daemon cut off from the server
        in the middle of a transaction (a position save holds its task row's lock) would
        otherwise keep that lock for the server's ``wait_timeout`` (8 hours by default), and no
        other daemon could take the task (the fleet passes ``fleet.leaseSeconds``)."""
        self.root_path = root_path
        # password_source: the password read again when MySQL refuses it (sql_engine.py)
        self._engine = make_engine(
            url, connect_timeout, session_timeout, password_source=password_source
        )
        # the fleet's calls (lease renewals above all) on connections of their own: a daemon
        # whose tasks keep every pooled connection busy (hundreds of channels saving
        # positions) must still renew its leases in time, or it stops all of them
        self._fleet_engine = (
            self._engine
            if ":memory:" in url
            else make_engine(url, connect_timeout, session_timeout, 2, password_source)
        )
        self._is_mysql = self._engine.dialect.name == "mysql"
        try:
            create_schema(self._engine)
        except SQLAlchemyError as exc:
            self.close()
            raise MetaStoreUnavailableError(
                f"cannot open the SQL metastore {mysql_where(url)}: {brief_error(exc)}"
            ) from exc

    @contextmanager
    def _tx(self, *, fleet: bool = False) -> Iterator[Connection]:
        engine = self._fleet_engine if fleet else self._engine
        try:
            with engine.begin() as conn:
                yield conn
        except (OperationalError, SAInterfaceError) as exc:
            raise MetaStoreUnavailableError(
                f"SQL metastore unavailable: {brief_error(exc)}"
            ) from exc

    def _task_key(self, task_id: str) -> Any:
        return and_(tasks_table.c.root_path == self.root_path, tasks_table.c.task_id == task_id)

    def _lock_task(self, conn: Connection, task_id: str) -> bool:
        """True if the task exists; on MySQL the row stays locked until the transaction ends."""
        return conn.execute(_TASK_ROWS[self._is_mysql], self._row_of(task_id)).first() is not None

    def _row_of(self, task_id: str) -> dict[str, str]:
        return {"root_path": self.root_path, "task_id": task_id}

    def _write_for_task(
        self,
        conn: Connection,
        task_id: str,
        write: Callable[[], int],
        lease: Lease | None = None,
    ) -> int:
        """Run ``write`` only if the task exists (and ``lease`` is live), atomically with
        respect to ``delete_task`` and ``acquire_lease``.

        MySQL: lock the task row first (the order ``delete_task`` uses, so no deadlock), then
        the lease row. SQLite: write first, which takes the database's write lock, then look;
        a missing task or a lost lease raises and the transaction rolls the write back.
        """
        if self._is_mysql:
            if not self._lock_task(conn, task_id):
                raise TaskNotFoundError(task_id)
            self._check_lease(conn, lease)
        written = write()
        if not self._is_mysql:
            if not self._lock_task(conn, task_id):
                raise TaskNotFoundError(task_id)
            self._check_lease(conn, lease)
        return written

    def _now(self, conn: Connection) -> float:
        """The time leases are measured by: the database server's clock on MySQL."""
        if self._is_mysql:
            return float(conn.execute(select(func.unix_timestamp(func.now(6)))).scalar_one())
        return time.time()

    def _lease_key(self, task_id: str) -> Any:
        return and_(leases_table.c.root_path == self.root_path, leases_table.c.task_id == task_id)

    def _lease_row(self, conn: Connection, task_id: str) -> Any:
        return conn.execute(_LEASE_ROWS[self._is_mysql], self._row_of(task_id)).first()

    def _check_lease(self, conn: Connection, lease: Lease | None) -> None:
        if lease is None:
            return
        row = self._lease_row(conn, lease.task_id)
        if row is None or row.token != lease.token or row.expires_at <= self._now(conn):
            raise FencedError(
                f"task {lease.task_id}: lease token {lease.token} of {lease.owner} is no "
                "longer held"
            )

    # --- lifecycle ---------------------------------------------------------------------------
    def ping(self) -> None:
        with self._tx() as conn:
            conn.execute(select(1))

    def close(self) -> None:
        self._engine.dispose()
        if self._fleet_engine is not self._engine:
            self._fleet_engine.dispose()
