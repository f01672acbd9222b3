"""Scheduled verification and the requests around a verify: when one is due, which ranges a
sampled run compares, the wait for the task's applied position (over a real SQLite metastore),
and the refusals of bad input (no I/O beyond a temporary SQLite file)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from metastore import Position, TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.backfill.ranges import cut_ranges
from replicator.compare.gate import applied_ts, now_ts, wait_applied
from replicator.compare.job import sample_ranges
from replicator.compare.state import VerifyJob
from replicator.config.settings import load_settings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import physical_ms
from server.errors import BadRequestError
from server.runtime.verify_schedule import HOUR, Schedule, due, schedule_of
from server.tasks.requests import CreateRequest, VerifyRequest, parse_model
from server.tasks.spec import validate_create, validate_verify

WITH_SOURCE = load_settings(None, {"CDC_SOURCECONFIG__MILVUS__URI": "http://source:19530"})
WITHOUT_SOURCE = load_settings(None, {})
SELECTION = {("default", "orders"), ("shop", "*")}


def task(state: TaskState = TaskState.RUNNING, created_at: float = 0.0) -> TaskRecord:
    return TaskRecord("t1", state, "", {}, created_at, created_at)


def test_a_verify_is_due_once_an_interval_has_passed_since_the_last_one():
    every_hour = Schedule(1.0, 0.1)
    now = 10 * HOUR
    assert due(task(), None, every_hour, now)
    assert not due(task(created_at=now - 0.5 * HOUR), None, every_hour, now)
    last = VerifyJob.new(["*"], False).with_(state="done", created_at=now - 2 * HOUR)
    assert due(task(), last, every_hour, now)
    assert not due(task(), last.with_(created_at=now - 0.9 * HOUR), every_hour, now)
    assert not due(task(), last.with_(state="running"), every_hour, now)
    assert not due(task(TaskState.PAUSED), last, every_hour, now)
    assert not due(task(), last, Schedule(0.0, 0.1), now)


def test_the_tasks_schedule_wins_over_the_daemons_default():
    defaults = load_settings(
        None, {"CDC_VERIFY__INTERVALHOURS": "24", "CDC_VERIFY__SAMPLEFRACTION": "0.2"}
    ).verify
    assert schedule_of(TaskSpec.from_stored({}), defaults) == Schedule(24.0, 0.2)
    assert schedule_of(
        TaskSpec.from_stored({"verify": {"intervalHours": 2}}), defaults
    ) == Schedule(2.0, 0.2)
    asked = {"verify": {"intervalHours": 2, "sampleFraction": 0.5}}
    assert schedule_of(TaskSpec.from_stored(asked), defaults) == Schedule(2.0, 0.5)
    assert (
        schedule_of(TaskSpec.from_stored({}), WITH_SOURCE.verify).interval_hours == 0
    )  # none by default


def test_a_sampled_run_compares_a_fraction_of_the_ranges_in_key_order():
    ranges = cut_ranges(range(1000), 50)  # 20 ranges
    chosen = sample_ranges(ranges, 0.25, random.Random(3))
    assert len(chosen) == 5
    assert [r.index for r in chosen] == sorted(r.index for r in chosen)
    assert set(chosen) <= set(ranges)
    assert len(sample_ranges(ranges, 0.01, random.Random(3))) == 1
    assert sample_ranges(ranges, 1.0, random.Random(3)) == ranges
    drawn = {
        r.index for seed in range(40) for r in sample_ranges(ranges, 0.25, random.Random(seed))
    }
    assert drawn == set(range(20))  # every range is drawn sooner or later


def test_the_wait_ends_when_every_channel_of_the_collection_passed_the_moment(tmp_path):
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    store.create_task(task())
    moment = now_ts()
    store.save_position("t1", Position("kafka", "dml_0", b"\x01", moment - 1), None)
    store.save_position("t1", Position("kafka", "dml_1", b"\x01", moment + 5), None)
    store.save_position("t1", Position("kafka", "idle", b"", 0), None)
    stop = threading.Event()
    assert applied_ts(store, "t1", frozenset({"dml_1"}))() == moment + 5
    assert wait_applied(applied_ts(store, "t1", frozenset({"dml_1"})), moment, 1, stop)
    # dml_0 is behind the moment: the wait times out (briefly) and says so
    started = time.monotonic()
    both = applied_ts(store, "t1", frozenset({"dml_0", "dml_1"}))
    assert not wait_applied(both, moment, 0.6, stop)
    assert time.monotonic() - started >= 0.6
    # a channel of the collection without any position: nothing applied there
    assert applied_ts(store, "t1", frozenset({"dml_1", "dml_9"}))() == 0
    # channels unknown: every channel that has a tick (the idle one is left out)
    assert applied_ts(store, "t1", None)() == moment - 1
    store.save_position(
        "t1", Position("kafka", "dml_0", b"\x02", moment + 1), store.get_positions("t1")["dml_0"]
    )
    assert wait_applied(both, moment, 5, stop)
    assert physical_ms(now_ts()) >= physical_ms(moment)


def test_verify_requests_default_to_every_collection_without_repair():
    request = parse_model(VerifyRequest, {"task_id": "t1"})
    assert (request.collections, request.repair) == (["*"], False)
    assert validate_verify(["orders", "shop.items"], SELECTION, WITH_SOURCE) == [
        "orders",
        "shop.items",
    ]


@pytest.mark.parametrize(
    ("data", "names", "settings", "expected"),
    [
        ({"task_id": "t1", "repair": "yes"}, None, WITH_SOURCE, "repair"),
        ({"task_id": "t1", "collection": ["x"]}, None, WITH_SOURCE, "collection"),
        ({"task_id": ""}, None, WITH_SOURCE, "task_id"),
        (None, ["*", "orders"], WITH_SOURCE, "give it alone"),
        (None, [], WITH_SOURCE, "empty"),
        (None, ["users"], WITH_SOURCE, "'users' is not selected by the task"),
        (None, ["bad name"], WITH_SOURCE, "not a valid name"),
        (None, ["*"], WITHOUT_SOURCE, "sourceConfig.milvus.uri"),
    ],
)
def test_bad_verify_requests_are_refused_naming_the_problem(data, names, settings, expected):
    def ask() -> object:
        if data is not None:
            return parse_model(VerifyRequest, data)
        return validate_verify(names, SELECTION, settings)

    with pytest.raises(BadRequestError) as caught:
        ask()
    assert expected in str(caught.value)


def create(settings=WITH_SOURCE, **data):
    data.setdefault("milvus_connect_param", {"host": "milvus-b", "port": 19530})
    data.setdefault("collection_infos", [{"name": "orders"}])
    return validate_create(parse_model(CreateRequest, data), settings).to_stored()


def test_a_create_may_ask_for_a_schedule():
    assert "verify" not in create()
    spec = create(verify={"intervalHours": 6, "sampleFraction": 0.25})
    assert spec["verify"] == {"intervalHours": 6, "sampleFraction": 0.25}
    assert create(verify={"intervalHours": 0.5})["verify"] == {"intervalHours": 0.5}
    for bad, expected in [
        ({"intervalHours": 0}, "intervalHours"),
        ({"intervalHours": 1, "sampleFraction": 1.5}, "sampleFraction"),
        ({}, "intervalHours"),
        ({"intervalHours": 1, "every": 2}, "every"),
    ]:
        with pytest.raises(BadRequestError) as caught:
            create(verify=bad)
        assert expected in str(caught.value)
    with pytest.raises(BadRequestError) as caught:
        create(WITHOUT_SOURCE, verify={"intervalHours": 1})
    assert "sourceConfig.milvus.uri" in str(caught.value)


def test_a_running_tasks_own_figures_count_where_its_saved_ticks_are_older(tmp_path):
    """An idle channel saves its moving position only now and then: while the task runs in
    this daemon, its runner's applied tick per channel ends the wait without that save."""
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    store.create_task(task())
    moment = now_ts()
    store.save_position("t1", Position("kafka", "dml_0", b"\x01", moment - 10), None)
    store.save_position("t1", Position("kafka", "dml_1", b"\x01", moment + 5), None)
    live: dict[str, int] = {}
    both = applied_ts(store, "t1", frozenset({"dml_0", "dml_1"}), lambda: live)
    assert both() == moment - 10
    live.update({"dml_0": moment + 2, "dml_1": moment - 20})  # each channel: the later one
    assert both() == moment + 2
    assert wait_applied(both, moment, 1, threading.Event())
    # a channel only the runner knows yet; channels unknown: every channel with a tick
    live["dml_7"] = moment + 9
    assert applied_ts(store, "t1", frozenset({"dml_7"}), lambda: live)() == moment + 9
    assert applied_ts(store, "t1", None, lambda: live)() == moment + 2
    # the task not running here: the saved ticks alone
    assert applied_ts(store, "t1", frozenset({"dml_0"}), lambda: None)() == moment - 10
