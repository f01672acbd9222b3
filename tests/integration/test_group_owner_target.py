"""The task's own Kafka target of a task in channel groups is made in a thread of its own while
the groups start (replicator/pipeline/group_runner.py, ``OwnerTarget``): a group's call waits
for it, gets the same target every time, and a target that cannot be made is the error of every
call and of the run (the groups are then stopped), never a target half made. Against the Kafka
mock; a broker no one listens on for the failure."""

from __future__ import annotations

import threading
import time

import pytest
from harness.services import free_port

from replicator.errors import TargetUnavailableError
from replicator.pipeline.group_runner import OwnerTarget
from replicator.sinks.kafka import KafkaTarget
from tests.integration.test_kafka_target import params  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


def test_calls_made_while_the_target_is_made_wait_for_it_and_share_it(params):  # noqa: F811
    started = threading.Event()

    def make() -> KafkaTarget:
        started.set()
        return KafkaTarget(params, "task-owner", "1.0")

    owner = OwnerTarget(make, "owner-test")
    started.wait(5)
    got: list[KafkaTarget] = []
    callers = [threading.Thread(target=lambda: got.append(owner.get())) for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    try:
        assert len(got) == 3 and all(target is got[0] for target in got)
        assert got[0].committed_positions == {}  # made whole: its positions topic read
    finally:
        owner.close()
    assert got[0]._closed


def test_a_target_that_cannot_be_made_is_every_calls_error_and_close_ends(params):  # noqa: F811
    port = free_port()  # nothing listens there
    made_at: list[float] = []

    def make() -> KafkaTarget:
        try:
            return KafkaTarget(
                {**params, "address": f"127.0.0.1:{port}"}, "task-owner-down", "1.0", timeout=2
            )
        finally:
            made_at.append(time.monotonic())

    owner = OwnerTarget(make, "owner-test-down")
    for _ in range(2):
        with pytest.raises(TargetUnavailableError, match="cannot start transactions"):
            owner.get()
    owner.close()  # nothing to close, and it does not raise
    assert len(made_at) == 1  # made once, its error told to every caller
