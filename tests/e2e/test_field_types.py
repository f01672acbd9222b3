"""Every field type a real Milvus 2.3.5 source holds, replicated by the daemon into a real Milvus
2.3.5 target and into Kafka events, compared field by field with the source (floats at float32
precision, binary vectors as bytes, JSON as parsed values with their types); a verify over the
replicated collections finds nothing; a backfill copies the same collections, written before the
task, just as exactly (test_field_types_backfill.py: the Spark tests run as one group). The
collections and the comparison: field_type_shapes.py.

What a 2.3.5 source cannot hold is shown too (README, "Field types"): nullable fields (the flag
is dropped, a null refused), arrays of JSON, a second vector field, sparse and int8 vectors.
Float16 and BFloat16 vectors are accepted in a schema but crash 2.3.5's query node once loaded,
so they are not tried on the session's shared server.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import numpy as np
import pytest
from field_type_shapes import (
    ARRAY_TYPES,
    DEFAULT_N,
    DEFAULT_TEXT,
    EDGE_JSON,
    Key,
    Kinds,
    Written,
    bits_key,
    bits_row,
    create_collections,
    differences,
    event_schema_shape,
    expr_literal,
    kinds_of,
    read_rows,
    schema_differences,
    schema_shape,
    tenant_row,
    write_all,
)
from harness.services import ServiceStartError, wait_until
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import MilvusException
from test_kafka_sink import Rebuilt
from test_replication import create_task, source_config
from test_verify import kinds as verify_kinds
from test_verify import only_collection, run_verify, verify_config

pytestmark = pytest.mark.e2e


SHAPES = ("every", "bits", "auto", "tenants")


def shape_names() -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    return {shape: f"ft_{shape}_{tag}" for shape in SHAPES}


def wait_same(
    source: MilvusClient,
    target: MilvusClient,
    collection: str,
    keys: set[Key],
    timeout: float = 90,
) -> tuple[Kinds, dict]:
    """Wait until the target holds the source's rows of ``keys``, field by field; fail naming
    every difference (collection, key, field, type) when it does not."""
    kinds = kinds_of(source, collection)
    expected = read_rows(source, collection, kinds.pk, keys)
    last: list[str] = ["the collection is not on the target"]

    def same() -> bool:
        nonlocal last
        if not target.has_collection(collection):
            return False
        last = differences(
            kinds, collection, expected, read_rows(target, collection, kinds.pk, keys)
        )
        return not last

    try:
        wait_until(same, timeout, f"target {collection} equal to the source, field by field")
    except ServiceStartError:
        pytest.fail(f"{len(last)} differences: {last[:20]}")
    return kinds, expected


def check_source_holds_what_was_written(
    expected: Mapping[str, dict], names: Mapping[str, str], written: Written
) -> None:
    """The source keeps the values the comparison relies on (else a lossy source and a lossy
    target could agree)."""
    every = expected[names["every"]]
    assert set(every) == written.alive(names["every"])
    assert every[0]["doc"] == EDGE_JSON and every[0]["i64"] == -(2**63)
    assert every[1]["i64"] == 2**63 - 1 and every[1]["text"] == "x" * 16
    assert every[2]["text"] == "🙂" * 4 and every[0]["a_i64"] == [-(2**63), 2**63 - 1, 2**53 + 1]
    assert every[4]["dflt"] == -4  # the inserted value, the default where none was given:
    assert every[45]["dflt"] == every[95]["dflt"] == DEFAULT_N
    assert every[45]["dtext"] == DEFAULT_TEXT and every[4]["text"] == "\x00ins\n4\t"
    assert every[9]["note"] == "ins ü 9" and "note" not in every[11]  # upserted: no key now
    assert every[13]["text"].startswith("upsert")
    assert all(every[1][name] == [] for name in ARRAY_TYPES)
    tenants = expected[names["tenants"]]
    assert tenants[10]["tenant"] != tenant_row(10, "ins")["tenant"]  # moved by the upsert
    for shape in ("bits", "auto", "tenants"):
        assert set(expected[names[shape]]) == written.alive(names[shape]), shape


def test_every_2_3_5_type_reaches_milvus_and_kafka_exactly_and_verifies_clean(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    names = shape_names()
    topic = f"events_{names['every']}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        config = verify_config(milvus_source, etcd_service, kafka_mock)
        # small ranges and pages: range bounds and page cursors are keys of every kind
        config["verify"].update(rangeRows=30, batchRows=20)
        daemon = daemon_factory(**config).start()
        task_id = create_task(daemon, milvus_source_rocksmq.uri, *names.values())
        created = daemon.call(
            "create",
            {
                "kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": topic},
                "collection_infos": [{"name": n} for n in names.values()],
            },
        )
        assert created.code == 200, created.body
        kafka_task = created.data["task_id"]

        create_collections(source, names)
        written = write_all(source, names)

        expected: dict[str, dict] = {}
        kinds: dict[str, Kinds] = {}
        for name in names.values():
            kinds[name], expected[name] = wait_same(source, target, name, written.keys[name])
        check_source_holds_what_was_written(expected, names, written)
        for name in names.values():  # the schemas too (auto_id is off on the target: its keys
            source_shape = schema_shape(source, name, auto_id=False)  # are the source's)
            target_shape = schema_shape(target, name, auto_id=False)
            assert not schema_differences(source_shape, target_shape), name

        # the Kafka events of the same collections: every field present with its value
        last: list[str] = []

        def events_equal() -> bool:
            nonlocal last
            rebuilt = Rebuilt(kafka_mock.bootstrap, topic, kafka_task)
            last = [
                d
                for name in names.values()
                for d in kafka_events_differences(rebuilt, kinds[name], name, expected[name])
            ]
            return not last

        try:
            wait_until(events_equal, 90, "the Kafka events rebuilding every collection")
        except ServiceStartError:
            pytest.fail(f"Kafka events: {len(last)} differences: {last[:20]}")
        created_events = {
            e["collection"]: e
            for e in Rebuilt(kafka_mock.bootstrap, topic, kafka_task).ddl
            if e["op"] == "create_collection"
        }
        for name in names.values():  # each field's type, element type, parameters, default
            source_shape = schema_shape(source, name, auto_id=False)
            del source_shape["partitions"]
            event_shape = event_schema_shape(created_events[name])
            assert not schema_differences(source_shape, event_shape), name

        # a verify over every replicated collection: nothing divergent, every row compared
        verify = run_verify(daemon, task_id)
        by_name = {c["collection"]: c for c in verify["collections"]}
        assert verify["divergent_rows"] == 0, {k: verify_kinds(v) for k, v in by_name.items()}
        assert verify["rows_compared"] >= sum(len(rows) for rows in expected.values()), verify
        assert verify["ranges_total"] >= 8, verify  # bounds and cursors of every key kind

        # ... and it sees a change of one value of a type, hidden in a row on the target only
        every = names["every"]
        changed = {
            0: {"doc": {**EDGE_JSON, "big": 2**53 + 2}},  # lost by a float64 JSON decoder
            1: {"a_f32": [3.4028234663852886e38, -1.1754943508222875e-38, 1 / 3, -0.0]},
            3: {"f32": 0.0},  # -0.0 on the source
            9: {"ratio": 9 / 7 + 1e-15},  # a dynamic key
            42: {"flag": False},
        }
        rows = [{**expected[every][k], **change} for k, change in changed.items()]
        target.upsert(every, rows)
        verify = run_verify(daemon, task_id, collections=[every])
        assert verify_kinds(only_collection(verify)) == {
            "missing": (0, []),
            "extra": (0, []),
            "different": (len(changed), sorted(changed)),
        }, verify
        # a repair writes the source's rows back, every type intact
        repaired = run_verify(daemon, task_id, collections=[every], repair=True)
        assert repaired["repaired"] == len(changed), repaired
        wait_same(source, target, every, written.keys[every])

        # varchar keys with control characters, quotes and backslashes: reported and repaired
        bits = names["bits"]
        gone, extra = bits_key(7), '\x00extra\n"\\'
        target.delete(bits, filter=f"key in [{expr_literal(gone)}]")
        target.insert(bits, [{**bits_row(10, "extra"), "key": extra}])
        verify = run_verify(daemon, task_id, collections=[bits], repair=True)
        assert verify_kinds(only_collection(verify)) == {
            "missing": (1, [gone]),
            "extra": (1, [extra]),
            "different": (0, []),
        }, verify
        assert verify["repaired"] == 2, verify
        wait_same(source, target, bits, written.keys[bits])
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        assert task["state"] == "Running", task
    finally:
        source.close()
        target.close()


def kafka_events_differences(
    rebuilt: Rebuilt, kinds: Kinds, collection: str, expected: Mapping[Key, dict]
) -> list[str]:
    """The rows the topic's events rebuild for ``collection``, against the source's rows."""
    mine: dict[Key, dict] = {}
    for event in rebuilt.events:
        if event.get("collection") != collection or "row" not in event:
            continue
        if event["op"] == "delete":
            mine.pop(event["pk"], None)
        else:
            mine[event["pk"]] = event["row"]
    return differences(kinds, collection, expected, mine)


def test_what_a_2_3_5_source_cannot_hold(milvus_source):
    """The source side of the README's "source cannot hold": 2.3.5 drops a nullable flag and
    refuses a null; refuses arrays of JSON and a second vector field; refuses the rows of sparse
    and int8 vectors. (Nothing of these reaches a task: there is nothing to replicate.)"""
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    tag = uuid.uuid4().hex[:6]
    made: list[str] = []

    def attempt(name: str, add, vector=("vec", DataType.FLOAT_VECTOR)) -> None:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        if vector[1] == DataType.SPARSE_FLOAT_VECTOR:
            schema.add_field(vector[0], vector[1])
        else:
            schema.add_field(vector[0], vector[1], dim=4)
        add(schema)
        made.append(name)
        source.create_collection(name, schema=schema)

    try:
        nullable = f"ft_nullable_{tag}"
        attempt(nullable, lambda s: s.add_field("n", DataType.INT64, nullable=True))
        (n_field,) = [f for f in source.describe_collection(nullable)["fields"] if f["name"] == "n"]
        assert not n_field.get("nullable"), n_field  # the flag is not kept
        with pytest.raises(MilvusException, match="num_rows"):
            source.insert(nullable, [{"id": 1, "vec": [0.0] * 4, "n": None}])

        with pytest.raises(MilvusException, match="element type JSON is not supported"):
            attempt(
                f"ft_json_array_{tag}",
                lambda s: s.add_field(
                    "a", DataType.ARRAY, element_type=DataType.JSON, max_capacity=2
                ),
            )
        with pytest.raises(MilvusException, match="multiple vector fields is not supported"):
            attempt(
                f"ft_two_vectors_{tag}", lambda s: s.add_field("v2", DataType.FLOAT_VECTOR, dim=4)
            )
        sparse = f"ft_sparse_{tag}"
        attempt(sparse, lambda s: None, vector=("sv", DataType.SPARSE_FLOAT_VECTOR))
        with pytest.raises(MilvusException, match="not supported"):
            source.insert(sparse, [{"id": 1, "sv": {1: 0.5}}])
        int8 = f"ft_int8_vector_{tag}"
        attempt(int8, lambda s: None, vector=("iv", DataType.INT8_VECTOR))
        with pytest.raises(MilvusException, match="not supported"):
            source.insert(int8, [{"id": 1, "iv": np.array([1, -2, 3, -4], dtype=np.int8)}])
    finally:
        for name in made:
            if source.has_collection(name):
                source.drop_collection(name)
        source.close()


def test_flags_a_2_3_5_source_drops_do_not_stop_its_replication(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """A client may ask 2.3.5 for flags it does not know (``nullable``, a clustering key, an
    analyzer); 2.3.5 drops them, and its collection is replicated as it holds it."""
    name = f"ft_flags_{uuid.uuid4().hex[:6]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
        task_id = create_task(daemon, milvus_source_rocksmq.uri, name)
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=4)
        schema.add_field("n", DataType.INT64, nullable=True)
        schema.add_field("k", DataType.INT64, is_clustering_key=True)
        schema.add_field("t", DataType.VARCHAR, max_length=16, enable_analyzer=True)
        index = source.prepare_index_params()
        index.add_index("vec", index_type="FLAT", metric_type="L2")
        source.create_collection(name, schema=schema, index_params=index)
        rows = [{"id": i, "vec": [i / 4] * 4, "n": -i, "k": i, "t": f"t{i}"} for i in range(30)]
        source.insert(name, rows)
        wait_same(source, target, name, set(range(30)))
        assert not schema_differences(
            schema_shape(source, name, auto_id=False), schema_shape(target, name, auto_id=False)
        )
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        assert task["state"] == "Running", task
    finally:
        source.close()
        target.close()
