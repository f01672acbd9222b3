"""End to end: a real Milvus 2.3.5 source (WAL on the Kafka mock, metadata in etcd), the daemon
over HTTP, and a Milvus Lite target; the target is compared with the source row by row."""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.dr_clusters import DIM, create_source_collection
from harness.services import ServiceStartError, wait_until
from prometheus_client.parser import text_string_to_metric_families
from pymilvus import DataType, MilvusClient

from replicator.backfill.transfer import pages_by_key

pytestmark = pytest.mark.e2e

__all__ = ["DIM", "create_source_collection"]  # imported from here by other tests


def source_config(milvus_source, etcd_service, kafka_mock) -> dict:
    return {
        "sourceConfig": {
            "etcd": {"address": [etcd_service.endpoint]},
            "etcdRootPath": milvus_source.etcd_root_path,
            "channelPrefix": milvus_source.chan_prefix,
            "kafka": {"address": kafka_mock.bootstrap},
        }
    }


def rows(client: MilvusClient, collection: str, pk: str, *, by_key: bool = False) -> dict:
    """Every row by primary key (read with a query iterator, so any key range works); a primary
    key seen twice fails the test, and so does a count that disagrees with count(*).

    ``by_key`` reads page by page after the last key with the backfill's escaped cursor
    instead: pymilvus's iterator puts a varchar key into its expression unescaped, so a key
    holding a quote at a page boundary breaks it. (Milvus Lite does not return the lowest keys
    first across partitions, so it needs the iterator.)"""
    client.load_collection(collection, timeout=60)
    total = int(
        client.query(
            collection,
            filter="",
            output_fields=["count(*)"],
            consistency_level="Strong",
            timeout=30,
        )[0]["count(*)"]
    )
    result: dict = {}
    for page in _pages(client, collection, pk, by_key):
        for row in page:
            key = row[pk]
            assert key not in result, f"duplicate primary key {key!r} in {collection}"
            result[key] = {k: comparable(v) for k, v in row.items()}
    assert len(result) == total, f"{collection}: count(*) says {total} rows, read {len(result)}"
    return result


def _pages(client: MilvusClient, collection: str, pk: str, by_key: bool) -> Iterator[list]:
    if by_key:
        yield from pages_by_key(client, collection, pk, "", ["*"], None, 2000)
        return
    pages = client.query_iterator(
        collection,
        batch_size=2000,
        output_fields=["*"],
        consistency_level="Strong",
        timeout=30,
    )
    try:
        while page := pages.next():
            yield page
    finally:
        pages.close()


def comparable(value):
    """Field values as plain Python: float vectors come back as numpy floats or lists of them."""
    if isinstance(value, list) and value and not isinstance(value[0], (str, dict, bytes)):
        return [float(x) if not isinstance(x, bool) else x for x in value]
    return value


def describe_difference(expected: dict, actual: dict) -> str:
    missing = sorted(set(expected) - set(actual), key=str)
    extra = sorted(set(actual) - set(expected), key=str)
    changed = sorted((k for k in set(expected) & set(actual) if expected[k] != actual[k]), key=str)
    example = [(expected[k], actual[k]) for k in changed[:1]]
    return (
        f"{len(missing)} missing {missing[:10]}, {len(extra)} extra {extra[:10]}, "
        f"{len(changed)} changed {changed[:10]}, e.g. {example}"
    )


def wait_equal(
    source, target, collection: str, pk: str, timeout: float = 90, *, by_key: bool = False
) -> dict:
    # a query can fail when a server drops the test client's connection (GOAWAY): read again
    (expected,) = wait_until(
        lambda: (rows(source, collection, pk, by_key=by_key),), 120, f"read {collection}"
    )

    def same() -> bool:
        if not target.has_collection(collection):
            return False
        return rows(target, collection, pk, by_key=by_key) == expected

    try:
        wait_until(same, timeout, f"target {collection} equal to the source")
    except ServiceStartError:
        exists = target.has_collection(collection)
        actual = rows(target, collection, pk, by_key=by_key) if exists else {}
        pytest.fail(f"{collection}: {describe_difference(expected, actual)}")
    return expected


def source_database(uri: str, db: str) -> MilvusClient:
    """Create a database on the source; a client bound to it (``use_database`` asks
    DescribeDatabase, which 2.3.5 lacks)."""
    admin = MilvusClient(uri=uri, dedicated=True)
    try:
        admin.create_database(db)
    finally:
        admin.close()
    return MilvusClient(uri=uri, db_name=db, dedicated=True)


def create_task(daemon, target_uri: str, *collections: str) -> str:
    """Create a task replicating the named collections of the default database; its id."""
    created = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": target_uri},
            "collection_infos": [{"name": name} for name in collections],
        },
    )
    assert created.code == 200, created.body
    return str(created.data["task_id"])


def make_rows(start: int, count: int, tag: str) -> list[dict]:
    rnd = random.Random(start)
    return [
        {
            "id": i,
            "vec": [rnd.random() for _ in range(DIM)],
            "title": f"{tag}-{i}",
            "score": i * 0.5,
        }
        for i in range(start, start + count)
    ]


def shared_everywhere(daemon, task_id: str) -> bool:
    """Every DML channel of the task reads the daemon's shared reader of that channel."""
    task = daemon.call("get", {"task_id": task_id}).data["task"]
    channels = [c for c in task["progress"]["channels"] if "-rootcoord-dml_" in c["channel"]]
    return bool(channels) and all(c.get("reader") == "shared" for c in channels)


def test_inserts_upserts_and_deletes_reach_the_target(
    daemon_factory,
    milvus_source,
    etcd_service,
    kafka_mock,
    target,
    source_client,
    target_milvus,
):
    """With a second task on another collection, started earlier: the two read the source's
    channels through the daemon's shared readers, each from its own start."""
    name, other = (f"e2e_{uuid.uuid4().hex[:8]}" for _ in range(2))
    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    create_source_collection(source_client, other)
    other_task = create_task(daemon, target.uri, other)
    source_client.insert(other, make_rows(0, 200, "other"))

    create_source_collection(source_client, name)
    source_client.insert(name, make_rows(0, 200, "before"))  # written before the task exists
    task_id = create_task(daemon, target.uri, name)

    for collection in (name, other):
        source_client.insert(collection, make_rows(200, 300, "after"))
        source_client.upsert(
            collection, [dict(r, title="upserted") for r in make_rows(150, 100, "x")]
        )
        source_client.delete(collection, ids=list(range(40)))
    source_client.insert(name, [dict(r, extra_field="dynamic") for r in make_rows(900, 5, "dyn")])

    expected = wait_equal(source_client, target_milvus, name, "id")
    assert len(expected) == 500 - 40 + 5
    assert expected[160]["title"] == "upserted"
    assert expected[905 - 1]["extra_field"] == "dynamic"
    assert 10 not in expected
    assert len(wait_equal(source_client, target_milvus, other, "id")) == 500 - 40
    assert daemon.call("get", {"task_id": other_task}).data["task"]["state"] == "Running"
    wait_until(
        lambda: shared_everywhere(daemon, task_id) and shared_everywhere(daemon, other_task),
        60,
        "both tasks reading the shared readers",
    )

    task = daemon.call("get", {"task_id": task_id}).data["task"]
    assert task["state"] == "Running", task
    progress = task["progress"]
    # 200 rows before the task + 300 + 100 upserted (written as delete + insert) + 40 + 5
    assert progress["rows"] >= 500 + 100 + 40 + 5, progress
    assert progress["bytes"] > 0
    assert progress["lag_seconds"] is not None
    assert progress["lag_seconds"] < 30
    channel = next(c for c in progress["channels"] if c["rows"])
    assert channel["position"]["backend"] == "kafka"
    listed = next(t for t in daemon.call("list").data["tasks"] if t["task_id"] == task_id)
    assert listed["progress"]["rows"] >= progress["rows"]
    metrics = daemon.get("/metrics")[1].decode()
    label = f'channel="{channel["channel"]}",task_id="{task_id}"'
    assert f"cdc_replicated_rows_total{{{label}}}" in metrics
    assert f"cdc_lag_seconds{{{label}}}" in metrics
    # the Go tool's metrics beside ours: boards made for it read the same series
    go = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.startswith("milvus_cdc_")
    }
    assert go[("milvus_cdc_task_state", (("task_id", task_id),))] == 1
    inserted = [
        value
        for (metric, labels), value in go.items()
        if metric == "milvus_cdc_replicate_data_cnt"
        and ("collection_name", name) in labels
        and ("api_type", "insert") in labels
    ]
    assert inserted and inserted[0] >= 1, go
    written = {
        dict(labels)["vchannel_name"]
        for (metric, labels), _ in go.items()
        if metric == "milvus_cdc_replicate_tt" and ("op_type", "write") in labels
    }
    assert channel["channel"] in written, go
    positions = daemon.call("position", {"task_id": task_id}).data["positions"]
    assert positions, "positions are saved per channel"
    # the index made on the source (replicate channel) is on the target with its parameters
    wait_until(lambda: "vec" in target_milvus.list_indexes(name), 30, "index replicated")
    described = target_milvus.describe_index(name, "vec")
    assert (described["index_type"], described["metric_type"]) == ("FLAT", "L2")
    # the replicate channel's position is saved once its first record is applied
    positions = daemon.call("position", {"task_id": task_id}).data["positions"]
    assert milvus_source.replicate_channel in {p["channel_name"] for p in positions}

    # release and drop the index on the source: the same on the target; then back again
    source_client.release_collection(name)
    source_client.drop_index(name, "vec")
    wait_until(lambda: "vec" not in target_milvus.list_indexes(name), 30, "index dropped")
    if target.kind != "milvus-lite":  # Lite answers Loaded whatever was released
        assert target_milvus.get_load_state(name)["state"].name == "NotLoad"
    index = source_client.prepare_index_params()
    index.add_index("vec", index_type="IVF_FLAT", metric_type="IP", params={"nlist": 16})
    source_client.create_index(name, index)
    source_client.load_collection(name)
    wait_until(lambda: "vec" in target_milvus.list_indexes(name), 30, "index made again")
    described = target_milvus.describe_index(name, "vec")
    assert (described["index_type"], described["metric_type"]) == ("IVF_FLAT", "IP")
    wait_until(
        lambda: target_milvus.get_load_state(name)["state"].name == "Loaded", 30, "loaded again"
    )

    # pause: nothing moves; resume: the writes made meanwhile arrive
    assert daemon.call("pause", {"task_id": task_id}).code == 200
    source_client.insert(name, make_rows(2000, 50, "paused"))
    time.sleep(2)
    target_now = rows(target_milvus, name, "id")
    assert 2000 not in target_now
    assert daemon.call("resume", {"task_id": task_id}).code == 200
    wait_equal(source_client, target_milvus, name, "id")

    # a restart resumes from the saved positions, with no duplicates
    assert daemon.stop() == 0
    source_client.insert(name, make_rows(3000, 50, "while down"))
    daemon.start()
    final = wait_equal(source_client, target_milvus, name, "id")
    assert 3049 in final

    # a partition (made in etcd only in 2.3) appears on first insert; dropping it drops it
    source_client.create_partition(name, "p_extra")
    source_client.insert(name, make_rows(5000, 40, "partition"), partition_name="p_extra")
    with_partition = wait_equal(source_client, target_milvus, name, "id")
    assert 5039 in with_partition
    assert "p_extra" in target_milvus.list_partitions(name)
    source_client.release_partitions(name, ["p_extra"])
    source_client.drop_partition(name, "p_extra")
    wait_until(
        lambda: "p_extra" not in target_milvus.list_partitions(name), 60, "partition dropped"
    )
    assert 5039 not in wait_equal(source_client, target_milvus, name, "id")

    # drop on the source drops on the target
    source_client.drop_collection(name)
    wait_until(lambda: not target_milvus.has_collection(name), 60, "target collection dropped")


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for process {pid}")


def test_ten_tasks_run_on_about_the_threads_of_one(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_lite_service, source_client
):
    """A daemon's threads follow the source's channels, not tasks x channels: nine more tasks,
    each reading every DML channel, add a few threads at most (before the fibers, each added a
    thread per channel and four more), and the tasks replicate, a collection created after its
    task too."""
    names = [f"thr_{i}_{uuid.uuid4().hex[:6]}" for i in range(10)]
    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    assert daemon.process is not None
    create_source_collection(source_client, names[0])
    first = create_task(daemon, milvus_lite_service.uri, names[0])
    wait_until(lambda: shared_everywhere(daemon, first), 60, "the first task reading")
    one = threads_of(daemon.process.pid)
    others = [create_task(daemon, milvus_lite_service.uri, name) for name in names[1:]]
    wait_until(lambda: all(shared_everywhere(daemon, t) for t in others), 90, "every task reading")
    ten = threads_of(daemon.process.pid)
    # a thread per task and source channel, as before the fibers, made it 119 -> 299
    assert ten - one <= 20, f"1 task: {one} threads, 10 tasks: {ten}"
    pool = {
        sample.name: sample.value
        for family in text_string_to_metric_families(daemon.get("/metrics")[1].decode())
        for sample in family.samples
        if sample.name.startswith(("cdc_pool_", "cdc_fibers"))
    }
    assert pool["cdc_fibers"] >= 10 * 2, pool  # a runner and a channel worker at least, each
    assert 8 <= pool["cdc_pool_threads"] < ten, pool
    create_source_collection(source_client, names[1])
    for name in names[:2]:
        source_client.insert(name, make_rows(0, 50, name))
    target = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    try:
        for name in names[:2]:
            assert len(wait_equal(source_client, target, name, "id")) == 50
    finally:
        target.close()
    for task_id in [first, *others]:
        assert daemon.call("get", {"task_id": task_id}).data["task"]["state"] == "Running"


def test_rocksmq_source_replicates_and_resumes(
    daemon_factory, milvus_source_rocksmq, etcd_service, milvus_lite_service, target_client
):
    """A standalone source on this host whose WAL is RocksMQ, read as a RocksDB secondary."""
    src = milvus_source_rocksmq
    source = MilvusClient(uri=src.uri, dedicated=True)
    try:
        name = f"rmq_{uuid.uuid4().hex[:8]}"
        create_source_collection(source, name)
        source.insert(name, make_rows(0, 100, "before"))
        daemon = daemon_factory(
            sourceConfig={
                "etcd": {"address": [etcd_service.endpoint]},
                "etcdRootPath": src.etcd_root_path,
                "channelPrefix": src.chan_prefix,
                "mqType": "rocksmq",
                "rocksmq": {"path": str(src.rocksmq_path)},
            }
        ).start()
        created = daemon.call(
            "create",
            {
                "milvus_connect_param": {"uri": milvus_lite_service.uri},
                "db_collections": {"default": [{"name": name}]},
            },
        )
        assert created.code == 200, created.body
        source.insert(name, make_rows(100, 200, "after"))
        source.upsert(name, [dict(r, title="upserted") for r in make_rows(50, 100, "x")])
        source.delete(name, ids=list(range(25)))
        expected = wait_equal(source, target_client, name, "id")
        assert len(expected) == 300 - 25
        assert expected[120]["title"] == "upserted"
        positions = daemon.call("position", {"task_id": created.data["task_id"]}).data
        assert {p["backend"] for p in positions["positions"]} == {"rocksmq"}
        assert daemon.stop() == 0
        source.insert(name, make_rows(1000, 30, "while down"))
        daemon.start()
        assert 1029 in wait_equal(source, target_client, name, "id")
    finally:
        source.close()


def test_history_lost_to_retention_starts_at_the_end_with_a_warning(
    daemon_factory,
    milvus_source,
    etcd_service,
    kafka_mock,
    milvus_lite_service,
    source_client,
    target_client,
):
    """A collection whose creation the queue no longer holds: the task starts at the end of the
    WAL, says so in its reason (again after a pause and resume), and replicates what follows."""
    from replicator.sources.kafka import KafkaSource

    name = f"lost_{uuid.uuid4().hex[:8]}"
    dim = 1024
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=dim)
    index = source_client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    source_client.create_collection(name, schema=schema, index_params=index, num_shards=1)
    rnd = random.Random(5)

    def batch(start: int, count: int) -> list[dict]:
        return [
            {"id": i, "vec": [rnd.random() for _ in range(dim)]}
            for i in range(start, start + count)
        ]

    # about 16 MB into the collection's one channel: the mock keeps a few MB per partition
    for start in range(0, 4000, 100):
        source_client.insert(name, batch(start, 100))
    kafka = KafkaSource(kafka_mock.bootstrap)
    assert any(kafka.watermarks(ch)[0] > 0 for ch in milvus_source.dml_channels), (
        "the mock kept the whole channel; write more to test retention"
    )

    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    task_id = create_task(daemon, milvus_lite_service.uri, name)

    def task() -> dict:
        return daemon.call("get", {"task_id": task_id}).data["task"]

    wait_until(lambda: "no longer holds" in task()["reason"], 60, "the warning in the reason")
    assert task()["state"] == "Running"
    assert "backfill" in task()["reason"]
    assert task()["progress"]["warnings"] == [task()["reason"]]

    source_client.insert(name, batch(100_000, 50))
    source_client.delete(name, ids=[100_000, 100_001])

    def replicated() -> bool:
        return target_client.has_collection(name) and set(rows(target_client, name, "id")) == set(
            range(100_002, 100_050)
        )

    # only what was written after the task started: the older rows need a backfill
    wait_until(replicated, 60, "rows written after the task on the target")

    assert daemon.call("pause", {"task_id": task_id}).code == 200
    assert "no longer holds" not in task()["reason"]
    assert daemon.call("resume", {"task_id": task_id}).code == 200
    wait_until(lambda: "no longer holds" in task()["reason"], 60, "the warning after a resume")


def test_aliases_follow_the_source(
    daemon_factory, milvus_source, etcd_service, kafka_mock, target, source_client, target_milvus
):
    """Aliases exist only in the source's etcd (no WAL record in 2.3): created, moved between
    collections, dropped, and gone with their collection on the target too."""
    tag = uuid.uuid4().hex[:6]
    first, second = f"al_a_{tag}", f"al_b_{tag}"
    alias, other = f"live_{tag}", f"old_{tag}"
    for name in (first, second):
        create_source_collection(source_client, name)
        source_client.insert(name, make_rows(0, 10, name))
    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    create_task(daemon, target.uri, first, second)
    wait_equal(source_client, target_milvus, second, "id")

    def aliases() -> dict[str, list[str]]:
        return {
            name: sorted(target_milvus.list_aliases(name)["aliases"]) for name in (first, second)
        }

    source_client.create_alias(first, alias)
    source_client.create_alias(first, other)
    wait_until(lambda: aliases() == {first: [alias, other], second: []}, 30, "aliases created")
    source_client.alter_alias(second, alias)
    source_client.drop_alias(other)
    wait_until(lambda: aliases() == {first: [], second: [alias]}, 30, "alias moved, one dropped")
    # the alias reaches the data: a query through it on the target reads the second collection
    assert len(target_milvus.query(alias, filter="id >= 0", output_fields=["id"])) == 10

    source_client.create_alias(first, other)
    wait_until(lambda: aliases()[first] == [other], 30, "alias created again")
    source_client.drop_alias(other)  # Milvus 2.3 refuses to drop a collection that has aliases
    source_client.drop_collection(first)
    wait_until(lambda: not target_milvus.has_collection(first), 60, "collection dropped")
    assert target_milvus.list_aliases(second)["aliases"] == [alias]


def test_target_outage_is_retried_and_caught_up(
    daemon_factory, milvus_source, etcd_service, kafka_mock, source_client, tmp_path
):
    """The target goes away mid-stream: the task stays Running, its lag grows, and when the
    target returns (same address, same data) everything written meanwhile arrives, once."""
    from harness.services import milvus_lite_server

    name = f"outage_{uuid.uuid4().hex[:8]}"
    create_source_collection(source_client, name)
    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    with milvus_lite_server(tmp_path / "target") as lite:
        port, uri = lite.port, lite.uri
        task_id = create_task(daemon, uri, name)
        source_client.insert(name, make_rows(0, 100, "before"))
        target = MilvusClient(uri=uri, dedicated=True)
        try:
            wait_equal(source_client, target, name, "id")
        finally:
            target.close()

    # the target is down: writes go on at the source
    source_client.insert(name, make_rows(100, 200, "during"))
    source_client.upsert(name, [dict(r, title="upserted") for r in make_rows(0, 20, "x")])
    source_client.delete(name, ids=list(range(50, 60)))

    def task() -> dict:
        return daemon.call("get", {"task_id": task_id}).data["task"]

    time.sleep(3)
    first_lag = task()["progress"]["lag_seconds"]
    time.sleep(3)
    during = task()
    assert during["state"] == "Running", during
    assert during["progress"]["lag_seconds"] > first_lag + 2, (first_lag, during["progress"])

    with milvus_lite_server(tmp_path / "target", port=port):
        target = MilvusClient(uri=uri, dedicated=True)
        try:
            expected = wait_equal(source_client, target, name, "id", timeout=120)
            # caught up, the lag falls back to the ticks' few seconds (read while the target
            # is still up: once it goes away again the lag grows again, as it should)
            wait_until(lambda: task()["progress"]["lag_seconds"] < 10, 60, "lag back down")
        finally:
            target.close()
    assert len(expected) == 300 - 10 and expected[5]["title"] == "upserted"
    assert task()["state"] == "Running"


def test_a_rejected_write_fails_only_its_task_with_a_reason(
    daemon_factory,
    milvus_source,
    etcd_service,
    kafka_mock,
    milvus_lite_service,
    source_client,
    target_client,
):
    """The target refuses a task's rows (a collection of that name was already there, its
    titles shorter than the source's): that task goes Failed naming channel, position and
    cause; another task keeps replicating. (A collection there that lacks a field or has
    another vector size stops the task before any write: schema_check.)"""
    tag = uuid.uuid4().hex[:8]
    clash, fine = f"clash_{tag}", f"fine_{tag}"
    for name in (clash, fine):
        create_source_collection(source_client, name)
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=True)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("title", DataType.VARCHAR, max_length=4)  # "clash-0" does not fit
    schema.add_field("score", DataType.DOUBLE)
    target_client.create_collection(clash, schema=schema)

    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    failing = create_task(daemon, milvus_lite_service.uri, clash)
    healthy = create_task(daemon, milvus_lite_service.uri, fine)
    source_client.insert(clash, make_rows(0, 10, "clash"))
    source_client.insert(fine, make_rows(0, 10, "fine"))

    def state(task_id: str) -> dict:
        return daemon.call("get", {"task_id": task_id}).data["task"]

    wait_until(
        lambda: state(failing)["state"] == "Failed", 60, "the task with rejected rows failed"
    )
    reason = state(failing)["reason"]
    # channel, where it was reading, and the cause
    where = r"channel \S+-rootcoord-dml_\d+, reading (after position [0-9a-f]+|from the beginning)"
    assert re.search(where, reason), reason
    assert clash in reason and "length" in reason, reason
    wait_equal(source_client, target_client, fine, "id")
    source_client.insert(fine, make_rows(10, 10, "more"))
    wait_equal(source_client, target_client, fine, "id")
    assert state(healthy)["state"] == "Running"
