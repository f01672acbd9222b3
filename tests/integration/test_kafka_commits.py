"""The Kafka target's committer (``kafka_commits``) against a broker (the mock): channels that
hand their commits over and go on find every event once, in order, with their positions; a
transaction holding several channels' commits fails whole, and nothing after it commits."""

from __future__ import annotations

import threading

import pytest

from metastore import Position
from replicator.errors import SinkSessionLostError, TargetRejectedError
from replicator.sinks.kafka import KafkaTarget
from tests.integration.test_kafka_target import keyed_events, params  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def position(channel: str, n: int) -> Position:
    return Position("kafka", channel, n.to_bytes(8, "little"), 1000 + n)


def test_channels_handing_commits_over_find_each_event_once_in_order(params):  # noqa: F811 - the imported fixture
    target = KafkaTarget(params, "task-pipe", "1.0")
    topic = target.row_topic("default", "c")
    channels = [f"dml_{n}" for n in range(4)]

    def channel(name: str) -> None:
        log = target.channel_log(name)
        for n in range(1, 31):  # each commit handed over while the last may still commit
            for k in range(20):
                log.add(topic, name.encode(), {"op": "insert", "pk": k, "seq": n * 100 + k})
            log.submit(position(name, n))
        log.settle()

    threads = [threading.Thread(target=channel, args=(name,)) for name in channels]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        target.close()
    found = keyed_events(params["address"], topic)
    assert len(found) == 4 * 30 * 20
    for name in channels:
        seqs = [value["seq"] for key, value in found if key == name.encode()]
        assert seqs == [n * 100 + k for n in range(1, 31) for k in range(20)]  # once, in order
    again = KafkaTarget(params, "task-pipe", "1.0")
    try:
        assert again.committed_positions == {name: position(name, 30) for name in channels}
    finally:
        again.close()


def test_a_failed_transaction_fails_all_it_holds_and_every_commit_after_it(params):  # noqa: F811 - the imported fixture
    target = KafkaTarget({**params, "max_event_bytes": 300}, "task-pipe-fail", "1.0")
    topic = target.row_topic("default", "c")
    entered, gate = threading.Event(), threading.Event()
    transact = target._committer._transact

    def gated(commits):  # the first transaction waits until the next ones were handed over
        entered.set()
        gate.wait(10)
        transact(commits)

    target._committer._transact = gated
    a, b, c = (target.channel_log(name) for name in ("dml_a", "dml_b", "dml_c"))
    try:
        a.add(topic, b"a", {"op": "delete", "pk": 1})
        a.submit(position("dml_a", 1))
        assert entered.wait(10)  # taken by the committer, waiting at the gate
        b.add(topic, b"b", {"op": "insert", "pk": 2, "row": {"x": "y" * 400}})  # too large
        b.submit(position("dml_b", 1))
        c.add(topic, b"c", {"op": "delete", "pk": 3})
        c.submit(position("dml_c", 1))  # in the same transaction as b's
        gate.set()
        a.settle()
        with pytest.raises(TargetRejectedError, match="more than max_event_bytes"):
            b.settle()
        with pytest.raises(TargetRejectedError):  # c's events were in the aborted transaction
            c.settle()
        a.add(topic, b"a", {"op": "delete", "pk": 4})
        with pytest.raises(SinkSessionLostError, match="the target is closed"):
            a.commit(position("dml_a", 2))
    finally:
        target.close()
    assert [value["pk"] for _, value in keyed_events(params["address"], topic)] == [1]
    again = KafkaTarget(params, "task-pipe-fail", "1.0")
    try:
        assert again.committed_positions == {"dml_a": position("dml_a", 1)}
    finally:
        again.close()
