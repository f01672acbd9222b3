"""A Milvus 2.6 source, replicated by the daemon into a real target.

No 2.6 server runs here: the stream is written into the Kafka mock by tests/harness/
streaming_writer.py exactly as MILVUS-WIRE.md describes (broadcast copies with their own ticks
and ids, transactions, ticks out of order within a pchannel, repeated appends). The source's
etcd (the session's) holds no catalog for it, as the daemon must learn everything from the WAL.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from harness.services import ServiceStartError, wait_until
from harness.streaming_ddl_writer import DdlWriter
from harness.streaming_writer import VECTOR_DIM, StreamingWriter
from pymilvus import DataType, MilvusClient

from replicator.sources.kafka import decode_offset
from tests.e2e.test_replication import rows

pytestmark = pytest.mark.e2e


@dataclass
class Stream:
    """A 2.6 source of ``channels`` pchannels on the Kafka mock, and what the target must end
    with: primary key -> tag of every row of each collection."""

    writer: StreamingWriter
    prefix: str
    channels: int
    expected: dict[str, dict[int, str]] = field(default_factory=dict)

    def pchannel(self, i: int) -> str:
        return f"{self.prefix}-rootcoord-dml_{i}"

    def vchannels(self, collection_id: int, shards: int) -> list[str]:
        return [f"{self.pchannel(i % self.channels)}_{collection_id}v{i}" for i in range(shards)]

    def tick_all(self) -> None:
        for i in range(self.channels):
            self.writer.time_tick(self.pchannel(i))

    def config(self, etcd_service, kafka_mock) -> dict:
        return {
            "sourceConfig": {
                "etcd": {"address": [etcd_service.endpoint]},
                "etcdRootPath": f"{self.prefix}-meta",  # nothing there: a catalog-less source
                "channelPrefix": self.prefix,
                "kafka": {"address": kafka_mock.bootstrap},
                "dmlChannelNum": self.channels,
            }
        }


def start_task(
    daemon, target_uri: str, stream: Stream, *collections: str, **request: object
) -> str:
    """Create a task replicating ``collections`` of the default database (``request``: other
    fields of the create request, e.g. db_collections) and wait until it has a position on
    every channel of the stream; its id."""
    body: dict[str, object] = {}
    if "kafka_connect_param" not in request:
        body["milvus_connect_param"] = {"uri": target_uri}
    if collections:
        body["collection_infos"] = [{"name": name} for name in collections]
    created = daemon.call("create", {**body, **request})
    assert created.code == 200, created.body
    task_id = str(created.data["task_id"])

    def positioned() -> bool:
        positions = daemon.call("position", {"task_id": task_id}).data.get("positions") or []
        named = {p["channel_name"] for p in positions}
        return {stream.pchannel(i) for i in range(stream.channels)} <= named

    wait_until(positioned, 30, "the task has a position on every channel")
    return task_id


def task_view(daemon, task_id: str) -> dict:
    return daemon.call("get", {"task_id": task_id}).data["task"]


def wait_for_collection(client: MilvusClient, name: str, timeout: float = 60) -> None:
    wait_until(lambda: client.has_collection(name), timeout, f"{name} on the target")
    # the stream makes the collection; the comparison loads it, which needs an index
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="L2")
    client.create_index(name, index)


def wait_rows(
    client: MilvusClient,
    name: str,
    expected: dict[int, str],
    timeout: float = 90,
    daemon: Any = None,
):
    """Wait until the target's ``name`` holds ``expected`` (key -> tag); else fail naming the
    keys, and with ``daemon``, the last lines of its log that say what its tasks waited on."""
    got: dict = {}

    def same() -> bool:
        nonlocal got
        got = {pk: row["tag"] for pk, row in rows(client, name, "id").items()}
        return got == expected

    try:
        wait_until(same, timeout, f"{name} on the target equals the source")
    except ServiceStartError:
        missing = sorted(set(expected) - set(got))[:10]
        extra = sorted(set(got) - set(expected))[:10]
        wrong = [pk for pk in expected if pk in got and got[pk] != expected[pk]][:10]
        told = f"missing {missing}, extra {extra}, wrong {wrong}"
        if daemon is not None:
            said = [
                line for line in daemon.log_text().splitlines() if '"level": "INFO"' not in line
            ]
            waits = [line for line in daemon.log_text().splitlines() if "barrier" in line]
            told += "; daemon log:\n" + "\n".join([*waits[-12:], *said[-12:]])
        raise AssertionError(told) from None
    return rows(client, name, "id")


def test_a_2_6_stream_replicates_row_by_row_and_schema_by_schema(
    daemon_factory, etcd_service, kafka_mock, target, target_milvus, stream
):
    w = stream.writer
    coll, other = 51001, 51002
    name = f"books_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, target.uri, stream, name)

    v0, v1, v2 = stream.vchannels(coll, 3)
    control = f"{stream.pchannel(0)}_vcchan"
    w.create_collection(coll, name, [v0, v1, v2, control], partition_ids=[1])
    # a collection the task does not select, on the same channels
    w.create_collection(other, "not_selected", stream.vchannels(other, 2), partition_ids=[9])
    stream.tick_all()
    expected: dict[int, str] = {}

    # plain inserts on every vchannel; on v0 two appends whose ticks are in the other order
    early, late = w.tso.next(), w.tso.next()
    w.insert(v0, coll, range(50, 100), tt=late)
    w.insert(v0, coll, range(50), tt=early)
    w.insert(v1, coll, range(100, 200))
    repeated = w.insert(v2, coll, range(200, 300))
    w.repeat(repeated)  # a retried append: same _tt, applied once
    w.insert(stream.vchannels(other, 2)[0], other, range(10))
    expected.update({pk: f"row-{pk}" for pk in range(300)})
    stream.tick_all()

    # a committed transaction (inserts and a delete), and a rolled-back one
    txn = w.begin_txn(v1)
    w.insert(v1, coll, range(300, 310), txn=txn)
    w.delete(v1, coll, range(100, 105), txn=txn)
    w.time_tick(stream.pchannel(1))  # the transaction is still open at this tick
    w.end_txn(txn)
    expected.update({pk: f"row-{pk}" for pk in range(300, 310)})
    for pk in range(100, 105):
        del expected[pk]
    rolled = w.begin_txn(v2)
    w.insert(v2, coll, range(400, 410), txn=rolled)
    w.delete(v2, coll, range(200, 210), txn=rolled)
    w.end_txn(rolled, commit=False)

    # upserts (2.6 writes them as a transaction of an Insert and a Delete) and a plain delete
    w.upsert(v0, coll, range(10), tag="up")
    expected.update({pk: f"up-{pk}" for pk in range(10)})
    w.delete(v2, coll, range(290, 300))
    for pk in range(290, 300):
        del expected[pk]
    stream.tick_all()

    # a partition made by a broadcast, and rows written into it
    w.partition_ddl("CreatePartition", coll, name, 2, "recent", [v0, v1, v2])
    stream.tick_all()
    w.insert(v1, coll, range(500, 520), partition_id=2, partition_name="recent")
    expected.update({pk: f"row-{pk}" for pk in range(500, 520)})
    stream.tick_all()

    wait_for_collection(target_milvus, name)
    final = wait_rows(target_milvus, name, expected)
    assert final[7]["vector"] == pytest.approx([7.0] * VECTOR_DIM)
    assert final[510]["vector"] == pytest.approx([510.0] * VECTOR_DIM)
    assert not target_milvus.has_collection("not_selected")
    assert target_milvus.has_partition(name, "recent")
    in_partition = target_milvus.query(
        name, filter="id >= 0", partition_names=["recent"], output_fields=["id"], limit=100
    )
    assert sorted(r["id"] for r in in_partition) == list(range(500, 520))

    # the schema the stream declared
    described = target_milvus.describe_collection(name)
    fields = {f["name"]: f for f in described["fields"]}
    assert fields["id"]["type"] == DataType.INT64 and fields["id"].get("is_primary")
    assert fields["vector"]["type"] == DataType.FLOAT_VECTOR
    assert int(fields["vector"]["params"]["dim"]) == VECTOR_DIM
    assert fields["tag"]["type"] == DataType.VARCHAR
    assert int(fields["tag"]["params"]["max_length"]) == 64
    if target.kind != "milvus-lite":  # Lite does not keep the shard count
        assert described["num_shards"] == 3

    task = task_view(daemon, task_id)
    assert task["state"] == "Running", task
    assert task["progress"]["lag_seconds"] is not None


def test_a_restart_mid_stream_keeps_what_the_wal_taught(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """The collection and its index are known only from the stream, and a transaction is open
    when the daemon stops: after the restart all three are picked up where they were (a
    DropIndex names the index by its source id only)."""
    w = stream.writer
    coll = 52001
    name = f"restart_{uuid.uuid4().hex[:6]}"
    lite = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(lite, milvus_lite_service.uri, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    ddl = DdlWriter(w, f"{stream.pchannel(0)}_vcchan")
    w.create_collection(coll, name, [v0, v1, ddl.control])
    ddl.create_index(coll, 101, 9101, "vec_idx", {"index_type": "FLAT", "metric_type": "L2"})
    w.insert(v0, coll, range(100))
    txn = w.begin_txn(v1, keepalive_ms=600_000)
    w.insert(v1, coll, range(100, 150), txn=txn)
    stream.tick_all()
    wait_until(lambda: target_client.has_collection(name), 60, f"{name} on the target")
    wait_until(lambda: target_client.list_indexes(name), 60, "the index from the stream")
    wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(100)})

    lite.stop()
    w.end_txn(txn)
    w.insert(v0, coll, range(150, 200))
    stream.tick_all()
    lite.start()
    expected = {pk: f"row-{pk}" for pk in range(200)}
    wait_rows(target_client, name, expected)
    ddl.release(coll)
    ddl.drop_index(coll, [9101])
    stream.tick_all()
    wait_until(lambda: not target_client.list_indexes(name), 60, "the index dropped")
    assert task_view(lite, task_id)["state"] == "Running"


def test_a_drop_waits_for_the_inserts_a_slower_vchannel_holds_before_its_copy(
    daemon_factory, etcd_service, kafka_mock, target, target_milvus, stream
):
    """A second task, on another collection, reads the same channels through the daemon's
    shared readers: the first task's barrier holds its drop, not the other task."""
    w = stream.writer
    coll, other_coll = 53001, 53002
    name, other = f"dropped_{uuid.uuid4().hex[:6]}", f"kept_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    other_id = start_task(daemon, target.uri, stream, other)
    task_id = start_task(daemon, target.uri, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    p0, p1 = stream.pchannel(0), stream.pchannel(1)
    o0, o1 = stream.vchannels(other_coll, 2)
    w.create_collection(other_coll, other, [o0, o1])
    w.create_collection(coll, name, [v0, v1])
    stream.tick_all()
    w.insert(o0, other_coll, range(50))
    w.insert(v0, coll, range(100))
    # v1's inserts come before its copy of the drop, but p1 gets no tick until later
    w.insert(v1, coll, range(100, 300))
    drop = w.drop_collection(coll, name, [v0, v1])
    p0_tick = w.time_tick(p0)
    assert drop[0].pchannel == p0 and drop[1].pchannel == p1

    wait_for_collection(target_milvus, name)

    def p0_past_its_copy() -> bool:
        channels = task_view(daemon, task_id)["progress"]["channels"]
        position = next((c["position"] for c in channels if c["channel"] == p0), None)
        if position is None:
            return False
        return decode_offset(bytes.fromhex(position["msg_id"])) >= p0_tick.offset

    wait_until(p0_past_its_copy, 60, "p0 read past its copy of the drop")
    time.sleep(1.0)  # give a wrong implementation the time to drop early
    assert target_milvus.has_collection(name), "dropped before v1 was read up to its copy"
    assert sorted(rows(target_milvus, name, "id")) == list(range(100))

    w.time_tick(p1)
    wait_until(lambda: not target_milvus.has_collection(name), 60, "the drop applied")
    task = task_view(daemon, task_id)
    assert task["state"] == "Running", task
    # every insert was acknowledged by the target before the drop, none skipped
    assert task["progress"]["rows"] == 300, task["progress"]
    w.insert(o1, other_coll, range(50, 80))
    stream.tick_all()
    wait_for_collection(target_milvus, other)
    wait_rows(target_milvus, other, {pk: f"row-{pk}" for pk in range(80)})
    assert task_view(daemon, other_id)["state"] == "Running"


def test_2_6_ddl_indexes_load_aliases_properties_and_truncate(
    daemon_factory, etcd_service, kafka_mock, target, target_milvus, stream
):
    """The rest of the 2.6 DDL through the daemon: the index and load state come from the
    stream (the test makes none on the target), then an alias, collection properties, and a
    truncate that must not take rows written after it."""
    w = stream.writer
    coll = 54001
    name = f"ddl_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, target.uri, stream, name)
    vchannels = stream.vchannels(coll, 3)
    ddl = DdlWriter(w, f"{stream.pchannel(0)}_vcchan")
    w.create_collection(coll, name, [*vchannels, ddl.control], partition_ids=[1])
    ddl.create_index(coll, 101, 9001, "vec_idx", {"index_type": "FLAT", "metric_type": "L2"})
    ddl.load(coll, [1])
    for i, vchannel in enumerate(vchannels):
        w.insert(vchannel, coll, range(i * 100, i * 100 + 100))
    alias = f"{name}_current"
    ddl.alter_alias((1, "default"), (coll, name), alias)
    ddl.alter_collection(
        coll, vchannels, ["properties"], properties={"collection.ttl.seconds": "86400"}
    )
    stream.tick_all()

    wait_until(lambda: target_milvus.has_collection(name), 60, f"{name} on the target")
    wait_rows(target_milvus, name, {pk: f"row-{pk}" for pk in range(300)})
    indexes = target_milvus.list_indexes(name)
    assert indexes, "the index came from the stream"
    described = target_milvus.describe_index(name, indexes[0])
    assert (described["index_type"], described["metric_type"]) == ("FLAT", "L2")
    assert alias in target_milvus.list_aliases(name)["aliases"]
    if target.kind != "milvus-lite":  # Lite reports Loaded whatever; it keeps no properties
        assert target_milvus.get_load_state(name)["state"].name == "Loaded"
        properties = target_milvus.describe_collection(name)["properties"]
        assert properties.get("collection.ttl.seconds") == "86400"

    # truncate, with rows before it on a slow channel and rows after it
    w.insert(vchannels[2], coll, range(300, 310))  # before the truncate: gone with it
    w.truncate_collection(coll, vchannels, segment_ids=[1, 2])
    after = {pk: f"row-{pk}" for pk in range(1000, 1030)}
    w.insert(vchannels[0], coll, range(1000, 1010))
    w.insert(vchannels[1], coll, range(1010, 1030))
    stream.tick_all()
    # the target is read only once the truncate is applied: Milvus Lite 3.2 re-opens a
    # collection a query names while its truncate deletes the directory, which then fails
    # "Directory not empty" and leaves a directory no later create can use ("File exists")
    wait_until(
        lambda: f"TruncateCollection: applied truncate default.{name}" in daemon.log_text(),
        90,
        "the daemon applied the truncate",
    )
    wait_rows(target_milvus, name, after, daemon=daemon)
    assert alias in target_milvus.list_aliases(name)["aliases"]
    assert task_view(daemon, task_id)["state"] == "Running"


def test_an_idle_pchannel_stalls_nothing_and_shows_no_lag(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    """p2 gets nothing after the task starts, not even ticks (2.6 persists no ticks on an idle
    pchannel): the collection's other channels go on, and the task shows no lag."""
    w = stream.writer
    coll = 55001
    name = f"idle_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    v0, v1 = stream.vchannels(coll, 2)
    p0, p1 = stream.pchannel(0), stream.pchannel(1)
    w.create_collection(coll, name, [v0, v1])
    w.insert(v0, coll, range(100))
    w.insert(v1, coll, range(100, 200))
    stream.tick_all()  # p2's last tick
    wait_for_collection(target_client, name)
    wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(200)})

    time.sleep(3)  # p2's last tick ages; p0 and p1 keep writing
    w.insert(v0, coll, range(200, 300))
    w.time_tick(p0)
    w.time_tick(p1)
    wait_rows(target_client, name, {pk: f"row-{pk}" for pk in range(300)})
    progress = task_view(daemon, task_id)["progress"]
    assert stream.pchannel(2) in {c["channel"] for c in progress["channels"]}
    # p2's last tick is over 3 s old and stays so: a lag counted from it would never fall under
    # 2.5 s. Polled, since a loaded machine can take that long to show p0 and p1 caught up.
    wait_until(
        lambda: task_view(daemon, task_id)["progress"]["lag_seconds"] < 2.5,
        30,
        "the task shows no lag with p2 idle (lag_seconds under 2.5)",
    )


def test_an_encrypted_record_stops_the_task_with_a_reason(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, stream
):
    w = stream.writer
    coll = 56001
    name = f"secret_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(daemon, milvus_lite_service.uri, stream, name)
    (v0,) = stream.vchannels(coll, 1)
    w.create_collection(coll, name, [v0])
    w.insert(v0, coll, range(10), cipher=(7, b"zone-key"))
    w.time_tick(stream.pchannel(0))

    wait_until(lambda: task_view(daemon, task_id)["state"] == "Failed", 60, "the task stops")
    reason = task_view(daemon, task_id)["reason"]
    assert "encrypted" in reason, reason
    assert stream.pchannel(0) in reason, reason
    assert "zone-key" not in reason and "wrapped" not in reason


@pytest.mark.parametrize("enable_user_role", [True, False])
def test_rbac_follows_only_when_the_task_asks(
    daemon_factory, etcd_service, kafka_mock, milvus_source_rocksmq, stream, enable_user_role
):
    """Roles, users and their bindings from the stream, on a real Milvus 2.3.5 target (Milvus
    Lite has no RBAC); a task that does not set extra_info.enable_user_role leaves them."""
    w = stream.writer
    suffix = uuid.uuid4().hex[:6]
    role, user = f"reader_{suffix}", f"alice_{suffix}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id = start_task(
        daemon,
        milvus_source_rocksmq.uri,
        stream,
        db_collections={"*": [{"name": "*"}]},
        extra_info={"enable_user_role": enable_user_role},
    )
    ddl = DdlWriter(w, f"{stream.pchannel(0)}_vcchan")
    ddl.alter_role(role)
    ddl.alter_user(user, "$2a$10$" + "x" * 53)
    ddl.user_role(user, role)
    marker = f"marker_{suffix}"
    ddl.create_database(marker, 90, {})  # applied either way: shows the records were read
    stream.tick_all()

    client = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        wait_until(lambda: marker in client.list_databases(), 60, "the stream was read")
        if enable_user_role:
            wait_until(lambda: role in client.list_roles(), 30, "the role on the target")
            assert user in client.list_users()
            assert role in client.describe_user(user)["roles"]
        else:
            assert role not in client.list_roles()
            assert user not in client.list_users()
        assert "$2a$10$" not in daemon.log_text()
    finally:
        for name in (user,) if enable_user_role else ():
            client.drop_user(name)
        if enable_user_role:
            client.drop_role(role)
        client.drop_database(marker)
        client.close()
    assert task_view(daemon, task_id)["state"] == "Running"
