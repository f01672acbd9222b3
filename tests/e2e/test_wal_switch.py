"""A 2.6 source that moves its WAL to another message queue in the middle of a steady write
load: Kafka A to Kafka B (AlterWAL), Kafka to RocksMQ (the ``_mq_switch_*`` announcement), and
the daemon killed with SIGKILL while one channel has switched and another has not. The target
must end with every row once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.kafka_mock import KafkaMock, kafka_mock_cluster
from harness.rocksmq_writer import RocksmqWriter
from harness.services import wait_until
from harness.streaming_writer import KafkaSink
from pymilvus import MilvusClient

from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.codec import streaming_headers as sh
from tests.e2e.test_streaming_source import (
    Stream,
    start_task,
    task_view,
    wait_for_collection,
    wait_rows,
)

pytestmark = pytest.mark.e2e

ROWS_PER_INSERT = 20


@pytest.fixture(scope="module")
def kafka_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaMock]:
    """The Kafka cluster the source moves to."""
    with kafka_mock_cluster(tmp_path_factory.mktemp("kafka-b")) as mock:
        yield mock


class Load:
    """A steady write load on one collection's vchannels: an insert per vchannel and a tick
    per pchannel every round."""

    def __init__(self, stream: Stream, collection_id: int, vchannels: list[str]) -> None:
        self.stream = stream
        self.collection_id = collection_id
        self.vchannels = vchannels
        self.next_pk = 0
        self.expected: dict[int, str] = {}

    def rounds(self, count: int, vchannels: list[str] | None = None, pause: float = 0.02) -> None:
        w = self.stream.writer
        for _ in range(count):
            for vchannel in vchannels or self.vchannels:
                pks = range(self.next_pk, self.next_pk + ROWS_PER_INSERT)
                w.insert(vchannel, self.collection_id, pks)
                self.expected.update({pk: f"row-{pk}" for pk in pks})
                self.next_pk += ROWS_PER_INSERT
            self.stream.tick_all()
            time.sleep(pause)


def setup(stream: Stream, daemon, target_uri: str, name: str, coll: int) -> tuple[str, Load]:
    task_id = start_task(daemon, target_uri, stream, name)
    vchannels = stream.vchannels(coll, stream.channels)
    control = f"{stream.pchannel(0)}_vcchan"
    stream.writer.create_collection(coll, name, [*vchannels, control])
    stream.tick_all()
    return task_id, Load(stream, coll, vchannels)


def backends(daemon, task_id: str) -> dict[str, str]:
    """The WAL each DML pchannel's position is on (the replicate channel, which a 2.6 source
    does not write, keeps its start on the configured queue)."""
    positions = daemon.call("position", {"task_id": task_id}).data.get("positions") or []
    return {
        p["channel_name"]: p["backend"] for p in positions if "-rootcoord-dml_" in p["channel_name"]
    }


def test_kafka_a_to_kafka_b_by_alter_wal_under_load(
    daemon_factory, etcd_service, kafka_mock, kafka_b, target, target_milvus, stream
):
    w = stream.writer
    name = f"to_b_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id, load = setup(stream, daemon, target.uri, name, 61001)
    load.rounds(15)

    pchannels = [stream.pchannel(i) for i in range(stream.channels)]
    last_before = next(r for r in reversed(w.written) if r.properties[sh.TYPE] == "2")  # Insert
    w.alter_wal(pchannels, pchannels[0], "kafka", {"broker_address": kafka_b.bootstrap})
    sink = KafkaSink(kafka_b.bootstrap)
    w.switch_to(pchannels, sink)
    # the new WAL may repeat what the old one had up to the switch: it is not applied again
    w.repeat(last_before)
    load.rounds(15)

    wait_for_collection(target_milvus, name)
    wait_rows(target_milvus, name, load.expected)
    assert backends(daemon, task_id) == dict.fromkeys(pchannels, "kafka#1")
    assert task_view(daemon, task_id)["state"] == "Running"
    sink.close()
    # the settings the switch carried are stored encrypted (they may hold credentials)
    raw = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    switches = raw.list_state(task_id, "wal/")
    raw.close()
    assert switches and all(v.startswith(b'{"$sealed"') for v in switches.values())
    assert not any(kafka_b.bootstrap.encode() in v for v in switches.values())


def test_kafka_to_rocksmq_by_announcement_under_load(
    daemon_factory, etcd_service, kafka_mock, target, target_milvus, stream, tmp_path: Path
):
    w = stream.writer
    name = f"to_rmq_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id, load = setup(stream, daemon, target.uri, name, 62001)
    load.rounds(15)

    rocksmq = RocksmqWriter(tmp_path / "rdb_data")
    control = f"{stream.pchannel(0)}_vcchan"
    # one copy per vchannel: p0 holds two (its data vchannel and the control channel)
    w.announce_mq_switch([*load.vchannels, control], "rocksmq", {"path": str(rocksmq.path)})
    pchannels = [stream.pchannel(i) for i in range(stream.channels)]
    w.switch_to(pchannels, rocksmq)
    # the new WAL may repeat what the old one had up to the switch: it is not applied again
    w.repeat(next(r for r in reversed(w.written) if r.properties[sh.TYPE] == "2"))
    load.rounds(15)

    wait_for_collection(target_milvus, name)
    wait_rows(target_milvus, name, load.expected)
    assert backends(daemon, task_id) == dict.fromkeys(pchannels, "rocksmq#1")
    assert task_view(daemon, task_id)["state"] == "Running"
    rocksmq.close()


@pytest.mark.parametrize("to", ["kafka", "rocksmq"])
def test_sigkill_while_one_channel_has_switched_and_another_has_not(
    daemon_factory,
    etcd_service,
    kafka_mock,
    kafka_b,
    milvus_source_rocksmq,
    stream,
    tmp_path: Path,
    to: str,
):
    """Into a real Milvus 2.3.5 (a doubled row shows there; Milvus Lite may overwrite it).
    Two tasks, each with its own collection, read the channels through the daemon's shared
    readers until each one switches."""
    w = stream.writer
    name, other_name = f"kill_{uuid.uuid4().hex[:6]}", f"kill_other_{uuid.uuid4().hex[:6]}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    task_id, load = setup(stream, daemon, milvus_source_rocksmq.uri, name, 63001)
    other_id, other = setup(stream, daemon, milvus_source_rocksmq.uri, other_name, 63002)

    def rounds(count: int) -> None:
        load.rounds(count)
        other.rounds(count)

    rounds(10)

    p0, p1, p2 = (stream.pchannel(i) for i in range(3))
    sink: KafkaSink | RocksmqWriter
    if to == "kafka":
        config = {"broker_address": kafka_b.bootstrap}
        sink = KafkaSink(kafka_b.bootstrap)
    else:
        sink = RocksmqWriter(tmp_path / "rdb_data")
        config = {"path": str(sink.path)}
    # the switch reaches p0 and p2 first; p1 keeps writing on A
    copies = w.alter_wal([p0, p1, p2], p0, to, config, only=[p0, p2])
    broadcast_id = sh.parse_broadcast_header(
        sh.BROADCAST_HEADER, copies[0].properties[sh.BROADCAST_HEADER]
    ).broadcast_id
    w.switch_to([p0, p2], sink)
    rounds(10)

    def p0_switched() -> bool:
        seen = backends(daemon, task_id)
        return seen.get(p0) == f"{to}#1" and seen.get(p2) == f"{to}#1"

    wait_until(p0_switched, 60, "p0 and p2 read on Kafka B")
    assert backends(daemon, task_id)[p1] == "kafka"
    daemon.kill()  # SIGKILL in the middle of the switch

    # p1's copy arrives; everything goes on on B while the daemon is down
    w.alter_wal([p0, p1, p2], p0, to, config, only=[p1], broadcast_id=broadcast_id)
    w.switch_to([p1], sink)
    rounds(10)
    daemon.start()
    rounds(5)

    client = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        for collection, written in ((name, load), (other_name, other)):
            wait_for_collection(client, collection)
            wait_rows(client, collection, written.expected)
    finally:
        client.close()
    for task in (task_id, other_id):
        assert backends(daemon, task) == dict.fromkeys((p0, p1, p2), f"{to}#1")
        assert task_view(daemon, task)["state"] == "Running"
    sink.close()
