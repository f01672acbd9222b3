"""Several collection shapes replicated by one task, into Milvus Lite and into a real Milvus
2.3.5: varchar keys, auto-id keys (kept on the target), a partition key, explicit partitions (one
dropped), dynamic fields, every scalar type with a binary vector. (Milvus 2.3 allows one vector
field per collection, so several vector fields need a 2.4+ source.)"""

from __future__ import annotations

import random
import uuid

import pytest
from harness.services import wait_until
from pymilvus import DataType, MilvusClient
from test_replication import (
    DIM,
    create_source_collection,
    make_rows,
    rows,
    source_config,
    source_database,
    wait_equal,
)

pytestmark = pytest.mark.e2e


def vec(rnd: random.Random) -> list[float]:
    return [rnd.random() for _ in range(DIM)]


def with_index(client: MilvusClient, name: str, schema, **kwargs) -> None:
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, **kwargs)


def schema_of(client: MilvusClient, name: str, lite: bool = False) -> dict:
    """What a user sees of a collection's schema: fields with types and parameters, keys."""
    described = client.describe_collection(name)
    fields = [
        {
            "name": f["name"],
            "type": f["type"],
            "params": f.get("params", {}),
            "primary": f.get("is_primary", False),
            "partition_key": f.get("is_partition_key", False),
        }
        for f in described["fields"]
    ]
    shape = {
        "fields": fields,
        "dynamic": described.get("enable_dynamic_field"),
    }
    if not lite:  # Milvus Lite keeps none of these (it answers "", 1 and Strong)
        shape["description"] = described.get("description")
        shape["shards"] = described.get("num_shards")
        shape["consistency"] = described.get("consistency_level")
    return shape


def test_collection_shapes(daemon_factory, milvus_source, etcd_service, kafka_mock, target):
    target_uri, lite = target.uri, target.kind == "milvus-lite"
    binary = not lite  # Milvus Lite has no binary vectors
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=target_uri, dedicated=True)
    rnd = random.Random(11)
    tag = uuid.uuid4().hex[:6]
    names = {k: f"{k}_{tag}" for k in ("varchar", "autoid", "pkey", "parts", "types")}
    try:
        daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
        reply = daemon.call(
            "create",
            {
                "milvus_connect_param": {"uri": target_uri},
                "db_collections": {"default": [{"name": n} for n in names.values()]},
            },
        )
        assert reply.code == 200, reply.body

        # varchar primary key, dynamic field
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=True)
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=32)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
        with_index(source, names["varchar"], schema)
        source.insert(
            names["varchar"],
            [{"key": f"k{i:04d}", "vec": vec(rnd), "note": f"n{i}"} for i in range(300)],
        )
        source.delete(names["varchar"], ids=[f"k{i:04d}" for i in range(0, 300, 7)])
        source.upsert(names["varchar"], [{"key": "k0001", "vec": vec(rnd), "note": "upserted"}])

        # auto-id: the source makes the keys; the target must keep them
        schema = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True, auto_id=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
        schema.add_field("n", DataType.INT64)
        with_index(source, names["autoid"], schema)
        made = source.insert(names["autoid"], [{"vec": vec(rnd), "n": i} for i in range(200)])
        ids = list(made["ids"])
        source.delete(names["autoid"], ids=ids[:20])

        # partition key
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
        schema.add_field("tenant", DataType.VARCHAR, max_length=16, is_partition_key=True)
        with_index(source, names["pkey"], schema, num_partitions=4)
        source.insert(
            names["pkey"],
            [{"id": i, "vec": vec(rnd), "tenant": f"t{i % 5}"} for i in range(250)],
        )

        # explicit partitions (created in etcd only, no WAL message), one dropped later
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
        with_index(source, names["parts"], schema)
        for partition in ("p_keep", "p_drop"):
            source.create_partition(names["parts"], partition)
        source.insert(names["parts"], [{"id": i, "vec": vec(rnd)} for i in range(100)])
        source.insert(
            names["parts"],
            [{"id": i, "vec": vec(rnd)} for i in range(100, 200)],
            partition_name="p_keep",
        )
        source.insert(
            names["parts"],
            [{"id": i, "vec": vec(rnd)} for i in range(200, 300)],
            partition_name="p_drop",
        )

        # every scalar type, with a binary vector where the target supports one
        schema = MilvusClient.create_schema(
            auto_id=False, enable_dynamic_field=False, description="every scalar type"
        )
        schema.add_field("id", DataType.INT64, is_primary=True)
        if binary:
            schema.add_field("bits", DataType.BINARY_VECTOR, dim=16)
        else:
            schema.add_field("bits", DataType.FLOAT_VECTOR, dim=2)
        schema.add_field("flag", DataType.BOOL)
        schema.add_field("i8", DataType.INT8)
        schema.add_field("i16", DataType.INT16)
        schema.add_field("i32", DataType.INT32)
        schema.add_field("f32", DataType.FLOAT)
        schema.add_field("f64", DataType.DOUBLE)
        schema.add_field("text", DataType.VARCHAR, max_length=200)
        schema.add_field("doc", DataType.JSON)
        index = source.prepare_index_params()
        if binary:
            index.add_index("bits", index_type="BIN_FLAT", metric_type="HAMMING")
        else:
            index.add_index("bits", index_type="FLAT", metric_type="L2")
        source.create_collection(
            names["types"],
            schema=schema,
            index_params=index,
            consistency_level="Bounded",
            num_shards=2,
        )
        # three inserts at once: records of one channel between two ticks reach the target as
        # one merged write (byte vectors once kept only the last record's rows there)
        for chunk in (range(60), range(60, 100), range(100, 150)):
            source.insert(
                names["types"],
                [
                    {
                        "id": i,
                        "bits": bytes([i % 256, i * 7 % 256]) if binary else [i / 2, -i / 3],
                        "flag": i % 2 == 0,
                        "i8": i % 100 - 50,
                        "i16": i * 3 - 300,
                        "i32": i * 1000,
                        "f32": i / 4,
                        "f64": i / 3,
                        "text": f"text \u00e9 {i}",
                        "doc": {"n": i, "tags": ["a", str(i)], "nested": {"ok": i % 3 == 0}},
                    }
                    for i in chunk
                ],
            )
        source.delete(names["types"], filter="id in [3, 4, 5]")

        expected_varchar = wait_equal(source, target, names["varchar"], "key")
        assert expected_varchar["k0001"]["note"] == "upserted"
        assert "k0007" not in expected_varchar
        expected_autoid = wait_equal(source, target, names["autoid"], "id")
        assert sorted(expected_autoid) == sorted(ids[20:])  # the source's own keys
        wait_equal(source, target, names["pkey"], "id")
        wait_equal(source, target, names["parts"], "id")
        typed = wait_equal(source, target, names["types"], "id")
        assert typed[7]["doc"]["nested"] == {"ok": False} and 4 not in typed
        for name in (names["types"], names["pkey"]):
            assert schema_of(target, name, lite) == schema_of(source, name, lite)
        if not lite:  # the source's num_partitions (4), not the target's default (64)
            source_partitions = source.describe_collection(names["pkey"])["num_partitions"]
            assert source_partitions == 4
            target_partitions = target.describe_collection(names["pkey"])["num_partitions"]
            assert target_partitions == source_partitions
        assert set(target.list_partitions(names["parts"])) >= {"_default", "p_keep", "p_drop"}
        kept = target.query(
            names["parts"], filter="id >= 0", partition_names=["p_keep"], output_fields=["id"]
        )
        assert sorted(r["id"] for r in kept) == list(range(100, 200))

        # dropping a partition on the source drops it (and its rows) on the target
        source.release_partitions(names["parts"], ["p_drop"])
        source.drop_partition(names["parts"], "p_drop")
        wait_until(
            lambda: "p_drop" not in target.list_partitions(names["parts"]),
            60,
            "partition dropped on the target",
        )
        wait_equal(source, target, names["parts"], "id")
    finally:
        source.close()
        target.close()


def test_database_wildcard_and_name_mapping(
    daemon_factory, milvus_source, etcd_service, kafka_mock, target
):
    """A task on `<db>.*` with a name mapping: the database is made on the target under its
    mapped name, collections created after the task started are picked up, one is renamed,
    and a drop follows."""
    tag = uuid.uuid4().hex[:6]
    source_db, target_db = f"shop_{tag}", f"mirror_{tag}"
    source = source_database(milvus_source.uri, source_db)
    target_client = MilvusClient(uri=target.uri, dedicated=True)
    try:
        daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
        reply = daemon.call(
            "create",
            {
                "milvus_connect_param": {"uri": target.uri},
                "db_collections": {source_db: [{"name": "*"}]},
                "name_mapping": [
                    {
                        "source_db": source_db,
                        "target_db": target_db,
                        "collection_mapping": {"orders": "orders_copy"},
                    }
                ],
            },
        )
        assert reply.code == 200, reply.body
        for name in ("orders", "users"):
            create_source_collection(source, name)
            source.insert(name, make_rows(0, 30, name))
        source.delete("orders", ids=[1, 2])

        wait_until(
            lambda: target_db in target_client.list_databases(), 60, "database on the target"
        )
        target_client.close()
        target_client = MilvusClient(uri=target.uri, db_name=target_db, dedicated=True)
        orders = rows(source, "orders", "id")
        wait_until(
            lambda: (
                target_client.has_collection("orders_copy")
                and rows(target_client, "orders_copy", "id") == orders
            ),
            90,
            "orders under its mapped name",
        )
        wait_equal(source, target_client, "users", "id")
        assert not target_client.has_collection("orders")
        source.drop_collection("users")
        wait_until(lambda: not target_client.has_collection("users"), 60, "users dropped")
        # an empty database dropped on the source is dropped on the target
        source.drop_collection("orders")
        wait_until(lambda: not target_client.has_collection("orders_copy"), 60, "orders dropped")
        admin = MilvusClient(uri=milvus_source.uri, dedicated=True)
        admin.drop_database(source_db)
        admin.close()
        wait_until(lambda: target_db not in target_client.list_databases(), 60, "database dropped")
    finally:
        source.close()
        target_client.close()
