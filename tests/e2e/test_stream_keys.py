"""Key kinds and a field added during the stream, on a Milvus 2.6 stream replicated into Milvus
Lite 3.2.2, a real Milvus 2.3.5 and a Kafka target (issue 31; lesson: a task never loses rows
in silence).

The stream is written by tests/harness/streaming_writer.py through
tests/harness/stream_proxy.py, which lays a client's writes out as a 2.6 proxy appends them
(row ids, the keys of an auto_id collection made from them, rows sent to the vchannel their
key hashes to and, with a partition key, one Insert per partition its key hashes to, several
messages of one vchannel as one transaction, an auto_id upsert giving its rows new keys), each
rule citing the Go function it follows. What the target must hold is computed here from the
rows a client wrote, not from those messages.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from harness.services import wait_until
from harness.stream_columns import add_field, base_schema
from harness.stream_proxy import ProxyCollection
from harness.streaming_ddl_writer import DdlWriter
from pymilvus import MilvusClient
from pymilvus.grpc_gen import common_pb2, schema_pb2

from tests.e2e.test_replication import rows
from tests.e2e.test_stream_field_types import compared, wait_target_equal
from tests.e2e.test_streaming_source import start_task, task_view

pytestmark = pytest.mark.e2e

S = schema_pb2
KEY_MAX = 32  # the VarChar key's max_length
SPECIAL_KEYS = [
    "ünïcödé-键-ключ",
    'say "hi"',
    "it's",
    "back\\slash",
    "tab\there",
    "new\nline",
    "nul\x00key",
    " spaced out ",
    "k" * KEY_MAX,  # at max_length
    "é" * (KEY_MAX // 2),  # at max_length in bytes
    "😀" * (KEY_MAX // 4),
]
TENANTS = ["acme", "initech", "wayne", "cyberdyne", "globex", "soylent", "oscorp", "hooli"]


def vector(seed: float) -> list[float]:
    """Four float32-exact values."""
    return [seed * 0.25, -seed, 0.5, 2.0]


def f32(values: list[float]) -> list[float]:
    return [float(np.float32(v)) for v in values]


def index_vec(client: MilvusClient, name: str) -> None:
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_index(name, index)


def target_differences(
    client: MilvusClient, name: str, pk: str, expected: dict[Any, dict], *, by_key: bool = False
) -> list[str]:
    """Every field of every expected row, read back from the target (vectors as float32)."""
    got = {
        key: {**row, "vec": f32(row["vec"])}
        for key, row in rows(client, name, pk, by_key=by_key).items()
    }
    want = {key: {**row, "vec": f32(row["vec"])} for key, row in expected.items()}
    return compared(want, got)


# --- the collections -----------------------------------------------------------------------------


def text_keys(writer: Any, coll: int, name: str, vchannels: list[str]) -> ProxyCollection:
    """A VarChar key (max_length 32) with quotes, backslashes, control characters, unicode."""
    schema = S.CollectionSchema(name=name)
    add_field(schema, "key", S.VarChar, max_length=KEY_MAX).is_primary_key = True
    add_field(schema, "vec", S.FloatVector, dim=4)
    add_field(schema, "note", S.VarChar, max_length=64)
    return ProxyCollection(writer, coll, name, schema, vchannels)


def auto_ids(
    writer: Any, coll: int, name: str, vchannels: list[str], key_type: int = S.Int64
) -> ProxyCollection:
    """An auto_id key (Int64, or VarChar: the row ids as decimal text): the proxy makes it."""
    schema = S.CollectionSchema(name=name, autoID=True)
    pk = add_field(
        schema, "id", key_type, **({"max_length": KEY_MAX} if key_type == S.VarChar else {})
    )
    pk.is_primary_key = pk.autoID = True
    add_field(schema, "vec", S.FloatVector, dim=4)
    add_field(schema, "n", S.Int32)
    return ProxyCollection(writer, coll, name, schema, vchannels)


def auto_texts(writer: Any, coll: int, name: str, vchannels: list[str]) -> ProxyCollection:
    return auto_ids(writer, coll, name, vchannels, S.VarChar)


def tenants(writer: Any, coll: int, name: str, vchannels: list[str]) -> ProxyCollection:
    """A VarChar partition key over 4 partitions."""
    schema = base_schema(name)
    add_field(schema, "tenant", S.VarChar, max_length=16).is_partition_key = True
    return ProxyCollection(writer, coll, name, schema, vchannels, num_partitions=4)


def clustered(writer: Any, coll: int, name: str, vchannels: list[str]) -> ProxyCollection:
    """An Int64 clustering key."""
    schema = base_schema(name)
    add_field(schema, "k", S.Int64).is_clustering_key = True
    return ProxyCollection(writer, coll, name, schema, vchannels)


def test_key_kinds_of_a_2_6_stream_arrive_row_by_row_with_upserts_and_deletes(
    daemon_factory, etcd_service, kafka_mock, target, target_milvus, stream
):
    """Five collections, each replicated by one task into the target Milvus (Milvus Lite, a
    real 2.3.5) and by another into a Kafka topic: a VarChar key, an auto_id Int64 key and an
    auto_id VarChar key (the target holds the source's keys, the new ones an upsert gave too),
    a partition key (every row, after upserts that move rows to another partition; the
    source's 4 partitions on 2.3.5 and in the Kafka schema event) and a clustering key (the
    flag in the schema the daemon gives: Milvus Lite 3.2.2 and 2.3.5 keep no such flag, which
    the task shows among its warnings; the Kafka schema event shows it)."""
    from tests.e2e.test_kafka_sink import Rebuilt

    w = stream.writer
    suffix = uuid.uuid4().hex[:6]
    control = f"{stream.pchannel(0)}_vcchan"
    made = {
        kind: build(w, 66001 + i, f"{kind}_{suffix}", stream.vchannels(66001 + i, 2))
        for i, (kind, build) in enumerate(
            [
                ("text", text_keys),
                ("auto", auto_ids),
                ("auto_text", auto_texts),
                ("tenants", tenants),
                ("clustered", clustered),
            ]
        )
    }
    names = [c.name for c in made.values()]
    topic = f"events_keys_{suffix}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, target.uri, stream, *names)
    to_kafka = {"kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": topic}}
    kafka_task = start_task(daemon, "", stream, *names, **to_kafka)
    for collection in made.values():
        collection.create(control)
    stream.tick_all()
    expected: dict[str, dict[Any, dict]] = {}

    # VarChar keys: inserted on both vchannels (each key goes where it hashes), upserted,
    # deleted (quotes and a backslash among them)
    text = made["text"]
    keys = SPECIAL_KEYS + [f"k{i:03d}" for i in range(20)]
    source = {k: {"key": k, "vec": vector(i), "note": f"n{i}-{k}"} for i, k in enumerate(keys)}
    assert {text.vchannel_of(k) for k in keys} == set(text.vchannels)
    text.insert(list(source.values()))
    upserted = {
        k: {"key": k, "vec": vector(100 + i), "note": f"up-{i}"}
        for i, k in enumerate([SPECIAL_KEYS[0], "it's", "k" * KEY_MAX, "k007"])
    }
    text.upsert(list(upserted.values()))
    source.update(upserted)
    text.delete(['say "hi"', "back\\slash", "k005"])
    for k in ('say "hi"', "back\\slash", "k005"):
        del source[k]
    expected["text"] = source

    # auto_id: the keys are the proxy's row ids; an upsert gives its rows new keys
    for kind in ("auto", "auto_text"):
        auto = made[kind]
        written = [{"vec": vector(i), "n": i} for i in range(30)]
        source = dict(zip(auto.insert(written), written, strict=True))
        old = sorted(source)[:3]
        new_rows = [{"id": k, "vec": vector(200 + i), "n": -i} for i, k in enumerate(old)]
        new_keys = auto.upsert(new_rows)
        assert not set(new_keys) & set(old)
        for k in old:
            del source[k]
        source.update(
            {k: {"vec": r["vec"], "n": r["n"]} for k, r in zip(new_keys, new_rows, strict=True)}
        )
        gone = sorted(source)[5:7]
        auto.delete(gone)
        for k in gone:
            del source[k]
        expected[kind] = {k: {"id": k, **row} for k, row in source.items()}

    # a partition key: rows spread over the 4 partitions, upserts moving rows to another one
    keyed = made["tenants"]
    source = {
        pk: {"id": pk, "vec": vector(pk), "tenant": TENANTS[pk % len(TENANTS)]} for pk in range(40)
    }
    assert {keyed.partition_of(r) for r in source.values()} == set(keyed.partitions)
    keyed.insert(list(source.values()))
    moved = {}
    for pk in (1, 2, 3, 4):
        before = keyed.partition_of(source[pk])
        tenant = next(t for t in TENANTS if keyed.partition_of({"tenant": t}) != before)
        moved[pk] = {"id": pk, "vec": vector(300 + pk), "tenant": tenant}
    keyed.upsert(list(moved.values()))
    source.update(moved)
    keyed.delete([4, 10, 11, 12])  # 4 after its move
    for pk in (4, 10, 11, 12):
        del source[pk]
    expected["tenants"] = source

    # a clustering key
    clust = made["clustered"]
    source = {pk: {"id": pk, "vec": vector(pk), "k": (pk * 7919) % 1000 - 500} for pk in range(20)}
    clust.insert(list(source.values()))
    source.update({pk: {"id": pk, "vec": vector(400 + pk), "k": -pk} for pk in (0, 1)})
    clust.upsert([source[0], source[1]])
    clust.delete([8, 9])
    del source[8], source[9]
    expected["clustered"] = source
    stream.tick_all()

    pk_of = {"text": "key", "auto": "id", "auto_text": "id", "tenants": "id", "clustered": "id"}
    client = target_milvus
    try:
        for kind, collection in made.items():
            name = collection.name
            wait_until(lambda n=name: client.has_collection(n), 60, f"{name} on the target")
            index_vec(client, name)
            wait_target_equal(
                daemon,
                task_id,
                lambda n=name, k=kind: target_differences(
                    client, n, pk_of[k], expected[k], by_key=k in ("text", "auto_text")
                ),
                f"{name} equal to the source, row by row",
            )

        described = client.describe_collection(made["tenants"].name)
        fields = {f["name"]: f for f in described["fields"]}
        assert fields["tenant"].get("is_partition_key"), fields["tenant"]
        if target.kind != "milvus-lite":  # Lite makes _pk_0 .. _pk_15 and _default, whatever asked
            assert described["num_partitions"] == 4, described
        for tenant in TENANTS:  # the target routes each tenant's rows by its key
            found = client.query(
                made["tenants"].name,
                filter=f'tenant == "{tenant}"',
                output_fields=["id"],
                consistency_level="Strong",
            )
            want = {pk for pk, row in expected["tenants"].items() if row["tenant"] == tenant}
            assert {r["id"] for r in found} == want, tenant
        fields = {f["name"]: f for f in client.describe_collection(made["text"].name)["fields"]}
        assert fields["key"].get("is_primary"), fields["key"]
        assert int(fields["key"]["params"]["max_length"]) == KEY_MAX
        view = task_view(daemon, task_id)
        assert view["state"] == "Running"
        # the target made the clustering key's field without the flag: said, not stopped
        note = f"collection default.{made['clustered'].name}: the target keeps no clustering key"
        assert any(w.startswith(note) for w in view["progress"]["warnings"]), view["progress"]
    finally:
        if target.kind != "milvus-lite":  # the session's 2.3.5 serves other tests
            for name in names:
                client.drop_collection(name)

    # the Kafka target: every row of the five as events, and the schemas with their key flags
    def event_differences() -> list[str]:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, kafka_task)
        got: dict[str, dict[Any, dict]] = {}
        for event in rebuilt.row_events():
            held = got.setdefault(event["collection"], {})
            if event["op"] == "delete":
                held.pop(event["pk"], None)
            else:
                held[event["pk"]] = {**event["row"], "vec": f32(event["row"]["vec"])}
        problems = []
        for kind, collection in made.items():
            want = {k: {**r, "vec": f32(r["vec"])} for k, r in expected[kind].items()}
            problems += [f"{kind}: {p}" for p in compared(want, got.get(collection.name, {}))]
        created = {e["collection"]: e for e in rebuilt.ddl if e["op"] == "create_collection"}
        schemas = {n: {f["name"]: f for f in e["schema"]["fields"]} for n, e in created.items()}
        partitions = created.get(made["tenants"].name, {}).get("num_partitions")
        if partitions != 4:
            problems.append(f"{made['tenants'].name} created with num_partitions {partitions}")
        flags = [
            (made["tenants"].name, "tenant", "is_partition_key"),
            (made["clustered"].name, "k", "is_clustering_key"),
        ]
        for name, field_name, flag in flags:
            if not schemas.get(name, {}).get(field_name, {}).get(flag):
                problems.append(f"{name}.{field_name} without {flag}: {schemas.get(name)}")
        for kind in ("auto", "auto_text"):
            auto_pk = schemas.get(made[kind].name, {}).get("id", {})
            if not auto_pk.get("primary_key"):
                problems.append(f"the auto_id key of {kind}: {auto_pk}")
        return problems

    wait_target_equal(daemon, kafka_task, event_differences, f"{topic} rebuilding the five")
    assert task_view(daemon, kafka_task)["state"] == "Running"


# --- a field added during the stream -------------------------------------------------------------


def grown_schema(
    schema: S.CollectionSchema, field_name: str, data_type: int, **params: Any
) -> S.CollectionSchema:
    """The schema rootcoord broadcasts for AddCollectionField: ``broadcastAlterCollection
    ForAddField`` (internal/rootcoord/ddl_callbacks_alter_collection_add_field.go) appends the
    field with the next field id (``nextFieldID``: the largest + 1), bumps the schema version
    and keeps the collection's properties (here the consistency level its create set). A field
    added to a collection is nullable (``params``: a default value, type params)."""
    grown = S.CollectionSchema()
    grown.CopyFrom(schema)
    grown.version = schema.version + 1
    added = add_field(grown, field_name, data_type, nullable=True, **params)
    added.fieldID = max(f.fieldID for f in schema.fields) + 1
    if not any(p.key == "consistency_level" for p in grown.properties):
        bounded = common_pb2.ConsistencyLevel.Value("Bounded")
        grown.properties.add(key="consistency_level", value=str(bounded))
    return grown


def grow_row(pk: int, gen: int = 0, *, score: bool = False, label: bool = False) -> dict:
    """A row as a client writes it: ``score`` once that field exists (a null for some rows),
    ``label`` once it exists (left out of some rows: its default fills them)."""
    row: dict[str, Any] = {"id": pk, "vec": vector(pk + 100 * gen), "tag": f"t{pk}-{gen}"}
    if score:
        row["score"] = None if pk % 3 == 0 else pk * 10 + gen
    if label and pk % 2:
        row["label"] = f"l{pk}"
    return row


LABEL_DEFAULT = "none"


def test_a_field_added_on_a_2_6_stream_reaches_kafka_and_stops_lite_naming_it(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """AddCollectionField twice (2.6 broadcasts each as an AlterCollection of the schema to the
    control channel and every vchannel), each followed by rows that use the field. A Kafka
    target: a DDL event ``add_field`` names each field, and the events of the rows written
    after it carry it (a null, a default value where the row has none; rows written before do
    not). Milvus Lite 3.2.2 cannot add a field (its AddCollectionField is "not implemented"):
    its task stops with a reason naming the collection, the field and its type, and holds
    exactly the rows written before the field (none written without it)."""
    from tests.e2e.test_kafka_sink import Rebuilt

    w = stream.writer
    coll = 66101
    name = f"grow_{uuid.uuid4().hex[:6]}"
    topic = f"events_{name}"
    schema = base_schema(name)
    add_field(schema, "tag", S.VarChar, max_length=16)
    control = f"{stream.pchannel(0)}_vcchan"
    proxy = ProxyCollection(w, coll, name, schema, stream.vchannels(coll, 2))
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    target = {"kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": topic}}
    kafka_task = start_task(daemon, "", stream, name, **target)
    lite_task = start_task(daemon, milvus_lite_service.uri, stream, name)
    proxy.create(control)
    before = {pk: grow_row(pk) for pk in range(10)}
    proxy.insert(list(before.values()))
    stream.tick_all()
    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on Milvus Lite")
    index_vec(target_client, name)
    wait_target_equal(
        daemon,
        lite_task,
        lambda: target_differences(target_client, name, "id", before),
        f"{name}: the rows written before the field",
    )

    ddl = DdlWriter(w, control)
    proxy.schema = grown_schema(schema, "score", S.Int64)
    ddl.alter_collection(coll, proxy.vchannels, ["schema"], schema=proxy.schema)
    with_score = {pk: grow_row(pk, score=True) for pk in range(10, 20)}
    proxy.insert(list(with_score.values()))
    upserted = {2: grow_row(2, 1, score=True)}  # a row written before, now with the field
    proxy.upsert(list(upserted.values()))
    proxy.delete([5])
    stream.tick_all()
    default = ("string_data", LABEL_DEFAULT)
    proxy.schema = grown_schema(proxy.schema, "label", S.VarChar, default=default, max_length=8)
    ddl.alter_collection(coll, proxy.vchannels, ["schema"], schema=proxy.schema)
    with_label = {pk: grow_row(pk, score=True, label=True) for pk in range(20, 26)}
    proxy.insert(list(with_label.values()))
    stream.tick_all()

    filled = {pk: {"label": LABEL_DEFAULT, **row} for pk, row in with_label.items()}
    expected = {**before, **with_score, **upserted, **filled}
    del expected[5]
    expected_events = {pk: {**row, "vec": f32(row["vec"])} for pk, row in expected.items()}

    def event_differences() -> list[str]:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, kafka_task)
        got = {pk: {**row, "vec": f32(row["vec"])} for pk, row in rebuilt.rows.items()}
        problems = compared(expected_events, got)
        for pk, row in got.items():
            later = {"score", "label"} & set(row) - set(expected.get(pk, {}))
            if later:
                problems.append(f"row {pk}, written before field {later}, has it: {row}")
        added = {e["field"]["name"]: e["field"] for e in rebuilt.ddl if e["op"] == "add_field"}
        shown = {
            n: (f["type"], f.get("nullable"), f.get("default_value")) for n, f in added.items()
        }
        want = {"score": ("Int64", True, None), "label": ("VarChar", True, LABEL_DEFAULT)}
        if shown != want:
            problems.append(f"add_field events: {added}")
        return problems

    wait_target_equal(daemon, kafka_task, event_differences, f"{topic} with the added fields")
    assert task_view(daemon, kafka_task)["state"] == "Running"

    wait_until(lambda: task_view(daemon, lite_task)["state"] == "Failed", 60, "the Lite task stops")
    reason = task_view(daemon, lite_task)["reason"]
    for word in (name, "score", "Int64"):
        assert word in reason, reason
    assert not target_differences(target_client, name, "id", before)
