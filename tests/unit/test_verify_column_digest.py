"""The column digest (a query answer's protobuf columns) equals the row digest of the same rows.

Every case writes its rows by hand, as pymilvus hands them out (a float32 widened to a Python
float, a binary vector as ``[bytes]``, a sparse vector as a dict, the dynamic field's keys
merged into the row), and the columns a Milvus query answers for them, also by hand, with the
generated protobuf types: neither is derived from the code under test.
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import numpy as np
import pytest
from pymilvus.grpc_gen import schema_pb2

from replicator.compare.column_digest import columns_digest, row_encodings
from replicator.compare.digest import Digest, digest_rows, encode_row

DT = schema_pb2.DataType


def f32(x: float) -> float:
    return float(np.float32(x))


def scalar(name: str, dtype: int, attr: str, values: list[Any], **extra: Any) -> Any:
    field = schema_pb2.FieldData(field_name=name, type=dtype, **extra)
    getattr(field.scalars, attr).data.extend(values)
    return field


def float_vectors(name: str, dim: int, rows: list[list[float]]) -> Any:
    field = schema_pb2.FieldData(field_name=name, type=DT.FloatVector)
    field.vectors.dim = dim
    field.vectors.float_vector.data.extend(v for row in rows for v in row)
    return field


def byte_vectors(name: str, dtype: int, attr: str, dim: int, rows: list[bytes]) -> Any:
    field = schema_pb2.FieldData(field_name=name, type=dtype)
    field.vectors.dim = dim
    setattr(field.vectors, attr, b"".join(rows))
    return field


def sparse_vectors(name: str, rows: list[list[tuple[int, float]]]) -> Any:
    field = schema_pb2.FieldData(field_name=name, type=DT.SparseFloatVector)
    contents = [b"".join(struct.pack("<If", i, v) for i, v in pairs) for pairs in rows]
    field.vectors.sparse_float_vector.contents.extend(contents)
    field.vectors.sparse_float_vector.dim = 1000
    return field


def arrays(name: str, element: int, attr: str, rows: list[list[Any]]) -> Any:
    field = schema_pb2.FieldData(field_name=name, type=DT.Array)
    field.scalars.array_data.element_type = element
    for values in rows:
        cell = schema_pb2.ScalarField()
        getattr(cell, attr).data.extend(values)
        field.scalars.array_data.data.append(cell)
    return field


def shuffled(fields: list[Any], seed: int) -> list[Any]:
    """The same rows in another order (each column permuted alike), fields in another order."""
    return random.Random(seed).sample(fields, len(fields))


# --- every scalar kind and the float vector, int64 key ------------------------------------
SCALAR_KINDS = {
    "id": "INT64",
    "b": "BOOL",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "f": "FLOAT",
    "d": "DOUBLE",
    "title": "VARCHAR",
    "vec": "FLOAT_VECTOR",
}
SCALAR_ROWS = [
    {
        "id": -(2**63),
        "b": True,
        "i8": -128,
        "i16": 32767,
        "i32": -(2**31),
        "f": f32(0.1),
        "d": 0.1,
        "title": "",
        "vec": [f32(0.5), f32(-1.25), f32(3.0e-7)],
    },
    {
        "id": 7,
        "b": False,
        "i8": 0,
        "i16": -1,
        "i32": 12,
        "f": f32(-2.5e10),
        "d": -1e300,
        "title": 'quote " and \\ and ünïcødé 键 🙂',
        "vec": [0.0, f32(1 / 3), f32(2.0)],
    },
    {
        "id": 2**63 - 1,
        "b": True,
        "i8": 127,
        "i16": 0,
        "i32": 2**31 - 1,
        "f": 0.0,
        "d": 5e-324,
        "title": "x" * 300,
        "vec": [f32(9.75), 0.0, f32(-0.001)],
    },
]


def scalar_columns(rows: list[dict[str, Any]]) -> list[Any]:
    def col(name: str) -> list[Any]:
        return [r[name] for r in rows]

    return [
        scalar("id", DT.Int64, "long_data", col("id")),
        scalar("b", DT.Bool, "bool_data", col("b")),
        scalar("i8", DT.Int8, "int_data", col("i8")),
        scalar("i16", DT.Int16, "int_data", col("i16")),
        scalar("i32", DT.Int32, "int_data", col("i32")),
        scalar("f", DT.Float, "float_data", col("f")),
        scalar("d", DT.Double, "double_data", col("d")),
        scalar("title", DT.VarChar, "string_data", col("title")),
        float_vectors("vec", 3, col("vec")),
    ]


def test_scalars_and_float_vector_equal_the_row_digest() -> None:
    expected = digest_rows(SCALAR_ROWS, SCALAR_KINDS)
    assert columns_digest(scalar_columns(SCALAR_ROWS), SCALAR_KINDS) == expected
    assert expected.count == 3


def test_each_row_encodes_as_its_row() -> None:
    encodings = row_encodings(scalar_columns(SCALAR_ROWS), SCALAR_KINDS)
    assert encodings == [encode_row(r, SCALAR_KINDS) for r in SCALAR_ROWS]


def test_row_and_field_order_do_not_matter() -> None:
    rows = list(reversed(SCALAR_ROWS))
    fields = shuffled(scalar_columns(rows), 5)
    assert columns_digest(fields, SCALAR_KINDS) == digest_rows(SCALAR_ROWS, SCALAR_KINDS)


@pytest.mark.parametrize("field", ["b", "i8", "i16", "i32", "f", "d", "title", "vec", "id"])
def test_one_changed_value_changes_the_digest(field: str) -> None:
    changed = [dict(r) for r in SCALAR_ROWS]
    value = changed[1][field]
    if isinstance(value, bool):
        changed[1][field] = not value
    elif isinstance(value, list):
        changed[1][field] = [*value[:-1], f32(value[-1] + 1)]
    elif isinstance(value, str):
        changed[1][field] = value + "!"
    elif isinstance(value, float):
        changed[1][field] = value * 2  # exact in float32 too
    else:
        changed[1][field] = value + 1
    assert columns_digest(scalar_columns(changed), SCALAR_KINDS) != digest_rows(
        SCALAR_ROWS, SCALAR_KINDS
    )
    assert columns_digest(scalar_columns(changed), SCALAR_KINDS) == digest_rows(
        changed, SCALAR_KINDS
    )


# --- varchar key, JSON, arrays, byte and sparse vectors, dynamic field --------------------
OTHER_KINDS = {
    "pk": "VARCHAR",
    "doc": "JSON",
    "ints": "ARRAY",
    "words": "ARRAY",
    "reals": "ARRAY",
    "bin": "BINARY_VECTOR",
    "half": "FLOAT16_VECTOR",
    "brain": "BFLOAT16_VECTOR",
    "sparse": "SPARSE_FLOAT_VECTOR",
}
HALF = [np.array([0.5, -2.0], dtype="<f2").tobytes(), np.array([1.0, 0.0], dtype="<f2").tobytes()]
BRAIN = [b"\x80\x3f\x00\x40", b"\x00\x00\x80\xbf"]  # bfloat16 bytes as stored
META = [b'{"color": "red", "n": 3, "nested": {"z": 1, "a": [true, null]}}', b"{}"]


def other_rows() -> list[dict[str, Any]]:
    """Two rows as pymilvus makes them: the dynamic object's keys merged into the row (but not
    ``pk``, a field, which the object cannot override)."""
    return [
        {
            "pk": 'a"b',
            "doc": {"b": [1, 2.5], "a": "x", "none": None},
            "ints": [1, -2, 3],
            "words": ["w", "ünï"],
            "reals": [f32(0.1), f32(2.0)],
            "bin": [b"\x0f\xf0"],
            "half": [HALF[0]],
            "brain": [BRAIN[0]],
            "sparse": {3: f32(0.5), 1: f32(0.25), 900: f32(-7.0)},
            "color": "red",
            "n": 3,
            "nested": {"a": [True, None], "z": 1},
        },
        {
            "pk": "",
            "doc": None,  # the JSON value null
            "ints": [],
            "words": [],
            "reals": [f32(-1e-3)],
            "bin": [b"\x00\x01"],
            "half": [HALF[1]],
            "brain": [BRAIN[1]],
            "sparse": {},
        },
    ]


def other_columns(meta: list[bytes]) -> list[Any]:
    dynamic = scalar("$meta", DT.JSON, "json_data", meta, is_dynamic=True)
    return [
        scalar("pk", DT.VarChar, "string_data", ['a"b', ""]),
        scalar(
            "doc",
            DT.JSON,
            "json_data",
            [json.dumps({"b": [1, 2.5], "a": "x", "none": None}).encode(), b"null"],
        ),
        arrays("ints", DT.Int64, "long_data", [[1, -2, 3], []]),
        arrays("words", DT.VarChar, "string_data", [["w", "ünï"], []]),
        arrays("reals", DT.Float, "float_data", [[0.1, 2.0], [-1e-3]]),
        byte_vectors("bin", DT.BinaryVector, "binary_vector", 16, [b"\x0f\xf0", b"\x00\x01"]),
        byte_vectors("half", DT.Float16Vector, "float16_vector", 2, HALF),
        byte_vectors("brain", DT.BFloat16Vector, "bfloat16_vector", 2, BRAIN),
        # the pairs of the first row not in index order, as a client may have written them
        sparse_vectors("sparse", [[(3, 0.5), (1, 0.25), (900, -7.0)], []]),
        dynamic,
    ]


def test_json_arrays_byte_sparse_vectors_and_dynamic_field_equal_the_row_digest() -> None:
    expected = digest_rows(other_rows(), OTHER_KINDS)
    assert columns_digest(other_columns(META), OTHER_KINDS) == expected
    assert columns_digest(shuffled(other_columns(META), 2), OTHER_KINDS) == expected


def test_a_dynamic_key_named_as_a_field_is_left_out_as_pymilvus_leaves_it() -> None:
    meta = [META[0][:-1] + b', "pk": "other"}', META[1]]
    assert columns_digest(other_columns(meta), OTHER_KINDS) == digest_rows(
        other_rows(), OTHER_KINDS
    )


def test_a_changed_dynamic_value_changes_the_digest() -> None:
    meta = [META[0].replace(b'"red"', b'"blue"'), META[1]]
    assert columns_digest(other_columns(meta), OTHER_KINDS) != digest_rows(
        other_rows(), OTHER_KINDS
    )


def test_nulls_of_a_nullable_column_equal_none_in_the_rows() -> None:
    kinds = {"id": "INT64", "score": "DOUBLE", "tag": "VARCHAR"}
    rows = [
        {"id": 1, "score": 0.5, "tag": None},
        {"id": 2, "score": None, "tag": "t"},
    ]
    columns = [
        scalar("id", DT.Int64, "long_data", [1, 2]),
        # nullable scalars: a value for every row (the null's is a placeholder) and valid_data
        scalar("score", DT.Double, "double_data", [0.5, 0.0], valid_data=[True, False]),
        scalar("tag", DT.VarChar, "string_data", ["", "t"], valid_data=[False, True]),
    ]
    assert columns_digest(columns, kinds) == digest_rows(rows, kinds)


def test_no_columns_is_the_empty_digest() -> None:
    assert columns_digest([], SCALAR_KINDS) == Digest()
    empty = [scalar("id", DT.Int64, "long_data", []), float_vectors("vec", 3, [])]
    assert columns_digest(empty, SCALAR_KINDS) == Digest()


@pytest.mark.parametrize("layout", ["valid rows only", "every row"])
def test_nulls_of_a_nullable_vector_column_equal_none_in_the_rows(layout: str) -> None:
    """A nullable vector column (2.6) holds a vector for each valid row, or for every row;
    either way a null row digests as pymilvus's None (issue 31: no "unsupported")."""
    kinds = {"id": "INT64", "vec": "FLOAT_VECTOR", "bits": "BINARY_VECTOR"}
    rows = [
        {"id": 1, "vec": [0.5, 1.0], "bits": None},
        {"id": 2, "vec": None, "bits": b"\x0f"},
        {"id": 3, "vec": [2.0, -1.0], "bits": b"\xf0"},
    ]
    vec_valid, bits_valid = [True, False, True], [False, True, True]
    if layout == "every row":
        vec = float_vectors("vec", 2, [[0.5, 1.0], [0.0, 0.0], [2.0, -1.0]])
        bits = byte_vectors("bits", DT.BinaryVector, "binary_vector", 8, [b"\0", b"\x0f", b"\xf0"])
    else:
        vec = float_vectors("vec", 2, [[0.5, 1.0], [2.0, -1.0]])
        bits = byte_vectors("bits", DT.BinaryVector, "binary_vector", 8, [b"\x0f", b"\xf0"])
    vec.valid_data.extend(vec_valid)
    bits.valid_data.extend(bits_valid)
    columns = [scalar("id", DT.Int64, "long_data", [1, 2, 3]), vec, bits]
    assert columns_digest(columns, kinds) == digest_rows(rows, kinds)
    rows[1]["vec"] = [0.0, 0.0]  # a null is not a zero vector
    assert columns_digest(columns, kinds) != digest_rows(rows, kinds)
