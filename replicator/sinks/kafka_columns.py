"""An insert's row events made from its columns in one pass, as bytes (see :mod:`kafka_events`);
a commit's events as the records it produces.

The per-row way makes, for every row, the event as a dict (``op``, ``db``, ..., ``ts``), its key
with ``row_key`` and its time with ``ts_view``, and serializes the whole dict at the commit.
Here what every row of one insert shares (``op``, ``db``, ``collection``, ``partition``, the
time, the key's ``[db, collection,`` part) is serialized once; a row adds its key, its
``pk`` and its ``row`` object. The event is kept as its JSON up to ``ts`` (a *body*: every
field but ``source``, without the closing brace); the commit appends
``,"source":{...}}``, which it knows only then. The bytes are those of the dict serialized
whole (same keys in the same order, each part by :func:`kafka_events.dumps`): a row that
needs the standard library's JSON (an integer beyond 64 bits in a JSON field) is serialized
by it alone, as the whole event would be, and the other parts are JSON both libraries write
alike (strings and integers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TargetRejectedError
from replicator.sinks.kafka_events import dumps, key_prefix, rows_of, ts_view

# an event as logged: (topic, key, value), its value as a dict, or as the JSON of every field
# but "source" without the closing brace (a body, see insert_events); the commit adds "source"
Event = tuple[str, bytes, dict[str, Any] | bytes]
# a topic and its messages for produce_batch, in their order
Run = tuple[str, list[dict[str, bytes]]]


class EventLog(Protocol):
    """What ``insert_events`` needs of a channel's log (``kafka.ChannelLog``): its events."""

    events: list[Event]


def insert_events(
    log: EventLog,
    topic: str,
    db: str,
    collection: str,
    partition: str,
    pk_name: str,
    fields_data: Sequence[schema_pb2.FieldData],
    num_rows: int,
    ts: int,
    deleted: dict[tuple[Any, int], int],
) -> int:
    """The insert's rows as events appended to ``log``: an ``insert`` each, or an ``upsert``
    in place of the delete of the same key and time already logged (``deleted``: (pk, ts)
    -> its index, popped when paired). The number of rows."""
    rows = rows_of(fields_data, num_rows)
    shared = dumps({"db": db, "collection": collection, "partition": partition})[1:-1]
    insert = b'{"op":"insert",' + shared + b',"pk":'
    upsert = b'{"op":"upsert",' + shared + b',"pk":'
    when = b',"ts":' + dumps(ts_view(ts))
    prefix = key_prefix(db, collection)
    events = log.events
    append = events.append
    for row in rows:
        pk = row[pk_name]
        pk_json = dumps(pk)
        tail = (pk_json, b',"row":', dumps(row), when)
        paired = deleted.pop((pk, ts), None) if deleted else None
        if paired is None:
            append((topic, prefix + pk_json + b"]", b"".join((insert, *tail))))
        else:
            events[paired] = (topic, events[paired][1], b"".join((upsert, *tail)))
    return len(rows)


def topic_runs(events: Sequence[Event], source: dict[str, Any], limit: int) -> list[Run]:
    """A commit's events as runs of one topic, each a batch of messages for ``produce_batch``,
    every event with the commit's ``source`` (raises ``TargetRejectedError`` for an event of
    more than ``limit`` bytes)."""
    tail = b',"source":' + dumps(source) + b"}"
    runs: list[Run] = []
    batch: list[dict[str, bytes]] = []
    current = None
    for topic, key, value in events:
        if isinstance(value, bytes):
            data = value + tail
        else:
            value["source"] = source
            data = dumps(value)
        if len(data) > limit:
            event = json.loads(data)
            raise TargetRejectedError(
                f"kafka: the event of {event.get('db')}.{event.get('collection')} "
                f"pk {event.get('pk')!r} is {len(data):,} bytes, more than "
                f"max_event_bytes ({limit:,}): raise it (and the "
                "topic's max.message.bytes) to send it"
            )
        if topic != current:
            current, batch = topic, []
            runs.append((topic, batch))
        batch.append({"key": key, "value": data})
    return runs


__all__ = ["Event", "EventLog", "Run", "insert_events", "topic_runs"]
