"""The source's collection schema as a target creates it, and what the sink reads of a schema."""

from __future__ import annotations

from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TargetRejectedError

_SYSTEM_FIELD_IDS = (0, 1)  # RowID, Timestamp


def target_schema(source: schema_pb2.CollectionSchema) -> schema_pb2.CollectionSchema:
    """The source schema as a target can create it: user fields only, keys given by us."""
    schema = schema_pb2.CollectionSchema()
    schema.CopyFrom(source)
    del schema.fields[:]
    del schema.properties[:]  # given to CreateCollection as its properties
    schema.autoID = False
    for field in source.fields:
        if field.fieldID in _SYSTEM_FIELD_IDS and field.name in ("RowID", "Timestamp"):
            continue
        if field.is_dynamic:  # "$meta" is implied by enable_dynamic_field
            continue
        copy = schema.fields.add()
        copy.CopyFrom(field)
        copy.autoID = False
    return schema


def pk_field(schema: schema_pb2.CollectionSchema) -> schema_pb2.FieldSchema:
    for field in schema.fields:
        if field.is_primary_key:
            return field
    raise TargetRejectedError(f"collection {schema.name} has no primary key field")


def has_partition_key(schema: schema_pb2.CollectionSchema) -> bool:
    return any(field.is_partition_key for field in schema.fields)


__all__ = ["has_partition_key", "pk_field", "target_schema"]
