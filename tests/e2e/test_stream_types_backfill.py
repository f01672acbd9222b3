"""The backfill and the verify of a 2.6 source's types (issue 31): rows written before the task
are copied by the Spark backfill with every type intact, rows written after it stream on, and a
verify finds the two sides equal, then finds and repairs what was changed on the target.

No 2.6 server runs here. The source is two parts that a real 2.6 cluster keeps in step: its WAL
and catalog (the test writers, tests/harness/streaming_writer.py and catalog26_writer.py, on the
Kafka mock and the session's etcd) and its query side, which the backfill and the verify read
through the public API: a Milvus Lite 3.2.2 server, which holds Geometry, Timestamptz, nullable
fields, default values, sparse vectors, a BM25 function and a dynamic field as a 2.6 does. Every
row is written to both parts, as a client's write reaches both on a real cluster. What the
target must hold is computed from the rows the client wrote (test_stream_field_types.py).

A file of its own: the files that run Spark jobs are one test group (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import etcd3
import pytest
from harness.catalog26_writer import Catalog26Writer
from harness.services import milvus_lite_server, wait_until
from harness.stream_columns import wal_columns
from pymilvus import MilvusClient
from pymilvus.grpc_gen import milvus_pb2, schema_pb2
from test_backfill import wait_backfill
from test_verify import kinds as verify_kinds
from test_verify import run_verify

from tests.e2e.test_replication import rows
from tests.e2e.test_stream_field_types import (
    all_types_schema,
    client_row,
    compared,
    expected_row,
    load,
    target_row,
    wait_target_equal,
)
from tests.e2e.test_stream_functions import (
    QUERIES,
    bm25_row,
    bm25_schema,
    dynamic_differences,
    dynamic_row,
    dynamic_schema,
    full_text_hits,
    index_vec,
    load_bm25,
)
from tests.e2e.test_streaming_source import Stream, task_view

pytestmark = pytest.mark.e2e


@dataclass
class QuerySide:
    uri: str
    client: MilvusClient


@pytest.fixture
def query_side(tmp_path: Path) -> Iterator[QuerySide]:
    """The source's query side: a Milvus Lite server of this test's own."""
    with milvus_lite_server(tmp_path / "source-lite") as server:
        client = MilvusClient(uri=server.uri, dedicated=True)
        try:
            yield QuerySide(server.uri, client)
        finally:
            client.close()


@dataclass
class Collection:
    """One collection of the source, written to both of its parts."""

    collection_id: int
    name: str
    schema: schema_pb2.CollectionSchema
    vchannels: list[str]
    rows: dict[int, dict[str, Any]]  # what the source holds: key -> the row the client wrote


class TwoPartSource:
    """A 2.6 source made of the stream (WAL and catalog) and a Milvus Lite (the query side)."""

    def __init__(self, stream: Stream, lite: MilvusClient, etcd_service: Any) -> None:
        self.stream, self.lite, self.etcd_service = stream, lite, etcd_service
        self.pchannels = [stream.pchannel(i) for i in range(stream.channels)]
        self.collections: dict[str, Collection] = {}

    def create(self, collection_id: int, schema: schema_pb2.CollectionSchema) -> Collection:
        """The collection on the query side (the very schema, through ``CreateCollection``) and
        in the WAL and catalog (its broadcast, then the catalog's keys, as 2.6 writes them)."""
        asked = schema_pb2.CollectionSchema()  # as a client asks: no "$meta" field of its own
        asked.CopyFrom(schema)
        del asked.fields[:]
        asked.fields.extend(f for f in schema.fields if not f.is_dynamic)
        request = milvus_pb2.CreateCollectionRequest(
            collection_name=schema.name, schema=asked.SerializeToString(), shards_num=1
        )
        status = self.lite._get_connection()._stub.CreateCollection(request, timeout=30)
        assert not (status.code or status.error_code), status
        etcd = etcd3.client(host=self.etcd_service.host, port=self.etcd_service.port, timeout=10)
        try:
            catalog = Catalog26Writer(
                etcd, f"{self.stream.prefix}-meta", tso=self.stream.writer.tso
            )
            catalog.register_pchannels(self.pchannels)
            made = catalog.create_collection(
                collection_id, schema.name, self.pchannels, schema=schema, wal=self.stream.writer
            )
        finally:
            etcd.close()
        created = Collection(collection_id, schema.name, schema, list(made.vchannels), {})
        self.collections[schema.name] = created
        return created

    def insert(self, c: Collection, written: dict[int, dict[str, Any]], *, upsert=False) -> None:
        """``written`` rows (key -> row) on both parts: on the WAL, each row on the vchannel
        its key picks (an upsert as one transaction of an Insert and a Delete)."""
        if upsert:
            self.lite.upsert(c.name, list(written.values()))
            if c.schema.enable_dynamic_field:
                # Milvus Lite 3.2.2 keeps the dynamic keys an upserted row leaves out: the WAL
                # holds the row the source keeps, as a 2.6 proxy appends the row it made
                written = {pk: self.stored(c, pk) for pk in written}
        else:
            self.lite.insert(c.name, list(written.values()))
        write = self.stream.writer.upsert if upsert else self.stream.writer.insert
        by_channel: dict[str, list[int]] = {}
        for pk in written:
            by_channel.setdefault(c.vchannels[pk % len(c.vchannels)], []).append(pk)
        for vchannel, pks in by_channel.items():
            batch = [written[pk] for pk in pks]
            write(vchannel, c.collection_id, pks, columns=wal_columns(c.schema, batch))
        c.rows.update(written)
        self.stream.tick_all()

    def stored(self, c: Collection, pk: int) -> dict[str, Any]:
        (row,) = self.lite.query(
            c.name, filter=f"id == {pk}", output_fields=["*"], consistency_level="Strong"
        )
        return dict(row)

    def delete(self, c: Collection, pks: list[int]) -> None:
        for pk in pks:
            self.stream.writer.delete(c.vchannels[pk % len(c.vchannels)], c.collection_id, [pk])
            del c.rows[pk]
        self.lite.delete(c.name, ids=pks)
        self.stream.tick_all()


@contextlib.contextmanager
def ticking(stream: Stream, every: float = 0.2) -> Iterator[None]:
    """The source's time ticks, every ``every`` seconds on every pchannel, as a 2.6 cluster
    writes them whether or not anything is written (nothing else writes the stream meanwhile:
    the writer is not shared between threads)."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every):
            stream.tick_all()

    thread = threading.Thread(target=tick, name="source-ticks", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def config(source: TwoPartSource, lite_uri: str, etcd_service, kafka_mock) -> dict:
    """The stream's source settings with the query side's address, and a Spark backfill and a
    verify in small ranges and pages (range bounds and cursors fall on many keys)."""
    settings = source.stream.config(etcd_service, kafka_mock)
    settings["sourceConfig"]["milvus"] = {"uri": lite_uri}
    settings["backfill"] = {
        "sparkMaster": "local[2]",
        "taskMaxFailures": 2,
        "batchRows": 7,
        "rangeRows": 10,
    }
    settings["verify"] = {"rangeRows": 10, "batchRows": 7}
    return settings


def prepare_target(target: MilvusClient, c: Collection) -> None:
    """The indexes a query on the target needs (the stream makes the collection, not them)."""
    wait_until(lambda: target.has_collection(c.name), 60, f"{c.name} on the target")
    if c.name.startswith("types"):
        load(target, c.name)
    elif c.name.startswith("bm25"):
        load_bm25(target, c.name)
    else:
        index_vec(target, c.name)


def bm25_differences(source: MilvusClient, target: MilvusClient, c: Collection) -> list[str]:
    """Rows of the BM25 collection that differ: the text the client wrote, and the sparse
    vector the target's function made of it against the source's."""
    on_source, got = rows(source, c.name, "id"), rows(target, c.name, "id")
    problems = [f"missing {sorted(set(c.rows) - set(got))}"] if set(c.rows) - set(got) else []
    if set(got) - set(c.rows):
        problems.append(f"extra {sorted(set(got) - set(c.rows))}")
    for pk in sorted(set(c.rows) & set(got)):
        if got[pk]["text"] != c.rows[pk]["text"]:
            problems.append(f"row {pk} text {got[pk]['text']!r} != {c.rows[pk]['text']!r}")
        if got[pk]["sparse"] != on_source[pk]["sparse"]:
            problems.append(f"row {pk} sparse {got[pk]['sparse']} != {on_source[pk]['sparse']}")
    return problems


@pytest.mark.timeout(900)
def test_a_2_6_sources_types_are_backfilled_streamed_verified_and_repaired(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream, query_side
):
    source_lite = query_side.client
    source = TwoPartSource(stream, source_lite, etcd_service)
    suffix = uuid.uuid4().hex[:6]
    every = source.create(66001, all_types_schema(f"types_{suffix}"))
    bm25 = source.create(66101, bm25_schema(f"bm25_{suffix}"))
    dynamic = source.create(66201, dynamic_schema(f"dyn_{suffix}", since_2_6_alter=True))
    makers = {every.name: client_row, bm25.name: bm25_row, dynamic.name: dynamic_row}
    for c in (every, bm25, dynamic):  # history: copied by the backfill
        source.insert(c, {pk: makers[c.name](pk) for pk in range(45)})
    load(source_lite, every.name)
    load_bm25(source_lite, bm25.name)
    index_vec(source_lite, dynamic.name)
    for c in (every, dynamic):
        source_lite.load_collection(c.name)

    daemon = daemon_factory(**config(source, query_side.uri, etcd_service, kafka_mock)).start()
    created = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": milvus_lite_service.uri},
            "collection_infos": [{"name": c} for c in source.collections],
            "backfill": {"collections": ["*"]},
        },
    )
    assert created.code == 200, created.body
    task_id = created.data["task_id"]
    for c in source.collections.values():
        prepare_target(target_client, c)
    backfill = wait_backfill(daemon, task_id, timeout=600)
    assert backfill["ranges_done"] == backfill["ranges_total"] >= 3 * 5, backfill
    assert backfill["rows_done"] >= 3 * 45, backfill

    # after the copy: new rows, upserts (defaults and nulls change sides) and deletes, streamed
    for c in (every, bm25, dynamic):
        source.insert(c, {pk: makers[c.name](pk) for pk in range(45, 60)})
        source.insert(c, {pk: makers[c.name](pk, gen=1) for pk in (1, 2, 3, 50)}, upsert=True)
        source.delete(c, [4, 51])

    expected = {pk: expected_row(row) for pk, row in every.rows.items()}
    wait_target_equal(
        daemon,
        task_id,
        lambda: compared(
            expected, {pk: target_row(r) for pk, r in rows(target_client, every.name, "id").items()}
        ),
        f"{every.name} equal to what the client wrote, field by field",
    )
    wait_target_equal(
        daemon,
        task_id,
        lambda: bm25_differences(source_lite, target_client, bm25),
        f"{bm25.name} equal to the source, sparse vectors included",
    )
    for word in QUERIES:
        assert full_text_hits(target_client, bm25.name, word) == full_text_hits(
            source_lite, bm25.name, word
        ), word
    wait_target_equal(
        daemon,
        task_id,
        lambda: dynamic_differences(dynamic.rows, target_client, dynamic.name),
        f"{dynamic.name} equal to the source, keys outside the schema included",
    )

    # a verify finds the sides equal, every type digested (as columns, and row by row)
    with ticking(stream):  # a verify waits until the task has applied the moment it read at
        clean = run_verify(daemon, task_id, repair=False)
    assert clean["divergent_rows"] == 0, [verify_kinds(c) for c in clean["collections"]]
    assert clean["rows_compared"] >= sum(len(c.rows) for c in source.collections.values())

    # values changed on the target only: found, each in its collection, and repaired
    changed = {
        every.name: [
            {**client_row(10), "geo": "POINT (99 99)"},
            {**client_row(11), "tz": "2030-01-01T00:00:00+00:00"},
            {**client_row(12), "n_i32": 5},  # a null on the source
            {**client_row(13), "sparse": {1: 9.5}},
        ],
        bm25.name: [{**bm25_row(10), "text": "thunder thunder"}],
        dynamic.name: [{**dynamic_row(10), "größe": -1.0}],
    }
    for name, changes in changed.items():
        target_client.upsert(name, changes)
    with ticking(stream):
        repaired = run_verify(daemon, task_id, repair=True)
    found = {c["collection"]: verify_kinds(c) for c in repaired["collections"]}
    assert repaired["divergent_rows"] == 6 and repaired["repaired"] == 6, found
    assert found[f"default.{every.name}"]["different"] == (4, [10, 11, 12, 13]), found
    assert found[f"default.{bm25.name}"]["different"] == (1, [10]), found
    assert found[f"default.{dynamic.name}"]["different"] == (1, [10]), found
    with ticking(stream):
        again = run_verify(daemon, task_id, repair=False)
    assert again["divergent_rows"] == 0, [verify_kinds(c) for c in again["collections"]]
    assert bm25_differences(source_lite, target_client, bm25) == []
    assert task_view(daemon, task_id)["state"] == "Running"
