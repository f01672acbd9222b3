"""An insert's columns as JSON text, a piece a row, without a Python step per row.

Each column becomes ``(before, pieces, after)``: ``before + pieces[i] + after`` is row ``i``'s
value as :func:`kafka_events.dumps` writes it (compact orjson). Where the column's values have a
JSON form that cannot hold the separator of a list, the whole column is serialized by ONE
``orjson.dumps`` and cut at the separators with ``bytes.split`` (both in C):

- numbers and booleans: ``[1,2,3]`` cut at ``,`` (a number holds no comma);
- texts (VarChar, Geometry as WKT, Timestamptz, base64 of binary and half-float vectors):
  ``["a","b"]`` cut at ``","``, the quotes put back by ``before``/``after``. In JSON text a quote
  inside a string is always escaped, so ``","`` occurs only between two strings;
- float and int8 vectors: the column as a 2-D numpy array (float32 widened to float64 exactly,
  as Python's float of a float32 is), ``[[..],[..]]`` cut at ``],[``. orjson writes a float64
  of numpy as it writes a Python float (the shortest text that reads back the same double).

A column of any other kind (JSON, arrays, sparse vectors, a nullable column with nulls) has its
values from :func:`kafka_events.column_values` serialized one by one. Why not a piece a value
from ``orjson.dumps`` always: orjson gives each result a large buffer first, and keeping
thousands of them alive cost 1.5 µs a value here, against 0.05 µs for the column whole
(``bench/kafka_event_builders.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import orjson
from pymilvus.grpc_gen import schema_pb2

from replicator.sinks.kafka_events import SCALAR_DATA, check_count, column_values, dumps

DataType = schema_pb2.DataType

# (before, pieces, after): before + pieces[i] + after is row i's value as JSON
Fragments = tuple[bytes, list[bytes], bytes]

# numbers and booleans: the types of SCALAR_DATA but texts
_NUMBERS = {kind: member for kind, member in SCALAR_DATA.items() if member != "string_data"}
_TEXTS = {
    DataType.String,
    DataType.VarChar,
    DataType.Geometry,
    DataType.Timestamptz,
    DataType.BinaryVector,
    DataType.Float16Vector,
    DataType.BFloat16Vector,
}
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def column_json(column: schema_pb2.FieldData, num_rows: int, then: bytes = b"") -> Fragments:
    """The column's values as JSON, a piece a row (see the module's docstring), each followed
    by ``then`` (the same text in every row: in ``after``, or in the pieces where that makes
    the cut cheaper)."""
    kind = column.type
    valid = column.valid_data
    if valid and not all(valid):
        return _one_by_one(column, num_rows, then)  # nulls: a piece of its own each
    if kind in _NUMBERS:
        data = getattr(column.scalars, _NUMBERS[kind]).data
        pieces = _cut(orjson.dumps(list(data)), 1, b",")
        return _checked(column, num_rows, (b"", pieces, then))
    if kind == DataType.FloatVector:
        return _vectors(column, num_rows, _float_matrix, then)
    if kind == DataType.Int8Vector:
        return _vectors(column, num_rows, _int8_matrix, then)
    if kind in _TEXTS:
        values = column_values(column, num_rows)
        if kind == DataType.Geometry and None in values:  # an empty WKB
            return b"", list(map(dumps, values)), then
        pieces = _cut(orjson.dumps(values), 2, b'","')
        return _checked(column, num_rows, (b'"', pieces, b'"' + then))
    return _one_by_one(column, num_rows, then)


def _one_by_one(column: schema_pb2.FieldData, num_rows: int, then: bytes) -> Fragments:
    return b"", list(map(dumps, column_values(column, num_rows))), then


def _cut(blob: bytes, brackets: int, separator: bytes) -> list[bytes]:
    """A JSON list's items, the list's ``brackets`` outer characters on each side left out."""
    if len(blob) <= 2:  # [] : no row
        return []
    return blob[brackets:-brackets].split(separator)


def _vectors(
    column: schema_pb2.FieldData,
    num_rows: int,
    matrix: Callable[[schema_pb2.VectorField], np.ndarray | None],
    then: bytes,
) -> Fragments:
    if column.valid_data:  # every row valid (nulls went one by one): a vector a row as usual
        return _one_by_one(column, num_rows, then)
    rows = matrix(column.vectors)
    if rows is None:  # no dimension, or a length that is not rows of it: said by the reader
        return _one_by_one(column, num_rows, then)
    blob = orjson.dumps(rows, option=_NUMPY)
    if then.startswith(b",") and len(blob) > 2:
        # [[1,2],[3,4]] -> "1,2],[3,4]," cut at "[" (one byte, a faster cut than at "],["):
        # each piece a vector's numbers with its "]," (a number holds no "[")
        pieces = (blob[2:-1] + b",").split(b"[")
        return _checked(column, num_rows, (b"[", pieces, then[1:]))
    return _checked(column, num_rows, (b"[", _cut(blob, 2, b"],["), b"]" + then))


def _float_matrix(vectors: schema_pb2.VectorField) -> np.ndarray | None:
    data = np.asarray(vectors.float_vector.data, dtype=np.float32)
    return _matrix(data, vectors.dim, np.float64)


def _int8_matrix(vectors: schema_pb2.VectorField) -> np.ndarray | None:
    return _matrix(np.frombuffer(vectors.int8_vector, dtype=np.int8), vectors.dim, np.int64)


def _matrix(data: np.ndarray, dim: int, wide: type) -> np.ndarray | None:
    if dim <= 0 or data.size % dim:
        return None
    # (an empty column: rows of zero vectors, serialized as [] and cut into no pieces)
    return data.astype(wide).reshape(-1, dim)


def _checked(column: schema_pb2.FieldData, num_rows: int, fragments: Fragments) -> Fragments:
    check_count(column, len(fragments[1]), num_rows)
    return fragments


__all__ = ["Fragments", "column_json"]
