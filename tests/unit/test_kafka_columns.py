"""An insert's row events made from its columns as bytes (``kafka_columns``), against events
written out here as the README's "Row events" table describes them: the same JSON, byte for
byte, as the event serialized whole."""

from __future__ import annotations

import json
import struct
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from replicator.sinks.kafka_columns import Rows, insert_events

T = schema_pb2.DataType
HYBRID = (1_795_392_000_000 << 18) | 5  # 2026-11-23T00:00:00.000Z, logical 5
TS = {"hybrid": HYBRID, "time": "2026-11-23T00:00:00.000Z"}
SOURCE = {"channel": "dml_0", "position": "0a00000000000000", "commit": "c1"}


class Log:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def add_rows(self, rows: Rows) -> None:
        self.events.append(rows)

    def flat(self) -> list[tuple[str, bytes, Any]]:
        """The events one by one, an insert's rows each."""
        found: list[tuple[str, bytes, Any]] = []
        for entry in self.events:
            if isinstance(entry, Rows):
                found += [
                    (entry.topic, k, b) for k, b in zip(entry.keys, entry.bodies, strict=True)
                ]
            else:
                found.append(entry)
        return found


def columns(pks: list[int], doc: list[bytes]) -> list[schema_pb2.FieldData]:
    pk = schema_pb2.FieldData(type=T.Int64, field_name="id")
    pk.scalars.long_data.data.extend(pks)
    vec = schema_pb2.FieldData(
        type=T.FloatVector, field_name="vec", vectors=schema_pb2.VectorField(dim=2)
    )
    vec.vectors.float_vector.data.extend([0.1 * (i + 1) for i in range(2 * len(pks))])
    title = schema_pb2.FieldData(type=T.VarChar, field_name="title")
    title.scalars.string_data.data.extend([f'tï"{i}' for i in pks])
    meta = schema_pb2.FieldData(type=T.JSON, field_name="$meta", is_dynamic=True)
    meta.scalars.json_data.data.extend(doc)
    return [pk, vec, title, meta]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def whole(event: dict[str, Any]) -> bytes:
    """The event serialized whole, compact (the standard library's JSON)."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def test_inserts_and_an_upsert_are_the_events_serialized_whole():
    log = Log()
    delete = {"op": "delete", "pk": 8}
    log.events.append(("t", b'["default","c",8]', delete))  # a delete of this batch, logged
    deleted = {(8, HYBRID): 0}
    cols = columns([7, 8], [b'{"color":"red"}', b"{}"])
    written = insert_events(log, "t", "default", "c", "p1", "id", cols, 2, HYBRID, deleted)
    assert written == 2 and deleted == {}
    upsert, insert = log.flat()
    assert upsert[:2] == ("t", b'["default","c",8]')  # the delete's place and key
    assert insert[:2] == ("t", b'["default","c",7]')
    expected_insert = {
        "op": "insert",
        "db": "default",
        "collection": "c",
        "partition": "p1",
        "pk": 7,
        "row": {"id": 7, "vec": [f32(0.1), f32(0.2)], "title": 'tï"7', "color": "red"},
        "ts": TS,
        "source": SOURCE,
    }
    expected_upsert = {
        **expected_insert,
        "op": "upsert",
        "pk": 8,
        "row": {"id": 8, "vec": [f32(0.3), f32(0.4)], "title": 'tï"8'},
    }
    tail = b',"source":' + whole(SOURCE) + b"}"  # what the commit appends
    assert insert[2] + tail == whole(expected_insert)
    assert upsert[2] + tail == whole(expected_upsert)


def test_a_json_integer_beyond_64_bits_is_still_the_whole_events_json():
    log = Log()
    cols = columns([1], [b'{"big": 123456789012345678901234567890}'])
    insert_events(log, "t", "db", "c", "_default", "id", cols, 1, HYBRID, {})
    ((_topic, key, body),) = log.flat()
    assert key == b'["db","c",1]'
    event = json.loads(body + b"}")
    assert event["row"]["big"] == 123456789012345678901234567890
    assert body + b"}" == whole(event)


def test_no_rows_no_events():
    log = Log()
    assert insert_events(log, "t", "db", "c", "_default", "id", columns([], []), 0, 1, {}) == 0
    assert log.events == []
