"""SQL metastore: SQLite (the embedded default) and MySQL/MariaDB through SQLAlchemy + PyMySQL.

Six tables (:mod:`metastore.sql_schema`), each keyed by ``root_path`` first so daemons sharing a
database stay apart; the URL and engine: :mod:`metastore.sql_engine`. The position
compare-and-set is one conditional UPDATE (or INSERT) followed by a locking read of the task row
in the same transaction, so a position is never saved for a task deleted meanwhile.

The fleet: ``cdc_members`` and ``cdc_leases`` rows carry an expiry on the database server's
clock (MySQL's ``NOW(6)``; the daemons' clocks may disagree, the server's is one), extended by
every heartbeat of their member. A lease taken (a new owner, or the same after it expired)
gets a token greater than every earlier one of the task (and than the milliseconds since the
epoch, so a task deleted and created again does not reuse its predecessor's tokens). A write
under a lease reads the lease row in its own transaction (locked on MySQL, after the task row:
the order ``delete_task`` and ``acquire_lease`` use) and is refused unless the token is the
live one's. SQLite serves one daemon (its database is a local file); the same code keeps it
honest there too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import orjson
from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import InterfaceError as SAInterfaceError

from metastore.base import (
    Lease,
    Member,
    Position,
    StoreFormat,
    TaskRecord,
    TaskState,
    check_position_step,
    encode_spec,
)
from metastore.errors import (
    ConcurrentUpdateError,
    FencedError,
    MetaStoreUnavailableError,
    PositionConflictError,
    TaskExistsError,
    TaskNotFoundError,
)
from metastore.sql_engine import brief_error, make_engine
from metastore.sql_schema import (
    create_schema,
    leases_table,
    members_table,
    position_from_row,
    positions_table,
    records_table,
    secret_keys_table,
    state_table,
    store_format_table,
    task_from_row,
    tasks_table,
)
from metastore.sql_urls import mysql_where


class SqlMetaStore:
    """One class for SQLite and MySQL; the dialect differences are the engine's business."""

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

    # --- plumbing ----------------------------------------------------------------------------
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
        query = select(tasks_table.c.revision).where(self._task_key(task_id))
        if self._is_mysql:
            query = query.with_for_update()
        return conn.execute(query).first() is not None

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
        query = select(leases_table).where(self._lease_key(task_id))
        if self._is_mysql:
            query = query.with_for_update()
        return conn.execute(query).first()

    def _check_lease(self, conn: Connection, lease: Lease | None) -> None:
        if lease is None:
            return
        row = self._lease_row(conn, lease.task_id)
        if row is None or row.token != lease.token or row.expires_at <= self._now(conn):
            raise FencedError(
                f"task {lease.task_id}: lease token {lease.token} of {lease.owner} is no "
                "longer held"
            )

    # --- tasks -------------------------------------------------------------------------------
    def create_task(self, task: TaskRecord) -> TaskRecord:
        stored = replace(task, revision=1)
        try:
            with self._tx() as conn:
                conn.execute(insert(tasks_table).values(self._task_row(stored)))
        except IntegrityError as exc:
            raise TaskExistsError(task.task_id) from exc
        return stored

    def get_task(self, task_id: str) -> TaskRecord | None:
        with self._tx() as conn:
            row = conn.execute(select(tasks_table).where(self._task_key(task_id))).first()
        return None if row is None else task_from_row(row._mapping)

    def list_tasks(self) -> list[TaskRecord]:
        query = (
            select(tasks_table)
            .where(tasks_table.c.root_path == self.root_path)
            .order_by(tasks_table.c.created_at, tasks_table.c.task_id)
        )
        with self._tx() as conn:
            return [task_from_row(row._mapping) for row in conn.execute(query)]

    def update_task(
        self,
        task_id: str,
        *,
        state: TaskState,
        reason: str,
        expected_revision: int,
        lease: Lease | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        values: dict[str, Any] = {"state": state.value, "reason": reason, "updated_at": time.time()}
        if extra is not None:
            values["extra"] = json.dumps(dict(extra), sort_keys=True)
        return self._update_task_row(task_id, expected_revision, values, lease)

    def replace_spec(
        self,
        task_id: str,
        spec: Mapping[str, Any],
        *,
        expected_revision: int,
        lease: Lease | None = None,
    ) -> TaskRecord:
        values = {"spec": encode_spec(spec)}
        return self._update_task_row(task_id, expected_revision, values, lease)

    def _update_task_row(
        self,
        task_id: str,
        expected_revision: int,
        values: dict[str, Any],
        lease: Lease | None,
    ) -> TaskRecord:
        with self._tx() as conn:

            def write() -> int:
                return int(
                    conn.execute(
                        update(tasks_table)
                        .where(self._task_key(task_id), tasks_table.c.revision == expected_revision)
                        .values(**values, revision=expected_revision + 1)
                    ).rowcount
                )

            if self._write_for_task(conn, task_id, write, lease) != 1:
                raise ConcurrentUpdateError(task_id)
            row = conn.execute(select(tasks_table).where(self._task_key(task_id))).one()
        return task_from_row(row._mapping)

    def delete_task(self, task_id: str) -> bool:
        with self._tx() as conn:
            removed = conn.execute(delete(tasks_table).where(self._task_key(task_id))).rowcount
            for table in (positions_table, state_table, leases_table):
                conn.execute(
                    delete(table).where(
                        table.c.root_path == self.root_path, table.c.task_id == task_id
                    )
                )
        return bool(removed)

    def _task_row(self, task: TaskRecord) -> dict[str, Any]:
        return {
            "root_path": self.root_path,
            "task_id": task.task_id,
            "state": task.state.value,
            "reason": task.reason,
            "spec": task.spec_json(),
            "extra": json.dumps(dict(task.extra), sort_keys=True),
            "created_at": task.created_at,
            "updated_at": task.updated_at,
            "revision": task.revision,
        }

    # --- positions ---------------------------------------------------------------------------
    def get_positions(self, task_id: str) -> dict[str, Position]:
        query = select(positions_table).where(
            positions_table.c.root_path == self.root_path, positions_table.c.task_id == task_id
        )
        with self._tx() as conn:
            return {row.pchannel: position_from_row(row._mapping) for row in conn.execute(query)}

    def save_position(
        self,
        task_id: str,
        position: Position,
        expected: Position | None,
        *,
        lease: Lease | None = None,
    ) -> None:
        values = {
            "backend": position.backend,
            "msg_id": position.msg_id,
            "ts": position.ts,
            "updated_at": time.time(),
        }
        key = and_(
            positions_table.c.root_path == self.root_path,
            positions_table.c.task_id == task_id,
            positions_table.c.pchannel == position.pchannel,
        )

        def write(conn: Connection) -> int:
            if expected is None:
                conn.execute(
                    insert(positions_table).values(
                        root_path=self.root_path,
                        task_id=task_id,
                        pchannel=position.pchannel,
                        **values,
                    )
                )
                return 1
            return int(
                conn.execute(
                    update(positions_table)
                    .where(
                        key,
                        positions_table.c.backend == expected.backend,
                        positions_table.c.msg_id == expected.msg_id,
                        positions_table.c.ts == expected.ts,
                        positions_table.c.ts <= position.ts,
                    )
                    .values(**values)
                ).rowcount
            )

        try:
            with self._tx() as conn:
                if self._write_for_task(conn, task_id, lambda: write(conn), lease) != 1:
                    row = conn.execute(select(positions_table).where(key)).first()
                    stored = None if row is None else position_from_row(row._mapping)
                    check_position_step(task_id, stored, expected, position)
                    # check_position_step raises for every way the UPDATE can miss
                    raise PositionConflictError(f"position of task {task_id} was not saved")
        except IntegrityError as exc:  # the INSERT met a row: someone saved first
            raise PositionConflictError(
                f"position of task {task_id} channel {position.pchannel} changed: expected "
                "nothing, found a saved position"
            ) from exc

    # --- per-task state ----------------------------------------------------------------------
    def _state_key(self, task_id: str, key: str) -> Any:
        return and_(
            state_table.c.root_path == self.root_path,
            state_table.c.task_id == task_id,
            state_table.c.state_key == key,
        )

    def put_state(
        self, task_id: str, key: str, value: bytes, *, lease: Lease | None = None
    ) -> None:
        where = self._state_key(task_id, key)

        def write(conn: Connection) -> int:
            if conn.execute(update(state_table).where(where).values(value=value)).rowcount == 0:
                conn.execute(
                    insert(state_table).values(
                        root_path=self.root_path, task_id=task_id, state_key=key, value=value
                    )
                )
            return 1

        with self._tx() as conn:
            self._write_for_task(conn, task_id, lambda: write(conn), lease)

    def replace_state(self, task_id: str, key: str, value: bytes, expected: bytes | None) -> bool:
        def write(conn: Connection) -> int:
            if expected is None:  # a row there already: IntegrityError
                row = {"root_path": self.root_path, "task_id": task_id, "state_key": key}
                return conn.execute(insert(state_table).values(**row, value=value)).rowcount
            stored_is = and_(self._state_key(task_id, key), state_table.c.value == expected)
            return conn.execute(update(state_table).where(stored_is).values(value=value)).rowcount

        try:
            with self._tx() as conn:
                return self._write_for_task(conn, task_id, lambda: write(conn)) == 1
        except IntegrityError:  # another writer stored it first
            if self.get_task(task_id) is None:
                raise TaskNotFoundError(task_id) from None
            return False

    def get_state(self, task_id: str, key: str) -> bytes | None:
        query = select(state_table.c.value).where(self._state_key(task_id, key))
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else bytes(row[0])

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        query = select(state_table.c.state_key, state_table.c.value).where(
            state_table.c.root_path == self.root_path, state_table.c.task_id == task_id
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        # Prefix filtering in Python: LIKE would need escaping of % and _ in user keys.
        return {k: bytes(v) for k, v in rows if k.startswith(prefix)}

    # --- the fleet ---------------------------------------------------------------------------
    def heartbeat(self, member_id: str, info: Mapping[str, Any], ttl: float) -> None:
        member = and_(
            members_table.c.root_path == self.root_path, members_table.c.member_id == member_id
        )
        with self._tx(fleet=True) as conn:
            now = self._now(conn)
            values = {"info": json.dumps(dict(info), sort_keys=True), "expires_at": now + ttl}
            if conn.execute(update(members_table).where(member).values(**values)).rowcount == 0:
                conn.execute(
                    insert(members_table).values(
                        root_path=self.root_path, member_id=member_id, **values
                    )
                )
            # read without locks, then extend each lease by its key: an UPDATE filtered on
            # owner would lock every lease row it scans (InnoDB), and wait on, or hold up, the
            # other members' position writes that lock their own lease rows
            held = conn.execute(
                select(leases_table.c.task_id, leases_table.c.token).where(
                    leases_table.c.root_path == self.root_path,
                    leases_table.c.owner == member_id,
                    leases_table.c.expires_at > now,
                )
            ).all()
            if held:  # one statement for all (executemany): fifty tasks, fifty rows a second
                extend = (
                    update(leases_table)
                    .where(
                        leases_table.c.root_path == self.root_path,
                        leases_table.c.task_id == bindparam("held_task"),
                        leases_table.c.token == bindparam("held_token"),
                        leases_table.c.expires_at > now,
                    )
                    .values(expires_at=now + ttl)
                )
                conn.execute(
                    extend, [{"held_task": r.task_id, "held_token": r.token} for r in held]
                )

    def leave(self, member_id: str) -> None:
        with self._tx(fleet=True) as conn:
            for table, column in (
                (leases_table, leases_table.c.owner),
                (members_table, members_table.c.member_id),
            ):
                conn.execute(
                    delete(table).where(table.c.root_path == self.root_path, column == member_id)
                )

    def members(self) -> list[Member]:
        with self._tx(fleet=True) as conn:
            now = self._now(conn)
            rows = conn.execute(
                select(members_table.c.member_id, members_table.c.info)
                .where(members_table.c.root_path == self.root_path)
                .where(members_table.c.expires_at > now)
                .order_by(members_table.c.member_id)
            ).all()
        return [Member(row.member_id, orjson.loads(row.info)) for row in rows]

    def acquire_lease(self, task_id: str, member_id: str, ttl: float) -> Lease | None:
        try:
            with self._tx(fleet=True) as conn:
                if not self._lock_task(conn, task_id):
                    raise TaskNotFoundError(task_id)
                now = self._now(conn)
                row = self._lease_row(conn, task_id)
                values = {"owner": member_id, "expires_at": now + ttl}
                if row is None:
                    token = int(now * 1000)
                    conn.execute(
                        insert(leases_table).values(
                            root_path=self.root_path, task_id=task_id, token=token, **values
                        )
                    )
                    return Lease(task_id, member_id, token)
                if row.expires_at > now:
                    return Lease(task_id, member_id, row.token) if row.owner == member_id else None
                token = max(row.token + 1, int(now * 1000))
                conn.execute(
                    update(leases_table)
                    .where(self._lease_key(task_id), leases_table.c.token == row.token)
                    .values(token=token, **values)
                )
                return Lease(task_id, member_id, token)
        except IntegrityError:  # another member inserted the first lease at the same moment
            return None

    def release_lease(self, lease: Lease) -> None:
        with self._tx(fleet=True) as conn:
            conn.execute(
                delete(leases_table).where(
                    self._lease_key(lease.task_id), leases_table.c.token == lease.token
                )
            )

    def leases(self) -> dict[str, Lease]:
        with self._tx(fleet=True) as conn:
            now = self._now(conn)
            rows = conn.execute(
                select(leases_table.c.task_id, leases_table.c.owner, leases_table.c.token)
                .where(leases_table.c.root_path == self.root_path)
                .where(leases_table.c.expires_at > now)
            ).all()
        return {row.task_id: Lease(row.task_id, row.owner, row.token) for row in rows}

    # --- the ids of the keys secrets are sealed with ------------------------------------------
    def _secret_key(self, key_id: str) -> Any:
        return and_(
            secret_keys_table.c.root_path == self.root_path,
            secret_keys_table.c.key_id == key_id,
        )

    def secret_key_ids(self) -> dict[str, int]:
        query = select(secret_keys_table.c.key_id, secret_keys_table.c.version).where(
            secret_keys_table.c.root_path == self.root_path
        )
        with self._tx() as conn:
            return {row.key_id: int(row.version) for row in conn.execute(query)}

    def record_secret_key_id(self, key_id: str) -> None:
        for _attempt in range(3):  # another daemon inserted the same id at the same moment
            try:
                with self._tx() as conn:
                    raised = conn.execute(
                        update(secret_keys_table)
                        .where(self._secret_key(key_id))
                        .values(version=secret_keys_table.c.version + 1, recorded_at=time.time())
                    ).rowcount
                    if not raised:
                        conn.execute(
                            insert(secret_keys_table).values(
                                root_path=self.root_path,
                                key_id=key_id,
                                version=1,
                                recorded_at=time.time(),
                            )
                        )
                return
            except IntegrityError:
                continue
        raise MetaStoreUnavailableError(
            f"secret key id {key_id}: recorded by other daemons at the same moment; try again"
        )

    def forget_secret_key_id(self, key_id: str, version: int) -> bool:
        with self._tx() as conn:
            removed = conn.execute(
                delete(secret_keys_table).where(
                    self._secret_key(key_id), secret_keys_table.c.version == version
                )
            ).rowcount
        return bool(removed)

    # --- records of the root path ------------------------------------------------------------
    def _record(self, key: str) -> Any:
        return (records_table.c.root_path == self.root_path) & (records_table.c.record_key == key)

    def get_record(self, key: str) -> tuple[bytes, int] | None:
        query = select(records_table.c.value, records_table.c.version).where(self._record(key))
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else (bytes(row.value), int(row.version))

    def list_records(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        query = select(
            records_table.c.record_key, records_table.c.value, records_table.c.version
        ).where(
            records_table.c.root_path == self.root_path,
            records_table.c.record_key.startswith(prefix, autoescape=True),
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return {str(r.record_key): (bytes(r.value), int(r.version)) for r in rows}

    def put_record(self, key: str, value: bytes, expected: int | None) -> int | None:
        try:
            with self._tx() as conn:
                if expected is None:
                    conn.execute(
                        insert(records_table).values(
                            root_path=self.root_path, record_key=key, value=value, version=1
                        )
                    )
                    return 1
                changed = conn.execute(
                    update(records_table)
                    .where(self._record(key), records_table.c.version == expected)
                    .values(value=value, version=expected + 1)
                ).rowcount
                return expected + 1 if changed else None
        except IntegrityError:  # another daemon stored it first
            return None

    def delete_record(self, key: str, expected: int) -> bool:
        with self._tx() as conn:
            removed = conn.execute(
                delete(records_table).where(self._record(key), records_table.c.version == expected)
            ).rowcount
        return bool(removed)

    # --- the format of the data --------------------------------------------------------------
    def store_format(self) -> StoreFormat | None:
        query = select(store_format_table.c.version, store_format_table.c.release).where(
            store_format_table.c.root_path == self.root_path
        )
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else StoreFormat(int(row.version), str(row.release))

    def set_store_format(self, expected: int | None, new: StoreFormat) -> bool:
        values = {"version": new.version, "release": new.release, "updated_at": time.time()}
        try:
            with self._tx() as conn:
                if expected is None:
                    conn.execute(
                        insert(store_format_table).values(root_path=self.root_path, **values)
                    )
                    return True
                changed = conn.execute(
                    update(store_format_table)
                    .where(
                        store_format_table.c.root_path == self.root_path,
                        store_format_table.c.version == expected,
                    )
                    .values(**values)
                ).rowcount
                return bool(changed)
        except IntegrityError:  # another daemon recorded a format first
            return False

    # --- lifecycle ---------------------------------------------------------------------------
    def ping(self) -> None:
        with self._tx() as conn:
            conn.execute(select(1))

    def close(self) -> None:
        self._engine.dispose()
        if self._fleet_engine is not self._engine:
            self._fleet_engine.dispose()
