"""SQL metastore: SQLite (the embedded default) and MySQL/MariaDB through SQLAlchemy + PyMySQL.

Six tables (:mod:`metastore.sql_schema`), each keyed by ``root_path`` first so daemons sharing a
database stay apart; the URL and engine: :mod:`metastore.sql_engine`, transactions and the lease
check :mod:`metastore.sql_plumbing`, the fleet :mod:`metastore.sql_fleet`, records, secret key
ids and the store's format :mod:`metastore.sql_records`; here the tasks, their positions and
their state. The position compare-and-set is one conditional UPDATE (or INSERT) followed by a
locking read of the task row in the same transaction, so a position is never saved for a task
deleted meanwhile. A write under a lease reads the lease row in its own transaction (locked on
MySQL, after the task row: the order ``delete_task`` and ``acquire_lease`` use) and is refused
unless the token is the live one's. SQLite serves one daemon (its database is a local file);
the same code keeps it honest there too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from metastore.base import Lease, Position, TaskRecord, TaskState, check_position_step, encode_spec
from metastore.errors import (
    ConcurrentUpdateError,
    PositionConflictError,
    TaskExistsError,
    TaskNotFoundError,
)
from metastore.sql_fleet import SqlFleet
from metastore.sql_records import SqlRecords
from metastore.sql_schema import (
    leases_table,
    position_from_row,
    positions_table,
    state_table,
    task_from_row,
    tasks_table,
)

# a channel's position: its row, and the saves (an INSERT of the first, then an UPDATE that
# moves it only from the position the saver read), built once (see sql_plumbing's statements)
_POSITION_KEY = and_(  # (an UPDATE's parameters may not be named as its columns)
    positions_table.c.root_path == bindparam("key_root_path"),
    positions_table.c.task_id == bindparam("key_task_id"),
    positions_table.c.pchannel == bindparam("key_pchannel"),
)
_POSITION_ROW = select(positions_table).where(_POSITION_KEY)
_POSITION_INSERT = insert(positions_table)
_POSITION_STEP = (
    update(positions_table)
    .where(
        _POSITION_KEY,
        positions_table.c.backend == bindparam("expected_backend"),
        positions_table.c.msg_id == bindparam("expected_msg_id"),
        positions_table.c.ts == bindparam("expected_ts"),
        positions_table.c.ts <= bindparam("new_ts"),
    )
    .values(
        backend=bindparam("new_backend"),
        msg_id=bindparam("new_msg_id"),
        ts=bindparam("new_ts"),
        updated_at=bindparam("new_updated_at"),
    )
)


class SqlMetaStore(SqlFleet, SqlRecords):
    """One class for SQLite and MySQL; the dialect differences are the engine's business."""

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
        row = {"root_path": self.root_path, "task_id": task_id, "pchannel": position.pchannel}
        key = {f"key_{name}": value for name, value in row.items()}
        values = {
            "backend": position.backend,
            "msg_id": position.msg_id,
            "ts": position.ts,
            "updated_at": time.time(),
        }

        def write(conn: Connection) -> int:
            if expected is None:
                conn.execute(_POSITION_INSERT, {**row, **values})
                return 1
            step = {
                "expected_backend": expected.backend,
                "expected_msg_id": expected.msg_id,
                "expected_ts": expected.ts,
                **{f"new_{name}": value for name, value in values.items()},
            }
            return int(conn.execute(_POSITION_STEP, {**key, **step}).rowcount)

        try:
            with self._tx() as conn:
                if self._write_for_task(conn, task_id, lambda: write(conn), lease) != 1:
                    found = conn.execute(_POSITION_ROW, key).first()
                    stored = None if found is None else position_from_row(found._mapping)
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
