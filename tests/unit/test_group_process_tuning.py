"""A channel group's process runs with the daemon's interpreter settings (its lock turn,
``gilSwitchMs``, and its collector's thresholds), not Python's defaults: it runs the same
pipeline (server/tasks/group_process.py, server/interpreter.py)."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

from metastore import TaskRecord, TaskState
from replicator.config.settings import CdcSettings
from replicator.pipeline.group_runner import GroupStart
from server.tasks.group_process import group_main

SPEC = {
    "kafka_connect_param": {"address": "127.0.0.1:1", "topic": "events"},
    "collection_infos": [{"name": "c"}],
}


def probe(_settings: CdcSettings, _source: str) -> None:
    """The group's context builder: says how the process's interpreter is set, and ends it."""
    Path(os.environ["GROUP_TUNING_PROBE"]).write_text(
        json.dumps({"switch": sys.getswitchinterval(), "threshold": gc.get_threshold()})
    )
    raise SystemExit(0)


def test_a_group_process_has_the_daemons_lock_turn_and_collector_thresholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "tuning.json"
    monkeypatch.setenv("GROUP_TUNING_PROBE", str(out))  # the spawned process inherits it
    now = time.time()
    task = TaskRecord("t-tuning", TaskState.RUNNING, "", SPEC, now, now)
    spawn = multiprocessing.get_context("spawn")
    parent_end, child_end = spawn.Pipe()
    settings = CdcSettings(gilSwitchMs=20)
    start = GroupStart(task, 0, "g0", ["dml_0"], child_end, spawn.Lock())
    process = spawn.Process(target=group_main, args=(settings.model_dump_json(), probe, start))
    process.start()
    process.join(60)
    parent_end.close()
    assert process.exitcode == 0, process.exitcode
    seen = json.loads(out.read_text())
    assert seen["switch"] == pytest.approx(0.020)  # Python's default: 0.005
    assert seen["threshold"] == [10_000, 20, 20]  # Python's default: 700, 10, 10
