"""A channel group's process runs with the daemon's interpreter settings (its lock turn,
``gilSwitchMs``, and its collector's thresholds), not Python's defaults: it runs the same
pipeline (server/tasks/group_process.py, server/interpreter.py). It is forked by a fork server
of one thread that imported a group's modules before (server/group_preload.py)."""

from __future__ import annotations

import gc
import json
import sys
import time
from functools import partial
from multiprocessing import forkserver
from pathlib import Path

import pytest

from metastore import TaskRecord, TaskState
from replicator.config.settings import CdcSettings
from replicator.pipeline.group_runner import GROUP_PROCESSES, GroupStart
from server.tasks.group_process import group_main, warm_group_processes

SPEC = {
    "kafka_connect_param": {"address": "127.0.0.1:1", "topic": "events"},
    "collection_infos": [{"name": "c"}],
}


def probe(out: Path, _settings: CdcSettings, _source: str) -> None:
    """The group's context builder: says how the process's interpreter is set (and what it
    found imported when it began), and ends it."""
    out.write_text(
        json.dumps(
            {
                "switch": sys.getswitchinterval(),
                "threshold": gc.get_threshold(),
                "frozen": gc.get_freeze_count(),
                "preloaded": "replicator.sources.rocksmq" in sys.modules,
            }
        )
    )
    raise SystemExit(0)


def test_a_group_process_has_the_daemons_lock_turn_and_collector_thresholds(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tuning.json"
    now = time.time()
    task = TaskRecord("t-tuning", TaskState.RUNNING, "", SPEC, now, now)
    parent_end, child_end = GROUP_PROCESSES.Pipe()
    settings = CdcSettings(gilSwitchMs=20)
    start = GroupStart(task, 0, "g0", ["dml_0"], child_end, GROUP_PROCESSES.Lock())
    warm_group_processes()
    process = GROUP_PROCESSES.Process(
        target=group_main, args=(settings.model_dump_json(), partial(probe, out), start)
    )
    process.start()
    process.join(60)
    parent_end.close()
    assert process.exitcode == 0, process.exitcode
    seen = json.loads(out.read_text())
    assert seen["switch"] == pytest.approx(0.020)  # Python's default: 0.005
    assert seen["threshold"] == [10_000, 20, 20]  # Python's default: 700, 10, 10
    # forked from the fork server, which had imported the group's modules and frozen them
    assert seen["preloaded"] is True
    assert seen["frozen"] > 100_000, seen["frozen"]


def test_the_fork_server_of_the_groups_is_a_process_of_one_thread() -> None:
    """Its forks copy only the thread that forks: had an import started a thread (a client's
    poller, a gRPC channel), a lock that thread held would be held for ever in every group."""
    warm_group_processes()
    pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert pid is not None
    # it imports in the background: wait until it has (its modules are in its memory maps)
    deadline = time.monotonic() + 60
    maps = Path(f"/proc/{pid}/maps")
    while "rocksdict" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "rocksdict" in maps.read_text(), "the fork server did not import the group's modules"
    threads = sorted(p.name for p in Path(f"/proc/{pid}/task").iterdir())
    assert threads == [str(pid)], threads
