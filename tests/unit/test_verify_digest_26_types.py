"""Timestamptz and Geometry in the verify's digests (issue 31): two servers that hold the same
instant and the same shape digest alike whatever text they answer it in, and a query answer
read as columns digests as its rows do (a Geometry or Timestamptz column was refused)."""

from __future__ import annotations

import struct

from pymilvus.grpc_gen import schema_pb2

from replicator.compare.column_digest import columns_digest
from replicator.compare.digest import digest_rows

KINDS = {"id": "INT64", "at": "TIMESTAMPTZ", "shape": "GEOMETRY"}
INSTANT = 1_767_225_600_000_001  # 2026-01-01T00:00:00.000001Z


def test_the_same_instant_and_shape_digest_alike_in_any_spelling() -> None:
    lite = [{"id": 1, "at": "2026-01-01T00:00:00.000001Z", "shape": "POINT (1 2.5)"}]
    other = [{"id": 1, "at": "2026-01-01T01:00:00.000001+01:00", "shape": "POINT(1.0  2.50)"}]
    number = [{"id": 1, "at": INSTANT, "shape": "point (1 2.5)"}]
    assert digest_rows(lite, KINDS) == digest_rows(other, KINDS) == digest_rows(number, KINDS)
    moved = [{"id": 1, "at": INSTANT + 1, "shape": "POINT (1 2.5)"}]
    assert digest_rows(moved, KINDS) != digest_rows(lite, KINDS)
    elsewhere = [{"id": 1, "at": INSTANT, "shape": "POINT (1 2.25)"}]
    assert digest_rows(elsewhere, KINDS) != digest_rows(lite, KINDS)


def _columns(at: schema_pb2.FieldData, shape: schema_pb2.FieldData) -> list:
    key = schema_pb2.FieldData(field_name="id", type=schema_pb2.Int64)
    key.scalars.long_data.data.extend([1, 2])
    return [key, at, shape]


def test_columns_digest_as_their_rows() -> None:
    rows = [
        {"id": 1, "at": "2026-01-01T00:00:00.000001Z", "shape": "POINT (1 2.5)"},
        {"id": 2, "at": None, "shape": "POLYGON ((0 0, 1 0, 1 1, 0 0))"},
    ]
    at = schema_pb2.FieldData(field_name="at", type=schema_pb2.Timestamptz)
    at.scalars.string_data.data.extend(["2026-01-01T00:00:00.000001Z", ""])  # as Lite answers
    at.valid_data.extend([True, False])
    wkt = schema_pb2.FieldData(field_name="shape", type=schema_pb2.Geometry)
    wkt.scalars.geometry_wkt_data.data.extend([r["shape"] for r in rows])
    assert columns_digest(_columns(at, wkt), KINDS) == digest_rows(rows, KINDS)

    micros = schema_pb2.FieldData(field_name="at", type=schema_pb2.Timestamptz)
    micros.scalars.timestamptz_data.data.extend([INSTANT, 0])
    micros.valid_data.extend([True, False])
    wkb = schema_pb2.FieldData(field_name="shape", type=schema_pb2.Geometry)
    ring = struct.pack("<I8d", 4, 0, 0, 1, 0, 1, 1, 0, 0)
    wkb.scalars.geometry_data.data.extend(
        [struct.pack("<BIdd", 1, 1, 1, 2.5), struct.pack("<BII", 1, 3, 1) + ring]
    )
    assert columns_digest(_columns(micros, wkb), KINDS) == digest_rows(rows, KINDS)


def _chunks(rows: list[list[dict] | None]) -> schema_pb2.FieldData:
    """An Array of Struct column as a 2.6 query answers it (schema.proto ``StructArrayField``):
    one sub-field column per struct field, named ``<struct>[<sub>]``, a cell per row: the
    texts as an Array of VarChar, the vectors as an ArrayOfVector of FloatVector."""
    column = schema_pb2.FieldData(field_name="chunks", type=schema_pb2.ArrayOfStruct)
    text = column.struct_arrays.fields.add(field_name="chunks[text]", type=schema_pb2.Array)
    text.scalars.array_data.element_type = schema_pb2.VarChar
    emb = column.struct_arrays.fields.add(field_name="chunks[emb]", type=schema_pb2.ArrayOfVector)
    emb.vectors.dim = 2
    emb.vectors.vector_array.dim, emb.vectors.vector_array.element_type = 2, schema_pb2.FloatVector
    for items in rows:
        text.scalars.array_data.data.add().string_data.data.extend(i["text"] for i in items or [])
        cell = emb.vectors.vector_array.data.add(dim=2)
        cell.float_vector.data.extend(x for i in items or [] for x in i["emb"])
    return column


def test_an_array_of_struct_digests_as_the_rows_a_client_wrote() -> None:
    """Was refused ("a column of ARRAY_OF_STRUCT"): a verify of a collection with one failed."""
    kinds = {"id": "INT64"}  # a struct is no field of the schema's list: digested as JSON
    rows = [
        {"id": 1, "chunks": [{"text": "a", "emb": [0.5, -1.0]}, {"text": "ü", "emb": [2.0, 0.25]}]},
        {"id": 2, "chunks": []},
    ]
    key = schema_pb2.FieldData(field_name="id", type=schema_pb2.Int64)
    key.scalars.long_data.data.extend([1, 2])
    columns = [key, _chunks([r["chunks"] for r in rows])]
    assert columns_digest(columns, kinds) == digest_rows(rows, kinds)
    changed = [dict(rows[0], chunks=[{"text": "a", "emb": [0.5, -1.0]}]), rows[1]]
    assert columns_digest([key, _chunks([r["chunks"] for r in changed])], kinds) != (
        columns_digest(columns, kinds)
    )
