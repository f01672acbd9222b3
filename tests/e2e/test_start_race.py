"""Where a task starts is fixed before ``create`` answers: a collection created and written the
moment the answer arrives (no sleep) is replicated, on a Milvus 2.6 stream and on the real Milvus
2.3.5 source, again and again; ``position`` shows every channel's start at once."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from harness.services import wait_until
from pymilvus import MilvusClient

from metastore import Position, TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.codec.streaming import decode_any
from replicator.config.connections import EtcdSettings
from replicator.config.stores import etcd_client_for
from replicator.config.task_spec import TaskSpec
from replicator.errors import SourceUnavailableError
from replicator.events import CreateCollection
from replicator.meta.catalog import SourceCatalog
from replicator.pipeline.context import TaskContext
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.selection import TaskSelection
from replicator.sinks.milvus import MilvusTarget
from replicator.sources.kafka import KafkaSource
from tests.e2e.test_replication import (
    create_source_collection,
    make_rows,
    source_config,
    source_database,
    wait_equal,
)
from tests.e2e.test_streaming_source import task_view, wait_for_collection, wait_rows

pytestmark = pytest.mark.e2e

ROUNDS = 5


def create(daemon, target_uri: str, name: str) -> str:
    created = daemon.call(
        "create",
        {"milvus_connect_param": {"uri": target_uri}, "collection_infos": [{"name": name}]},
    )
    assert created.code == 200, created.body
    return str(created.data["task_id"])


def positions(daemon, task_id: str) -> list[dict]:
    return list(daemon.call("position", {"task_id": task_id}).data.get("positions") or [])


def test_a_2_6_collection_written_right_after_create_is_replicated(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    w = stream.writer
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[str, str, dict[int, str]]] = []
    for i in range(ROUNDS):
        name, collection_id = f"race26_{tag}_{i}", 52000 + i
        task_id = create(daemon, milvus_lite_service.uri, name)
        # no wait: the answer means the task's start is decided on every channel
        dml = {p["channel_name"] for p in positions(daemon, task_id)} & {
            stream.pchannel(i) for i in range(stream.channels)
        }
        assert len(dml) == stream.channels
        vchannels = stream.vchannels(collection_id, 3)
        w.create_collection(collection_id, name, [*vchannels, f"{stream.pchannel(0)}_vcchan"])
        expected: dict[int, str] = {}
        for n, vchannel in enumerate(vchannels):
            keys = range(n * 100, n * 100 + 22)
            w.insert(vchannel, collection_id, keys)
            expected.update({pk: f"row-{pk}" for pk in keys})
        stream.tick_all()
        made.append((task_id, name, expected))
    for task_id, name, expected in made:
        wait_for_collection(target_client, name)
        wait_rows(target_client, name, expected)
        task = task_view(daemon, task_id)
        assert task["state"] == "Running", task
        assert task["reason"] == "", task


def test_a_2_3_collection_written_right_after_create_is_replicated(
    daemon_factory, milvus_source, etcd_service, kafka_mock, source_client, milvus_lite_service
):

    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    target = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    tag = uuid.uuid4().hex[:6]
    names = []
    try:
        for i in range(ROUNDS):
            name = f"race23_{tag}_{i}"
            task_id = create(daemon, milvus_lite_service.uri, name)
            started = positions(daemon, task_id)
            assert started, "no start position saved before create answered"
            assert {p["channel_name"] for p in started} >= set(milvus_source.dml_channels), started
            create_source_collection(source_client, name)
            source_client.insert(name, make_rows(0, 40, name))
            names.append(name)
        for name in names:
            wait_until(lambda name=name: target.has_collection(name), 60, f"{name} on target")
            wait_equal(source_client, target, name, "id")
    finally:
        target.close()


def _copy_keys(etcd, keys: list[tuple[str, bytes]], source_root: str, mirror_root: str) -> None:
    for key, value in keys:
        etcd.put(mirror_root + key[len(source_root) :], value)


def test_a_2_3_create_record_read_before_the_catalog_has_it_waits_for_the_catalog(
    milvus_source, etcd_service, kafka_mock, source_client, milvus_lite_service, tmp_path
):
    """Milvus 2.3 writes a CreateCollection to the WAL before it adds the collection to its
    catalog (rootcoord's createCollectionTask takes the record's positions as the collection's
    start positions, then writes the meta), and the record names no database. A channel that
    reads the record at once must wait for the catalog, not take the collection for one of the
    default database (a ``<db>.*`` task then left it out, and its rows with it).

    The record is the source's own, read from its Kafka channel; the catalog is the source's
    own keys, copied under another root of the same etcd: the database first, the collection's
    keys 2 s after the record is applied, the order the real cluster writes them in. A task
    stopped while it waits applies nothing: the record is read again when it runs again."""
    tag = uuid.uuid4().hex[:6]
    db, name, target_db = f"late_{tag}", f"lagging_{tag}", f"late_copy_{tag}"
    client = source_database(milvus_source.uri, db)
    create_source_collection(client, name)
    client.close()

    etcd = etcd_client_for(EtcdSettings(address=[etcd_service.endpoint]))
    root = f"{milvus_source.meta_root}/root-coord/"
    mirror = f"mirror_{tag}/meta/root-coord/"
    (meta,) = [
        m
        for m in SourceCatalog(etcd, milvus_source.etcd_root_path).collections().values()
        if m.name == name and m.db_name == db
    ]
    everything = [(m.key.decode(), bytes(v)) for v, m in etcd.get_prefix(root)]
    # the collection's own keys: its info under its database, its fields and partitions
    own = (f"/{meta.db_id}/{meta.collection_id}", f"/{meta.collection_id}/")
    held = [(k, v) for k, v in everything if k.endswith(own[0]) or own[1] in k]
    assert any("collection-info" in k for k, _ in held) and any("fields" in k for k, _ in held)
    databases = [(k, v) for k, v in everything if "/database/db-info/" in k]
    _copy_keys(etcd, databases, root, mirror)

    kafka = KafkaSource(kafka_mock.bootstrap)
    pchannel = meta.pchannels[0]
    offset = kafka.offset_of(meta.start_positions[pchannel])
    before = kafka.position_before(offset)  # None: the record is the channel's first
    reader = kafka.open_channel(
        pchannel, Position("kafka", pchannel, before, 0) if before else None
    )
    try:
        records = reader.read_batch(1, 10.0)
    finally:
        reader.close()
    event = decode_any(records[0], "kafka", lambda _c: True)
    assert isinstance(event, CreateCollection) and event.collection_id == meta.collection_id
    assert event.db_name == "", "2.3.5 names no database in the record: nothing to test"

    spec = {
        "db_collections": {db: [{"name": "*"}]},
        "name_mapping": [{"source_db": db, "target_db": target_db}],
    }
    selection = TaskSelection.from_spec(TaskSpec.from_stored(spec))
    registry = CollectionRegistry(selection, "_default")
    target = MilvusTarget({"uri": milvus_lite_service.uri})
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    now = time.time()
    store.create_task(TaskRecord("late", TaskState.RUNNING, "", spec, now, now))
    catalog = SourceCatalog(etcd, f"mirror_{tag}")
    asked: list[int] = []

    def describe(collection_id: int):
        asked.append(collection_id)
        return catalog.collection(collection_id)

    context = TaskContext.build(
        "late", store, registry, target, threading.Event(), describe=describe
    )
    late = threading.Timer(2.0, _copy_keys, (etcd, held, root, mirror))
    try:
        # a task stopped while it waits applies nothing on a guess: the record is read again
        stopped = threading.Event()
        stopped.set()
        halted = TaskContext.build(
            "late",
            store,
            CollectionRegistry(selection, "_default"),
            target,
            stopped,
            describe=catalog.collection,
        )
        with pytest.raises(SourceUnavailableError, match="stopped while waiting"):
            halted.collections.apply_record(event, pchannel)
        assert not halted.registry.known(meta.collection_id)

        late.start()
        context.collections.apply_record(event, pchannel)
        assert registry.wanted(meta.collection_id), "the collection was taken for another db's"
        assert registry.resolve(meta.collection_id).db == target_db
        assert name in target.list_collections(target_db)

        # the record's copy on another channel: the catalog is not read, nothing made again
        made = registry.resolve(meta.collection_id)
        asked.clear()
        context.collections.apply_record(event, meta.pchannels[-1])
        assert asked == [], "the catalog was read again for a collection already made"
        assert registry.resolve(meta.collection_id) is made, "the collection was registered again"
    finally:
        late.cancel()
        if late.is_alive():
            late.join()
        etcd.delete_prefix(f"mirror_{tag}/")
        target.close()
        store.close()
