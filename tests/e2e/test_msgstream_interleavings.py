"""Interleavings a Milvus 2.3 pchannel holds, replicated by the daemon into a Kafka topic and a
Milvus (issue 48, Build item 3). The channel is written record by record by
tests/harness/msgstream_writer.py in the order under test (a real 2.3.5 writes these orders
only by chance: concurrent proxy tasks and rootcoord append to one pchannel side by side).

- An upsert's Insert, then a DDL of another collection (younger), then the upsert's Delete: the
  row is the upserted one, and a Kafka consumer gets one ``upsert`` event (fault 3: the DDL
  wrote the Insert alone, the Delete then went out alone: a Milvus target deleted the row, a
  Kafka consumer got ``insert`` and ``delete``).
- Insert A@100 waits for its tick while Insert B@90, after it, is released by tick 95 and
  committed with the position before A: a ``kill -9`` and a pause later, B is on the topic once
  (fault 6: each resume read B again and emitted it again).
- The same, with the metastore (etcd) down when B is committed: the Kafka commit holds B and its
  position, the metastore's save after it fails, the channel rewinds; B is on the topic once
  (fault 7: the rewind read from Kafka's position with the metastore's older tick and emitted B
  again, at every retry of the outage).
- An upsert's Insert into p1, the DropPartition of p1 (younger), then the upsert's Delete, and
  an Insert into p1 older than the drop read after it: nothing of p1 reaches the target after
  its drop (the Delete made p1 again on the target and the late Insert put its row there; a
  Kafka consumer got the upsert's Insert alone, p1 made again, the Delete and the late row).
- One read releasing more rows than a Kafka commit holds: committed at the tick that reaches
  the commit's size, each row once through a ``kill -9``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from harness.msgstream_writer import MsgstreamChannel
from harness.services import ServiceStartError, etcd_server, wait_until
from harness.streaming_writer import StreamingWriter
from pymilvus.grpc_gen import common_pb2, msg_pb2
from test_handover_upsert import collection_meta, dml_of, msg_type, records_since_creation
from test_kafka_sink import Rebuilt
from test_replication import create_source_collection, make_rows, rows

from replicator.sources.kafka import KafkaSource

pytestmark = pytest.mark.e2e

COLLECTION, OTHER = 61001, 61002


@pytest.fixture
def channel(kafka_mock):
    writer = StreamingWriter(kafka_mock.bootstrap)
    channel = MsgstreamChannel(writer, f"m23{uuid.uuid4().hex[:6]}")
    channel.tick(0)  # the topic exists before the task reads its end
    yield channel
    writer.close()


def source_config(channel: MsgstreamChannel, etcd_service, kafka_mock) -> dict[str, Any]:
    prefix = channel.pchannel.removesuffix("-rootcoord-dml_0")
    return {
        "sourceConfig": {
            "etcd": {"address": [etcd_service.endpoint]},
            "etcdRootPath": f"{prefix}-meta",  # no catalog: the records say it all
            "channelPrefix": prefix,
            "kafka": {"address": kafka_mock.bootstrap},
            "dmlChannelNum": 1,
        }
    }


def start_task(daemon, channel: MsgstreamChannel, target: dict[str, Any], *names: str) -> str:
    infos = [{"name": name} for name in names]
    created = daemon.call("create", {**target, "collection_infos": infos})
    assert created.code == 200, created.body
    task_id = str(created.data["task_id"])

    def positioned() -> bool:
        positions = daemon.call("position", {"task_id": task_id}).data.get("positions") or []
        return channel.pchannel in {p["channel_name"] for p in positions}

    wait_until(positioned, 30, "the task has a position on the channel")
    return task_id


def task_into_kafka(
    daemon_factory, etcd_service, kafka_mock, channel: MsgstreamChannel, prefix: str, *more: str
):
    """A daemon reading the channel and a task of a new collection (``prefix``_..., and that
    name with each suffix of ``more``) into a new topic: (the daemon, the collection's name,
    the topic, the task's id)."""
    name = f"{prefix}_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**source_config(channel, etcd_service, kafka_mock)).start()
    target, topic = kafka_target(kafka_mock)
    return daemon, name, topic, start_task(daemon, channel, target, name, *(name + m for m in more))


def kafka_target(kafka_mock) -> tuple[dict[str, Any], str]:
    topic = f"events-{uuid.uuid4().hex[:8]}"
    return {"kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": topic}}, topic


def tags(rebuilt: Rebuilt) -> dict[int, str]:
    return {pk: row["tag"] for pk, row in rebuilt.rows.items()}


def ops_per_key(rebuilt: Rebuilt) -> dict[int, list[str]]:
    ops: dict[int, list[str]] = {}
    for event in rebuilt.row_events():
        ops.setdefault(event["pk"], []).append(event["op"])
    return ops


def write_an_upsert_split_by_a_ddl(
    channel: MsgstreamChannel, name: str, after_the_ddl: Callable[[], None] = lambda: None
) -> dict[int, str]:
    """Rows 1..3, then an upsert of 2 whose Insert and Delete have a CreateCollection of
    another collection (younger than them) between them (``after_the_ddl`` runs once the DDL
    is written); what the target must hold."""
    channel.create_collection(COLLECTION, name, 10)
    channel.insert(COLLECTION, name, [1, 2, 3], 20, tag="old")
    channel.tick(30)
    channel.insert(COLLECTION, name, [2], 40, tag="new", upsert=True)
    channel.create_collection(OTHER, f"{name}_other", 50)
    after_the_ddl()
    channel.delete(COLLECTION, name, [2], 40, partition="_default")
    channel.tick(60)
    return {1: "old-1", 2: "new-2", 3: "old-3"}


def test_a_ddl_between_an_upserts_halves_into_kafka_gives_one_upsert_event(
    daemon_factory, etcd_service, kafka_mock, channel
):
    """The other collection is replicated too, and the daemon is killed once its creation is
    on the topic: the commit before the DDL (with the position before the waiting Insert)
    must name no tick above the released one, or the restart skips the upsert's halves."""
    name = f"split_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**source_config(channel, etcd_service, kafka_mock)).start()
    target, topic = kafka_target(kafka_mock)
    task_id = start_task(daemon, channel, target, name, f"{name}_other")

    def kill_once_the_ddl_is_applied() -> None:
        wait_until(
            lambda: any(
                e["op"] == "create_collection" and e["collection"] == f"{name}_other"
                for e in Rebuilt(kafka_mock.bootstrap, topic, task_id).ddl
            ),
            60,
            "the other collection's creation on the topic",
        )
        daemon.kill()
        daemon.start()

    expected = write_an_upsert_split_by_a_ddl(channel, name, kill_once_the_ddl_is_applied)

    def settled() -> Rebuilt | None:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        ops = ops_per_key(rebuilt)
        return rebuilt if len(ops.get(2, [])) >= 2 and len(rebuilt.rows) >= 2 else None

    with contextlib.suppress(ServiceStartError):  # the assertion below names what differs
        wait_until(settled, 60, "the upsert's events on the topic")
    time.sleep(1)  # a Delete sent alone comes in a later transaction: give it its time
    rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
    assert ops_per_key(rebuilt) == {1: ["insert"], 2: ["insert", "upsert"], 3: ["insert"]}
    assert tags(rebuilt) == expected


IntoMilvus = Callable[
    [Callable[[str], object], Callable[[dict[int, str]], bool]], tuple[str, dict[int, str]]
]


@pytest.fixture
def into_milvus(
    daemon_factory, etcd_service, kafka_mock, channel, milvus_lite_service, target_client
) -> IntoMilvus:
    """A task from the channel into Milvus Lite, the channel written (``write`` of a new
    collection's name); the collection's name and the target's tags by key once ``done`` says
    so (60 s at most), read once more a second later (a write sent alone comes after)."""

    def replicate(
        write: Callable[[str], object], done: Callable[[dict[int, str]], bool]
    ) -> tuple[str, dict[int, str]]:
        name = f"split_{uuid.uuid4().hex[:6]}"
        daemon = daemon_factory(**source_config(channel, etcd_service, kafka_mock)).start()
        start_task(
            daemon, channel, {"milvus_connect_param": {"uri": milvus_lite_service.uri}}, name
        )
        write(name)
        wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
        index = target_client.prepare_index_params()
        index.add_index("vector", index_type="FLAT", metric_type="L2")
        target_client.create_index(name, index)

        def tags_now() -> dict[int, str]:
            return {pk: row["tag"] for pk, row in rows(target_client, name, "id").items()}

        with contextlib.suppress(ServiceStartError):  # the caller's assertion names the rest
            wait_until(lambda: done(tags_now()), 60, "the target holds the rows written")
        time.sleep(1)
        return name, tags_now()

    return replicate


def test_a_ddl_between_an_upserts_halves_into_milvus_keeps_the_row(into_milvus, channel):
    expected: dict[int, str] = {}

    def write(name: str) -> None:
        expected.update(write_an_upsert_split_by_a_ddl(channel, name))

    _, got = into_milvus(write, lambda got: got == expected)
    assert got == expected


def test_an_out_of_order_record_is_on_the_topic_once_through_a_kill_and_a_pause(
    daemon_factory, etcd_service, kafka_mock, channel
):
    daemon, name, topic, task_id = task_into_kafka(
        daemon_factory, etcd_service, kafka_mock, channel, "order"
    )
    channel.create_collection(COLLECTION, name, 10)
    channel.tick(20)
    channel.insert(COLLECTION, name, [100], 100, tag="a")  # waits for a tick >= 100
    channel.insert(COLLECTION, name, [90], 90, tag="b")  # older, after it
    channel.tick(95)  # releases B only: B is committed with the position before A

    def on_topic(keys: set[int]):
        return lambda: keys <= set(Rebuilt(kafka_mock.bootstrap, topic, task_id).rows)

    wait_until(on_topic({90}), 60, "B on the topic")
    daemon.kill()
    daemon.start()
    time.sleep(2)  # it reads A, B and the tick again
    assert daemon.call("pause", {"task_id": task_id}).code == 200
    assert daemon.call("resume", {"task_id": task_id}).code == 200
    time.sleep(2)
    channel.tick(110)  # releases A
    wait_until(on_topic({90, 100}), 60, "A on the topic")
    time.sleep(1)
    rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
    events = Counter((e["pk"], e["op"]) for e in rebuilt.row_events())
    assert events == {(90, "insert"): 1, (100, "insert"): 1}, rebuilt.account()


def test_a_metastore_error_after_a_kafka_commit_emits_nothing_again(
    daemon_factory, etcd_service, kafka_mock, channel, tmp_path
):
    name = f"store_{uuid.uuid4().hex[:6]}"
    workdir = tmp_path / "meta-etcd"
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(etcd_server(workdir))
        daemon = daemon_factory(
            **source_config(channel, etcd_service, kafka_mock),
            metaStoreConfig={
                "storeType": "etcd",
                "etcd": {"address": [store.endpoint]},
                "rootPath": f"store-{uuid.uuid4().hex[:8]}",
            },
            fleet={"leaseSeconds": 20, "checkSeconds": 1},
        ).start()
        target, topic = kafka_target(kafka_mock)
        task_id = start_task(daemon, channel, target, name)
        channel.create_collection(COLLECTION, name, 10)
        channel.insert(COLLECTION, name, [20], 20, tag="c")
        channel.tick(30)

        def on_topic(keys: set[int]):
            return lambda: keys <= set(Rebuilt(kafka_mock.bootstrap, topic, task_id).rows)

        wait_until(on_topic({20}), 60, "the first row on the topic")
        time.sleep(1)  # its position saved in the metastore too

        stack.close()  # the metastore goes away
        channel.insert(COLLECTION, name, [100], 100, tag="a")
        channel.insert(COLLECTION, name, [90], 90, tag="b")
        channel.tick(95)  # B is committed to Kafka; the metastore's save fails
        wait_until(on_topic({90}), 30, "B on the topic")
        time.sleep(4)  # the channel rewinds and reads A, B and the tick again, twice
        stack.enter_context(etcd_server(workdir, ports=(store.port, store.peer_port)))
        wait_until(lambda: daemon.get("/readyz")[0] == 200, 60, "/readyz 200 after the outage")
        channel.tick(110)  # releases A
        wait_until(on_topic({20, 90, 100}), 60, "A on the topic")
        time.sleep(1)
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        events = Counter((e["pk"], e["op"]) for e in rebuilt.row_events())
        assert events == {(20, "insert"): 1, (90, "insert"): 1, (100, "insert"): 1}, (
            rebuilt.account()
        )
        assert "metastore" in daemon.log_text().lower()
        daemon.stop()


def test_the_harness_writes_an_upsert_as_a_real_2_3_5_does(
    milvus_source, etcd_service, kafka_mock, source_client
):
    """The writer's upsert records against a real 2.3.5's, field by field where they matter
    to the daemon: the Insert's MsgBase timestamp, its rows' time, its partition, and the
    Delete's time, partition and keys."""
    name = f"shape_{uuid.uuid4().hex[:8]}"
    create_source_collection(source_client, name)
    source_client.upsert(name, make_rows(1, 1, "new"))
    meta = collection_meta(milvus_source, etcd_service, name)
    kafka = KafkaSource(kafka_mock.bootstrap)
    real = [
        r
        for pchannel in meta.pchannels
        for r in records_since_creation(kafka, meta, pchannel)
        if dml_of(r, meta.collection_id)
    ]
    assert [msg_type(r) for r in real] == [common_pb2.Insert, common_pb2.Delete]

    ours = MsgstreamChannel(StreamingWriter(None), "shape")
    written = [
        ours.insert(COLLECTION, name, [1], 40, upsert=True),
        ours.delete(COLLECTION, name, [1], 40, partition="_default"),
    ]

    def shape(insert_payload: bytes, delete_payload: bytes) -> tuple:
        insert = msg_pb2.InsertRequest.FromString(insert_payload)
        delete = msg_pb2.DeleteRequest.FromString(delete_payload)
        return (
            insert.base.timestamp == 0,
            set(insert.timestamps) == {delete.base.timestamp},
            insert.partition_name,
            delete.partition_name,
            list(delete.primary_keys.int_id.data),
            set(delete.timestamps) == {delete.base.timestamp},
        )

    assert shape(written[0].payload, written[1].payload) == shape(real[0].payload, real[1].payload)


def write_an_upsert_split_by_its_partitions_drop(channel: MsgstreamChannel, name: str) -> None:
    """Rows 1..3 in p1 and 9 in _default; an upsert of 2 into p1 whose Insert and Delete have
    the drop of p1 (younger) between them, and an Insert of 5 into p1 older than the drop read
    after it; then 10 into _default. The source holds 9 and 10, and no p1."""
    channel.create_collection(COLLECTION, name, 10, partitions=("_default", "p1"))
    channel.insert(COLLECTION, name, [1, 2, 3], 20, tag="old", partition="p1")
    channel.insert(COLLECTION, name, [9], 20, tag="kept")
    channel.tick(30)
    channel.insert(COLLECTION, name, [2], 40, tag="new", partition="p1", upsert=True)
    channel.drop_partition(COLLECTION, name, "p1", 50)
    channel.delete(COLLECTION, name, [2], 40, partition="p1")
    channel.insert(COLLECTION, name, [5], 45, tag="late", partition="p1")
    channel.tick(60)
    channel.insert(COLLECTION, name, [10], 70, tag="after")
    channel.tick(80)


def test_a_partitions_drop_between_an_upserts_halves_into_milvus(
    into_milvus, channel, target_client
):
    name, got = into_milvus(
        lambda name: write_an_upsert_split_by_its_partitions_drop(channel, name),
        lambda got: 10 in got,
    )
    assert got == {9: "kept-9", 10: "after-10"}
    assert "p1" not in target_client.list_partitions(name)


def test_a_partitions_drop_between_an_upserts_halves_into_kafka(
    daemon_factory, etcd_service, kafka_mock, channel
):
    """Then the same upsert split by the drop of its own collection (another, replicated too:
    its lone Insert went out before the drop as a second ``insert`` of the key)."""
    _, name, topic, task_id = task_into_kafka(
        daemon_factory, etcd_service, kafka_mock, channel, "dropp", "_other"
    )
    write_an_upsert_split_by_its_partitions_drop(channel, name)
    other = f"{name}_other"
    channel.create_collection(OTHER, other, 90)
    channel.insert(OTHER, other, [1, 2], 100, tag="old")
    channel.tick(110)
    channel.insert(OTHER, other, [2], 120, tag="new", upsert=True)
    channel.drop_collection(OTHER, other, 130)
    channel.delete(OTHER, other, [2], 120, partition="_default")
    channel.tick(140)
    channel.insert(COLLECTION, name, [11], 150, tag="last")
    channel.tick(160)

    def written() -> Rebuilt | None:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        return rebuilt if 11 in rebuilt.rows else None

    with contextlib.suppress(ServiceStartError):
        wait_until(written, 60, "the row written after the drops on the topic")
    time.sleep(1)
    rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
    # the topic's partitions hold the events by key: compared per key and for the DDL
    by_key: dict[tuple[str, int], list[tuple[str, str]]] = {
        (name, 2): [],
        (name, 5): [],
        (other, 2): [],
    }
    for event in rebuilt.row_events():
        key = (event["collection"], event["pk"])
        if key in by_key:
            by_key[key].append((event["op"], (event.get("row") or {}).get("tag")))
    ddl = [(e["op"], e.get("partition")) for e in rebuilt.ddl if "partition" in e["op"]]
    # before: 2 inserted again alone (the upsert's Insert), p1 made again, 2 deleted, 5
    # inserted; the other collection's 2 inserted again alone
    assert by_key == {
        (name, 2): [("insert", "old-2")],
        (name, 5): [],
        (other, 2): [("insert", "old-2")],
    }, by_key
    assert sorted(ddl) == [("create_partition", "p1"), ("drop_partition", "p1")], ddl


def test_a_dropped_partitions_late_record_after_a_restart_past_the_drop_into_milvus(
    daemon_factory, etcd_service, kafka_mock, channel, milvus_lite_service, target_client
):
    """The drop of p1 at 50, then a row of the default partition and a tick at 46 (below the
    drop): the position is saved past the drop with tick 46. A ``kill -9``, and an Insert into
    p1 at 48 (older than the drop) comes after the restart: the drop is remembered across it
    (the row was on the target)."""
    name = f"dropr_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**source_config(channel, etcd_service, kafka_mock)).start()
    task_id = start_task(
        daemon, channel, {"milvus_connect_param": {"uri": milvus_lite_service.uri}}, name
    )
    channel.create_collection(COLLECTION, name, 10, partitions=("_default", "p1"))
    channel.insert(COLLECTION, name, [1], 20, tag="old", partition="p1")
    channel.insert(COLLECTION, name, [9], 20, tag="kept")
    channel.tick(30)
    channel.drop_partition(COLLECTION, name, "p1", 50)
    channel.insert(COLLECTION, name, [8], 45, tag="mid")  # written at the tick: saved past it
    channel.tick(46)

    def saved_tick() -> int:
        positions = daemon.call("position", {"task_id": task_id}).data.get("positions") or []
        return max((int(p["tt"]) for p in positions), default=0)

    wait_until(lambda: saved_tick() >= channel.at(46), 60, "the position saved past the drop")
    daemon.kill()
    daemon.start()
    channel.insert(COLLECTION, name, [5], 48, tag="late", partition="p1")
    channel.tick(60)
    channel.insert(COLLECTION, name, [10], 70, tag="after")
    channel.tick(80)
    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
    index = target_client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="L2")
    target_client.create_index(name, index)
    wait_until(lambda: 10 in rows(target_client, name, "id"), 60, "the last row on the target")
    got = {pk: row["tag"] for pk, row in rows(target_client, name, "id").items()}
    assert got == {8: "mid-8", 9: "kept-9", 10: "after-10"}
    assert "p1" not in target_client.list_partitions(name)


def test_a_read_of_more_rows_than_a_commit_holds_is_committed_at_its_ticks_and_once(
    daemon_factory, etcd_service, kafka_mock, channel
):
    """A Kafka target's events are built whole at their commit, several times the WAL's bytes:
    a read releasing more rows than a commit holds (``GROUP_EVENTS``) is committed at the tick
    that reaches it, with that tick's position, not whole at the read's end (eight channels
    each holding a read of 8 MB of WAL as JSON took a catch-up past a gigabyte). Written while
    the task is paused, the backlog is one read: 30,000 rows, a tick after each 5,000. No
    commit holds more than 20,000 rows, and through a ``kill -9`` each row is on the topic
    once."""
    daemon, name, topic, task_id = task_into_kafka(
        daemon_factory, etcd_service, kafka_mock, channel, "chunked"
    )
    channel.create_collection(COLLECTION, name, 10)
    channel.tick(20)
    assert daemon.call("pause", {"task_id": task_id}).code == 200
    for tick in range(6):
        base = 1_000 + tick * 100
        for part in range(5):
            first = tick * 5_000 + part * 1_000
            channel.insert(COLLECTION, name, range(first, first + 1_000), base + part)
        channel.tick(base + 50)
    assert daemon.call("resume", {"task_id": task_id}).code == 200

    def rebuilt_all() -> Rebuilt | None:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        return rebuilt if len(rebuilt.rows) == 30_000 else None

    rebuilt = wait_until(rebuilt_all, 90, "the 30,000 rows on the topic")
    per_commit = Counter(e["source"]["commit"] for e in rebuilt.row_events())
    assert len(per_commit) >= 2 and max(per_commit.values()) <= 20_000, sorted(per_commit.values())
    daemon.kill()
    daemon.start()
    channel.tick(2_000)
    time.sleep(3)  # it reads from its committed position again
    rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
    events = Counter(e["pk"] for e in rebuilt.row_events())
    assert len(events) == 30_000 and set(events.values()) == {1}, rebuilt.account()
