"""A Kafka target's row events, byte for byte, as the README's "Kafka targets" section describes
them: compact JSON, the fields in the table's order, each field type written as its table says.
The expected events are written out here by hand (literal text), not from the builder's
constants; the columns are built as Milvus sends them (``schema_pb2.FieldData``), then logged by
``insert_events`` and committed by ``topic_runs`` (which appends ``source``)."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pymilvus.grpc_gen import schema_pb2

from replicator.sinks.kafka_columns import Envelope, Rows, _by_rows, insert_events, topic_runs
from tests.unit.test_kafka_events import scalar, schema_2_6, vectors

T = schema_pb2.DataType
HYBRID = 470651240448000005  # 2026-11-23T00:00:00.000Z in milliseconds << 18, logical 5
SOURCE = {"channel": "dml_0", "position": "0a00000000000000", "commit": "c1"}
ENVELOPE = '{"op":"insert","db":"default","collection":"c","partition":"p1","pk":'
WHEN = ',"ts":{"hybrid":470651240448000005,"time":"2026-11-23T00:00:00.000Z"}'
SOURCE_JSON = ',"source":{"channel":"dml_0","position":"0a00000000000000","commit":"c1"}}'


class Log:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def add_rows(self, rows: Rows) -> None:
        self.events.append(rows)


def array(name: str, attr: str, cells: list[list[Any]]) -> Any:
    column = schema_pb2.FieldData(type=T.Array, field_name=name)
    for cell in cells:
        getattr(column.scalars.array_data.data.add(), attr).data.extend(cell)
    return column


def committed(columns: list[Any], rows: int, pk: str = "id") -> list[tuple[bytes, bytes]]:
    """(key, value) of each event as the commit produces it."""
    log = Log()
    assert insert_events(log, "t", "default", "c", "p1", pk, columns, rows, HYBRID, {}) == rows
    runs = topic_runs(log.events, SOURCE, 1_000_000)
    return [kv for _, keys, values in runs for kv in zip(keys, values, strict=True)]


def every_type() -> list[Any]:
    half = struct.pack("<4e", 1.0, -2.0, 0.5, 3.0)  # float16, dim 2, two rows
    sparse = [struct.pack("<IfIf", 3, 0.5, 70000, -1.25), struct.pack("<If", 0, 2.0)]
    return [
        scalar("id", T.Int64, "long_data", [1, -(2**62)]),
        scalar("flag", T.Bool, "bool_data", [True, False]),
        scalar("small", T.Int8, "int_data", [-128, 127]),
        scalar("mid", T.Int16, "int_data", [-32768, 32767]),
        scalar("big", T.Int32, "int_data", [-(2**31), 2**31 - 1]),
        scalar("ratio", T.Float, "float_data", [0.1, -0.25]),
        scalar("exact", T.Double, "double_data", [1e-7, 1e16]),
        scalar("name", T.VarChar, "string_data", ['quo"te\\', "中文 🙂\n\x01"]),
        scalar(
            "doc", T.JSON, "json_data", [b'{"a": [1, 2.5], "b": null, "c": {"d": "e"}}', b'"x"']
        ),
        array("tags", "long_data", [[7, 8], []]),
        array("words", "string_data", [["x", "y,z"], ['"']]),
        vectors("fv", T.FloatVector, 2, float_vector=schema_pb2.FloatArray(data=[1, 0.5, 0.1, -3])),
        vectors("bv", T.BinaryVector, 16, binary_vector=b"\x01\x02\xff\x00"),
        vectors("hv", T.Float16Vector, 2, float16_vector=half),
        vectors("bf", T.BFloat16Vector, 2, bfloat16_vector=bytes(range(8))),
        vectors(
            "sv",
            T.SparseFloatVector,
            70001,
            sparse_float_vector=schema_pb2.SparseFloatArray(contents=sparse, dim=70001),
        ),
        vectors("iv", T.Int8Vector, 3, int8_vector=bytes([1, 255, 128, 0, 2, 127])),
        scalar("n", T.Int64, "long_data", [5, 0], valid_data=[True, False]),  # a slot a row
        scalar("m", T.VarChar, "string_data", ["x"], valid_data=[False, True]),  # valid ones only
        scalar("geo", T.Geometry, "geometry_wkt_data", ["POINT (1 2)", "LINESTRING (0 0, 1 1)"]),
        scalar("tz", T.Timestamptz, "timestamptz_data", [0, 1_795_392_000_123_456]),
        scalar(
            "$meta", T.JSON, "json_data", [b'{"color": "red", "count": 1}', b"{}"], is_dynamic=True
        ),
    ]


def test_every_field_type_is_written_as_the_readme_says_byte_for_byte():
    first, second = committed(every_type(), 2)
    assert first[0] == b'["default","c",1]'
    assert second[0] == b'["default","c",-4611686018427387904]'
    row1 = (
        '{"id":1,"flag":true,"small":-128,"mid":-32768,"big":-2147483648,'
        '"ratio":0.10000000149011612,"exact":1e-7,"name":"quo\\"te\\\\",'
        '"doc":{"a":[1,2.5],"b":null,"c":{"d":"e"}},"tags":[7,8],"words":["x","y,z"],'
        '"fv":[1.0,0.5],"bv":"AQI=","hv":"ADwAwA==","bf":"AAECAw==",'
        '"sv":{"indices":[3,70000],"values":[0.5,-1.25]},"iv":[1,-1,-128],"n":5,"m":null,'
        '"geo":"POINT (1 2)","tz":"1970-01-01T00:00:00.000000Z","color":"red","count":1}'
    )
    row2 = (
        '{"id":-4611686018427387904,"flag":false,"small":127,"mid":32767,"big":2147483647,'
        '"ratio":-0.25,"exact":1e+16,"name":"中文 🙂\\n\\u0001","doc":"x","tags":[],'
        '"words":["\\""],"fv":[0.10000000149011612,-3.0],"bv":"/wA=","hv":"ADgAQg==",'
        '"bf":"BAUGBw==","sv":{"indices":[0],"values":[2.0]},"iv":[0,2,127],"n":null,"m":"x",'
        '"geo":"LINESTRING (0 0, 1 1)","tz":"2026-11-23T00:00:00.123456Z"}'
    )
    assert first[1].decode() == f'{ENVELOPE}1,"row":{row1}{WHEN}{SOURCE_JSON}'
    assert second[1].decode() == (f'{ENVELOPE}-4611686018427387904,"row":{row2}{WHEN}{SOURCE_JSON}')


def test_a_text_key_and_texts_with_the_separators_of_a_json_list_inside():
    texts = ['a","b', '\\","', "],[", "", ","]
    keys = ['k"1', "k2", "", "[", ","]
    columns = [
        scalar("key", T.VarChar, "string_data", keys),
        scalar("text", T.VarChar, "string_data", texts),
    ]
    found = committed(columns, 5, pk="key")
    assert [key for key, _ in found] == [
        b'["default","c","k\\"1"]',
        b'["default","c","k2"]',
        b'["default","c",""]',
        b'["default","c","["]',
        b'["default","c",","]',
    ]
    assert found[0][1].decode() == (
        f'{ENVELOPE}"k\\"1","row":{{"key":"k\\"1","text":"a\\",\\"b"}}{WHEN}{SOURCE_JSON}'
    )
    assert found[1][1].decode() == (
        f'{ENVELOPE}"k2","row":{{"key":"k2","text":"\\\\\\",\\""}}{WHEN}{SOURCE_JSON}'
    )
    assert [json.loads(v)["row"]["text"] for _, v in found] == texts


def test_dynamic_keys_that_name_a_field_give_the_row_that_value_in_the_fields_place():
    """(Milvus keeps such a key apart; a row made of the two takes the dynamic value.)"""
    columns = [
        scalar("id", T.Int64, "long_data", [1]),
        scalar("title", T.VarChar, "string_data", ["t"]),
        scalar("$meta", T.JSON, "json_data", [b'{"title": "d", "x": [1]}'], is_dynamic=True),
    ]
    ((_, value),) = committed(columns, 1)
    assert value.decode() == (
        f'{ENVELOPE}1,"row":{{"id":1,"title":"d","x":[1]}}{WHEN}{SOURCE_JSON}'
    )


def test_an_array_of_structs_is_a_list_of_objects():
    from harness.stream_columns import wal_columns

    schema = schema_2_6(geometry=False)
    rows = [
        {
            "id": 1,
            "vec": [0.5, 1.5],
            "tz": "2026-11-27T09:30:00.123456+01:00",
            "chunks": [{"text": "a", "emb": [1.0, 2.0]}, {"text": "b", "emb": [3.0, 4.5]}],
        },
    ]
    ((key, value),) = committed(wal_columns(schema, rows), 1)
    assert key == b'["default","c",1]'
    row = (
        '{"id":1,"vec":[0.5,1.5],"tz":"2026-11-27T08:30:00.123456Z",'
        '"chunks":[{"text":"a","emb":[1.0,2.0]},{"text":"b","emb":[3.0,4.5]}]}'
    )
    assert value.decode() == f'{ENVELOPE}1,"row":{row}{WHEN}{SOURCE_JSON}'


finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=True)
texts = st.text(max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**63), 2**63 - 1),
            texts,
            finite_f32,
            st.floats(allow_nan=False),
            st.booleans(),
            st.lists(finite_f32, min_size=3, max_size=3),
            st.integers(-128, 127),
        ),
        min_size=1,
        max_size=20,
        unique_by=lambda r: r[0],
    )
)
def test_columns_joined_are_the_rows_serialized_whole(rows):
    """The column-at-a-time events equal those of each row's dict serialized whole (the
    row-at-a-time way), for any values of the types it joins (infinities are null, as orjson
    writes them)."""
    ids, names, floats, doubles, flags, vecs, small = (list(c) for c in zip(*rows, strict=True))
    columns = [
        scalar("id", T.Int64, "long_data", ids),
        scalar("name", T.VarChar, "string_data", names),
        scalar("f", T.Float, "float_data", floats),
        scalar("d", T.Double, "double_data", doubles),
        scalar("b", T.Bool, "bool_data", flags),
        scalar("s", T.Int8, "int_data", small),
        vectors(
            "v",
            T.FloatVector,
            3,
            float_vector=schema_pb2.FloatArray(data=[x for v in vecs for x in v]),
        ),
    ]
    found = committed(columns, len(rows))
    envelope = Envelope(ENVELOPE.encode(), WHEN.encode(), b'["default","c",')
    keys, bodies = _by_rows(columns, len(rows), "id", envelope)
    assert [k for k, _ in found] == keys
    assert [v for _, v in found] == [b + SOURCE_JSON.encode() for b in bodies]
    for (_, value), d in zip(found, doubles, strict=True):
        read = json.loads(value)["row"]["d"]
        assert read == d or (read is None and math.isinf(d))
