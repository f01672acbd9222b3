"""The Kafka target's model answers the pipeline's Milvus calls as a Milvus does: "already
exists" and "not found" where a Milvus gives them, each change once, and the same after a round
trip through JSON (what a restart reads back)."""

from __future__ import annotations

import pytest
from pymilvus.grpc_gen import milvus_pb2, schema_pb2

from replicator.errors import Rejection, TargetRejectedError
from replicator.sinks.target_model import TargetModel


def schema() -> bytes:
    s = schema_pb2.CollectionSchema(name="ignored")
    s.fields.add(fieldID=100, name="id", data_type=schema_pb2.DataType.Int64, is_primary_key=True)
    vec = s.fields.add(fieldID=101, name="vec", data_type=schema_pb2.DataType.FloatVector)
    vec.type_params.add(key="dim", value="4")
    return s.SerializeToString()


def create(model: TargetModel, name: str = "c", db: str = "") -> list:
    request = milvus_pb2.CreateCollectionRequest(
        db_name=db, collection_name=name, schema=schema(), shards_num=2
    )
    return model.handle("CreateCollection", request)[1]


def rejection(model: TargetModel, method: str, request) -> Rejection:
    with pytest.raises(TargetRejectedError) as error:
        model.handle(method, request)
    return error.value.rejection


def test_a_collection_is_created_once_and_described_as_created():
    model = TargetModel()
    (change,) = create(model)
    assert change.op == "create_collection" and change.collection == "c"
    fields = change.detail["schema"]["fields"]
    assert [(f["name"], f["type"], f["primary_key"]) for f in fields] == [
        ("id", "Int64", True),
        ("vec", "FloatVector", False),
    ]
    assert fields[1]["params"] == {"dim": "4"}
    has = milvus_pb2.HasCollectionRequest(collection_name="c")
    assert model.handle("HasCollection", has)[0].value
    described = model.handle(
        "DescribeCollection", milvus_pb2.DescribeCollectionRequest(collection_name="c")
    )[0]
    assert [f.fieldID for f in described.schema.fields] == [100, 101]
    assert described.shards_num == 2 and described.schema.name == "c"
    again = milvus_pb2.CreateCollectionRequest(collection_name="c", schema=schema())
    assert rejection(model, "CreateCollection", again) is Rejection.ALREADY_EXISTS


def test_a_partition_key_collection_keeps_its_partition_count():
    """The create's num_partitions (a partition key's partitions, as the source has them) is
    in the schema event and described back, also after a restart; absent when the create gave
    none."""
    model = TargetModel()
    keyed = milvus_pb2.CreateCollectionRequest(
        collection_name="k", schema=schema(), shards_num=1, num_partitions=4
    )
    (change,) = model.handle("CreateCollection", keyed)[1]
    assert change.detail["num_partitions"] == 4
    describe = milvus_pb2.DescribeCollectionRequest(collection_name="k")
    restarted = TargetModel.from_json(model.to_json())
    assert restarted.handle("DescribeCollection", describe)[0].num_partitions == 4
    assert "num_partitions" not in create(model)[0].detail


def test_partitions_indexes_aliases_and_drops_answer_like_milvus():
    model = TargetModel()
    create(model)
    part = milvus_pb2.CreatePartitionRequest(collection_name="c", partition_name="p1")
    assert [c.op for c in model.handle("CreatePartition", part)[1]] == ["create_partition"]
    assert rejection(model, "CreatePartition", part) is Rejection.ALREADY_EXISTS
    shown = model.handle("ShowPartitions", milvus_pb2.ShowPartitionsRequest(collection_name="c"))
    assert list(shown[0].partition_names) == ["_default", "p1"]

    index = milvus_pb2.CreateIndexRequest(collection_name="c", field_name="vec", index_name="i")
    index.extra_params.add(key="index_type", value="FLAT")
    assert [c.op for c in model.handle("CreateIndex", index)[1]] == ["create_index"]
    assert model.handle("CreateIndex", index)[1] == []  # the same index again: no change
    other = milvus_pb2.CreateIndexRequest(collection_name="c", field_name="id", index_name="i")
    assert rejection(model, "CreateIndex", other) is Rejection.ALREADY_EXISTS

    alias = milvus_pb2.CreateAliasRequest(collection_name="c", alias="a")
    assert model.handle("CreateAlias", alias)[1][0].detail == {"alias": "a"}
    assert rejection(model, "CreateAlias", alias) is Rejection.ALREADY_EXISTS
    realias = milvus_pb2.AlterAliasRequest(collection_name="c", alias="a")
    assert model.handle("AlterAlias", realias)[1] == []  # already so (a replayed create)
    drop = milvus_pb2.DropCollectionRequest(collection_name="c")
    assert [c.op for c in model.handle("DropCollection", drop)[1]] == ["drop_collection"]
    assert rejection(model, "DropCollection", drop) is Rejection.NOT_FOUND
    aliases = model.handle("ListAliases", milvus_pb2.ListAliasesRequest())[0]
    assert list(aliases.aliases) == []  # went with its collection
    assert rejection(model, "Insert", None) is Rejection.UNIMPLEMENTED


def test_databases_and_the_json_round_trip():
    model = TargetModel()
    db = milvus_pb2.CreateDatabaseRequest(db_name="sales")
    db.properties.add(key="database.replica.number", value="1")
    assert model.handle("CreateDatabase", db)[1][0].detail == {
        "properties": {"database.replica.number": "1"}
    }
    create(model, "orders", "sales")
    drop_db = milvus_pb2.DropDatabaseRequest(db_name="sales")
    assert rejection(model, "DropDatabase", drop_db) is Rejection.OTHER  # not empty
    restored = TargetModel.from_json(model.to_json())
    assert restored.state == model.state
    listed = restored.handle("ListDatabases", milvus_pb2.ListDatabasesRequest())[0]
    assert list(listed.db_names) == ["default", "sales"]
    assert rejection(restored, "CreateDatabase", db) is Rejection.ALREADY_EXISTS
    copy = restored.copy()
    create(copy, "more", "sales")
    assert "more" not in restored.state["databases"]["sales"]["collections"]  # a deep copy


def test_a_field_s_default_value_and_element_type_are_in_the_schema_event():
    s = schema_pb2.CollectionSchema.FromString(schema())
    n = s.fields.add(fieldID=102, name="n", data_type=schema_pb2.DataType.Int64)
    n.default_value.long_data = -(2**63)
    s.fields.add(
        fieldID=103, name="zero", data_type=schema_pb2.DataType.Int32
    ).default_value.int_data = 0
    text = s.fields.add(fieldID=104, name="t", data_type=schema_pb2.DataType.VarChar)
    text.default_value.string_data = ""
    s.fields.add(
        fieldID=105,
        name="tags",
        data_type=schema_pb2.DataType.Array,
        element_type=schema_pb2.DataType.VarChar,
    )
    request = milvus_pb2.CreateCollectionRequest(collection_name="d", schema=s.SerializeToString())
    (change,) = TargetModel().handle("CreateCollection", request)[1]
    fields = {f["name"]: f for f in change.detail["schema"]["fields"]}
    assert fields["n"]["default_value"] == -(2**63)
    assert fields["zero"]["default_value"] == 0  # a default of zero is a default, not none
    assert fields["t"]["default_value"] == ""
    assert fields["tags"]["element_type"] == "VarChar" and "default_value" not in fields["tags"]
    assert "default_value" not in fields["id"]
