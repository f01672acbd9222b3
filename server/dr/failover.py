"""Failover: the source cluster is lost. The task stops at once; the answer says up to when the
target holds every write the source acknowledged (``consistent_up_to``), and, when the source's
WAL can still be read (its queue survived the Milvus), what the WAL holds after that point: the
row changes and DDL of the task's collections, counted by collection and kind, and written to a
file of JSON lines in the Kafka target's event format (README "Kafka targets") that the
operator can inspect or replay.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from metastore import Position
from replicator.config.task_spec import TaskSpec
from replicator.events import CollectionEvent, Delete, Insert, RawRecord
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.runner import RunnerContext
from replicator.sinks.kafka_events import dumps, rows_of, ts_view
from server.dr.wal_tail import changed_keys, primary_key_name, records_after, selected_collections

log = logging.getLogger(__name__)


@dataclass
class Unreplicated:
    """What the source's WAL holds after the consistent point, for the task's collections."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (db.coll, kind)
    channels_read: list[str] = field(default_factory=list)
    file: str = ""
    complete: bool = True  # every channel was read to its end
    problems: list[str] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        by_collection: dict[str, dict[str, int]] = {}
        for (collection, kind), count in sorted(self.counts.items()):
            by_collection.setdefault(collection, {})[kind] = count
        return {
            "records": sum(self.counts.values()),
            "by_collection": by_collection,
            "file": self.file or None,
            "channels_read": self.channels_read,
            "complete": self.complete,
            "problems": self.problems,
        }


def export_unreplicated(
    context: RunnerContext,
    spec: TaskSpec,
    positions: dict[str, Position],
    consistent_ts: int,
    out: Path,
    budget: float,
) -> Unreplicated:
    """Read every DML channel of the task from its saved position to the end (``budget``
    seconds in all); records newer than ``consistent_ts`` of the selected collections go to
    ``out``, one JSON event per row change or DDL."""
    result = Unreplicated()
    deadline = time.monotonic() + budget
    try:
        selected = selected_collections(context, spec)
    except Exception as exc:  # noqa: BLE001 - the source is being lost: any failure is told
        result.complete = False
        result.problems.append(f"the source catalog cannot be read: {exc}")
        return result
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    source = context.source()
    with open(partial, "w", encoding="utf-8") as file:
        for pchannel in context.channels:
            if time.monotonic() >= deadline:
                result.complete = False
                result.problems.append(f"{pchannel}: not read, out of time")
                continue
            try:
                for event, record in records_after(
                    source, pchannel, positions.get(pchannel), selected, deadline
                ):
                    if event is not None and event.ts > consistent_ts:
                        _write(file, event, record, selected, result)
                result.channels_read.append(pchannel)
            except Exception as exc:  # noqa: BLE001 - a queue failing is the answer's news
                result.complete = False
                result.problems.append(f"{pchannel}: {type(exc).__name__}: {exc}")
    partial.replace(out)
    result.file = str(out)
    return result


def _write(
    file: IO[str],
    event: CollectionEvent,
    record: RawRecord,
    selected: dict[int, CollectionMeta],
    result: Unreplicated,
) -> None:
    meta = selected[event.collection_id]
    name = f"{meta.db_name or 'default'}.{meta.name}"
    source = {"channel": record.pchannel, "position": record.offset}
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
