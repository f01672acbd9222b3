"""Every field type of a Milvus 2.6 stream, replicated into Milvus Lite 3.2.2: exact on the
target, or the task stops with a reason naming the collection, the field and the type before
any row of that collection is written (issue 31; lesson: a task never loses rows in silence).

The stream is written by tests/harness/streaming_writer.py with columns from
tests/harness/stream_columns.py, which lays them out as a 2.6 proxy appends them (nulls
expanded with ``valid_data``, defaults filled, Geometry as WKB, Timestamptz as UTC
microseconds, an Array of Struct flattened into ``<struct>[<sub>]`` columns). What the target
must hold is computed here from the rows a client inserted, not from those columns.

Milvus Lite 3.2.2 holds Bool, Int8-64, Float, Double, VarChar, JSON, Array (each element
type), Geometry (POINT and POLYGON), Timestamptz, FloatVector and SparseFloatVector, nullable
fields and default values; it refuses BinaryVector, Float16Vector, BFloat16Vector and
Int8Vector at create, and creates a collection with an Array of Struct without the field.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from harness.services import ServiceStartError, wait_until
from harness.stream_columns import add_field, base_schema, iso_to_micros, wal_columns
from pymilvus import MilvusClient
from pymilvus.grpc_gen import schema_pb2

from tests.e2e.test_replication import rows
from tests.e2e.test_streaming_source import start_task, task_view

pytestmark = pytest.mark.e2e

S = schema_pb2
ELEMENTS = {
    "bool": S.Bool,
    "i8": S.Int8,
    "i16": S.Int16,
    "i32": S.Int32,
    "i64": S.Int64,
    "f": S.Float,
    "d": S.Double,
    "s": S.VarChar,
}
DEFAULTS = {"d_i64": 7, "d_s": "dflt", "d_f": 2.5, "d_geo": "POINT (0 0)", "dn_i32": 3}
DEFAULT_TZ = "2025-01-01T00:00:00+00:00"
EPOCH_2026 = datetime(2026, 1, 1, tzinfo=UTC)


def all_types_schema(name: str) -> schema_pb2.CollectionSchema:
    schema = base_schema(name)
    add_field(schema, "vec2", S.FloatVector, dim=2)
    add_field(schema, "sparse", S.SparseFloatVector)
    for field, data_type in [("b", S.Bool), ("i8", S.Int8), ("i16", S.Int16), ("i32", S.Int32)]:
        add_field(schema, field, data_type)
    for field, data_type in [("i64", S.Int64), ("f", S.Float), ("d", S.Double), ("j", S.JSON)]:
        add_field(schema, field, data_type)
    add_field(schema, "s", S.VarChar, max_length=64)
    add_field(schema, "ja", S.JSON)  # a JSON array (a 2.6 proxy takes any JSON value)
    for short, element in ELEMENTS.items():
        params = {"max_length": 16} if element == S.VarChar else {}
        add_field(schema, f"arr_{short}", S.Array, element_type=element, max_capacity=4, **params)
    add_field(schema, "geo", S.Geometry)
    add_field(schema, "tz", S.Timestamptz)
    add_field(schema, "n_i32", S.Int32, nullable=True)
    add_field(schema, "n_s", S.VarChar, nullable=True, max_length=16)
    add_field(schema, "n_j", S.JSON, nullable=True)
    add_field(schema, "n_geo", S.Geometry, nullable=True)
    add_field(schema, "n_arr", S.Array, element_type=S.Int64, nullable=True, max_capacity=4)
    add_field(schema, "d_i64", S.Int64, default=("long_data", DEFAULTS["d_i64"]))
    add_field(schema, "d_s", S.VarChar, default=("string_data", DEFAULTS["d_s"]), max_length=8)
    add_field(schema, "d_f", S.Double, default=("double_data", DEFAULTS["d_f"]))
    add_field(schema, "d_geo", S.Geometry, default=("string_data", DEFAULTS["d_geo"]))
    add_field(schema, "d_tz", S.Timestamptz, default=("timestamptz_data", micros(DEFAULT_TZ)))
    add_field(schema, "dn_i32", S.Int32, nullable=True, default=("int_data", DEFAULTS["dn_i32"]))
    return schema


def add_chunks(schema: Any, first_id: int) -> None:
    """An Array of Struct "chunks" (text[] and emb[] of 2-float vectors), field ids from
    ``first_id``, as pymilvus's schema protos lay it out."""
    chunks = schema.struct_array_fields.add(fieldID=first_id, name="chunks")
    text = chunks.fields.add(fieldID=first_id + 1, name="chunks[text]", data_type=S.Array)
    text.element_type = S.VarChar
    text.type_params.add(key="max_length", value="32")
    text.type_params.add(key="max_capacity", value="4")
    emb = chunks.fields.add(fieldID=first_id + 2, name="chunks[emb]", data_type=S.ArrayOfVector)
    emb.element_type = S.FloatVector
    emb.type_params.add(key="dim", value="2")
    emb.type_params.add(key="max_capacity", value="4")


def micros(text: str) -> int:
    return iso_to_micros(text)


def client_row(pk: int, gen: int = 0) -> dict[str, Any]:
    """A row as a client inserts it (generation ``gen``: an upsert's new values)."""
    v = pk + 1000 * gen
    row: dict[str, Any] = {
        "id": pk,
        "vec": [v * 0.5, -float(v), 1 / (v + 3), 2.0],
        "vec2": [float(v), 0.25],
        "sparse": {pk % 7: 0.5 + v, 100 + pk: 1.25},
        "b": v % 2 == 0,
        "i8": (v * 37) % 256 - 128,
        "i16": -3 * v,
        "i32": v * 100_003,
        "i64": (v - 30) * 10**12 + 7,
        "f": v / 3,
        "d": v / 7 + 1e-9,
        "s": f"s-{v}-ü",
        "j": {"k": v, "l": [1, "x", None], "o": {"f": 0.5}},
        "ja": ["x", v, [True, None], {"f": v / 4}],
        "arr_bool": [True, v % 3 == 0],
        "arr_i8": [-128, 127, v % 100],
        "arr_i16": [-32768, v],
        "arr_i32": [v, -v],
        "arr_i64": [2**40 + v],
        "arr_f": [0.1 * v],
        "arr_d": [v / 9],
        "arr_s": ["a", f"t{v}"],
        "geo": (
            f"POINT ({v} {v / 4})"
            if pk % 2
            else f"POLYGON ((0 0, {v + 1} 0, {v + 1} {v + 2.5}, 0 0))"
        ),
        "tz": (EPOCH_2026 + timedelta(seconds=v, microseconds=pk)).isoformat(),
        "n_i32": None if pk % 3 == 0 else v,
        "n_s": None if pk % 4 == 0 else f"n{v}",
        "n_j": None if pk % 5 == 0 else {"v": v},
        "n_geo": None if pk % 2 == 0 else f"POINT ({v} 1)",
        "n_arr": None if pk % 3 == 1 else [v, v + 1],
    }
    if (pk + gen) % 2:  # the other rows are written without them: the proxy fills defaults
        row.update(
            d_i64=-v,
            d_s=f"x{v % 100}",
            d_f=v * 1.5,
            d_geo=f"POINT (1 {v})",
            d_tz=(EPOCH_2026 - timedelta(days=v)).isoformat(),
            dn_i32=v,
        )
    return row


# --- what the target must hold, and what it does -------------------------------------------------


def _f32(value: float) -> float:
    return float(np.float32(value))


def _geometry(text: str | None) -> tuple | None:
    if text is None:
        return None
    kind = text.strip().split("(")[0].strip().upper()
    return kind, tuple(float(n) for n in re.findall(r"-?[\d.]+(?:e-?\d+)?", text))


def normalized(row: dict[str, Any]) -> dict[str, Any]:
    """A row in the terms rows are compared in: float32 fields as the float32 they are stored
    as, Geometry as its kind and coordinates, Timestamptz in UTC microseconds, sparse vectors
    as index -> float32 maps."""
    out = dict(row)
    for field in ("vec", "vec2", "arr_f"):
        out[field] = [_f32(x) for x in row[field]]
    out["sparse"] = {int(k): _f32(v) for k, v in row["sparse"].items()}
    out["f"] = _f32(row["f"])
    for field in ("geo", "n_geo", "d_geo"):
        out[field] = _geometry(row[field])
    for field in ("tz", "d_tz"):
        value = row[field]
        out[field] = value if isinstance(value, int) else micros(value)
    return out


def expected_row(row: dict[str, Any]) -> dict[str, Any]:
    """A client row as the target must read it back: defaults filled, then normalized."""
    return normalized({**DEFAULTS, "d_tz": DEFAULT_TZ, **row})


def target_row(got: dict[str, Any]) -> dict[str, Any]:
    """A row read from the target, normalized."""
    return normalized(got)


def wait_target_equal(
    daemon: Any, task_id: str, differences: Callable[[], list[str]], what: str
) -> None:
    """Wait until ``differences`` finds none; else fail naming them and the task's state."""
    problems: list[str] = []

    def same() -> bool:
        nonlocal problems
        try:
            problems = differences()
        except Exception as exc:  # noqa: BLE001 - shown if it lasts
            problems = [f"reading failed: {exc!r}"]
        return not problems

    try:
        wait_until(same, 60, what)
    except ServiceStartError:
        task = task_view(daemon, task_id)
        raise AssertionError(
            f"{len(problems)} differences: {problems[:12]}; task {task['state']}: "
            f"{task.get('reason')}"
        ) from None


def load(client: MilvusClient, name: str) -> None:
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    index.add_index("vec2", index_type="FLAT", metric_type="L2")
    index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
    client.create_index(name, index)


def differences(expected: dict[int, dict], client: MilvusClient, name: str) -> list[str]:
    got = {pk: target_row(row) for pk, row in rows(client, name, "id").items()}
    return compared(expected, got)


def compared(expected: dict[int, dict], got: dict[int, dict]) -> list[str]:
    """Every difference between the rows expected and those found, field by field."""
    problems = [f"missing {sorted(set(expected) - set(got))}"] if set(expected) - set(got) else []
    if set(got) - set(expected):
        problems.append(f"extra {sorted(set(got) - set(expected))}")
    for pk in sorted(set(expected) & set(got)):
        for field, value in expected[pk].items():
            if got[pk].get(field) != value:
                problems.append(f"row {pk} field {field}: {got[pk].get(field)!r} != {value!r}")
    return problems


# --- the tests ---------------------------------------------------------------------------------


def test_every_type_lite_holds_arrives_exact_with_upserts_and_deletes(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    w = stream.writer
    coll = 61001
    name = f"types_{uuid.uuid4().hex[:6]}"
    schema = all_types_schema(name)
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    w.create_collection(coll, name, [v0, v1], schema=schema)
    stream.tick_all()
    source = {pk: client_row(pk) for pk in range(40)}
    for vchannel, pks in ((v0, range(20)), (v1, range(20, 40))):
        batch = [source[pk] for pk in pks]
        w.insert(vchannel, coll, list(pks), columns=wal_columns(schema, batch))
    # upserts (a transaction of an Insert and a Delete): defaults and nulls change sides
    upserted = {pk: client_row(pk, gen=1) for pk in (0, 1, 2, 3)}
    w.upsert(v0, coll, list(upserted), columns=wal_columns(schema, list(upserted.values())))
    source.update(upserted)
    w.delete(v1, coll, [25, 26])
    del source[25], source[26]
    stream.tick_all()

    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
    load(target_client, name)
    expected = {pk: expected_row(row) for pk, row in source.items()}
    wait_target_equal(
        daemon,
        task_id,
        lambda: differences(expected, target_client, name),
        f"{name} equal to the source, field by field",
    )
    fields = {f["name"]: f for f in target_client.describe_collection(name)["fields"]}
    assert all(fields[f].get("nullable") for f in ("n_i32", "n_s", "n_j", "n_geo", "n_arr"))
    assert task_view(daemon, task_id)["state"] == "Running"


def refused_schemas(suffix: str) -> dict[str, tuple[schema_pb2.CollectionSchema, str, str]]:
    """Collection name -> (schema, the field Lite cannot hold, its type's name)."""
    out = {}
    for field, data_type, dim in [
        ("bin", S.BinaryVector, 16),
        ("half", S.Float16Vector, 2),
        ("brain", S.BFloat16Vector, 2),
        ("small", S.Int8Vector, 4),
    ]:
        name = f"{field}_{suffix}"
        schema = base_schema(name)
        add_field(schema, field, data_type, dim=dim)
        out[name] = (schema, field, S.DataType.Name(data_type))
    name = f"chunks_{suffix}"
    schema = base_schema(name)
    schema.enable_dynamic_field = True  # where Lite would put the flattened columns
    add_chunks(schema, 200)
    out[name] = (schema, "chunks", "ArrayOfStruct")
    # only scalar sub-fields: Lite would take their columns into $meta without a word
    name = f"tags_{suffix}"
    schema = base_schema(name)
    schema.enable_dynamic_field = True
    tags = schema.struct_array_fields.add(fieldID=200, name="tags")
    label = tags.fields.add(fieldID=201, name="tags[label]", data_type=S.Array)
    label.element_type = S.VarChar
    label.type_params.add(key="max_length", value="32")
    label.type_params.add(key="max_capacity", value="4")
    out[name] = (schema, "tags", "ArrayOfStruct")
    return out


def refused_row(pk: int) -> dict[str, Any]:
    return {
        "id": pk,
        "vec": [1.0, 2.0, 3.0, float(pk)],
        "bin": [pk, 255 - pk],
        "half": [0.5, float(pk)],
        "brain": [0.5, float(pk)],
        "small": [-1, 0, 1, pk % 100],
        "chunks": [{"text": f"c{pk}", "emb": [0.5, float(pk)]}, {"text": "d", "emb": [1.0, 2.0]}],
        "tags": [{"label": f"l{pk}"}],
    }


def test_a_type_lite_cannot_hold_stops_the_task_naming_collection_field_and_type(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """One task per collection: each stops with a reason naming what it cannot replicate,
    and no row of its collection is on the target."""
    w = stream.writer
    suffix = uuid.uuid4().hex[:6]
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    collections = refused_schemas(suffix)
    tasks = {
        name: start_task(daemon, milvus_lite_service.uri, stream, name) for name in collections
    }
    for i, (name, (schema, _, _)) in enumerate(collections.items()):
        coll = 62001 + i
        (v0,) = stream.vchannels(coll, 1)
        w.create_collection(coll, name, [v0], schema=schema)
        batch = [refused_row(pk) for pk in range(10)]
        w.insert(v0, coll, list(range(10)), columns=wal_columns(schema, batch))
    stream.tick_all()

    for name, (_, field, type_name) in collections.items():
        task_id = tasks[name]
        wait_until(
            lambda t=task_id: task_view(daemon, t)["state"] == "Failed", 60, f"{name} stopped"
        )
        reason = task_view(daemon, task_id)["reason"]
        for word in (name, field, type_name):
            assert word in reason, reason
        if target_client.has_collection(name):  # made, but without the field: left empty
            index = target_client.prepare_index_params()
            index.add_index("vec", index_type="FLAT", metric_type="L2")
            target_client.create_index(name, index)
            target_client.load_collection(name)
            count = target_client.query(
                name, filter="", output_fields=["count(*)"], consistency_level="Strong"
            )
            assert count[0]["count(*)"] == 0, (name, count)


def test_a_2_3_target_stops_the_task_on_fields_it_cannot_hold(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """A real Milvus 2.3.5 target: a nullable field (2.3 keeps no such flag: a null would
    arrive as 0) and the 2.6 types it does not know stop their tasks by name."""
    w = stream.writer
    suffix = uuid.uuid4().hex[:6]
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    cases = {}
    for field, data_type, params, type_name in [
        ("maybe", S.Int32, {"nullable": True}, "nullable"),
        ("place", S.Geometry, {}, "Geometry"),
        ("moment", S.Timestamptz, {}, "Timestamptz"),
        ("sparse", S.SparseFloatVector, {}, "SparseFloatVector"),
        ("small", S.Int8Vector, {"dim": 4}, "Int8Vector"),
    ]:
        name = f"{field}_{suffix}"
        schema = base_schema(name)
        add_field(schema, field, data_type, **params)
        cases[name] = (schema, field, type_name)
    uri = milvus_source_rocksmq.uri
    tasks = {name: start_task(daemon, uri, stream, name) for name in cases}
    rows_of = {
        "maybe": None,
        "place": "POINT (1 2)",
        "moment": "2026-01-01T00:00:00+00:00",
        "sparse": {1: 0.5},
        "small": [1, -2, 3, -4],
    }
    for i, (name, (schema, field, _)) in enumerate(cases.items()):
        coll = 63001 + i
        (v0,) = stream.vchannels(coll, 1)
        w.create_collection(coll, name, [v0], schema=schema)
        batch = [{"id": pk, "vec": [1.0] * 4, field: rows_of[field]} for pk in range(5)]
        w.insert(v0, coll, list(range(5)), columns=wal_columns(schema, batch))
    stream.tick_all()

    client = MilvusClient(uri=uri, dedicated=True)
    try:
        for name, (_, field, type_name) in cases.items():
            task_id = tasks[name]
            wait_until(
                lambda t=task_id: task_view(daemon, t)["state"] == "Failed", 60, f"{name} stopped"
            )
            reason = task_view(daemon, task_id)["reason"]
            for word in (name, field, type_name):
                assert word in reason, reason
            if client.has_collection(name):
                assert client.get_collection_stats(name)["row_count"] == 0
    finally:
        for name in cases:
            if client.has_collection(name):
                client.drop_collection(name)
        client.close()


def test_a_2_3_target_refuses_float16_and_bfloat16_before_creating_them_and_stays_up(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """A 2.3.5 creates a Float16Vector or BFloat16Vector collection, then its query node dies
    when it is loaded. Decided from the target's version before anything is created there:
    the task stops naming collection, fields and types, the collection is not on the target,
    and the target still serves another task's collection (loaded and queried after)."""
    w = stream.writer
    suffix = uuid.uuid4().hex[:6]
    refused, kept = f"halves_{suffix}", f"kept_{suffix}"
    schema = base_schema(refused)
    del schema.fields[1:]  # the key only, then the two 16-bit vectors
    add_field(schema, "half", S.Float16Vector, dim=2)
    add_field(schema, "brain", S.BFloat16Vector, dim=2)
    uri = milvus_source_rocksmq.uri
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    refused_task = start_task(daemon, uri, stream, refused)
    kept_task = start_task(daemon, uri, stream, kept)
    (v0,) = stream.vchannels(63101, 1)
    w.create_collection(63101, refused, [v0], schema=schema)
    batch = [{"id": pk, "half": [0.5, float(pk)], "brain": [0.5, float(pk)]} for pk in range(5)]
    w.insert(v0, 63101, list(range(5)), columns=wal_columns(schema, batch))
    kept_schema = base_schema(kept)
    (v1,) = stream.vchannels(63102, 1)
    w.create_collection(63102, kept, [v1], schema=kept_schema)
    kept_rows = [{"id": pk, "vec": [1.0, 2.0, 3.0, float(pk)]} for pk in range(5)]
    w.insert(v1, 63102, list(range(5)), columns=wal_columns(kept_schema, kept_rows))
    stream.tick_all()

    client = MilvusClient(uri=uri, dedicated=True)
    try:
        wait_until(
            lambda: task_view(daemon, refused_task)["state"] == "Failed", 60, f"{refused} stopped"
        )
        reason = task_view(daemon, refused_task)["reason"]
        for word in (refused, "half (Float16Vector", "brain (BFloat16Vector", "Milvus 2.3.5"):
            assert word in reason, reason
        assert "not created" in reason, reason
        assert refused not in client.list_collections()  # nothing made, nothing to load
        wait_until(lambda: client.has_collection(kept), 60, f"{kept} created")
        index = client.prepare_index_params()
        index.add_index("vec", index_type="FLAT", metric_type="L2")
        client.create_index(kept, index)
        wait_until(lambda: len(rows(client, kept, "id")) == 5, 60, f"{kept} rows")
        assert task_view(daemon, kept_task)["state"] == "Running"
        assert refused not in client.list_collections()
    finally:
        for name in (refused, kept):
            if client.has_collection(name):
                client.drop_collection(name)
        client.close()


def with_chunks(row: dict[str, Any]) -> dict[str, Any]:
    """A client row with an Array of Struct (texts and 2-float vectors) besides every type."""
    pk = row["id"]
    chunks = [{"text": f"c{pk}-{i}", "emb": [float(pk), i + 0.5]} for i in range(pk % 3)]
    return {**row, "chunks": chunks}


def start_kafka_task(
    daemon_factory: Any, etcd_service: Any, kafka_mock: Any, stream: Any, name: str
) -> tuple[Any, str]:
    """A daemon reading ``stream`` and its task replicating ``name`` into the topic
    ``events_<name>``."""
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    target = {"kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": f"events_{name}"}}
    return daemon, start_task(daemon, "", stream, name, **target)


def test_every_type_reaches_a_kafka_target_as_the_client_wrote_it(
    daemon_factory, etcd_service, kafka_mock, stream
):
    """The same stream into a Kafka target, with an Array of Struct besides (a topic holds what
    Milvus Lite cannot): the rows the topic's events rebuild equal what the client inserted,
    field by field (Geometry as WKT, Timestamptz as ISO 8601 UTC, sparse vectors as indices and
    values, structs as objects; README "Kafka targets")."""
    from tests.e2e.test_kafka_sink import Rebuilt

    w = stream.writer
    coll = 61101
    name = f"ktypes_{uuid.uuid4().hex[:6]}"
    topic = f"events_{name}"  # start_kafka_task's
    schema = all_types_schema(name)
    add_chunks(schema, 300)
    daemon, task_id = start_kafka_task(daemon_factory, etcd_service, kafka_mock, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    w.create_collection(coll, name, [v0, v1], schema=schema)
    stream.tick_all()
    source = {pk: with_chunks(client_row(pk)) for pk in range(30)}
    for vchannel, pks in ((v0, range(15)), (v1, range(15, 30))):
        batch = [source[pk] for pk in pks]
        w.insert(vchannel, coll, list(pks), columns=wal_columns(schema, batch))
    upserted = {pk: with_chunks(client_row(pk, gen=1)) for pk in (0, 1, 2)}
    w.upsert(v0, coll, list(upserted), columns=wal_columns(schema, list(upserted.values())))
    source.update(upserted)
    w.delete(v1, coll, [20, 21])
    del source[20], source[21]
    stream.tick_all()

    expected = {pk: {**expected_row(row), "chunks": row["chunks"]} for pk, row in source.items()}

    def event_differences() -> list[str]:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        got = {}
        for pk, row in rebuilt.rows.items():
            sparse = row["sparse"]
            row = {**row, "sparse": dict(zip(sparse["indices"], sparse["values"], strict=True))}
            got[pk] = target_row(row)
        problems = compared(expected, got)
        created = [e for e in rebuilt.ddl if e["op"] == "create_collection"]
        structs = created[0]["schema"].get("struct_array_fields") if created else None
        # the struct's sub-fields under the names Milvus gives them, with their types
        subs = [
            (f["name"], f["type"], f.get("element_type"), f.get("params"))
            for struct in structs or []
            for f in struct["fields"]
        ]
        want = [
            ("chunks[text]", "Array", "VarChar", {"max_length": "32", "max_capacity": "4"}),
            ("chunks[emb]", "ArrayOfVector", "FloatVector", {"dim": "2", "max_capacity": "4"}),
        ]
        if [s["name"] for s in structs or []] != ["chunks"] or subs != want:
            problems.append(f"the create_collection event's struct_array_fields: {structs}")
        fields = {f["name"]: f for f in created[0]["schema"]["fields"]} if created else {}
        for nullable in ("n_i32", "n_s", "n_j", "n_geo", "n_arr", "dn_i32"):
            if not fields.get(nullable, {}).get("nullable"):
                problems.append(f"{nullable} not nullable in the schema event: {fields}")
        return problems

    wait_target_equal(daemon, task_id, event_differences, f"{topic} rebuilding the source")
    assert task_view(daemon, task_id)["state"] == "Running"
