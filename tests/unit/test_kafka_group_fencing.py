"""Which producers of a Kafka target's channel groups are fenced before a task writes again
(replicator/pipeline/group_layout.py), with the layout kept in the task's state on a real SQLite
metastore. What is fenced is recorded (fence_producers itself calls ``init_transactions`` on
each id; the e2e test runs it against the Kafka mock, whose coordinator does not fence producer
epochs, so a zombie's commit cannot be shown refused here)."""

from __future__ import annotations

import time

import pytest

from metastore import TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.pipeline import group_layout
from replicator.pipeline.group_layout import fence_and_record, fence_recorded_groups
from replicator.pipeline.task_state import RunnerState

TASK = "task-groups"
PARAMS = {"address": "127.0.0.1:9", "topic": "t"}


@pytest.fixture
def state(tmp_path) -> RunnerState:
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    now = time.time()
    store.create_task(TaskRecord(TASK, TaskState.RUNNING, "", {}, now, now))
    return RunnerState(store, TASK)


@pytest.fixture
def fenced(monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(
        group_layout,
        "fence_producers",
        lambda _params, _task, groups, _timeout: calls.append(groups),
    )
    return calls


def test_groups_start_after_the_tasks_own_and_every_layouts_producers_are_fenced(
    state, fenced
) -> None:
    fence_and_record(state, PARAMS, TASK, ["g0", "g1", "g2"])  # first start: three processes
    fence_and_record(state, PARAMS, TASK, ["g0", "g1"])  # then two: g2 fenced too
    assert fenced == [["", "g0", "g1", "g2"], ["", "g0", "g1", "g2"]]
    assert state.kafka_groups() == ["g0", "g1"]


def test_a_start_in_the_daemon_fences_the_recorded_groups_once(state, fenced) -> None:
    fence_recorded_groups(state, PARAMS, TASK)  # never ran in groups: nothing to fence
    fence_and_record(state, PARAMS, TASK, ["g0", "g1"])
    fence_recorded_groups(state, PARAMS, TASK)  # kafkaTargetProcesses back to 1
    fence_recorded_groups(state, PARAMS, TASK)  # and again: forgotten
    assert fenced == [["", "g0", "g1"], ["g0", "g1"]]
    assert state.kafka_groups() == []
