"""An insert's row events made from its columns as bytes, a column at a time (see
:mod:`kafka_events` for the format, :mod:`kafka_fragments` for the columns' JSON); a commit's
events as the records it produces.

What every row of one insert shares (``op``, ``db``, ``collection``, ``partition``, the time,
the key's ``[db, collection,`` part) is serialized once; each column is serialized whole, a piece
a row; a row's event is then its pieces joined with the shared parts between them, by
``map(b"".join, zip(...))``: no Python step per row. An event is kept as its JSON up to ``ts``
(a *body*: every field but ``source``, without the closing brace), as the parts it is joined
from (:class:`Rows`); the commit joins them with ``,"source":{...}}``, which it knows only then,
in one join (a row's bytes are copied once). The bytes are those of the event's dict
serialized whole by :func:`kafka_events.dumps` (same keys in the same order), each value as
orjson writes it; a value orjson refuses (an integer beyond 64 bits in a JSON field) is
written by the standard library alone.

An insert whose rows need more than joining (an array of structs, put together from a column
per sub-field; a dynamic field with a key that is also a field's name, which the field's value
gives way to) is made row by row from :func:`kafka_events.rows_of`, to the same format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple, Protocol

from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TargetRejectedError
from replicator.sinks.kafka_events import (
    checked_values,
    column_values,
    dumps,
    key_prefix,
    rows_of,
    ts_view,
)
from replicator.sinks.kafka_fragments import column_json

# one event as logged: (topic, key, value), its value as a dict, or as the JSON of every field
# but "source" without the closing brace (a body, see insert_events); the commit adds "source"
Event = tuple[str, bytes, dict[str, Any] | bytes]
# a topic and its messages' keys and values, in their order
Run = tuple[str, list[bytes], list[bytes]]


@dataclass(slots=True)
class Rows:
    """An insert's row events of one topic, in their order: keys, and bodies (see ``Event``)
    kept as the ``parts`` they are joined from: a constant (bytes, the same in every row) or a
    piece a row (a list), the last part a constant. Row ``i``'s body is the parts joined, each
    list's ``i``-th piece in its place; the commit joins them with its ``source`` at the end
    (``values``), so a row's bytes are copied once, not joined and then copied again."""

    topic: str
    keys: list[bytes]
    parts: list[bytes | list[bytes]]

    def values(self, tail: bytes) -> list[bytes]:
        """Each row's event: its body, then ``tail``."""
        *middle, end = self.parts
        assert isinstance(end, bytes), "the last part is a constant"
        sequences = [repeat(part) if isinstance(part, bytes) else part for part in middle]
        # (every list holds a piece a row, checked when it was cut; the constants repeat)
        return list(map(b"".join, zip(*sequences, repeat(end + tail), strict=False)))

    @property
    def bodies(self) -> list[bytes]:
        return self.values(b"")

    def body(self, row: int) -> bytes:
        return b"".join(part if isinstance(part, bytes) else part[row] for part in self.parts)

    def select(self, rows: list[int]) -> Rows:
        """These rows only, in this order."""
        parts = [
            part if isinstance(part, bytes) else [part[n] for n in rows] for part in self.parts
        ]
        return Rows(self.topic, [self.keys[n] for n in rows], parts)


# what a channel's log holds: single events (deletes, DDL, upserts) and inserts' rows
Entry = Event | Rows


class EventLog(Protocol):
    """What ``insert_events`` needs of a channel's log (``kafka.ChannelLog``)."""

    events: list[Entry]

    def add_rows(self, rows: Rows) -> None:
        """Log an insert's row events."""


_INSERT = b'{"op":"insert",'
_UPSERT = b'{"op":"upsert",'


class Envelope(NamedTuple):
    """What the events of one insert share: the event up to its pk (``head``), from its row's
    end to its ``ts`` (``when``) and its key up to the pk (``prefix``)."""

    head: bytes
    when: bytes
    prefix: bytes


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
    """The insert's rows as events logged in ``log``: an ``insert`` each, or an ``upsert``
    in place of the delete of the same key and time already logged (``deleted``: (pk, ts)
    -> its index in ``log.events``, popped when paired). The number of rows."""
    if num_rows <= 0:
        return 0
    shared = dumps({"db": db, "collection": collection, "partition": partition})[1:-1]
    envelope = Envelope(
        _INSERT + shared + b',"pk":', b',"ts":' + dumps(ts_view(ts)), key_prefix(db, collection)
    )
    made = _by_columns(fields_data, num_rows, pk_name, envelope)
    if made is None:
        keys, bodies = _by_rows(fields_data, num_rows, pk_name, envelope)
        made = keys, [bodies, b""]
    rows = Rows(topic, *made)
    if deleted:
        rows = _pair_upserts(log, fields_data, pk_name, ts, deleted, rows)
    if rows.keys:
        log.add_rows(rows)
    return num_rows


def _by_columns(
    fields_data: Sequence[schema_pb2.FieldData], num_rows: int, pk_name: str, envelope: Envelope
) -> tuple[list[bytes], list[bytes | list[bytes]]] | None:
    """Keys, and the bodies' parts (see ``Rows``) from the columns' JSON pieces; None where a
    row needs more than joining (see the module's docstring)."""
    names = [column.field_name for column in fields_data if not column.is_dynamic]
    if not names or fields_data[0].is_dynamic or any("[" in name for name in names):
        return None
    parts: list[bytes | list[bytes]] = []  # constants and columns' pieces, alternating
    constant = b',"row":{'
    pk_pieces: tuple[bytes, list[bytes], bytes] | None = None
    for n, column in enumerate(fields_data):
        if column.is_dynamic:
            extra = _dynamic_pieces(column, num_rows, set(names))
            if extra is None:
                return None
            parts += [constant, extra]
            constant = b""
            continue
        # a member follows: the comma between them ends this column's text (in its pieces,
        # where that lets a vector column be cut at one byte; never in the pk's, also the key's)
        follows = n + 1 < len(fields_data) and not fields_data[n + 1].is_dynamic
        is_pk = column.field_name == pk_name
        then = b"," if follows and not is_pk else b""
        before, pieces, after = column_json(column, num_rows, then)
        if is_pk:
            pk_pieces = (before, pieces, after)
            after += b"," if follows else b""
        lead = b"," if n and fields_data[n - 1].is_dynamic else b""
        parts += [constant + lead + dumps(column.field_name) + b":" + before, pieces]
        constant = after
    if pk_pieces is None:
        raise TargetRejectedError(f"field {pk_name}: the primary key's column is missing")
    head, when, prefix = envelope
    before, pk, after = pk_pieces
    keys = list(map(b"".join, zip(repeat(prefix + before), pk, repeat(after + b"]"))))
    first = parts[0]
    assert isinstance(first, bytes)
    return keys, [head + before, pk, after + first, *parts[1:], constant + b"}" + when]


def _dynamic_pieces(
    column: schema_pb2.FieldData, num_rows: int, names: set[str]
) -> list[bytes] | None:
    """A dynamic field's keys as the row's further members (``,"k":v``), a piece a row; None
    when a row has a key that is also a field's name."""
    values = checked_values(column, num_rows)
    pieces = []
    for extra in values:  # a JSON document a row: parsed already, so a step a row anyway
        if not isinstance(extra, dict) or not extra:
            pieces.append(b"")
        elif names.isdisjoint(extra):
            pieces.append(b"," + dumps(extra)[1:-1])
        else:
            return None
    return pieces


def _by_rows(
    fields_data: Sequence[schema_pb2.FieldData], num_rows: int, pk_name: str, envelope: Envelope
) -> tuple[list[bytes], list[bytes]]:
    """Keys and bodies from the rows as dicts (``rows_of``), a row at a time."""
    head, when, prefix = envelope
    keys, bodies = [], []
    for row in rows_of(fields_data, num_rows):
        pk_json = dumps(row[pk_name])
        keys.append(prefix + pk_json + b"]")
        bodies.append(b"".join((head, pk_json, b',"row":', dumps(row), when)))
    return keys, bodies


def _pair_upserts(
    log: EventLog,
    fields_data: Sequence[schema_pb2.FieldData],
    pk_name: str,
    ts: int,
    deleted: dict[tuple[Any, int], int],
    rows: Rows,
) -> Rows:
    """A row whose key this batch deleted at the same time is an upsert: its event takes the
    delete's place in the log (Milvus writes an upsert as the two). The rows left."""
    column = next(c for c in fields_data if c.field_name == pk_name)
    events = log.events
    kept: list[int] = []
    for n, pk in enumerate(column_values(column, len(rows.keys))):
        paired = deleted.pop((pk, ts), None)
        if paired is None:
            kept.append(n)
            continue
        replaced = events[paired]
        assert not isinstance(replaced, Rows), "a delete is logged as one event"
        events[paired] = (rows.topic, replaced[1], _UPSERT + rows.body(n)[len(_INSERT) :])
    if len(kept) == len(rows.keys):
        return rows
    return rows.select(kept)


def topic_runs(events: Sequence[Entry], source: dict[str, Any], limit: int) -> list[Run]:
    """A commit's events as runs of one topic, keys and values, every event with the commit's
    ``source`` (raises ``TargetRejectedError`` for an event of more than ``limit`` bytes). An
    insert's rows take no Python step each: their values are joined by ``map`` in C, from
    their parts and the ``source`` at once."""
    tail = b',"source":' + dumps(source) + b"}"
    runs: list[Run] = []
    keys: list[bytes] = []
    values: list[bytes] = []
    current = None
    for entry in events:
        if isinstance(entry, Rows):
            topic = entry.topic
            made = entry.values(tail)
            if max(map(len, made)) > limit:
                raise _too_large(next(v for v in made if len(v) > limit), limit)
        else:
            topic, key, value = entry
            if isinstance(value, bytes):
                data = value + tail
            else:
                value["source"] = source
                data = dumps(value)
            if len(data) > limit:
                raise _too_large(data, limit)
        if topic != current:
            current, keys, values = topic, [], []
            runs.append((topic, keys, values))
        if isinstance(entry, Rows):
            keys += entry.keys
            values += made
        else:
            keys.append(key)
            values.append(data)
    return runs


def _too_large(data: bytes, limit: int) -> TargetRejectedError:
    event = json.loads(data)
    return TargetRejectedError(
        f"kafka: the event of {event.get('db')}.{event.get('collection')} "
        f"pk {event.get('pk')!r} is {len(data):,} bytes, more than "
        f"max_event_bytes ({limit:,}): raise it (and the "
        "topic's max.message.bytes) to send it"
    )


__all__ = ["Entry", "Envelope", "Event", "EventLog", "Rows", "Run", "insert_events", "topic_runs"]
