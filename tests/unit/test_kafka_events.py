"""Row values of a Kafka target's events, from columns built by hand as Milvus sends them
(``schema_pb2.FieldData``), against values written out here: the README's table of encodings."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TargetRejectedError
from replicator.sinks.kafka_events import row_key, rows_of, ts_view

T = schema_pb2.DataType


def scalar(name: str, kind: int, attr: str, values, **extra) -> schema_pb2.FieldData:
    column = schema_pb2.FieldData(type=kind, field_name=name, **extra)
    getattr(column.scalars, attr).data.extend(values)
    return column


def vectors(name: str, kind: int, dim: int, **data) -> schema_pb2.FieldData:
    return schema_pb2.FieldData(
        type=kind, field_name=name, vectors=schema_pb2.VectorField(dim=dim, **data)
    )


def test_every_supported_type_is_encoded_as_the_readme_says():
    half = struct.pack("<4e", 1.0, -2.0, 0.5, 3.0)  # float16, dim 2, two rows
    brain = bytes(range(8))  # bfloat16: the bytes as stored
    sparse = [struct.pack("<IfIf", 3, 0.5, 70000, -1.25), struct.pack("<If", 0, 2.0)]
    json_rows = [b'{"a": [1, 2], "b": null}', b'"text"']
    array = schema_pb2.FieldData(type=T.Array, field_name="tags")
    array.scalars.array_data.data.add().long_data.data.extend([7, 8])
    array.scalars.array_data.data.add().long_data.data.extend([])
    dynamic = scalar("$meta", T.JSON, "json_data", [b'{"color": "red"}', b"{}"], is_dynamic=True)
    columns = [
        scalar("id", T.Int64, "long_data", [1, -(2**62)]),
        scalar("flag", T.Bool, "bool_data", [True, False]),
        scalar("small", T.Int8, "int_data", [-128, 127]),
        scalar("ratio", T.Float, "float_data", [0.5, -0.25]),
        scalar("exact", T.Double, "double_data", [1e-300, 2.5]),
        scalar("name", T.VarChar, "string_data", ['quo"te', "中文 🙂"]),
        scalar("doc", T.JSON, "json_data", json_rows),
        array,
        vectors("fv", T.FloatVector, 2, float_vector=schema_pb2.FloatArray(data=[1, 2, 3, 4])),
        vectors("bv", T.BinaryVector, 16, binary_vector=b"\x01\x02\xff\x00"),
        vectors("hv", T.Float16Vector, 2, float16_vector=half),
        vectors("bf", T.BFloat16Vector, 2, bfloat16_vector=brain),
        vectors(
            "sv",
            T.SparseFloatVector,
            70001,
            sparse_float_vector=schema_pb2.SparseFloatArray(contents=sparse, dim=70001),
        ),
        vectors("iv", T.Int8Vector, 3, int8_vector=bytes([1, 255, 128, 0, 2, 127])),
        dynamic,
    ]
    first, second = rows_of(columns, 2)
    assert first == {
        "id": 1,
        "flag": True,
        "small": -128,
        "ratio": 0.5,
        "exact": 1e-300,
        "name": 'quo"te',
        "doc": {"a": [1, 2], "b": None},
        "tags": [7, 8],
        "fv": [1.0, 2.0],
        "bv": base64.b64encode(b"\x01\x02").decode(),
        "hv": base64.b64encode(half[:4]).decode(),
        "bf": base64.b64encode(brain[:4]).decode(),
        "sv": {"indices": [3, 70000], "values": [0.5, -1.25]},
        "iv": [1, -1, -128],
        "color": "red",
    }
    assert second["id"] == -(2**62) and second["name"] == "中文 🙂" and second["doc"] == "text"
    assert second["tags"] == [] and second["fv"] == [3.0, 4.0] and second["iv"] == [0, 2, 127]
    assert second["sv"] == {"indices": [0], "values": [2.0]}
    assert "color" not in second
    json.dumps(first)  # every value is JSON


def test_null_values_of_nullable_fields_whether_the_column_is_full_or_compact():
    full = scalar("n", T.Int64, "long_data", [5, 0, 7], valid_data=[True, False, True])
    compact = scalar("m", T.VarChar, "string_data", ["x"], valid_data=[False, True, False])
    rows = rows_of([full, compact], 3)
    assert [r["n"] for r in rows] == [5, None, 7]
    assert [r["m"] for r in rows] == [None, "x", None]


def test_a_type_without_an_encoding_stops_with_a_reason_never_a_silent_gap():
    column = schema_pb2.FieldData(type=T.Decimal, field_name="price")
    with pytest.raises(TargetRejectedError, match="price: type Decimal cannot be written"):
        rows_of([column], 1)


def test_a_column_of_the_wrong_length_is_refused():
    with pytest.raises(TargetRejectedError, match="2 values for 3 rows"):
        rows_of([scalar("id", T.Int64, "long_data", [1, 2])], 3)


def test_keys_and_times():
    assert row_key("default", "c.1", 'k"') == b'["default","c.1","k\\""]'
    # 2026-11-23T00:00:00Z in milliseconds, shifted past the 18 logical bits, plus a logical 5
    hybrid = (1_795_392_000_000 << 18) | 5
    assert ts_view(hybrid) == {"hybrid": hybrid, "time": "2026-11-23T00:00:00.000Z"}
    assert ts_view(None)["hybrid"] is None


def schema_2_6(*, geometry: bool) -> schema_pb2.CollectionSchema:
    """A collection ``c`` (``id``, ``vec`` of dim 2) with a Geometry ``geo`` (nullable; if
    ``geometry``), a Timestamptz ``tz`` and an array of structs ``chunks`` (``text`` a VarChar,
    ``emb`` a float vector of dim 2), as a 2.6 Milvus describes it."""
    from harness.stream_columns import add_field, base_schema

    s = schema_pb2
    schema = base_schema("c", dim=2)
    if geometry:
        add_field(schema, "geo", s.Geometry, nullable=True)
    add_field(schema, "tz", s.Timestamptz)
    chunks = schema.struct_array_fields.add(fieldID=200, name="chunks")
    text = chunks.fields.add(fieldID=201, name="chunks[text]", data_type=s.Array)
    text.element_type = s.VarChar
    emb = chunks.fields.add(fieldID=202, name="chunks[emb]", data_type=s.ArrayOfVector)
    emb.element_type = s.FloatVector
    emb.type_params.add(key="dim", value="2")
    return schema


def test_2_6_geometry_timestamptz_and_struct_arrays_become_wkt_iso_text_and_objects():
    """Columns as a 2.6 proxy leaves them in its WAL (harness/stream_columns.py, from Milvus's
    Go code: Geometry as WKB, Timestamptz as UTC microseconds, an array of structs as one
    column per sub-field) become what a client inserted, in the README's value format."""
    from harness.stream_columns import wal_columns

    schema = schema_2_6(geometry=True)
    rows = [
        {
            "id": 1,
            "vec": [0.5, 1.5],
            "geo": "POLYGON ((0 0, 4 0, 4 4, 0 0))",
            "tz": "2026-11-27T09:30:00.123456+01:00",
            "chunks": [{"text": "a", "emb": [1.0, 2.0]}, {"text": "b", "emb": [3.0, 4.5]}],
        },
        {"id": 2, "vec": [0.0, 0.0], "geo": None, "tz": "1969-12-31T23:59:59Z", "chunks": []},
    ]
    got = rows_of(wal_columns(schema, rows), 2)
    assert got == [
        {
            "id": 1,
            "vec": [0.5, 1.5],
            "geo": "POLYGON ((0 0, 4 0, 4 4, 0 0))",
            "tz": "2026-11-27T08:30:00.123456Z",
            "chunks": rows[0]["chunks"],
        },
        {"id": 2, "vec": [0.0, 0.0], "geo": None, "tz": "1969-12-31T23:59:59.000000Z"}
        | {"chunks": []},
    ]
