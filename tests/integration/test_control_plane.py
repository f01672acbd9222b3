"""The control plane answers whatever the source does: with the source's etcd and Kafka behind a
listener that accepts and never answers, a Running task's runner is stuck connecting, and
pause, resume, delete and SIGTERM still complete within 2 s (the issue's bound; the measured
times are in bench/control_latency.py's results)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness.blackhole import BlackHole
from harness.services import wait_until

pytestmark = pytest.mark.integration

BOUND = 2.0


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def hung_source(hole: BlackHole) -> dict:
    return {
        "etcd": {"address": [hole.endpoint]},
        "etcdRootPath": "no-source",
        "kafka": {"address": hole.endpoint},
        "dmlChannelNum": 2,
    }


def running_task(daemon_factory, milvus_lite_service, name: str) -> str:
    """A task created on a healthy (empty) source, its positions saved; the daemon stopped."""
    healthy = daemon_factory(name).start()
    created = healthy.call(
        "create",
        {
            "milvus_connect_param": {"uri": milvus_lite_service.uri},
            "collection_infos": [{"name": "*"}],
        },
    )
    assert created.code == 200, created.body
    task_id = str(created.data["task_id"])
    positions = healthy.call("position", {"task_id": task_id})
    assert positions.code == 200 and positions.data, positions.body
    assert healthy.stop() == 0
    return task_id


def test_pause_resume_delete_answer_while_the_source_hangs(daemon_factory, milvus_lite_service):
    task_id = running_task(daemon_factory, milvus_lite_service, "ctl")
    with BlackHole() as hole:
        daemon = daemon_factory("ctl", sourceConfig=hung_source(hole)).start()
        wait_until(lambda: hole.accepted > 0, 30, "the runner connecting to the hung source")
        time.sleep(1)  # well inside a blocking call by now

        paused, took = timed(lambda: daemon.call("pause", {"task_id": task_id}))
        assert paused.code == 200, paused.body
        assert took < BOUND, f"pause took {took:.2f} s"

        resumed, took = timed(lambda: daemon.call("resume", {"task_id": task_id}))
        assert resumed.code == 200, resumed.body
        assert took < BOUND, f"resume took {took:.2f} s"
        got = daemon.call("get", {"task_id": task_id})
        assert got.data["task"]["state"] == "Running", got.body

        time.sleep(1)
        deleted, took = timed(lambda: daemon.call("delete", {"task_id": task_id}))
        assert deleted.code == 200, deleted.body
        assert took < BOUND, f"delete took {took:.2f} s"
        assert daemon.call("get", {"task_id": task_id}).code != 200
        assert "abandoned" in daemon.log_text(), daemon.log_text()[-3000:]


def test_sigterm_exits_promptly_while_the_source_hangs(daemon_factory, milvus_lite_service):
    task_id = running_task(daemon_factory, milvus_lite_service, "term")
    with BlackHole() as hole:
        daemon = daemon_factory("term", sourceConfig=hung_source(hole)).start()
        wait_until(lambda: hole.accepted > 0, 30, "the runner connecting to the hung source")
        time.sleep(1)
        assert daemon.process is not None
        started = time.monotonic()
        os.kill(daemon.process.pid, signal.SIGTERM)
        code = daemon.process.wait(timeout=30)
        took = time.monotonic() - started
        assert code == 0, daemon.log_text()[-3000:]
        assert took < BOUND, f"SIGTERM took {took:.2f} s to exit"
    # the task is still Running in the store, with its positions: the next start resumes it
    restarted = daemon_factory("term").start()
    got = restarted.call("get", {"task_id": task_id})
    assert got.data["task"]["state"] == "Running", got.body
    assert restarted.call("position", {"task_id": task_id}).data, "positions kept"
