"""Insert columns of every field type, as a Milvus 2.6 proxy appends them to the WAL, for
:class:`harness.streaming_writer.StreamingWriter` (``insert(columns=...)``).

A client sends rows; the proxy's insert task checks and completes them before the Insert is
appended, and the WAL holds what it leaves. Derived from Milvus's Go code and the schema protos
(pymilvus ``schema_pb2``), never from our decoder:

- ``internal/proxy/util.go`` ``checkFieldsDataBySchema``: a field the client did not send that
  is nullable or has a default value gets an empty column whose ``valid_data`` is all false;
- ``internal/proxy/validate_util.go`` ``fillWithValue``: a nullable field's column is expanded
  to one value per row (``fillWithNullValueImpl``: the zero value where ``valid_data`` is
  false) and keeps ``valid_data``; a field with a default value gets the default where
  ``valid_data`` is false (``fillWithDefaultValueImpl``), then ``valid_data`` all true if the
  field is nullable, else none at all; a Geometry default is the field's WKT
  (``default_value.string_data``) turned into WKB;
- ``checkGeometryFieldData``: the client's WKT (``geometry_wkt_data``) becomes WKB in
  ``geometry_data`` (``wkb.Marshal(geom, wkb.NDR)``: little-endian OGC WKB, 2D here);
- Timestamptz: the client sends ISO 8601 text, the WAL column is ``timestamptz_data``, UTC
  microseconds (``FillWithNullValue``/``FillWithDefaultValue`` work on ``TimestamptzData``, the
  default read with ``GetTimestamptzData``);
- ``checkAndFlattenStructFieldData``: an Array of Struct is not appended as one column but as
  one column per sub-field, named ``<struct>[<sub>]`` (``typeutil.ConcatStructFieldName``; the
  create task renames sub-fields the same way, ``transformStructFieldNames``), each an Array or
  an ArrayOfVector (``vectors.vector_array``) with one entry per row;
- value layouts (``schema.proto``): Int8/Int16/Int32 in ``int_data``; JSON as UTF-8 bytes; a
  sparse row as little-endian (uint32 index, float32 value) pairs in index order, ``dim`` the
  largest index + 1 (``CreateSparseFloatRow``); BinaryVector dim/8 bytes per row; Float16 and
  BFloat16 two bytes per dimension (IEEE half; the high half of a float32); Int8Vector one;
- a nullable vector field (Milvus 2.6.18 and later; ``pkg/util/typeutil/nullable_vector.go``:
  "ValidData has one entry per logical row, while vector data only contains valid rows"): the
  column is *not* expanded (``FillWithNullValue`` fills scalars only), ``fillWithValue`` gives
  it an all-true ``valid_data`` when the client sent none, and ``checkAligned`` wants as many
  vectors as valid rows; ``msg_pack.go`` ``genInsertMsgsByPartition`` copies a row's vector
  only when it is not null (``typeutil.AppendFieldData``) and always sets ``vectors.dim``, so
  a message whose rows are all null holds the dim and no data;
- functions (BM25, VarChar in, sparse vector out): the proxy runs none but embedding functions
  before the append (``genFunctionFields`` in ``internal/proxy/task_insert.go`` calls the
  executor only when ``HasNonBM25Functions``; ``LackOfFieldsDataBySchema`` lets a BM25 output
  be missing), and a 2.6 reader fills the output after reading the WAL (the querynode's
  ``internal/querynodev2/pipeline/embedding_node.go`` appends it to the message's
  ``FieldsData``, the streaming node's ``flushcommon/pipeline/flow_graph_embedding_node.go``
  to its insert data): the WAL's Insert holds the text column, not the sparse one. The create
  task numbers functions from 100 in schema order and fills ``input_field_ids`` /
  ``output_field_ids`` from the field names (``assignFieldAndFunctionID``); the output field
  is ``is_function_output``;
- the dynamic field: the proxy appends ``$meta`` (JSON, ``is_dynamic``) after the user fields
  when the schema enables it (``appendDynamicField``), and an Insert always carries its column:
  the client's (``checkDynamicFieldData`` renames it ``$meta``), else one ``{}`` per row. 2.6
  can enable it on an existing collection (``alterDynamicFieldTask``, AlterCollection
  ``dynamicfield.enabled``): that ``$meta`` is nullable with the default value ``{}``, so its
  column is filled like any such field (``valid_data`` all true).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from pymilvus.grpc_gen import schema_pb2 as S  # noqa: N812 - the protos, read as S.Int64

Row = Mapping[str, Any]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_ARRAY_SLOT = {
    S.Bool: "bool_data",
    S.Int8: "int_data",
    S.Int16: "int_data",
    S.Int32: "int_data",
    S.Int64: "long_data",
    S.Float: "float_data",
    S.Double: "double_data",
    S.VarChar: "string_data",
}
_SCALAR_SLOT = {
    **_ARRAY_SLOT,
    S.JSON: "json_data",
    S.Geometry: "geometry_data",
    S.Timestamptz: "timestamptz_data",
}
_ZERO: dict[int, Any] = {
    S.Bool: False,
    S.VarChar: "",
    S.JSON: b"",
    S.Geometry: b"",
    S.Float: 0.0,
    S.Double: 0.0,
}


# --- client values to WAL values -----------------------------------------------------------------


def wkt_to_wkb(text: str) -> bytes:
    """OGC WKB, little endian, of a 2D ``POINT (x y)`` or ``POLYGON ((x y, ...), ...)``."""
    name, _, body = text.strip().partition("(")
    kind = name.strip().upper()
    body = "(" + body

    def coords(chunk: str) -> list[tuple[float, float]]:
        pairs = [p.split() for p in chunk.strip("() ").split(",")]
        return [(float(x), float(y)) for x, y in pairs]

    if kind == "POINT":
        ((x, y),) = coords(body)
        return struct.pack("<BIdd", 1, 1, x, y)
    if kind == "POLYGON":
        rings = [r for r in body.strip()[1:-1].split(")") if r.strip(" ,(")]
        out = struct.pack("<BII", 1, 3, len(rings))
        for ring in rings:
            points = coords(ring.strip(" ,"))
            out += struct.pack("<I", len(points))
            out += b"".join(struct.pack("<dd", x, y) for x, y in points)
        return out
    raise ValueError(f"not a 2D POINT or POLYGON: {text}")


def iso_to_micros(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def sparse_row(values: Mapping[int, float]) -> bytes:
    return b"".join(struct.pack("<If", i, v) for i, v in sorted(values.items()))


def _wal_value(field: S.FieldSchema, value: Any) -> Any:
    if field.data_type == S.JSON:
        return json.dumps(value).encode()
    if field.data_type == S.Geometry:
        return wkt_to_wkb(value)
    if field.data_type == S.Timestamptz:
        return iso_to_micros(value)
    return value


def _default(field: S.FieldSchema) -> Any:
    which = field.default_value.WhichOneof("data")
    value = getattr(field.default_value, which)
    if field.data_type == S.Geometry:
        return wkt_to_wkb(value)
    if field.data_type == S.JSON:
        return bytes(value)
    return value


# --- columns -------------------------------------------------------------------------------------


def _scalar_column(field: S.FieldSchema, rows: Sequence[Row]) -> S.FieldData:
    column = S.FieldData(field_name=field.name, field_id=field.fieldID, type=field.data_type)
    has_default = field.HasField("default_value")
    valid = [row.get(field.name) is not None for row in rows]
    filler = _default(field) if has_default else _ZERO.get(field.data_type, 0)
    values = [
        _wal_value(field, row[field.name]) if ok else filler
        for row, ok in zip(rows, valid, strict=True)
    ]
    if field.data_type == S.Array:
        array = column.scalars.array_data
        array.element_type = field.element_type
        for value in values:
            cell = array.data.add()
            getattr(cell, _ARRAY_SLOT[field.element_type]).data.extend(value or [])
    else:
        getattr(column.scalars, _SCALAR_SLOT[field.data_type]).data.extend(values)
    if field.nullable:
        column.valid_data.extend([True] * len(rows) if has_default else valid)
    return column


def _vector_column(field: S.FieldSchema, rows: Sequence[Row]) -> S.FieldData:
    column = S.FieldData(field_name=field.name, field_id=field.fieldID, type=field.data_type)
    if field.nullable:  # compact: a vector for each valid row only
        valid = [row.get(field.name) is not None for row in rows]
        column.valid_data.extend(valid)
        values = [row[field.name] for row, ok in zip(rows, valid, strict=True) if ok]
    else:
        values = [row[field.name] for row in rows]
    vectors = column.vectors
    if field.data_type == S.SparseFloatVector:
        if values:
            vectors.sparse_float_vector.contents.extend(sparse_row(v) for v in values)
            vectors.sparse_float_vector.dim = max(max(v, default=0) + 1 for v in values)
            vectors.dim = vectors.sparse_float_vector.dim
        return column
    dim = int(next(p.value for p in field.type_params if p.key == "dim"))
    vectors.dim = dim
    if not values:
        return column  # every row null: the dim, no data
    flat = [x for v in values for x in v]
    if field.data_type == S.FloatVector:
        vectors.float_vector.data.extend(flat)
    elif field.data_type == S.BinaryVector:
        vectors.binary_vector = bytes(flat)  # values given as dim/8 bytes per row
    elif field.data_type == S.Float16Vector:
        vectors.float16_vector = np.asarray(flat, dtype="<f2").tobytes()
    elif field.data_type == S.BFloat16Vector:
        words = np.asarray(flat, dtype="<f4").view("<u4") >> 16
        vectors.bfloat16_vector = words.astype("<u2").tobytes()
    elif field.data_type == S.Int8Vector:
        vectors.int8_vector = np.asarray(flat, dtype="i1").tobytes()
    else:
        raise ValueError(f"no layout for {S.DataType.Name(field.data_type)}")
    return column


def _struct_columns(struct_field: S.StructArrayFieldSchema, rows: Sequence[Row]) -> list[Any]:
    """One column per sub-field, flattened as the proxy leaves them; ``rows[i][struct]`` is a
    list of dicts keyed by the sub-fields' short names."""
    columns = []
    for sub in struct_field.fields:
        short = sub.name[len(struct_field.name) + 1 : -1]  # "<struct>[<short>]"
        column = S.FieldData(field_name=sub.name, field_id=sub.fieldID, type=sub.data_type)
        for row in rows:
            items = [item[short] for item in row[struct_field.name]]
            if sub.data_type == S.Array:
                array = column.scalars.array_data
                array.element_type = sub.element_type
                getattr(array.data.add(), _ARRAY_SLOT[sub.element_type]).data.extend(items)
            else:  # ArrayOfVector of FloatVector
                dim = int(next(p.value for p in sub.type_params if p.key == "dim"))
                array = column.vectors.vector_array
                array.dim, array.element_type = dim, sub.element_type
                column.vectors.dim = dim
                cell = array.data.add(dim=dim)
                cell.float_vector.data.extend(x for v in items for x in v)
        columns.append(column)
    return columns


def _dynamic_column(
    schema: S.CollectionSchema, meta: S.FieldSchema, rows: Sequence[Row]
) -> S.FieldData:
    """``$meta``: each row's keys outside the schema as one JSON object (``{}`` for none)."""
    named = {f.name for f in schema.fields} | {s.name for s in schema.struct_array_fields}
    column = S.FieldData(field_name=meta.name, field_id=meta.fieldID, type=S.JSON)
    column.is_dynamic = True
    for row in rows:
        extra = {k: v for k, v in row.items() if k not in named}
        column.scalars.json_data.data.append(json.dumps(extra, ensure_ascii=False).encode())
    if meta.nullable:  # the 2.6 $meta of a collection made dynamic later: default {}
        column.valid_data.extend([True] * len(rows))
    return column


def wal_columns(schema: S.CollectionSchema, rows: Sequence[Row]) -> list[S.FieldData]:
    """The Insert's ``fields_data`` for ``rows`` (dicts as a client inserts them: WKT text for
    Geometry, ISO text for Timestamptz, ``None`` or no key for a null or a default), without
    an auto_id key's column."""
    columns: list[S.FieldData] = []
    for field in schema.fields:
        if field.fieldID < 100 or field.is_function_output:
            continue
        if field.is_primary_key and field.autoID:
            continue  # the client sends none: harness/stream_proxy.py appends the proxy's
        if field.is_dynamic:
            columns.append(_dynamic_column(schema, field, rows))
            continue
        if field.data_type >= S.BinaryVector:
            columns.append(_vector_column(field, rows))
        else:
            columns.append(_scalar_column(field, rows))
    for struct_field in schema.struct_array_fields:
        columns.extend(_struct_columns(struct_field, rows))
    return columns


# --- schemas -------------------------------------------------------------------------------------


def add_field(schema: S.CollectionSchema, name: str, data_type: int, **params: Any) -> Any:
    """A field numbered after the last one; ``params``: ``element_type``, ``nullable``,
    ``default`` (a ValueField slot and value), the rest type params (dim, max_length, ...)."""
    field = schema.fields.add(fieldID=100 + len(schema.fields), name=name, data_type=data_type)
    field.element_type = params.pop("element_type", 0)
    field.nullable = params.pop("nullable", False)
    default = params.pop("default", None)
    if default is not None:
        slot, value = default
        setattr(field.default_value, slot, value)
    for key, value in params.items():
        field.type_params.add(key=key, value=str(value))
    return field


def add_bm25(schema: S.CollectionSchema, name: str, text: str, sparse: str) -> Any:
    """A BM25 function from the VarChar ``text`` (analyzer enabled) to the sparse ``sparse``,
    numbered and linked as the create task leaves it."""
    by_name = {f.name: f for f in schema.fields}
    by_name[text].type_params.add(key="enable_analyzer", value="true")
    by_name[sparse].is_function_output = True
    function = schema.functions.add(
        id=100 + len(schema.functions), name=name, type=S.FunctionType.BM25
    )
    function.input_field_names.append(text)
    function.input_field_ids.append(by_name[text].fieldID)
    function.output_field_names.append(sparse)
    function.output_field_ids.append(by_name[sparse].fieldID)
    return function


def add_dynamic_field(schema: S.CollectionSchema, *, since_2_6_alter: bool = False) -> Any:
    """``$meta`` after the user fields; ``since_2_6_alter``: as 2.6 adds it to an existing
    collection (nullable, default ``{}``) rather than as a create makes it."""
    schema.enable_dynamic_field = True
    meta = add_field(schema, "$meta", S.JSON)
    meta.is_dynamic = True
    meta.description = "dynamic schema"
    if since_2_6_alter:
        meta.nullable = True
        meta.default_value.bytes_data = b"{}"
    return meta


def base_schema(name: str, dim: int = 4) -> S.CollectionSchema:
    """``id`` (Int64 key) and ``vec`` (FloatVector of ``dim``)."""
    schema = S.CollectionSchema(name=name)
    add_field(schema, "id", S.Int64).is_primary_key = True
    add_field(schema, "vec", S.FloatVector, dim=dim)
    return schema
