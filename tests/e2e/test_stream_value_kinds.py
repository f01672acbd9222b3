"""Values of a 2.6 stream beyond the every-type collection (issue 31): JSON that is not an
object, vectors of bytes and nullable vectors, on the targets that hold them (Milvus Lite, a real
Milvus 2.3.5, a Kafka topic). The stream is written as in test_stream_field_types.py."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import numpy as np
import pytest
from harness.services import wait_until
from harness.stream_columns import add_field, base_schema, wal_columns
from pymilvus import MilvusClient
from pymilvus.grpc_gen import schema_pb2

from tests.e2e.test_stream_field_types import compared, start_kafka_task, wait_target_equal
from tests.e2e.test_streaming_source import start_task, task_view

pytestmark = pytest.mark.e2e

S = schema_pb2


def events_differ(bootstrap: str, name: str, task_id: str, want: dict[Any, dict]) -> list[str]:
    """:func:`compared` of ``want`` with what the events of ``name``'s topic hold."""
    return compared(want, event_rows(bootstrap, f"events_{name}", task_id))


def held(client: MilvusClient, name: str, field: str, where: str = "id >= 0") -> list:
    """``(id, value of field)`` of the rows the target holds, values as pymilvus answers them
    (not ``test_replication.rows``: it makes floats of a list's numbers)."""
    found = client.query(name, filter=where, output_fields=[field], consistency_level="Strong")
    return [(r["id"], r[field]) for r in found]


def write_story(
    stream: Any,
    coll: int,
    schema: schema_pb2.CollectionSchema,
    rows: dict[int, dict[str, Any]],
    batches: list[tuple[int, range]],
    upserts: tuple[int, dict[int, dict[str, Any]]],
    deletes: tuple[int, list[int]],
) -> None:
    """A collection of two vchannels on ``stream``: made, then ``rows`` inserted in ``batches``
    (vchannel index, keys; several on one vchannel before a tick are merged by a read), then
    ``upserts`` and ``deletes`` (each on one vchannel: that of its keys' inserts), then a tick.
    ``rows`` ends as the source holds it."""
    w = stream.writer
    vchannels = stream.vchannels(coll, 2)
    w.create_collection(coll, schema.name, vchannels, schema=schema)
    stream.tick_all()
    for index, pks in batches:
        batch = [rows[pk] for pk in pks]
        w.insert(vchannels[index], coll, list(pks), columns=wal_columns(schema, batch))
    index, upserted = upserts
    w.upsert(
        vchannels[index], coll, list(upserted), columns=wal_columns(schema, [*upserted.values()])
    )
    rows.update(upserted)
    index, gone = deletes
    w.delete(vchannels[index], coll, gone)
    for pk in gone:
        del rows[pk]
    stream.tick_all()


def event_rows(bootstrap: str, topic: str, task_id: str) -> dict[Any, dict[str, Any]]:
    """The rows a consumer of ``topic`` holds after the task's committed row events, values as
    the events carry them (not ``test_kafka_sink.Rebuilt``: it makes floats of a list's
    numbers)."""
    from tests.e2e.test_kafka_sink import committed_ids, read_topic

    commits = committed_ids(bootstrap, task_id)
    held: dict[Any, dict[str, Any]] = {}
    for _, _, event in read_topic(bootstrap, topic):
        if event["source"]["commit"] not in commits or "row" not in event:
            continue
        if event["op"] == "delete":
            held.pop(event["pk"], None)
        else:
            held[event["pk"]] = event["row"]
    return held


def index_and_load(client: MilvusClient, name: str, field: str, kind: str, metric: str) -> None:
    """Once the stream made ``name`` on the target: an index on ``field``, then load it."""
    wait_until(lambda: client.has_collection(name), 60, f"{name} on the target")
    index = client.prepare_index_params()
    index.add_index(field, index_type=kind, metric_type=metric)
    client.create_index(name, index)
    client.load_collection(name)


# --- JSON values that are not objects ----------------------------------------------------------

# A 2.6 proxy takes any JSON value into a JSON field: its check is a length limit only
# (``internal/proxy/validate_util.go`` ``checkJSONFieldData``); 2.3.5 refused all but objects.
JSON_ARRAYS = [[1, "x", {"a": [2, None]}], [], [[1.5, -0.0], True], [2**64 - 1, -(2**63)]]
JSON_SCALARS = [7, -(2**63), 2**64 - 1, 1.5, 5e-324, "text ü", "", True, False]


def json_rows(values: list[Any], first: int = 0) -> dict[int, dict[str, Any]]:
    return {
        first + i: {"id": first + i, "vec": [float(i), 0.5, 1.0, -1.0], "j": value}
        for i, value in enumerate(values)
    }


def typed_json(value: Any) -> str:
    """A JSON value with its types kept: 1, 1.0 and true differ."""
    return json.dumps(value, sort_keys=True)


def test_json_that_is_not_an_object_arrives_as_it_was(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """Arrays into Milvus Lite (which holds no other JSON value: its server refuses a number or
    a string, "Expected bytes, got a 'int' object"), arrays, numbers, strings and booleans into
    a Kafka target; upserted (an array becoming a number) and deleted too."""
    w = stream.writer
    suffix = uuid.uuid4().hex[:6]
    lite_name, kafka_name = f"jarr_{suffix}", f"jall_{suffix}"
    schemas = {}
    for name in (lite_name, kafka_name):
        schemas[name] = base_schema(name)
        add_field(schemas[name], "j", S.JSON)
    daemon, kafka_task = start_kafka_task(
        daemon_factory, etcd_service, kafka_mock, stream, kafka_name
    )
    lite_task = start_task(daemon, milvus_lite_service.uri, stream, lite_name)
    sources = {lite_name: json_rows(JSON_ARRAYS), kafka_name: json_rows(JSON_ARRAYS + JSON_SCALARS)}
    for coll, name in ((62001, lite_name), (62002, kafka_name)):
        v0, v1 = stream.vchannels(coll, 2)
        w.create_collection(coll, name, [v0, v1], schema=schemas[name])
        stream.tick_all()
        rows_ = sources[name]
        half = sorted(rows_)[: len(rows_) // 2]
        for vchannel, pks in ((v0, half), (v1, sorted(set(rows_) - set(half)))):
            batch = [rows_[pk] for pk in pks]
            w.insert(vchannel, coll, pks, columns=wal_columns(schemas[name], batch))
        changed = {0: {**rows_[0], "j": [0]} if name == lite_name else {**rows_[0], "j": 42}}
        w.upsert(v0, coll, [0], columns=wal_columns(schemas[name], list(changed.values())))
        rows_.update(changed)
        w.delete(v0, coll, [1])  # on the vchannel of its insert, as Milvus routes a key
        del rows_[1]
        stream.tick_all()

    def lite_differences() -> list[str]:
        got = {pk: typed_json(value) for pk, value in held(target_client, lite_name, "j")}
        want = {pk: typed_json(r["j"]) for pk, r in sources[lite_name].items()}
        return [] if got == want else [f"{got} != {want}"]

    def kafka_differences() -> list[str]:
        held = event_rows(kafka_mock.bootstrap, f"events_{kafka_name}", kafka_task)
        got = {pk: typed_json(row["j"]) for pk, row in held.items()}
        want = {pk: typed_json(r["j"]) for pk, r in sources[kafka_name].items()}
        return [
            f"row {pk}: {got.get(pk)} != {want.get(pk)}"
            for pk in set(got) | set(want)
            if got.get(pk) != want.get(pk)
        ]

    index_and_load(target_client, lite_name, "vec", "FLAT", "L2")
    wait_target_equal(daemon, lite_task, lite_differences, f"{lite_name}'s arrays on Milvus Lite")
    wait_target_equal(daemon, kafka_task, kafka_differences, f"{kafka_name}'s values in Kafka")
    assert task_view(daemon, lite_task)["state"] == "Running"
    assert task_view(daemon, kafka_task)["state"] == "Running"


# --- vectors of bytes --------------------------------------------------------------------------


def byte_vector_row(pk: int, gen: int = 0) -> dict[str, Any]:
    """A row as a client writes it: 16-bit binary vectors as 2 bytes, float16 and bfloat16
    vectors as floats they hold exactly, int8 vectors as integers."""
    v = pk + 100 * gen
    return {
        "id": pk,
        "vec": [float(v), 0.5, -1.0, 2.0],
        "bin": bytes([v % 256, (v * 7 + 1) % 256]),
        "half": [v / 4, -0.5, 65504.0, 0.0],
        "brain": [float(v), -2.0, 3.0e38, 0.5],
        "small": [v % 128, -128, 127, -(v % 100)],
    }


def byte_vectors_schema(name: str) -> schema_pb2.CollectionSchema:
    schema = base_schema(name)
    add_field(schema, "bin", S.BinaryVector, dim=16)
    add_field(schema, "half", S.Float16Vector, dim=4)
    add_field(schema, "brain", S.BFloat16Vector, dim=4)
    add_field(schema, "small", S.Int8Vector, dim=4)
    return schema


def as_event(row: dict[str, Any]) -> dict[str, Any]:
    """A client's row as a Kafka event holds it (README "Kafka targets"): the bytes Milvus
    stores, little-endian, in base64; an Int8Vector as its integers."""
    half = np.asarray(row["half"], dtype="<f2").tobytes()
    brain = (np.asarray(row["brain"], dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return {
        **row,
        "bin": base64.b64encode(row["bin"]).decode(),
        "half": base64.b64encode(half).decode(),
        "brain": base64.b64encode(brain).decode(),
    }


def test_vectors_of_bytes_reach_kafka_and_a_2_3_target_byte_for_byte(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """BinaryVector, Float16Vector, BFloat16Vector and Int8Vector from a 2.6 stream: into a
    Kafka target, each row as the client wrote it, through inserts a read merges into one write
    (two Inserts of 6 and 4 rows: protobuf's ``MergeFrom`` once kept only the last one's bytes),
    upserts and deletes; a BinaryVector into a real Milvus 2.3.5 (one vector field: 2.3 holds no
    more), byte for byte."""
    suffix = uuid.uuid4().hex[:6]
    kafka_name, milvus_name = f"vbytes_{suffix}", f"vbin_{suffix}"
    schemas = {kafka_name: byte_vectors_schema(kafka_name), milvus_name: base_schema(milvus_name)}
    del schemas[milvus_name].fields[1:]  # the key only, then the binary vector
    add_field(schemas[milvus_name], "bin", S.BinaryVector, dim=16)
    daemon, kafka_task = start_kafka_task(
        daemon_factory, etcd_service, kafka_mock, stream, kafka_name
    )
    milvus_task = start_task(daemon, milvus_source_rocksmq.uri, stream, milvus_name)
    sources: dict[str, dict[int, dict[str, Any]]] = {}
    for coll, name in ((62101, kafka_name), (62102, milvus_name)):
        keep = {f.name for f in schemas[name].fields}
        written = {
            pk: {k: v for k, v in byte_vector_row(pk).items() if k in keep} for pk in range(20)
        }
        upserted = {
            pk: {k: v for k, v in byte_vector_row(pk, 1).items() if k in keep} for pk in (2, 3)
        }
        batches = [(0, range(6)), (0, range(6, 10)), (1, range(10, 20))]
        write_story(stream, coll, schemas[name], written, batches, (0, upserted), (1, [12]))
        sources[name] = written

    def kafka_differences() -> list[str]:
        want = {pk: as_event(row) for pk, row in sources[kafka_name].items()}
        return events_differ(kafka_mock.bootstrap, kafka_name, kafka_task, want)

    def milvus_differences() -> list[str]:
        got = {pk: {"id": pk, "bin": bytes(v[0])} for pk, v in held(client, milvus_name, "bin")}
        want = {pk: {"id": pk, "bin": row["bin"]} for pk, row in sources[milvus_name].items()}
        return compared(want, got)

    wait_target_equal(daemon, kafka_task, kafka_differences, f"{kafka_name}'s vectors in Kafka")
    client = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        index_and_load(client, milvus_name, "bin", "BIN_FLAT", "HAMMING")
        wait_target_equal(daemon, milvus_task, milvus_differences, f"{milvus_name} on 2.3.5")
    finally:
        client.close()
    assert task_view(daemon, kafka_task)["state"] == "Running"
    assert task_view(daemon, milvus_task)["state"] == "Running"


# --- nullable vectors (Milvus 2.6.18 and later) ------------------------------------------------


def nullable_vectors_schema(name: str) -> schema_pb2.CollectionSchema:
    schema = base_schema(name)
    add_field(schema, "nv", S.FloatVector, dim=3, nullable=True)
    add_field(schema, "nb", S.BinaryVector, dim=16, nullable=True)
    add_field(schema, "ns", S.SparseFloatVector, nullable=True)
    add_field(schema, "ni", S.Int8Vector, dim=2, nullable=True)
    return schema


def nullable_vector_row(pk: int, gen: int = 0, *, nulls: bool | None = None) -> dict[str, Any]:
    """Every third row (or every row, ``nulls``) null in each nullable vector."""
    null = pk % 3 == (gen % 3) if nulls is None else nulls
    v = pk + 100 * gen
    return {
        "id": pk,
        "vec": [float(v), 1.0, 0.5, -1.0],
        "nv": None if null else [v / 2, -1.5, 0.25],
        "nb": None if null else bytes([v % 256, 255 - v % 256]),
        "ns": None if null else {v % 5: 1.5, 10 + v: -0.5},
        "ni": None if null else [v % 100, -(v % 100)],
    }


def nullable_event(row: dict[str, Any]) -> dict[str, Any]:
    """A client's row as a Kafka event holds it: a null as null."""
    return {
        **row,
        "nb": None if row["nb"] is None else base64.b64encode(row["nb"]).decode(),
        "ns": None
        if row["ns"] is None
        else {"indices": sorted(row["ns"]), "values": [row["ns"][i] for i in sorted(row["ns"])]},
    }


def test_nullable_vectors_reach_kafka_as_nulls_beside_their_vectors(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """Nullable FloatVector, BinaryVector, SparseFloatVector and Int8Vector columns laid out as a
    2.6 proxy appends them (a vector for each valid row only; an Insert of null rows only holds
    none): into Kafka each null as null and each vector in its row, through inserts a read
    merges, an Insert whose rows are all null, upserts turning nulls into vectors and back, and
    deletes; the FloatVector into Milvus Lite, each vector in its row (Lite 3.2.2 answers a null
    vector as a zero vector, as it does to its own clients)."""
    suffix = uuid.uuid4().hex[:6]
    kafka_name, lite_name = f"nvk_{suffix}", f"nvl_{suffix}"
    schemas = {kafka_name: nullable_vectors_schema(kafka_name), lite_name: base_schema(lite_name)}
    add_field(schemas[lite_name], "nv", S.FloatVector, dim=3, nullable=True)
    daemon, kafka_task = start_kafka_task(
        daemon_factory, etcd_service, kafka_mock, stream, kafka_name
    )
    lite_task = start_task(daemon, milvus_lite_service.uri, stream, lite_name)
    sources: dict[str, dict[int, dict[str, Any]]] = {}
    for coll, name in ((62201, kafka_name), (62202, lite_name)):
        keep = {f.name for f in schemas[name].fields}

        def row_of(pk: int, gen: int = 0, nulls: bool | None = None, keep=keep) -> dict:
            return {k: v for k, v in nullable_vector_row(pk, gen, nulls=nulls).items() if k in keep}

        written = {pk: row_of(pk) for pk in range(12)}
        written.update({pk: row_of(pk, nulls=True) for pk in range(12, 16)})
        # the last Insert's rows are all null: the dim, no vector
        batches = [(0, range(5)), (0, range(5, 8)), (1, range(8, 12)), (1, range(12, 16))]
        upserted = {pk: row_of(pk, gen=1) for pk in (0, 1)}  # 0: null -> vector, 1: -> null
        write_story(stream, coll, schemas[name], written, batches, (0, upserted), (1, [9]))
        sources[name] = written

    def kafka_differences() -> list[str]:
        want = {pk: nullable_event(row) for pk, row in sources[kafka_name].items()}
        return events_differ(kafka_mock.bootstrap, kafka_name, kafka_task, want)

    def lite_differences() -> list[str]:
        got = dict(held(target_client, lite_name, "nv"))
        problems = [f"keys {sorted(got)}"] if set(got) != set(sources[lite_name]) else []
        for pk, row in sources[lite_name].items():
            want = row["nv"]
            if pk in got and want is not None and got[pk] != want:
                problems.append(f"row {pk}: {got[pk]} != {want}")
        return problems

    wait_target_equal(daemon, kafka_task, kafka_differences, f"{kafka_name}'s nullable vectors")
    index_and_load(target_client, lite_name, "vec", "FLAT", "L2")
    wait_target_equal(daemon, lite_task, lite_differences, f"{lite_name}'s vectors on Lite")
    nulls = [pk for pk, row in sources[lite_name].items() if row["nv"] is None]
    answered = dict(held(target_client, lite_name, "nv", f"id in {nulls}"))
    assert answered == {pk: [0.0, 0.0, 0.0] for pk in nulls}
    assert task_view(daemon, kafka_task)["state"] == "Running"
    assert task_view(daemon, lite_task)["state"] == "Running"
