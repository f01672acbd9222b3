"""The Kafka target's events: one JSON record per row change, one per DDL change.

A row event (key: the JSON array ``[db, collection, pk]``, so a compacted topic keeps each
row's last state)::

    {"op": "insert" | "upsert" | "delete", "db": ..., "collection": ..., "partition": ...,
     "pk": 42, "row": {every field} | null,
     "ts": {"hybrid": 4464..., "time": "2026-11-23T15:44:56.123Z"},
     "source": {"channel": "by-dev-rootcoord-dml_0", "position": 1234, "commit": "..."}}

A DDL event (key ``[db, collection, "$ddl", what]``)::

    {"op": "create_collection" | "drop_collection" | "create_partition" | ..., "db": ...,
     "collection": ..., <what the change says: schema, partition, index, alias, properties>,
     "ts": {"hybrid": null, "time": ...}, "source": {"channel": ..., "commit": ...}}

Field values in ``row`` (see README, "Kafka targets"): integers, floats, booleans and strings as
JSON; JSON fields as the JSON they hold; a dynamic field's keys as keys of the row; arrays as
lists; float vectors as lists of floats (the float32 values, widened exactly); int8 vectors as
lists of integers; binary, float16 and bfloat16 vectors as base64 of the bytes as Milvus stores
them (little-endian); sparse vectors as ``{"indices": [...], "values": [...]}``; geometries as
WKT text (a 2.6 WAL holds WKB); timestamptz values as ISO 8601 UTC text with microseconds; an
array of structs (2.6: a WAL holds one column per sub-field, ``<struct>[<sub>]``) as a list of
objects keyed by the sub-fields' names, their vectors as lists of floats; a null value
(nullable field) as null. A field of a type this table does not name stops the task with a
reason, never a silently missing value.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import orjson
from pymilvus.grpc_gen import schema_pb2

from replicator.codec.wkb import wkb_to_wkt
from replicator.errors import TargetRejectedError
from replicator.hybrid_time import to_seconds

DataType = schema_pb2.DataType


def ts_view(hybrid: int | None) -> dict[str, Any]:
    """The source's hybrid timestamp and its wall-clock time (UTC, milliseconds)."""
    if not hybrid:
        return {"hybrid": None, "time": _iso(datetime.now(UTC))}
    return {"hybrid": hybrid, "time": _time_of(hybrid)}


@lru_cache(maxsize=1024)
def _time_of(hybrid: int) -> str:
    """(Every row of a message has its message's time: computed once, not once a row.)"""
    return _iso(datetime.fromtimestamp(to_seconds(hybrid), UTC))


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def row_key(db: str, collection: str, pk: int | str) -> bytes:
    """``[db, collection, pk]`` as JSON (the collection's part made once)."""
    return key_prefix(db, collection) + dumps(pk) + b"]"


@lru_cache(maxsize=4096)
def key_prefix(db: str, collection: str) -> bytes:
    """A row key up to its pk: ``[db,collection,``."""
    return dumps([db, collection])[:-1] + b","


def ddl_key(db: str, collection: str, what: str) -> bytes:
    return dumps([db, collection, "$ddl", what])


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (orjson; the standard library for what it refuses: an integer
    beyond 64 bits inside a JSON field)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# --- columns to values ------------------------------------------------------------------------
def _scalars(name: str) -> Callable[[schema_pb2.FieldData], Sequence[Any]]:
    return lambda column: list(getattr(column.scalars, name).data)


def _json_values(column: schema_pb2.FieldData) -> list[Any]:
    return [json.loads(raw) if raw else None for raw in column.scalars.json_data.data]


def _array_values(column: schema_pb2.FieldData) -> list[Any]:
    values = []
    for cell in column.scalars.array_data.data:
        kind = cell.WhichOneof("data")
        values.append(list(getattr(cell, kind).data) if kind else [])
    return values


def _fixed_width(
    width_of: Callable[[int], int], encode: Callable[[bytes], Any]
) -> Callable[[schema_pb2.FieldData], list[Any]]:
    def values(column: schema_pb2.FieldData) -> list[Any]:
        vectors = column.vectors
        raw = getattr(vectors, vectors.WhichOneof("data") or "binary_vector")
        width = width_of(vectors.dim)
        if width <= 0:
            return []
        return [encode(raw[i : i + width]) for i in range(0, len(raw), width)]

    return values


def _float_vectors(column: schema_pb2.FieldData) -> list[list[float]]:
    dim = column.vectors.dim
    data = list(column.vectors.float_vector.data)  # slicing the protobuf container is slow
    return [data[i : i + dim] for i in range(0, len(data), dim)] if dim else []


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _sparse_values(column: schema_pb2.FieldData) -> list[dict[str, list[Any]]]:
    rows = []
    for raw in column.vectors.sparse_float_vector.contents:
        pairs = [struct.unpack_from("<If", raw, i) for i in range(0, len(raw), 8)]
        rows.append({"indices": [p[0] for p in pairs], "values": [p[1] for p in pairs]})
    return rows


def _int8_vectors(column: schema_pb2.FieldData) -> list[list[int]]:
    dim = column.vectors.dim
    raw = column.vectors.int8_vector
    return [list(struct.unpack(f"<{dim}b", raw[i : i + dim])) for i in range(0, len(raw), dim)]


def _geometry_values(column: schema_pb2.FieldData) -> list[Any]:
    scalars = column.scalars
    if scalars.HasField("geometry_wkt_data"):
        return list(scalars.geometry_wkt_data.data)
    return [wkb_to_wkt(raw) if raw else None for raw in scalars.geometry_data.data]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _timestamptz_values(column: schema_pb2.FieldData) -> list[str]:
    """UTC microseconds (what a 2.6 WAL holds) as ISO 8601 text."""
    return [
        (_EPOCH + timedelta(microseconds=micros)).isoformat(timespec="microseconds")[:-6] + "Z"
        for micros in column.scalars.timestamptz_data.data
    ]


def _vector_arrays(column: schema_pb2.FieldData) -> list[list[list[float]]]:
    """An ArrayOfVector (a struct's vector sub-field): each row's vectors."""
    array = column.vectors.vector_array
    if array.element_type != DataType.FloatVector:
        raise TargetRejectedError(
            f"field {column.field_name}: ArrayOfVector of "
            f"{DataType.Name(array.element_type)} cannot be written to a Kafka target yet"
        )
    rows = []
    for cell in array.data:
        dim = cell.dim or array.dim
        data = list(cell.float_vector.data)
        rows.append([data[i : i + dim] for i in range(0, len(data), dim)] if dim else [])
    return rows


def _struct_values(column: schema_pb2.FieldData) -> list[list[dict[str, Any]]]:
    """An ArrayOfStruct column with its sub-fields nested in it: each row's structs."""
    subs = list(column.struct_arrays.fields)
    if not subs:
        return []
    rows = len(subs[0].scalars.array_data.data or subs[0].vectors.vector_array.data)
    per_sub = {_sub_name(column.field_name, s.field_name): column_values(s, rows) for s in subs}
    return [
        _structs(column.field_name, {sub: values[i] for sub, values in per_sub.items()}, i)
        for i in range(rows)
    ]


# the ScalarField member holding each plain scalar type's values
SCALAR_DATA = {
    DataType.Bool: "bool_data",
    DataType.Int8: "int_data",
    DataType.Int16: "int_data",
    DataType.Int32: "int_data",
    DataType.Int64: "long_data",
    DataType.Float: "float_data",
    DataType.Double: "double_data",
    DataType.String: "string_data",
    DataType.VarChar: "string_data",
}

_READERS: dict[int, Callable[[schema_pb2.FieldData], Sequence[Any]]] = {
    **{kind: _scalars(member) for kind, member in SCALAR_DATA.items()},
    DataType.JSON: _json_values,
    DataType.Array: _array_values,
    DataType.FloatVector: _float_vectors,
    DataType.BinaryVector: _fixed_width(lambda dim: dim // 8, _b64),
    DataType.Float16Vector: _fixed_width(lambda dim: dim * 2, _b64),
    DataType.BFloat16Vector: _fixed_width(lambda dim: dim * 2, _b64),
    DataType.SparseFloatVector: _sparse_values,
    DataType.Int8Vector: _int8_vectors,
    DataType.Geometry: _geometry_values,
    DataType.Timestamptz: _timestamptz_values,
    DataType.ArrayOfVector: _vector_arrays,
    DataType.ArrayOfStruct: _struct_values,
}

# a struct's sub-field as a 2.6 WAL names its column (typeutil.ConcatStructFieldName)
_SUB_FIELD = re.compile(r"^(?P<struct>[^\[\]]+)\[(?P<sub>[^\[\]]+)\]$")


def _sub_name(struct_name: str, column_name: str) -> str:
    match = _SUB_FIELD.match(column_name)
    return match["sub"] if match and match["struct"] == struct_name else column_name


def _structs(name: str, lists: dict[str, list[Any] | None], row: int) -> list[dict[str, Any]]:
    """Row ``row``'s structs of field ``name``, from each sub-field's list of that row."""
    items = {sub: values or [] for sub, values in lists.items()}
    if len({len(values) for values in items.values()}) > 1:
        raise TargetRejectedError(
            f"field {name}: row {row} has sub-fields of different lengths "
            f"({', '.join(f'{sub} {len(values)}' for sub, values in items.items())})"
        )
    return [dict(zip(items, values, strict=True)) for values in zip(*items.values(), strict=True)]


def _nest_structs(rows: list[dict[str, Any]]) -> None:
    """Sub-field columns ``<struct>[<sub>]`` made one field ``<struct>``: a list of objects."""
    if not rows:
        return
    groups: dict[str, list[tuple[str, str]]] = {}
    for key in rows[0]:
        if match := _SUB_FIELD.match(key):
            groups.setdefault(match["struct"], []).append((match["sub"], key))
    for struct_name, subs in groups.items():
        for n, row in enumerate(rows):
            row[struct_name] = _structs(struct_name, {sub: row.pop(key) for sub, key in subs}, n)


def column_values(column: schema_pb2.FieldData, num_rows: int) -> list[Any]:
    """One column's values, a row each; a nullable column's missing values as None."""
    reader = _READERS.get(column.type)
    if reader is None:
        raise TargetRejectedError(
            f"field {column.field_name}: type {DataType.Name(column.type)} cannot be written to "
            f"a Kafka target yet"
        )
    values = list(reader(column))
    valid = column.valid_data
    if valid:
        if len(values) == len(valid):  # every row has a slot; invalid ones hold a default
            return [v if ok else None for v, ok in zip(values, valid, strict=True)]
        present = iter(values)  # only the valid rows are there
        return [next(present) if ok else None for ok in valid]
    check_count(column, len(values), num_rows)
    return values


def check_count(column: schema_pb2.FieldData, found: int, num_rows: int) -> None:
    """A column of another length than its insert's rows is refused (no row is guessed)."""
    if found != num_rows:
        raise TargetRejectedError(f"field {column.field_name}: {found} values for {num_rows} rows")


def rows_of(fields_data: Sequence[schema_pb2.FieldData], num_rows: int) -> list[dict[str, Any]]:
    """The rows of an insert's columns, fields by name; a dynamic field's keys merged in.

    Columnar: each column is read whole, then the rows are made in one pass over the columns
    before the first dynamic one (a row's keys in the columns' order); a dynamic column and
    the columns after it are merged in after, column by column."""
    names: list[str] = []
    columns: list[list[Any]] = []
    rest: list[schema_pb2.FieldData] = []
    for n, column in enumerate(fields_data):
        if column.is_dynamic:
            rest = list(fields_data[n:])
            break
        names.append(column.field_name)
        columns.append(checked_values(column, num_rows))
    if columns:
        # (every column's length checked above: zip's own check would cost a third more)
        rows = [dict(zip(names, values)) for values in zip(*columns)]  # noqa: B905
    else:
        rows = [{} for _ in range(num_rows)]
    for column in rest:
        values = checked_values(column, num_rows)
        if column.is_dynamic:
            for row, extra in zip(rows, values, strict=True):
                if isinstance(extra, dict):
                    row.update(extra)
            continue
        name = column.field_name
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    if any("[" in column.field_name for column in fields_data):
        _nest_structs(rows)
    return rows


def checked_values(column: schema_pb2.FieldData, num_rows: int) -> list[Any]:
    """``column_values``, a value for each of the ``num_rows`` rows."""
    values = column_values(column, num_rows)
    check_count(column, len(values), num_rows)
    return values
