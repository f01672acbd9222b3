"""What a source says beyond rows reaches the target too: a 2.6 collection's consistency level and
properties, 2.6 flushes, and deletes limited to one partition."""

from __future__ import annotations

import uuid

import etcd3
import grpc
import pytest
from harness.catalog26_writer import IMPORT_COMPLETED, IMPORT_IMPORTING, Catalog26Writer
from harness.services import wait_until
from pymilvus import MilvusClient
from pymilvus.grpc_gen import common_pb2, milvus_pb2, milvus_pb2_grpc

from tests.e2e.test_replication import (
    create_source_collection,
    create_task,
    make_rows,
    source_config,
)
from tests.e2e.test_streaming_source import start_task, task_view, wait_for_collection, wait_rows

pytestmark = pytest.mark.e2e

BOUNDED = common_pb2.ConsistencyLevel.Value("Bounded")


def persistent_rows(uri: str, collection: str) -> tuple[int, set[str]]:
    """(rows in flushed segments, their states) of a collection on a real Milvus."""
    address = uri.split("://", 1)[-1]
    with grpc.insecure_channel(address) as channel:
        stub = milvus_pb2_grpc.MilvusServiceStub(channel)
        answer = stub.GetPersistentSegmentInfo(
            milvus_pb2.GetPersistentSegmentInfoRequest(dbName="default", collectionName=collection),
            timeout=30,
        )
    states = {common_pb2.SegmentState.Name(i.state) for i in answer.infos}
    return sum(i.num_rows for i in answer.infos), states


def test_a_2_6_collection_keeps_its_consistency_level_and_properties(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """A 2.6 CreateCollection carries its consistency level only as a schema property; a
    real Milvus target must end with Bounded (not the Strong of a missing level), and with
    the collection's other properties (``timezone``, a TTL)."""
    w = stream.writer
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    name, collection_id = f"bounded_{uuid.uuid4().hex[:6]}", 53001
    try:
        daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
        start_task(daemon, milvus_source_rocksmq.uri, stream, name)
        w.create_collection(
            collection_id,
            name,
            [*stream.vchannels(collection_id, 2), f"{stream.pchannel(0)}_vcchan"],
            consistency_level=BOUNDED,
            properties=[("timezone", "Asia/Shanghai"), ("collection.ttl.seconds", "86400")],
        )
        stream.tick_all()
        wait_until(lambda: target.has_collection(name), 60, f"{name} on the target")
        described = target.describe_collection(name)
        assert described["consistency_level"] == BOUNDED, described
        properties = dict(described.get("properties") or {})
        assert properties.get("timezone") == "Asia/Shanghai", described
        assert properties.get("collection.ttl.seconds") == "86400", described
    finally:
        target.close()


def test_2_6_flushes_reach_the_target(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """ManualFlush of one collection, then FlushAll: the target's segments are flushed with
    every row written before them (a real Milvus shows its flushed segments)."""
    w = stream.writer
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    tag = uuid.uuid4().hex[:6]
    first, second = f"flush_a_{tag}", f"flush_b_{tag}"
    try:
        daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
        start_task(daemon, milvus_source_rocksmq.uri, stream, first, second)
        expected: dict[str, dict[int, str]] = {}
        vchannels = {}
        for collection_id, name in ((53101, first), (53102, second)):
            vchannels[name] = stream.vchannels(collection_id, 2)
            w.create_collection(
                collection_id, name, [*vchannels[name], f"{stream.pchannel(0)}_vcchan"]
            )
            stream.tick_all()
            for n, vchannel in enumerate(vchannels[name]):
                w.insert(vchannel, collection_id, range(n * 100, n * 100 + 30))
            expected[name] = {
                pk: f"row-{pk}" for n in range(2) for pk in range(n * 100, n * 100 + 30)
            }
        stream.tick_all()
        for name in (first, second):
            wait_for_collection(target, name)
            wait_rows(target, name, expected[name])
        assert persistent_rows(milvus_source_rocksmq.uri, first)[0] == 0  # not flushed yet

        w.manual_flush(53101, vchannels[first], segment_ids=[1])
        stream.tick_all()
        wait_until(
            lambda: persistent_rows(milvus_source_rocksmq.uri, first)[0] == 60,
            60,
            f"{first} flushed on the target",
        )
        assert persistent_rows(milvus_source_rocksmq.uri, second)[0] == 0

        w.flush_all([stream.pchannel(i) for i in range(stream.channels)], stream.pchannel(0))
        stream.tick_all()
        wait_until(
            lambda: persistent_rows(milvus_source_rocksmq.uri, second)[0] == 60,
            60,
            f"{second} flushed on the target by FlushAll",
        )
    finally:
        target.close()


def test_a_delete_in_one_of_two_partitions_holding_a_key_stays_in_that_partition(
    daemon_factory, milvus_source, etcd_service, kafka_mock, source_client, milvus_source_rocksmq
):
    """Milvus keeps a primary key once per partition; a delete that names a partition removes
    the key there only, one that names none removes it everywhere. (A real Milvus target only:
    Milvus Lite keeps a key once across partitions and ignores a delete's partition, seen.)"""
    target = milvus_source_rocksmq
    target_milvus = MilvusClient(uri=target.uri, dedicated=True)
    name = f"twoparts_{uuid.uuid4().hex[:8]}"
    create_source_collection(source_client, name)
    for partition in ("p1", "p2"):
        source_client.create_partition(name, partition)
    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    task_id = create_task(daemon, target.uri, name)
    for partition in ("p1", "p2"):
        source_client.insert(name, make_rows(0, 10, partition), partition_name=partition)
    source_client.delete(name, ids=[0, 1, 2, 3, 4], partition_name="p1")
    source_client.delete(name, ids=[9])  # every partition

    def keys(client: MilvusClient, partition: str) -> list[int]:
        client.load_collection(name)
        found = client.query(
            name,
            filter="id >= 0",
            partition_names=[partition],
            output_fields=["id"],
            consistency_level="Strong",
        )
        return sorted(r["id"] for r in found)

    wanted = {"p1": [5, 6, 7, 8], "p2": [0, 1, 2, 3, 4, 5, 6, 7, 8]}
    assert {p: keys(source_client, p) for p in wanted} == wanted  # what Milvus itself does
    wait_until(
        lambda: (
            target_milvus.has_collection(name)
            and {p: keys(target_milvus, p) for p in wanted} == wanted
        ),
        90,
        "the target's partitions equal the source's",
    )
    assert task_view(daemon, task_id)["state"] == "Running"
    target_milvus.close()


def test_a_star_task_stops_rather_than_drop_rows_it_cannot_place(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, stream
):
    """A 2.6 collection created before the task, which the source's etcd does not describe:
    its rows, written after the task started, stop a ``*`` task with a reason naming the
    collection, the channel and the position (they were dropped in silence before)."""
    w = stream.writer
    collection_id = 53201
    name = f"before_{uuid.uuid4().hex[:6]}"
    vchannels = stream.vchannels(collection_id, 1)
    w.create_collection(collection_id, name, [*vchannels, f"{stream.pchannel(0)}_vcchan"])
    stream.tick_all()
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, "*")  # every collection
    w.insert(vchannels[0], collection_id, range(10))
    stream.tick_all()
    wait_until(lambda: task_view(daemon, task_id)["state"] == "Failed", 60, "the task stops")
    reason = task_view(daemon, task_id)["reason"]
    assert f"collection {collection_id}" in reason, reason
    assert vchannels[0].rsplit("_", 1)[0] in reason, reason  # the channel
    assert "offset" in reason, reason


def test_records_a_named_task_skips_are_counted_by_cause(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """Rows of a collection the task does not select (known from its CreateCollection) and of
    one nobody knows are counted apart, in progress and in /metrics; the task's own rows
    arrive."""
    w = stream.writer
    tag = uuid.uuid4().hex[:6]
    mine, other, unknown = f"mine_{tag}", f"other_{tag}", 53303
    unknown_channel = stream.vchannels(unknown, 1)[0]
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, mine)
    control = f"{stream.pchannel(0)}_vcchan"
    w.create_collection(53301, mine, [*stream.vchannels(53301, 1), control])
    w.create_collection(53302, other, [*stream.vchannels(53302, 1), control])
    stream.tick_all()
    w.insert(stream.vchannels(53301, 1)[0], 53301, range(5))
    w.insert(stream.vchannels(53302, 1)[0], 53302, range(7))
    w.insert(unknown_channel, unknown, range(3))
    w.insert(unknown_channel, unknown, range(3, 6))
    stream.tick_all()
    wait_for_collection(target_client, mine)
    wait_rows(target_client, mine, {pk: f"row-{pk}" for pk in range(5)})

    def skipped() -> dict:
        return task_view(daemon, task_id)["progress"].get("skipped") or {}

    wait_until(
        lambda: skipped().get("not_selected") == 1 and skipped().get("unknown_collection") == 2,
        30,
        f"skips counted by cause (now {skipped()})",
    )
    metrics = daemon.get("/metrics")[1].decode()
    assert f'cdc_skipped_records_total{{cause="unknown_collection",task_id="{task_id}"}} 2.0' in (
        metrics
    ), [line for line in metrics.splitlines() if "skipped" in line]
    assert task_view(daemon, task_id)["state"] == "Running"


def test_ignore_partition_writes_every_row_to_the_default_partition(
    daemon_factory,
    milvus_source,
    etcd_service,
    kafka_mock,
    source_client,
    target_client,
    milvus_lite_service,
):
    """The Go tool's ``ignore_partition``: the target gets the rows of every partition in its
    default partition, and no partitions of its own. (A delete naming a partition deletes the
    key from that single partition: a key the source held only in another partition would go
    too, which is what the option means.)"""
    name = f"onepart_{uuid.uuid4().hex[:8]}"
    create_source_collection(source_client, name)
    for partition in ("p1", "p2"):
        source_client.create_partition(name, partition)
    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    created = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": milvus_lite_service.uri, "ignore_partition": True},
            "collection_infos": [{"name": name}],
        },
    )
    assert created.code == 200, created.body
    source_client.insert(name, make_rows(0, 10, "p1"), partition_name="p1")
    source_client.insert(name, make_rows(10, 10, "p2"), partition_name="p2")
    source_client.insert(name, make_rows(20, 5, "default"))
    source_client.delete(name, ids=[3], partition_name="p1")

    def keys() -> list[int]:
        target_client.load_collection(name)
        found = target_client.query(
            name, filter="id >= 0", output_fields=["id"], consistency_level="Strong"
        )
        return sorted(r["id"] for r in found)

    expected = sorted(set(range(25)) - {3})
    wait_until(
        lambda: target_client.has_collection(name) and keys() == expected,
        90,
        "every row in the target's default partition",
    )
    assert target_client.list_partitions(name) == ["_default"]


def test_a_2_6_source_with_collections_made_before_the_task_is_replicated(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream
):
    """A 2.6 source whose etcd describes a collection made (and written) before the task: a
    ``*`` task finds it in the catalog, starts at its creation, and copies every row, before
    and after the task, with its consistency level; nothing is skipped as unknown."""
    import etcd3
    from harness.catalog26_writer import Catalog26Writer

    w = stream.writer
    name, collection_id = f"early_{uuid.uuid4().hex[:6]}", 53401
    pchannels = [stream.pchannel(i) for i in range(stream.channels)]
    client = etcd3.client(host=etcd_service.host, port=etcd_service.port, timeout=10)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        catalog = Catalog26Writer(client, f"{stream.prefix}-meta", tso=w.tso)
        catalog.register_pchannels(pchannels)
        made = catalog.create_collection(
            collection_id,
            name,
            pchannels,
            consistency_level=BOUNDED,
            properties={"timezone": "UTC"},
            wal=w,
        )
        expected: dict[int, str] = {}
        for n, vchannel in enumerate(made.vchannels):
            w.insert(vchannel, collection_id, range(n * 100, n * 100 + 10))
            expected.update({pk: f"row-{pk}" for pk in range(n * 100, n * 100 + 10)})
        stream.tick_all()

        daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
        task_id = start_task(daemon, milvus_source_rocksmq.uri, stream, "*")
        for n, vchannel in enumerate(made.vchannels):
            w.insert(vchannel, collection_id, range(n * 100 + 50, n * 100 + 60))
            expected.update({pk: f"row-{pk}" for pk in range(n * 100 + 50, n * 100 + 60)})
        stream.tick_all()

        wait_for_collection(target, name)
        wait_rows(target, name, expected)
        assert target.describe_collection(name)["consistency_level"] == BOUNDED
        task = task_view(daemon, task_id)
        assert task["state"] == "Running", task
        skipped = task["progress"].get("skipped") or {}
        assert not skipped.get("unknown_collection") and not skipped.get("unknown_before_task")
    finally:
        target.close()
        client.close()


def test_a_2_6_bulk_import_is_shown_as_pending_until_copied(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """An Import carries no rows through the WAL: the task says so (``imports_pending`` with
    the job and its files, a warning in its reason naming the remedy), keeps running, and
    still after a restart; the source's import-job record tells when it completed."""
    w = stream.writer
    name, collection_id = f"imported_{uuid.uuid4().hex[:6]}", 53501
    vchannels = stream.vchannels(collection_id, 2)
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    w.create_collection(collection_id, name, [*vchannels, f"{stream.pchannel(0)}_vcchan"])
    stream.tick_all()
    w.insert(vchannels[0], collection_id, range(5))
    w.import_job(collection_id, name, vchannels, 9001, [["s3://bucket/part-0.parquet"]])
    stream.tick_all()
    wait_for_collection(target_client, name)
    wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(5)})

    def pending() -> list:
        return list(task_view(daemon, task_id)["progress"].get("imports_pending") or [])

    wait_until(lambda: len(pending()) == 1, 30, "the import shown as pending")
    (job,) = pending()
    assert job["job_id"] == 9001 and job["files"] == [["s3://bucket/part-0.parquet"]], job
    task = task_view(daemon, task_id)
    assert task["state"] == "Running" and "job 9001" in task["reason"], task
    assert f"backfill of {name}" in task["reason"], task
    daemon.stop()
    daemon.start()
    wait_until(lambda: len(pending()) == 1, 30, "still pending after a restart")

    # the data coordinator's import-job record (written as Milvus does) says when it completed;
    # this daemon cannot backfill (no source Milvus to read): it waits with the command to run
    files = [["s3://bucket/part-0.parquet"]]
    client = etcd3.client(etcd_service.host, etcd_service.port)
    try:
        catalog = Catalog26Writer(client, f"{stream.prefix}-meta")
        catalog.import_job(9001, collection_id, name, files, IMPORT_IMPORTING, vchannels=vchannels)
        wait_until(lambda: pending()[0]["phase"] == "running", 30, "the import job read")
        catalog.import_job(9001, collection_id, name, files, IMPORT_COMPLETED, vchannels=vchannels)
        wait_until(lambda: pending()[0]["phase"] == "completed", 30, "its completion read")
    finally:
        client.close()
    (job,) = pending()
    assert job["state"] == "pending", job
    assert f"milvus-cdc task backfill {task_id} --collection {name}" in job["detail"], job
    assert "job 9001" in task_view(daemon, task_id)["reason"]
