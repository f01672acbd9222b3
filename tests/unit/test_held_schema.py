"""A 2.3-2.5 CreateCollection record's schema, with each field's flags as the source's catalog
holds them (``collection_ddl.held_schema``): a Milvus 2.3.5 source keeps a client's ``nullable``
in the record but not in its catalog (tests/e2e/test_field_types.py shows both on a real one)."""

from __future__ import annotations

from pymilvus.grpc_gen import schema_pb2

from replicator.pipeline.collection_ddl import held_schema

DataType = schema_pb2.DataType


def schema(*, nullable: bool, clustering: bool) -> schema_pb2.CollectionSchema:
    s = schema_pb2.CollectionSchema(name="c", enable_dynamic_field=True)
    s.fields.add(fieldID=100, name="id", data_type=DataType.Int64, is_primary_key=True)
    n = s.fields.add(fieldID=101, name="n", data_type=DataType.Int64)
    n.nullable = nullable
    n.is_clustering_key = clustering
    n.default_value.long_data = 7
    return s


def test_flags_the_catalog_does_not_hold_are_dropped_the_rest_kept():
    record = schema(nullable=True, clustering=True)
    held = held_schema(record, schema(nullable=False, clustering=False))
    (n,) = [f for f in held.fields if f.name == "n"]
    assert not n.nullable and not n.is_clustering_key
    assert n.default_value.long_data == 7 and held.enable_dynamic_field
    assert record.fields[1].nullable  # the record itself is left as it was


def test_flags_the_catalog_holds_are_kept():
    held = held_schema(
        schema(nullable=True, clustering=True), schema(nullable=True, clustering=True)
    )
    assert held.fields[1].nullable and held.fields[1].is_clustering_key


def test_a_field_the_catalog_lacks_is_left_as_the_record_has_it():
    record = schema(nullable=True, clustering=False)
    catalog = schema_pb2.CollectionSchema(name="c")
    assert held_schema(record, catalog) == record
