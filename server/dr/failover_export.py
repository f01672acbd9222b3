"""A failover's account of the source's WAL once the task stopped: per DML channel, what its
ticks and saved position prove the target holds, and every record of the task's collections the
target does not hold, written to a file of JSON lines in the Kafka target's event format (README
"Kafka targets") for the operator to inspect or replay.

The saved position of a stopped task is exactly what its target holds (``pipeline/checkpoint.py``:
a position is saved once the records before it are written; a worker that stops saves the last
one it read when nothing waits for a tick). A record after it is applied only when its timestamp
is at or below the position's tick (a 2.6 record released before an older-offset one still
waiting; the runner itself drops those on a restart as repeats), so the rest, every one, is
unapplied and goes to the file: no record both on the target and in the file, none in neither.

A channel's figure is what its ticks prove, never a clock: the greater of its position's tick and
the last time tick read after it, bounded below the first unapplied record. A channel that holds
no tick and nothing unapplied (no collection on it in 2.3; a 2.6 pchannel without writes) bounds
nothing. The task's figure is the lowest of the channels'.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from metastore import Position
from replicator.config.task_spec import TaskSpec
from replicator.events import CollectionEvent, Delete, FailedRecord, Insert, RawRecord, TimeTick
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.runner_context import RunnerContext
from replicator.pipeline.selection import TaskSelection
from replicator.pipeline.status import consistent_view
from replicator.sinks.kafka_events import dumps, rows_of, ts_view
from server.dr.wal_tail import changed_keys, decoded_after, primary_key_name, selected_collections


@dataclass
class ChannelTail:
    """One DML channel read from its saved position to its end."""

    channel: str
    saved_ts: int  # the tick of the saved position: everything up to it is on the target
    after_offset: int = -1  # the saved position's record (-1: the channel's beginning)
    inflight_bound: int = -1  # records up to this offset may be on the target (a write cut off)
    read: bool = False  # read to its end
    last_tick: int = 0  # the greatest time tick read after the saved position
    first_unapplied: int = 0  # the lowest timestamp of a record the target lacks (0: none)
    records: int = 0  # WAL records of the task's collections the target lacks
    applied_after: int = 0  # records after the position the target holds (at or below its tick)
    in_doubt: int = 0  # exported records at or below the in-flight bound

    @property
    def consistent_ts(self) -> int:
        """Up to when every write of the channel is on the target (0: nothing proven)."""
        proven = max(self.saved_ts, self.last_tick)
        if self.first_unapplied:
            proven = min(proven, self.first_unapplied - 1)
        return proven

    @property
    def bounds_task(self) -> bool:
        """Whether the task's figure depends on this channel (one with no tick and nothing
        unapplied carries none of the task's writes)."""
        return bool(self.consistent_ts or self.records)

    def view(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "after_offset": self.after_offset,
            "read": self.read,
            "saved_ts": self.saved_ts,
            "last_tick": self.last_tick,
            "consistent_up_to": consistent_view(self.consistent_ts),
            "unapplied_from": consistent_view(self.first_unapplied),
            "records": self.records,
            "applied_after": self.applied_after,
            "in_doubt": self.in_doubt,
        }


@dataclass
class Unreplicated:
    """What the source's WAL holds after the task's saved positions, for its collections."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (db.coll, kind): rows
    channels: list[ChannelTail] = field(default_factory=list)
    file: str = ""
    complete: bool = True  # every channel was read to its end
    problems: list[str] = field(default_factory=list)

    @property
    def channels_read(self) -> list[str]:
        return [tail.channel for tail in self.channels if tail.read]

    @property
    def consistent_ts(self) -> int:
        """The task's figure: its lowest channel's (0: nothing proven)."""
        figures = [tail.consistent_ts for tail in self.channels if tail.bounds_task]
        return min(figures) if figures else 0

    @property
    def unapplied_from(self) -> int:
        """The timestamp of the earliest record the target lacks (0: none)."""
        firsts = [tail.first_unapplied for tail in self.channels if tail.first_unapplied]
        return min(firsts) if firsts else 0

    def view(self) -> dict[str, Any]:
        by_collection: dict[str, dict[str, int]] = {}
        for (collection, kind), count in sorted(self.counts.items()):
            by_collection.setdefault(collection, {})[kind] = count
        return {
            "records": sum(self.counts.values()),
            "wal_records": sum(tail.records for tail in self.channels),
            "by_collection": by_collection,
            "unapplied_from": consistent_view(self.unapplied_from),
            "file": self.file or None,
            "channels_read": self.channels_read,
            "channels": [tail.view() for tail in self.channels],
            "complete": self.complete,
            "problems": self.problems,
        }


def export_unapplied(
    context: RunnerContext,
    spec: TaskSpec,
    tails: list[ChannelTail],
    positions: dict[str, Position],
    learnt: list[CollectionMeta],
    out: Path,
    budget: float,
) -> Unreplicated:
    """Read each channel of ``tails`` (one per DML channel, with its saved ``positions``) to
    its end, ``budget`` seconds in all; every record of the selected collections (in the source
    catalog, or ``learnt`` by the task from the WAL: a 2.6 source's, a catalog lost with its
    cluster) the target does not hold goes to ``out``, one JSON event per row change or DDL."""
    result = Unreplicated(channels=tails)
    deadline = time.monotonic() + budget
    selection = TaskSelection.from_spec(spec)
    selected = {m.collection_id: m for m in learnt if selection.selects(m.db_name, m.name)}
    try:
        selected.update(selected_collections(context, spec))
    except Exception as exc:  # noqa: BLE001 - the source is being lost: any failure is told
        # records of a collection only the catalog knows would be missed: not complete
        result.complete = False
        result.problems.append(f"the source catalog cannot be read: {exc}")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    source = context.source()
    with open(partial, "w", encoding="utf-8") as file:
        for tail in tails:
            if time.monotonic() >= deadline:
                result.complete = False
                result.problems.append(f"{tail.channel}: not read, out of time")
                continue
            start = positions.get(tail.channel)
            try:
                if start is not None and start.msg_id:
                    tail.after_offset = source.offset_of(start.msg_id)
                for event, record in decoded_after(source, tail.channel, start, selected, deadline):
                    _account(file, tail, event, record, selected, result)
                tail.read = True
            except Exception as exc:  # noqa: BLE001 - a queue failing is the answer's news
                result.complete = False
                result.problems.append(f"{tail.channel}: {type(exc).__name__}: {exc}")
    partial.replace(out)
    result.file = str(out)
    return result


def _account(
    file: IO[str],
    tail: ChannelTail,
    event: object,
    record: RawRecord,
    selected: dict[int, CollectionMeta],
    result: Unreplicated,
) -> None:
    """One record after the saved position: a tick moves the channel's proof, a record of
    the task's collections the target lacks goes to the file."""
    if isinstance(event, TimeTick):
        tail.last_tick = max(tail.last_tick, event.ts)
        return
    if isinstance(event, FailedRecord):
        result.complete = False  # it may be one of the task's writes: the operator must know
        result.problems.append(f"{tail.channel} offset {record.offset}: {event.reason}")
        return
    if not isinstance(event, CollectionEvent) or event.collection_id not in selected:
        return
    if event.ts <= tail.saved_ts:
        tail.applied_after += 1  # released at or before the saved tick: on the target
        return
    tail.records += 1
    tail.first_unapplied = min(tail.first_unapplied or event.ts, event.ts)
    doubt = record.offset <= tail.inflight_bound
    tail.in_doubt += doubt
    _write(file, event, record, selected[event.collection_id], result, doubt)


def _write(
    file: IO[str],
    event: CollectionEvent,
    record: RawRecord,
    meta: CollectionMeta,
    result: Unreplicated,
    in_doubt: bool,
) -> None:
    name = f"{meta.db_name or 'default'}.{meta.name}"
    source: dict[str, Any] = {"channel": record.pchannel, "position": record.offset}
    if in_doubt:  # a write under way when the task stopped: the target may hold it too
        source["maybe_on_target"] = True
    base = {"db": meta.db_name or "default", "collection": meta.name, "ts": ts_view(event.ts)}
    if isinstance(event, Insert):
        pk_name = primary_key_name(meta)
        for row in rows_of(event.request.fields_data, event.num_rows):
            line = {"op": "insert", **base, "partition": event.partition_name}
            file.write(
                dumps({**line, "pk": row.get(pk_name), "row": row, "source": source}).decode()
            )
            file.write("\n")
        result.counts[(name, "insert")] += event.num_rows
    elif isinstance(event, Delete):
        pks = changed_keys(event, meta)
        for pk in pks:
            line = {"op": "delete", **base, "partition": event.partition_name}
            file.write(dumps({**line, "pk": pk, "row": None, "source": source}).decode())
            file.write("\n")
        result.counts[(name, "delete")] += len(pks)
    else:
        kind = _snake(type(event).__name__)
        file.write(dumps({"op": kind, **base, "source": source}).decode())
        file.write("\n")
        result.counts[(name, kind)] += 1


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
