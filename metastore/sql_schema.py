"""The SQL metastore's tables, their creation where missing, and the records read from rows."""

from __future__ import annotations

import time
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Engine,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.exc import SQLAlchemyError

from metastore.base import Position, TaskRecord, TaskState

metadata = MetaData()
_BIG_TEXT = Text().with_variant(Text(length=2**24), "mysql")  # MEDIUMTEXT on MySQL
_BIG_BLOB = LargeBinary().with_variant(LargeBinary(length=2**24), "mysql")

tasks_table = Table(
    "cdc_tasks",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("task_id", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("spec", _BIG_TEXT, nullable=False),
    Column("extra", _BIG_TEXT, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("revision", BigInteger, nullable=False),
)
positions_table = Table(
    "cdc_positions",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("task_id", String(64), primary_key=True),
    Column("pchannel", String(255), primary_key=True),
    Column("backend", String(32), nullable=False),
    Column("msg_id", LargeBinary, nullable=False),
    Column("ts", BigInteger, nullable=False),
    Column("updated_at", Double, nullable=False),
)
state_table = Table(
    "cdc_task_state",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("task_id", String(64), primary_key=True),
    Column("state_key", String(255), primary_key=True),
    Column("value", _BIG_BLOB, nullable=False),
)

members_table = Table(
    "cdc_members",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("member_id", String(128), primary_key=True),
    Column("info", Text, nullable=False),
    Column("expires_at", Double, nullable=False),
)
leases_table = Table(
    "cdc_leases",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("task_id", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("expires_at", Double, nullable=False),
)

# the ids of the keys the root path's secrets are sealed with (never a key): one row per id,
# its version raised each time the id is recorded again
secret_keys_table = Table(
    "cdc_secret_keys",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("key_id", String(64), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("recorded_at", Double, nullable=False),
)

# the format of the root path's data (metastore/format.py): one row, absent in stores of
# releases before formats were recorded
store_format_table = Table(
    "cdc_store_format",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("release", String(64), nullable=False),
    Column("updated_at", Double, nullable=False),
)

# records of the root path changed by compare-and-set (disaster recovery's cluster pairs); the
# version is raised by one at every write
records_table = Table(
    "cdc_records",
    metadata,
    Column("root_path", String(128), primary_key=True),
    Column("record_key", String(255), primary_key=True),
    Column("value", _BIG_BLOB, nullable=False),
    Column("version", BigInteger, nullable=False),
)


# what a database answers when another daemon created the same table or index first
_CREATED_MEANWHILE = ("already exists", "duplicate key name")


def create_schema(engine: Engine, attempts: int = 5) -> None:
    """The tables and indexes, made where missing. Daemons of a fleet that start together on a
    new database race here: ``create_all`` checks, then creates, and a table another daemon made
    in between is refused ("already exists"); the check is then made again."""
    for attempt in range(attempts):
        try:
            metadata.create_all(engine)
            return
        except SQLAlchemyError as exc:
            text = str(exc).lower()
            if attempt + 1 == attempts or not any(m in text for m in _CREATED_MEANWHILE):
                raise
            time.sleep(0.05 * (attempt + 1))


def task_from_row(row: Any) -> TaskRecord:
    return TaskRecord(
        task_id=row["task_id"],
        state=TaskState(row["state"]),
        reason=row["reason"],
        spec=orjson.loads(row["spec"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        revision=row["revision"],
        extra=orjson.loads(row["extra"]),
    )


def position_from_row(row: Any) -> Position:
    return Position(
        backend=row["backend"], pchannel=row["pchannel"], msg_id=bytes(row["msg_id"]), ts=row["ts"]
    )


__all__ = [
    "create_schema",
    "leases_table",
    "members_table",
    "metadata",
    "position_from_row",
    "positions_table",
    "records_table",
    "secret_keys_table",
    "state_table",
    "store_format_table",
    "task_from_row",
    "tasks_table",
]
