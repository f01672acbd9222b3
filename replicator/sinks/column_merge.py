"""Merging the columns of several inserts into one request's, value by value."""

from __future__ import annotations

from collections.abc import Sequence

from pymilvus.grpc_gen import schema_pb2


def merge_columns(
    into: Sequence[schema_pb2.FieldData], more: Sequence[Sequence[schema_pb2.FieldData]]
) -> None:
    """Appends the values of each batch of ``more`` to the column of ``into`` of the same name.

    protobuf's ``MergeFrom`` concatenates repeated values but *replaces* a singular one, and the
    byte-typed vectors (binary, float16, bfloat16, int8) are one ``bytes`` value for all rows:
    those are concatenated here, as is each sub-field of a struct array (``MergeFrom`` would add
    the second batch's sub-fields as more sub-fields); a sparse column keeps the largest ``dim``."""
    by_name = {column.field_name: column for column in into}
    for columns in more:
        for column in columns:
            target = by_name.get(column.field_name)
            if target is None:
                raise ValueError(f"insert batches disagree on columns: {column.field_name}")
            _append_column(target, column)


_BYTE_VECTORS = frozenset(
    field.name
    for field in schema_pb2.VectorField.DESCRIPTOR.fields
    if field.type == field.TYPE_BYTES
)


def _append_column(target: schema_pb2.FieldData, column: schema_pb2.FieldData) -> None:
    if column.HasField("struct_arrays"):
        merge_columns(target.struct_arrays.fields, [column.struct_arrays.fields])
        column = _without_struct_arrays(column)
    kind = str(column.vectors.WhichOneof("data")) if column.HasField("vectors") else ""
    if kind in _BYTE_VECTORS:
        joined = getattr(target.vectors, kind) + getattr(column.vectors, kind)
        target.MergeFrom(column)
        setattr(target.vectors, kind, joined)
    elif kind == "sparse_float_vector":
        dim = max(target.vectors.sparse_float_vector.dim, column.vectors.sparse_float_vector.dim)
        target.MergeFrom(column)
        target.vectors.sparse_float_vector.dim = dim
    else:
        target.MergeFrom(column)


def _without_struct_arrays(column: schema_pb2.FieldData) -> schema_pb2.FieldData:
    rest = schema_pb2.FieldData()
    rest.CopyFrom(column)
    rest.ClearField("struct_arrays")
    return rest


__all__ = ["merge_columns"]
