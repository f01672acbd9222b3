"""Reading a cluster's WAL from a point to its end, for disaster recovery: the failover's export
of what the target lacks (:mod:`failover`) and the watch of an old primary for writes of stale
clients (:mod:`stale_watch`).

A read is of one DML channel, from a saved position (the first record after it) to the end the
channel had when the read began, within a deadline; it yields every record, with its event
decoded when it is a change of a selected collection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from metastore import Position
from replicator.backfill.ranges import Key
from replicator.codec.streaming import decode_any
from replicator.config.task_spec import TaskSpec
from replicator.events import CollectionEvent, Delete, Event, FailedRecord, Insert, RawRecord
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.bootstrap import position_before_offset
from replicator.pipeline.runner_context import RunnerContext
from replicator.pipeline.selection import TaskSelection
from replicator.sources.base import WalSource

READ_BATCH = 1000
READ_WAIT = 0.5  # seconds a read of a channel waits before the channel counts as read


def selected_collections(context: RunnerContext, spec: TaskSpec) -> dict[int, CollectionMeta]:
    """The collections of the cluster (its catalog, by id) that the task's selection names."""
    selection = TaskSelection.from_spec(spec)
    return {
        cid: meta
        for cid, meta in context.catalog().items()
        if selection.selects(meta.db_name, meta.name)
    }


def end_positions(context: RunnerContext, timeout: float = 10.0) -> dict[str, Position]:
    """Per DML channel, a position after its last record: a read from it sees only what the
    channel takes from now on."""
    source = context.source()
    positions = {}
    for pchannel in context.channels:
        _, end = source.watermarks(pchannel, timeout)
        positions[pchannel] = position_before_offset(source, pchannel, end)
    return positions


def records_after(
    source: WalSource,
    pchannel: str,
    start: Position | None,
    selected: dict[int, CollectionMeta],
    deadline: float,
    limit: int | None = None,
) -> Iterator[tuple[CollectionEvent | None, RawRecord]]:
    """Every record of ``pchannel`` after ``start`` up to the channel's end as it is now (at
    most ``limit``), each with its event when it is a change of a ``selected`` collection.
    Raises TimeoutError when the deadline passes first."""
    for event, record in decoded_after(source, pchannel, start, selected, deadline, limit):
        wanted = isinstance(event, CollectionEvent) and event.collection_id in selected
        yield (event if wanted else None), record  # type: ignore[misc]


def decoded_after(
    source: WalSource,
    pchannel: str,
    start: Position | None,
    selected: dict[int, CollectionMeta],
    deadline: float,
    limit: int | None = None,
) -> Iterator[tuple[Event | FailedRecord, RawRecord]]:
    """As :func:`records_after`, with every record's decoded event (time ticks, other
    collections' records as skipped, an undecodable record as a ``FailedRecord``)."""
    earliest, end = source.watermarks(pchannel, max(0.1, deadline - time.monotonic()))
    if end <= earliest:
        return  # an empty channel
    # an empty message id: the channel was empty when the position was taken (read from its
    # start)
    reader = source.open_channel(pchannel, start if start is not None and start.msg_id else None)
    count = 0
    try:
        while time.monotonic() < deadline:
            records = reader.read_batch(READ_BATCH, READ_WAIT)
            for record in records:
                yield decode_any(record, source.backend, lambda cid: cid in selected), record
                count += 1
                if limit is not None and count >= limit:
                    return
            last = records[-1].offset if records else None
            if not records or (last is not None and last >= end - 1):
                return
        raise TimeoutError("not read to its end in time")
    finally:
        reader.close()


def unapplied_changes(
    context: RunnerContext,
    spec: TaskSpec,
    positions: dict[str, Position],
    budget: float,
) -> dict[str, int]:
    """The row changes and DDL of the task's collections in its WAL after ``positions`` (a
    stopped task's saved positions: what the target holds), counted by channel; raises
    TimeoutError when the channels are not read to their ends within ``budget`` seconds."""
    deadline = time.monotonic() + budget
    selected = selected_collections(context, spec)
    source = context.source()
    found: dict[str, int] = {}
    for pchannel in context.channels:
        for event, _ in records_after(
            source, pchannel, positions.get(pchannel), selected, deadline
        ):
            if event is not None:
                found[pchannel] = found.get(pchannel, 0) + 1
    return found


def primary_key_name(meta: CollectionMeta) -> str:
    for f in meta.schema.fields:
        if f.is_primary_key:
            return str(f.name)
    return ""


def _primary_key_id(meta: CollectionMeta) -> int:
    return next((int(f.fieldID) for f in meta.schema.fields if f.is_primary_key), -1)


def changed_keys(event: CollectionEvent, meta: CollectionMeta) -> list[Key]:
    """The primary keys an Insert or Delete writes (none for anything else)."""
    if isinstance(event, Delete):
        keys = event.request.primary_keys
        return list(keys.int_id.data) if keys.HasField("int_id") else list(keys.str_id.data)
    if isinstance(event, Insert):
        name, field_id = primary_key_name(meta), _primary_key_id(meta)
        for column in event.request.fields_data:
            if column.field_name == name or (column.field_id and column.field_id == field_id):
                scalars = column.scalars
                if scalars.HasField("long_data"):
                    return list(scalars.long_data.data)
                return list(scalars.string_data.data)
    return []
