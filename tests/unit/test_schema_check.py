"""replicator/sinks/schema_check.py: what a target's collection lost of the source's schema."""

from __future__ import annotations

import pytest
from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TaskFailedError
from replicator.sinks.schema_check import dropped_clustering_keys, lost_fields, require_fields


def schema(*fields: tuple[str, int], dynamic: bool = False) -> schema_pb2.CollectionSchema:
    out = schema_pb2.CollectionSchema(name="c", enable_dynamic_field=dynamic)
    out.fields.add(fieldID=0, name="RowID", data_type=schema_pb2.Int64)
    for i, (name, data_type) in enumerate(fields):
        out.fields.add(fieldID=100 + i, name=name, data_type=data_type)
    return out


def test_a_target_holding_every_field_loses_nothing() -> None:
    source = schema(("id", schema_pb2.Int64), ("g", schema_pb2.Geometry), dynamic=True)
    source.fields.add(fieldID=102, name="$meta", data_type=schema_pb2.JSON, is_dynamic=True)
    target = schema(("id", schema_pb2.Int64), ("g", schema_pb2.Geometry), dynamic=True)
    del target.fields[0]  # a target lists no system field
    assert lost_fields(source, target) == []


def test_missing_retyped_unflagged_struct_and_dynamic_fields_are_named() -> None:
    source = schema(
        ("id", schema_pb2.Int64),
        ("a", schema_pb2.Int32),
        ("t", schema_pb2.Timestamptz),
        ("n", schema_pb2.VarChar),
        dynamic=True,
    )
    source.fields[-1].nullable = True
    chunks = source.struct_array_fields.add(fieldID=200, name="chunks")
    chunks.fields.add(name="chunks[x]", data_type=schema_pb2.Array, element_type=schema_pb2.Int8)
    target = schema(("id", schema_pb2.Int64), ("t", schema_pb2.Int64), ("n", schema_pb2.VarChar))
    assert lost_fields(source, target) == [
        "a (Int32)",
        "t (Timestamptz)",
        "n (VarChar, nullable)",
        "chunks (ArrayOfStruct: chunks[x] Array of Int8)",
        "$meta (JSON, the dynamic field)",
    ]
    with pytest.raises(TaskFailedError, match=r"collection db\.c: .*a \(Int32\)"):
        require_fields("db.c", source, target)


def with_bm25(out: schema_pb2.CollectionSchema) -> schema_pb2.CollectionSchema:
    function = out.functions.add(id=100, name="fts", type=schema_pb2.FunctionType.BM25)
    function.input_field_names.append("text")
    function.output_field_names.append("sparse")
    return out


def test_a_function_the_target_does_not_hold_names_its_output_and_the_function() -> None:
    fields = (("id", schema_pb2.Int64), ("text", schema_pb2.VarChar))
    source = with_bm25(schema(*fields, ("sparse", schema_pb2.SparseFloatVector)))
    kept = with_bm25(schema(*fields, ("sparse", schema_pb2.SparseFloatVector)))
    kept.functions[0].id = 0  # a target numbers functions itself (Lite: 0)
    assert lost_fields(source, kept) == []
    plain = schema(*fields, ("sparse", schema_pb2.SparseFloatVector))  # Milvus 2.3: no function
    retargeted = with_bm25(schema(*fields, ("sparse", schema_pb2.SparseFloatVector)))
    retargeted.functions[0].input_field_names[0] = "id"
    expected = ["sparse (SparseFloatVector, output of function fts: BM25 of text)"]
    assert lost_fields(source, plain) == expected
    assert lost_fields(source, retargeted) == expected


def test_a_vector_of_another_dimension_is_named_with_both() -> None:
    source = schema(("id", schema_pb2.Int64), ("vec", schema_pb2.FloatVector))
    source.fields[-1].type_params.add(key="dim", value="8")
    target = schema(("id", schema_pb2.Int64), ("vec", schema_pb2.FloatVector))
    target.fields[-1].type_params.add(key="dim", value="16")
    assert lost_fields(source, target) == ["vec (FloatVector, dim 8; the target's has dim 16)"]
    target.fields[-1].type_params[0].value = "8"
    assert lost_fields(source, target) == []


def test_a_clustering_key_the_target_dropped_is_a_flag_not_a_lost_field() -> None:
    source = schema(("id", schema_pb2.Int64), ("k", schema_pb2.Int64), ("v", schema_pb2.Int64))
    source.fields[2].is_clustering_key = True
    dropped = schema(("id", schema_pb2.Int64), ("k", schema_pb2.Int64), ("v", schema_pb2.Int64))
    assert lost_fields(source, dropped) == []  # every row is held exactly: no stop
    assert dropped_clustering_keys(source, dropped) == ["k"]
    kept = schema(("id", schema_pb2.Int64), ("k", schema_pb2.Int64), ("v", schema_pb2.Int64))
    kept.fields[2].is_clustering_key = True
    assert dropped_clustering_keys(source, kept) == []
