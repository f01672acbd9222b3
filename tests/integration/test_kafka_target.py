"""The Kafka target against a Kafka broker (the mock): what one connection commits, the next one
reads back (positions, and the model that makes each DDL announced once), what was never
committed is not there, and a fenced or closed target writes nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from harness.kafka_topics import read_topic
from pymilvus.grpc_gen import schema_pb2

from metastore import Position
from metastore.fenced import Fence, FencedError
from replicator.errors import SinkSessionLostError, TargetRejectedError
from replicator.sinks.kafka import KafkaTarget

pytestmark = pytest.mark.integration


def schema() -> schema_pb2.CollectionSchema:
    s = schema_pb2.CollectionSchema()
    s.fields.add(fieldID=100, name="id", data_type=schema_pb2.DataType.Int64, is_primary_key=True)
    return s


def keyed_events(bootstrap: str, topic: str) -> list[tuple[bytes, dict]]:
    """Every committed event of ``topic`` with its key (read_committed, each partition to its
    end)."""
    return [(record.key, record.value) for record in read_topic(bootstrap, topic)]


def events(bootstrap: str, topic: str) -> list[dict]:
    return [value for _, value in keyed_events(bootstrap, topic)]


@pytest.fixture
def params(kafka_mock) -> dict:
    suffix = uuid.uuid4().hex[:8]
    return {
        "address": kafka_mock.bootstrap,
        "topic": f"events-{suffix}",
        "positions_topic": f"positions-{suffix}",
    }


def test_positions_and_ddl_survive_a_new_connection_and_nothing_uncommitted_does(params):
    first = KafkaTarget(params, "task-a", "1.0")
    try:
        assert first.committed_positions == {}
        assert first.create_collection("default", "c", schema(), 2) is True
        first.create_partition("default", "c", "p1")
        log = first.channel_log("dml_0")
        log.add(first.row_topic("default", "c"), b"k1", {"op": "insert", "pk": 1})
        at = Position("kafka", "dml_0", (41).to_bytes(8, "little"), 1000)
        log.commit(at)
        log.add(
            first.row_topic("default", "c"), b"k2", {"op": "insert", "pk": 2}
        )  # never committed
    finally:
        first.close()

    again = KafkaTarget(params, "task-a", "1.0")  # the restart
    try:
        assert again.committed_positions == {"dml_0": at}
        assert again.create_collection("default", "c", schema(), 2) is False  # known: no event
        again.create_partition("default", "c", "p1")  # known: no event
        assert again.partitions("default", "c") == ["_default", "p1"]
    finally:
        again.close()
    written = events(params["address"], params["topic"])
    # (one each; the topic's partitions hold them in no order between them)
    assert sorted(e["op"] for e in written) == ["create_collection", "create_partition", "insert"]
    (inserted,) = [e for e in written if e["op"] == "insert"]
    assert inserted["pk"] == 1
    assert inserted["source"]["channel"] == "dml_0"
    assert inserted["source"]["position"] == at.msg_id.hex()

    other = KafkaTarget(params, "task-a", "2.0")  # the same id, created again: a new task
    try:
        assert other.committed_positions == {}
        assert other.has_collection("default", "c") is False
    finally:
        other.close()


def test_a_fenced_target_writes_nothing_and_a_closed_one_asks_for_a_new_connection(params):
    target = KafkaTarget(params, "task-b", "1.0")
    fence = Fence("test")
    target.fence = fence
    log = target.channel_log("dml_0")
    log.add(target.row_topic("default", "c"), b"k", {"op": "delete", "pk": 1})
    fence.revoke()
    with pytest.raises(FencedError):
        log.commit(Position("kafka", "dml_0", (1).to_bytes(8, "little"), 5))
    target.fence = None
    target.close()
    with pytest.raises(SinkSessionLostError):
        target.commit("dml_0", [], Position("kafka", "dml_0", (2).to_bytes(8, "little"), 6))
    assert events(params["address"], params["topic"]) == []
    fresh = KafkaTarget(params, "task-b", "1.0")
    try:
        assert fresh.committed_positions == {}
    finally:
        fresh.close()


def test_topics_per_collection_and_ddl_on_its_own_topic(params):
    params = {
        **params,
        "topic": params["topic"] + ".{db}.{collection}",
        "ddl_topic": f"{params['topic']}-ddl",
    }
    target = KafkaTarget(params, "task-c", "1.0")
    try:
        target.create_collection("default", "c", schema(), 1)
        assert target.row_topic("default", "c").endswith(".default.c")
    finally:
        target.close()
    (created,) = events(params["address"], params["ddl_topic"])
    assert created["op"] == "create_collection" and created["collection"] == "c"


def test_events_tail_prints_a_topics_events_readably(params):
    import subprocess
    import sys

    from harness.daemon import REPO_ROOT

    target = KafkaTarget(params, "task-d", "1.0")
    try:
        target.create_collection("default", "c", schema(), 1)
        log = target.channel_log("dml_0")
        row = {"id": 7, "vec": [0.5] * 10, "title": "x"}
        when = {"hybrid": 1, "time": "2026-11-23T00:00:00.000Z"}
        value = {"op": "insert", "db": "default", "collection": "c", "partition": "_default",
                 "pk": 7, "row": row, "ts": when}  # fmt: skip
        log.add(target.row_topic("default", "c"), b'["default","c",7]', value)
        log.commit(Position("kafka", "dml_0", (3).to_bytes(8, "little"), 9))
    finally:
        target.close()

    def tail(*extra: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "server", "events", "tail", "--brokers", params["address"],
             "--topic", params["topic"], *extra],
            capture_output=True, text=True, timeout=60, check=True,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        return done.stdout.splitlines()

    lines = tail()
    assert len(lines) == 2, lines
    created = next(line for line in lines if "create_collection" in line)
    assert "default.c" in created and 'fields="id:Int64*"' in created
    inserted = next(line for line in lines if " insert " in line)
    assert "default.c[_default]  pk=7" in inserted
    assert '"vec": [0.5, 0.5, 0.5, "...(10)"]' in inserted  # long lists shortened
    raw = [json.loads(line) for line in tail("--json")]
    assert sorted(e["op"] for e in raw) == ["create_collection", "insert"]


def test_an_event_too_large_stops_with_a_reason_and_commits_nothing(params):
    target = KafkaTarget({**params, "max_event_bytes": 200}, "task-e", "1.0")
    try:
        log = target.channel_log("dml_0")
        value = {
            "op": "insert",
            "db": "default",
            "collection": "c",
            "pk": 9,
            "row": {"x": "y" * 300},
        }
        log.add(target.row_topic("default", "c"), b"k", value)
        with pytest.raises(TargetRejectedError, match=r"pk 9 is \d+ bytes, more than max_event"):
            log.commit(Position("kafka", "dml_0", (1).to_bytes(8, "little"), 5))
    finally:
        target.close()
    assert events(params["address"], params["topic"]) == []
