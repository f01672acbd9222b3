"""Row events logged as bytes (``kafka_columns``) next to events logged as dicts, committed by
the Kafka target to a Kafka broker (the mock) and read back with read_committed: each a JSON
event with its ``source``, in the order logged per key; a too large one stops the commit with a
reason naming it and commits nothing."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Producer
from pymilvus.grpc_gen import schema_pb2

from metastore import Position
from replicator.errors import TargetRejectedError
from replicator.sinks.kafka import KafkaTarget
from replicator.sinks.kafka_columns import insert_events
from tests.integration.test_kafka_target import (
    keyed_events,
    params,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.integration
T = schema_pb2.DataType


read = keyed_events


def insert(pks: list[int], text: str = "x") -> list[schema_pb2.FieldData]:
    pk = schema_pb2.FieldData(type=T.Int64, field_name="id")
    pk.scalars.long_data.data.extend(pks)
    title = schema_pb2.FieldData(type=T.VarChar, field_name="title")
    title.scalars.string_data.data.extend([text] * len(pks))
    return [pk, title]


def test_bytes_and_dict_events_commit_as_json_with_their_source(params):  # noqa: F811 - the imported fixture
    target = KafkaTarget(params, "task-col", "1.0")
    topic = target.row_topic("default", "c")
    try:
        log = target.channel_log("dml_0")
        # a delete, then an insert batch: the key deleted and inserted at one time is an upsert
        log.add(topic, b'["default","c",2]', {"op": "delete", "pk": 2, "row": None})
        deleted = {(2, 77 << 18): 0}
        pks = list(range(1, 1001))
        insert_events(
            log, topic, "default", "c", "_default", "id", insert(pks), 1000, 77 << 18, deleted
        )
        insert_events(
            log, topic, "default", "c", "_default", "id", insert([5], "y"), 1, 78 << 18, {}
        )
        at = Position("kafka", "dml_0", (9).to_bytes(8, "little"), 78 << 18)
        log.commit(at)
    finally:
        target.close()
    found = read(params["address"], topic)
    assert len(found) == 1001
    by_key: dict[bytes, list[dict]] = {}
    for key, event in found:
        assert event["source"]["channel"] == "dml_0"
        assert event["source"]["position"] == at.msg_id.hex()
        by_key.setdefault(key, []).append(event)
    assert [e["op"] for e in by_key[b'["default","c",2]']] == ["upsert"]
    assert [e["row"]["title"] for e in by_key[b'["default","c",5]']] == ["x", "y"]  # in order
    assert by_key[b'["default","c",1000]'][0]["row"] == {"id": 1000, "title": "x"}
    assert len({e["source"]["commit"] for _, e in found}) == 1


def test_a_bytes_event_too_large_stops_with_a_reason_and_commits_nothing(params):  # noqa: F811 - the imported fixture
    target = KafkaTarget({**params, "max_event_bytes": 200}, "task-col2", "1.0")
    topic = target.row_topic("default", "c")
    try:
        log = target.channel_log("dml_0")
        insert_events(
            log, topic, "default", "c", "_default", "id", insert([9], "y" * 300), 1, 5, {}
        )
        with pytest.raises(TargetRejectedError, match=r"default\.c pk 9 is \d+ bytes, more than"):
            log.commit(Position("kafka", "dml_0", (1).to_bytes(8, "little"), 5))
    finally:
        target.close()
    assert read(params["address"], topic) == []


def small_queue_target(connect: dict, task_id: str, messages: int) -> KafkaTarget:
    """A Kafka target whose producer's local queue holds ``messages``: it fills at once."""
    target = KafkaTarget(connect, task_id, "1.0")
    target._producer.flush(10)
    target._producer = Producer(
        {
            "bootstrap.servers": connect["address"],
            "transactional.id": f"milvus-cdc.{task_id}-small-queue",
            "queue.buffering.max.messages": messages,
            "delivery.report.only.error": True,
        }
    )
    target._producer.init_transactions(30)
    return target


def test_a_local_queue_that_fills_keeps_every_event_once_and_in_order(params):  # noqa: F811 - the imported fixture
    """produce_batch refuses what does not fit (the message it is at and every one after it):
    those are given again once the queue drained, so one key's events stay in order."""
    target = small_queue_target(params, "task-col3", 50)
    topic = target.row_topic("default", "c")
    try:
        log = target.channel_log("dml_0")
        for n in range(300):  # one key, 300 versions of its row
            insert_events(
                log, topic, "default", "c", "_default", "id", insert([1], str(n)), 1, n, {}
            )
        log.commit(Position("kafka", "dml_0", (3).to_bytes(8, "little"), 300))
    finally:
        target.close()
    found = read(params["address"], topic)
    assert [e["row"]["title"] for _, e in found] == [str(n) for n in range(300)]


def test_a_queue_that_fills_in_a_transaction_of_many_topics_keeps_each_in_its_topic(params):  # noqa: F811 - the imported fixture
    """A transaction's runs (three collections' topics, two channels' commits) are produced in
    one call: when the queue fills at any message, what is given again goes to the topic it
    was meant for, each event once."""
    params = {**params, "topic": params["topic"] + "-{collection}"}  # a topic a collection
    target = small_queue_target(params, "task-col4", 37)
    names = ("a", "b", "c")
    entered, gate = threading.Event(), threading.Event()
    transact = target._committer._transact

    def gated(commits):  # the first commit alone; the next two channels' in one transaction
        entered.set()
        gate.wait(10)
        transact(commits)

    target._committer._transact = gated
    try:
        logs = [target.channel_log(f"dml_{n}") for n in range(3)]
        handed = []
        for n, log in enumerate(logs):
            for name in names:
                topic = target.row_topic("default", name)
                rows = insert(list(range(n * 100, n * 100 + 60)), f"{name}{n}")
                insert_events(log, topic, "default", name, "_default", "id", rows, 60, 5 + n, {})
            at = Position("kafka", f"dml_{n}", (n + 1).to_bytes(8, "little"), 5 + n)
            handed.append(target.commit(log.pchannel, log.events, at, count=180, wait=False))
            log.discard()
            if n == 0:
                assert entered.wait(10)
        gate.set()
        for commit in handed:
            commit.wait()
    finally:
        gate.set()
        target.close()
    for name in names:
        found = read(params["address"], target.row_topic("default", name))
        assert {e["collection"] for _, e in found} == {name}
        by_channel = {
            n: sorted(e["pk"] for _, e in found if e["row"]["title"] == f"{name}{n}")
            for n in range(3)
        }
        assert by_channel == {n: list(range(n * 100, n * 100 + 60)) for n in range(3)}
