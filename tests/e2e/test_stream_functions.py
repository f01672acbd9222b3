"""BM25 functions and the dynamic field (``$meta``) on a Milvus 2.6 stream, replicated into
Milvus Lite 3.2.2: exact on the target, or the task stops with a reason naming the collection,
the field and the function (issue 31; lesson: a task never loses rows in silence).

The stream is written by tests/harness/streaming_writer.py with columns from
tests/harness/stream_columns.py, laid out as a 2.6 proxy appends them: a BM25 collection's
Insert holds the text and not the sparse output (a 2.6 reader computes it after the WAL), and
every Insert of a dynamic collection holds a ``$meta`` column (``{}`` for a row without keys
outside the schema; with ``valid_data`` when 2.6 made the collection dynamic after its
creation, ``$meta`` then being nullable with the default ``{}``).

What the target must hold is computed here from the rows a client inserted: the text, the
keys outside the schema (compared as parsed JSON), and for full-text search the rows whose
text holds a word. A Lite collection filled directly by pymilvus with the same rows is the
reference for what Lite's BM25 makes of the same text (each row's sparse vector).

Milvus Lite 3.2.2 holds BM25 functions (it computes the output from the text, answers
full-text search, and refuses an insert that carries the output); it takes the property
``dynamicfield.enabled`` but its collection stays static, and has no AddCollectionField.
Milvus 2.3.5 keeps no function (it describes the sparse field back as a plain one).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from harness.services import wait_until
from harness.stream_columns import add_bm25, add_dynamic_field, add_field, base_schema, wal_columns
from harness.streaming_ddl_writer import DdlWriter
from pymilvus import DataType, Function, FunctionType, MilvusClient
from pymilvus.grpc_gen import schema_pb2

from tests.e2e.test_replication import rows
from tests.e2e.test_stream_field_types import compared, start_kafka_task, wait_target_equal
from tests.e2e.test_stream_value_kinds import write_story
from tests.e2e.test_streaming_source import start_task, task_view

pytestmark = pytest.mark.e2e

S = schema_pb2
WORDS = [
    *("river", "stone", "amber", "quiet", "falcon", "lantern", "meadow", "copper", "orbit"),
    *("velvet", "harbor", "cedar", "glacier", "ember", "prism", "willow", "canyon", "marble"),
    *("thunder", "saffron"),
]
QUERIES = ["falcon", "amber", "glacier", "saffron", "thunder", "quiet"]
FUNCTION = "text_bm25"


# --- BM25 ----------------------------------------------------------------------------------------


def bm25_schema(name: str) -> schema_pb2.CollectionSchema:
    """id (Int64 key), vec (FloatVector 4), text (VarChar, analyzer on), sparse (its BM25)."""
    schema = base_schema(name)
    add_field(schema, "text", S.VarChar, max_length=512)
    add_field(schema, "sparse", S.SparseFloatVector)
    add_bm25(schema, FUNCTION, "text", "sparse")
    return schema


def text_of(pk: int, gen: int = 0) -> str:
    """A row's text: a few words of WORDS, some repeated, chosen by ``pk`` and ``gen``."""
    pick = random.Random(pk * 31 + gen * 1009)
    words = [pick.choice(WORDS) for _ in range(pick.randint(3, 9))]
    return " ".join(w.capitalize() if i % 4 == 0 else w for i, w in enumerate(words))


def bm25_row(pk: int, gen: int = 0) -> dict[str, Any]:
    return {"id": pk, "vec": [pk * 0.5, 1.0, -1.0, float(gen)], "text": text_of(pk, gen)}


def reference_collection(client: MilvusClient, name: str, source: dict[int, dict]) -> None:
    """The same rows inserted by pymilvus into a collection made by pymilvus with the same
    schema and function: what Lite makes of the text when a client writes it."""
    schema = client.create_schema(enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=4)
    schema.add_field("text", DataType.VARCHAR, max_length=512, enable_analyzer=True)
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_function(
        Function(
            name=FUNCTION,
            function_type=FunctionType.BM25,
            input_field_names=["text"],
            output_field_names=["sparse"],
        )
    )
    client.create_collection(name, schema=schema)
    client.insert(name, list(source.values()))
    load_bm25(client, name)


def load_bm25(client: MilvusClient, name: str) -> None:
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    client.create_index(name, index)
    client.load_collection(name)


def full_text_hits(client: MilvusClient, name: str, word: str) -> set[int]:
    found = client.search(
        name,
        [word],
        anns_field="sparse",
        limit=100,
        search_params={"metric_type": "BM25"},
        consistency_level="Strong",
    )
    return {hit["id"] for hit in found[0]}


def test_a_bm25_collection_arrives_with_its_function_and_answers_full_text_search_the_same(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    w = stream.writer
    coll = 64001
    suffix = uuid.uuid4().hex[:6]
    name, reference = f"bm25_{suffix}", f"bm25ref_{suffix}"
    schema = bm25_schema(name)
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    w.create_collection(coll, name, [v0, v1], schema=schema)
    stream.tick_all()
    source = {pk: bm25_row(pk) for pk in range(40)}
    for vchannel, pks in ((v0, range(20)), (v1, range(20, 40))):
        columns = wal_columns(schema, [source[pk] for pk in pks])
        assert "sparse" not in {c.field_name for c in columns}  # the WAL holds the text only
        w.insert(vchannel, coll, list(pks), columns=columns)
    upserted = {pk: bm25_row(pk, gen=1) for pk in (1, 2, 3, 21)}
    for vchannel, pks in ((v0, [1, 2, 3]), (v1, [21])):
        batch = [upserted[pk] for pk in pks]
        w.upsert(vchannel, coll, pks, columns=wal_columns(schema, batch))
    source.update(upserted)
    w.delete(v1, coll, [30, 31])
    del source[30], source[31]
    stream.tick_all()

    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
    described = target_client.describe_collection(name)
    functions = [
        (f["name"], f["type"], f["input_field_names"], f["output_field_names"])
        for f in described["functions"]
    ]
    assert functions == [(FUNCTION, FunctionType.BM25, ["text"], ["sparse"])], described
    fields = {f["name"]: f for f in described["fields"]}
    assert fields["sparse"].get("is_function_output"), fields["sparse"]
    load_bm25(target_client, name)
    reference_collection(target_client, reference, source)
    expected_sparse = {
        pk: row["sparse"] for pk, row in rows(target_client, reference, "id").items()
    }

    def bm25_differences() -> list[str]:
        got = rows(target_client, name, "id")
        problems = [f"missing {sorted(set(source) - set(got))}"] if set(source) - set(got) else []
        if set(got) - set(source):
            problems.append(f"extra {sorted(set(got) - set(source))}")
        for pk in sorted(set(source) & set(got)):
            if got[pk]["text"] != source[pk]["text"]:
                problems.append(f"row {pk} text {got[pk]['text']!r} != {source[pk]['text']!r}")
            if got[pk]["sparse"] != expected_sparse[pk]:
                problems.append(f"row {pk} sparse {got[pk]['sparse']} != {expected_sparse[pk]}")
        return problems

    wait_target_equal(daemon, task_id, bm25_differences, f"{name} equal to the source, row by row")
    for word in QUERIES:
        holding = {pk for pk, row in source.items() if word in row["text"].lower().split()}
        assert holding, f"no row holds {word!r}: choose other words"
        assert full_text_hits(target_client, name, word) == holding, word
        assert full_text_hits(target_client, reference, word) == holding, word
    assert task_view(daemon, task_id)["state"] == "Running"


def test_a_bm25_collection_reaches_a_kafka_target_with_its_function_and_its_text(
    daemon_factory, etcd_service, kafka_mock, stream
):
    """A Kafka target's ``create_collection`` event names the function (type, input, output)
    and marks its output field; the row events carry the text the client wrote, through upserts
    and deletes, and no output (the WAL holds none): a consumer computes it from the text, as a
    Milvus target does."""
    from tests.e2e.test_kafka_sink import Rebuilt

    name = f"kbm25_{uuid.uuid4().hex[:6]}"
    topic = f"events_{name}"  # start_kafka_task's
    daemon, task_id = start_kafka_task(daemon_factory, etcd_service, kafka_mock, stream, name)
    source = {pk: bm25_row(pk) for pk in range(20)}
    upserted = {pk: bm25_row(pk, gen=1) for pk in (1, 2)}
    batches = [(0, range(10)), (1, range(10, 20))]
    write_story(stream, 64101, bm25_schema(name), source, batches, (0, upserted), (1, [15]))
    function = {
        "name": FUNCTION,
        "type": "BM25",
        "input_field_names": ["text"],
        "output_field_names": ["sparse"],
    }

    def event_differences() -> list[str]:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        got = rebuilt.rows
        problems = compared(source, got)  # id, vec and text
        problems += [
            f"row {pk} has {sorted(set(row) - set(source[pk]))}"  # no sparse
            for pk, row in got.items()
            if pk in source and set(row) - set(source[pk])
        ]
        created = [e for e in rebuilt.ddl if e["op"] == "create_collection"]
        if not created:
            return [*problems, "no create_collection event"]
        view = created[0]["schema"]
        if view.get("functions") != [function]:
            problems.append(f"functions {view.get('functions')} != {[function]}")
        fields = {f["name"]: f for f in view["fields"]}
        if not fields["sparse"].get("is_function_output"):
            problems.append(f"sparse not marked as the function's output: {fields['sparse']}")
        if fields["text"].get("params", {}).get("enable_analyzer") != "true":
            problems.append(f"text without its analyzer: {fields['text']}")
        return problems

    wait_target_equal(daemon, task_id, event_differences, f"{topic} holding {name}'s text")
    assert task_view(daemon, task_id)["state"] == "Running"


def test_a_target_without_bm25_stops_the_task_naming_collection_field_and_function(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """A real Milvus 2.3.5 target knows no functions (nor sparse vectors): the task stops
    with a reason naming the collection, the output field and the function, and the target
    holds no row of it."""
    w = stream.writer
    coll = 64101
    name = f"bm25old_{uuid.uuid4().hex[:6]}"
    schema = bm25_schema(name)
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    uri = milvus_source_rocksmq.uri
    task_id = start_task(daemon, uri, stream, name)
    (v0,) = stream.vchannels(coll, 1)
    w.create_collection(coll, name, [v0], schema=schema)
    w.insert(v0, coll, list(range(5)), columns=wal_columns(schema, [bm25_row(p) for p in range(5)]))
    stream.tick_all()

    client = MilvusClient(uri=uri, dedicated=True)
    try:
        wait_until(lambda: task_view(daemon, task_id)["state"] == "Failed", 60, f"{name} stopped")
        reason = task_view(daemon, task_id)["reason"]
        for word in (name, "sparse", FUNCTION, "BM25"):
            assert word in reason, reason
        if client.has_collection(name):
            assert client.get_collection_stats(name)["row_count"] == 0
    finally:
        if client.has_collection(name):
            client.drop_collection(name)
        client.close()


# --- the dynamic field -----------------------------------------------------------------------


def dynamic_row(pk: int, gen: int = 0) -> dict[str, Any]:
    """A row as a client inserts it into a dynamic collection: id, vec, tag and, for most
    rows, keys outside the schema: nested objects and lists, unicode keys and values."""
    row: dict[str, Any] = {"id": pk, "vec": [1.0, float(pk), 0.5, float(gen)], "tag": f"t{pk}"}
    if pk % 5 == 4:
        return row  # no key outside the schema: "$meta" is {}
    row["größe"] = pk * 1.5 + gen
    row["標籤"] = ["ü", f"g{gen}", {"深": {"x": [pk, None, True]}}]
    row["nested"] = {"a": {"b": {"c": pk - gen, "s": "naïve ☃"}}, "empty": {}, "list": []}
    if gen:
        row["only_after_upsert"] = {"k": "v"}
    else:
        row["only_before_upsert"] = f"old-{pk}"
    return row


def dynamic_schema(name: str, *, since_2_6_alter: bool = False) -> schema_pb2.CollectionSchema:
    schema = base_schema(name)
    add_field(schema, "tag", S.VarChar, max_length=32)
    add_dynamic_field(schema, since_2_6_alter=since_2_6_alter)
    return schema


STATIC = {"id", "vec", "tag"}


def outside_the_schema(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in STATIC}


def dynamic_differences(expected: dict[int, dict], client: MilvusClient, name: str) -> list[str]:
    got = rows(client, name, "id")
    problems = [f"missing {sorted(set(expected) - set(got))}"] if set(expected) - set(got) else []
    if set(got) - set(expected):
        problems.append(f"extra {sorted(set(got) - set(expected))}")
    for pk in sorted(set(expected) & set(got)):
        want, have = expected[pk], got[pk]
        if have["tag"] != want["tag"]:
            problems.append(f"row {pk} tag {have['tag']!r} != {want['tag']!r}")
        if outside_the_schema(have) != outside_the_schema(want):
            problems.append(
                f"row {pk} keys outside the schema {outside_the_schema(have)!r} != "
                f"{outside_the_schema(want)!r}"
            )
    return problems


def index_vec(client: MilvusClient, name: str) -> None:
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_index(name, index)


def dynamic_rows_arrive(
    daemon: Any, task_id: str, target_client: MilvusClient, name: str, source: dict[int, dict]
) -> None:
    """The target's collection is dynamic and holds ``source``'s rows, keys outside the schema
    included; the task still runs."""
    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
    assert target_client.describe_collection(name)["enable_dynamic_field"]
    index_vec(target_client, name)
    wait_target_equal(
        daemon,
        task_id,
        lambda: dynamic_differences(source, target_client, name),
        f"{name} equal to the source, keys outside the schema included",
    )
    assert task_view(daemon, task_id)["state"] == "Running"


def test_keys_outside_the_schema_arrive_as_they_were_with_upserts_and_deletes(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """A collection created dynamic (``$meta`` neither nullable nor with a default, as every
    version makes it at create)."""
    w = stream.writer
    coll = 64201
    name = f"dyn_{uuid.uuid4().hex[:6]}"
    schema = dynamic_schema(name)
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    w.create_collection(coll, name, [v0, v1], schema=schema)
    stream.tick_all()
    source = {pk: dynamic_row(pk) for pk in range(30)}
    for vchannel, pks in ((v0, range(15)), (v1, range(15, 30))):
        w.insert(vchannel, coll, list(pks), columns=wal_columns(schema, [source[p] for p in pks]))
    # upserts replace the keys (Milvus keeps none of the old row's: the new row is whole)
    upserted = {pk: dynamic_row(pk, gen=1) for pk in (0, 1, 4, 9)}
    w.upsert(v0, coll, list(upserted), columns=wal_columns(schema, list(upserted.values())))
    source.update(upserted)
    w.delete(v1, coll, [16, 17])
    del source[16], source[17]
    stream.tick_all()

    dynamic_rows_arrive(daemon, task_id, target_client, name, source)


def test_a_collection_made_dynamic_by_2_6_after_its_creation(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """2.6 can enable the dynamic field on an existing collection (AlterCollection
    ``dynamicfield.enabled``): its ``$meta`` comes in a schema change, nullable with the
    default ``{}``, and the Inserts after it carry ``$meta`` with ``valid_data``. The target
    must be made dynamic too, or, when it cannot be (Milvus Lite), the task stops naming the
    collection and ``$meta`` before a row with keys outside the schema is written there."""
    w = stream.writer
    coll = 64301
    name = f"dynlater_{uuid.uuid4().hex[:6]}"
    before = dynamic_schema(name)
    before.enable_dynamic_field = False
    del before.fields[-1]  # no $meta yet
    after = dynamic_schema(name, since_2_6_alter=True)
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    (v0,) = stream.vchannels(coll, 1)
    w.create_collection(coll, name, [v0], schema=before)
    static = {pk: {"id": pk, "vec": [1.0, 2.0, 3.0, float(pk)], "tag": f"s{pk}"} for pk in range(5)}
    w.insert(v0, coll, list(static), columns=wal_columns(before, list(static.values())))
    stream.tick_all()
    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
    ddl = DdlWriter(w, stream.pchannel(0) + "_vcchan")
    ddl.alter_collection(
        coll,
        [v0],
        ["schema", "properties"],
        schema=after,
        properties={"dynamicfield.enabled": "true"},
    )
    later = {pk: dynamic_row(pk) for pk in range(10, 20)}
    w.insert(v0, coll, list(later), columns=wal_columns(after, list(later.values())))
    stream.tick_all()

    index_vec(target_client, name)
    if target_client.describe_collection(name)["enable_dynamic_field"]:
        expected = {**static, **later}
        wait_until(
            lambda: not dynamic_differences(expected, target_client, name), 60, f"{name} equal"
        )
        assert task_view(daemon, task_id)["state"] == "Running"
        return
    wait_until(lambda: task_view(daemon, task_id)["state"] == "Failed", 60, f"{name} stopped")
    reason = task_view(daemon, task_id)["reason"]
    for word in (name, "$meta (JSON, the dynamic field)"):
        assert word in reason, reason
    got = rows(target_client, name, "id")
    assert set(got) == set(static), sorted(got)  # nothing after the change, nothing lost before


def test_rows_of_a_2_6_dynamic_field_with_its_default_arrive_with_their_keys(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """A collection 2.6 made dynamic before the task: its catalog holds ``$meta`` nullable with
    the default ``{}``, and every Insert's ``$meta`` carries ``valid_data``. The target's
    collection is made dynamic and every row arrives with its keys, upserts and deletes too."""
    import etcd3
    from harness.catalog26_writer import Catalog26Writer

    w = stream.writer
    coll = 64401
    name = f"dyn26_{uuid.uuid4().hex[:6]}"
    schema = dynamic_schema(name, since_2_6_alter=True)
    pchannels = [stream.pchannel(i) for i in range(stream.channels)]
    etcd = etcd3.client(host=etcd_service.host, port=etcd_service.port, timeout=10)
    try:
        catalog = Catalog26Writer(etcd, f"{stream.prefix}-meta", tso=w.tso)
        catalog.register_pchannels(pchannels)
        made = catalog.create_collection(coll, name, pchannels, schema=schema, wal=w)
    finally:
        etcd.close()
    v0, v1 = made.vchannels[:2]
    source = {pk: dynamic_row(pk) for pk in range(20)}
    w.insert(v0, coll, list(range(10)), columns=wal_columns(schema, [source[p] for p in range(10)]))
    stream.tick_all()
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    later = [source[p] for p in range(10, 20)]
    w.insert(v1, coll, list(range(10, 20)), columns=wal_columns(schema, later))
    upserted = {pk: dynamic_row(pk, gen=1) for pk in (2, 3, 12)}
    w.upsert(v0, coll, [2, 3], columns=wal_columns(schema, [upserted[2], upserted[3]]))
    w.upsert(v1, coll, [12], columns=wal_columns(schema, [upserted[12]]))
    source.update(upserted)
    w.delete(v0, coll, [5])
    del source[5]
    stream.tick_all()

    dynamic_rows_arrive(daemon, task_id, target_client, name, source)


# --- a function added later ------------------------------------------------------------------


def _bm25_added_later(stream, coll: int, name: str) -> list[int]:
    """The collection made without a function (its sparse field a plain one), rows written,
    then 2.6's AlterCollection of the schema adding the BM25 function; the keys written."""
    w = stream.writer
    before = base_schema(name)
    add_field(before, "text", S.VarChar, max_length=512)
    add_field(before, "sparse", S.SparseFloatVector)
    after = bm25_schema(name)
    (v0,) = stream.vchannels(coll, 1)
    w.create_collection(coll, name, [v0], schema=before)
    rows = [{**bm25_row(p), "sparse": {p: 1.0}} for p in range(5)]
    w.insert(v0, coll, list(range(5)), columns=wal_columns(before, rows))
    stream.tick_all()
    DdlWriter(w, stream.pchannel(0) + "_vcchan").alter_collection(
        coll, [v0], ["schema"], schema=after
    )
    stream.tick_all()
    return list(range(5))


def test_a_function_added_later_stops_a_target_that_cannot_add_it_naming_it(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """Milvus Lite 3.2.2 holds BM25 functions but cannot add one to a collection (no
    AddCollectionFunction): the task stops naming the collection and the function (it used to
    run on, the function dropped in silence: the target's sparse field stayed a plain one)."""
    name = f"bm25later_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    _bm25_added_later(stream, 64401, name)
    wait_until(lambda: task_view(daemon, task_id)["state"] == "Failed", 60, f"{name} stopped")
    reason = task_view(daemon, task_id)["reason"]
    assert (
        f"collection default.{name}: the source added function {FUNCTION} (BM25 of text into "
        "sparse), and the target cannot add a function (it does not offer "
        "AddCollectionFunction)" in reason
    ), reason
    assert target_client.describe_collection(name)["functions"] == []


def test_a_function_added_later_reaches_a_kafka_target_as_an_event(
    daemon_factory, etcd_service, kafka_mock, stream
):
    from tests.e2e.test_kafka_sink import Rebuilt

    name = f"kbm25later_{uuid.uuid4().hex[:6]}"
    daemon, task_id = start_kafka_task(daemon_factory, etcd_service, kafka_mock, stream, name)
    _bm25_added_later(stream, 64402, name)
    function = {
        "name": FUNCTION,
        "type": "BM25",
        "input_field_names": ["text"],
        "output_field_names": ["sparse"],
    }

    def added() -> list[dict] | None:
        events = Rebuilt(kafka_mock.bootstrap, f"events_{name}", task_id).ddl
        found = [e for e in events if e["op"] == "add_function"]
        return found or None

    (event,) = wait_until(added, 60, f"the add_function event of {name}")
    assert event["function"] == function, event
    assert task_view(daemon, task_id)["state"] == "Running"
