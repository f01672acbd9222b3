"""What a copy or a repair sends to the target's upsert. An empty array cell of a page's column,
which a 2.3.5 query answers with no member set (and which 2.3.5's proxy dereferences while
validating an upsert, killing the target: seen in tests/e2e/test_field_types.py), is typed by
its array's element type, the other cells untouched; a row read back with pymilvus has its byte
vector as bytes."""

from __future__ import annotations

from typing import Any

import pytest
from pymilvus.exceptions import MilvusException
from pymilvus.grpc_gen import schema_pb2

from replicator.backfill.columns import type_empty_arrays
from replicator.backfill.transfer import writable

DataType = schema_pb2.DataType


def array_column(element: int, cells: list[dict[str, list[Any]]]) -> schema_pb2.FieldData:
    column = schema_pb2.FieldData(field_name="a", type=DataType.Array)
    arrays = column.scalars.array_data
    arrays.element_type = element
    for cell in cells:
        added = arrays.data.add()
        for member, values in cell.items():
            getattr(added, member).data.extend(values)
    return column


def cells(column: schema_pb2.FieldData) -> list[tuple[str | None, list[Any]]]:
    found = []
    for cell in column.scalars.array_data.data:
        member = cell.WhichOneof("data")
        found.append((member, list(getattr(cell, member).data) if member else []))
    return found


@pytest.mark.parametrize(
    ("element", "member"),
    [
        (DataType.Bool, "bool_data"),
        (DataType.Int8, "int_data"),
        (DataType.Int16, "int_data"),
        (DataType.Int32, "int_data"),
        (DataType.Int64, "long_data"),
        (DataType.Float, "float_data"),
        (DataType.Double, "double_data"),
        (DataType.VarChar, "string_data"),
    ],
)
def test_an_empty_array_cell_is_typed_by_its_element_type(element, member):
    value = {"bool_data": True, "string_data": "é"}.get(member, 1)
    column = array_column(element, [{member: [value]}, {}, {member: []}])
    assert cells(column)[1] == (None, [])  # as a 2.3.5 query answers it
    type_empty_arrays(column, "c")
    assert cells(column) == [(member, [value]), (member, []), (member, [])]
    wire = schema_pb2.FieldData.FromString(column.SerializeToString())
    assert cells(wire) == cells(column)  # an empty member set is kept on the wire


def test_an_empty_cell_of_no_known_element_type_stops_the_copy_naming_it():
    column = array_column(0, [{}])
    with pytest.raises(MilvusException, match="collection c field a: array of element type"):
        type_empty_arrays(column, "c")


def test_a_row_read_back_for_an_upsert_has_its_byte_vector_as_bytes():
    """pymilvus answers a binary vector as ``[bytes]`` and refuses it so in an upsert (a
    verify's repair of a binary-vector collection failed: tests/e2e/test_field_types.py)."""
    row = {"key": "k", "bits": [b"\x00\xff"], "tags": ["a"], "doc": {"x": [1]}, "empty": []}
    assert writable(row) == {**row, "bits": b"\x00\xff"}
    assert writable({"two": [b"a", b"b"]}) == {"two": [b"a", b"b"]}  # not a vector's answer
