"""Failback end to end on two real Milvus 2.3.5 clusters (see test_disaster_recovery.py): a task
a -> b fails over while a writer writes to a (so a keeps rows b never got), production moves
to b, a comes back; the failback re-seeds a from b (a Spark backfill), removes a's unreplicated
tail (a verify with repair), proves a equal to b, and a switchover then moves production home.
The daemon is killed with ``kill -9`` while the repair's verify runs, and started again: the
failback asks for that verify again (the restart marked it failed) and goes on.
"""

from __future__ import annotations

import json

import pytest
from harness.services import wait_until

from server.dr.flows import FAULT_ENV
from tests.e2e.test_disaster_recovery import (
    Writer,
    _row,
    clusters,  # noqa: F401 - a fixture
    consistent_known,
    replicated,
    switchover_ends,
    task,
    watched,
)
from tests.e2e.test_replication import rows, wait_equal

pytestmark = pytest.mark.e2e


def test_failback_reseeds_the_old_primary_removes_its_tail_and_switches_home(
    daemon_factory,
    clusters,  # noqa: F811
    milvus_source,
    milvus_source_rocksmq,
):
    # a verify reading 20 rows per query: the repair's verify still runs when the daemon is
    # killed (the test checks it did)
    dr_daemon = daemon_factory(
        "dr", clusters=clusters, verify={"settleSeconds": 20, "batchRows": 20}
    )
    dr_daemon.env[FAULT_ENV] = "hold:repairing:120"
    dr_daemon.start()
    name, a, b, ab = replicated(dr_daemon, milvus_source, milvus_source_rocksmq, "drb", range(300))

    # a is lost while it takes writes: the failover stops the task at once
    writer = Writer(milvus_source.uri, name, first=10_000)
    writer.start()
    try:
        wait_until(lambda: len(writer.acknowledged) >= 100, 60, "the writer's rows")
        failed_over = dr_daemon.call("failover", {"task_id": ab, "export_seconds": 0})
        assert failed_over.code == 200, failed_over.message
        # a keeps taking writes b never sees: its unreplicated tail
        wait_until(lambda: len(writer.acknowledged) >= 200, 60, "the tail on a")
    finally:
        writer.stop.set()
        writer.join(30)
    tail = set(rows(a, name, "id")) - set(rows(b, name, "id"))
    assert tail, "a holds nothing b lacks: the test proves nothing"

    # production on b: new rows, deleted rows, changed rows
    b.insert(name, [_row(k) for k in range(50_000, 50_200)])
    b.delete(name, filter="id < 30")
    b.upsert(name, [{**_row(k), "title": "changed on b"} for k in range(100, 120)])

    refused = dr_daemon.call("failback", {"task_id": f"{ab}-nope"})
    assert refused.code == 404, refused.message
    asked = dr_daemon.call("failback", {"task_id": ab})
    assert asked.code == 200, asked.message
    back = asked.data["reverse_task_id"]
    again = dr_daemon.call("failback", {"task_id": ab})
    assert again.code == 409, again.message

    # killed while the repair's verify runs, started again
    wait_until(
        lambda: "failback held at repairing" in dr_daemon.log_text(), 300, "the repair's verify"
    )
    verify = (task(dr_daemon, back).get("progress") or {}).get("verify") or {}
    dr_daemon.kill()
    assert verify.get("state") in ("pending", "running"), (
        f"the verify ended before the kill: {verify}"
    )
    del dr_daemon.env[FAULT_ENV]
    dr_daemon.start()

    def finished() -> dict | None:
        job = (task(dr_daemon, ab).get("progress") or {}).get("failback") or {}
        return job if job.get("state") in ("in_sync", "failed") else None

    job = wait_until(finished, 600, "the failback", interval=1.0)
    assert job["state"] == "in_sync", json.dumps(job)
    assert [s["state"] for s in job["steps"]][:4] == [
        "creating",
        "seeding",
        "repairing",
        "streaming",
    ]
    assert job["repaired"] >= len(tail), job  # at least the tail was removed
    # the verify the restart ended without a result was asked again, not taken as the result
    assert verify["job_id"] in job["last_verify_problem"], job
    assert "the daemon stopped during the verify" in job["last_verify_problem"], job
    assert rows(a, name, "id") == rows(b, name, "id")
    reverse = task(dr_daemon, back)
    assert reverse["state"] == "Running"
    assert (reverse["source_cluster"], reverse["target_cluster"]) == ("b", "a")
    # from in_sync on, a is watched for writes of stale clients, as after a switchover
    a.insert(name, [_row(99_999)])
    watch = wait_until(
        lambda: watched(dr_daemon, back, lambda w: w["stale_rows"] >= 1),
        120,
        "the stale-write watch",
        interval=0.5,
    )
    assert watch["collections"][f"default.{name}"]["extra"] == 1, watch
    assert watch["collections"][f"default.{name}"]["sample"] == [99_999], watch
    a.delete(name, filter="id == 99999")

    # home: the switchover of the reverse task starts the original task again
    consistent_known(dr_daemon, back)
    home = dr_daemon.call("switchover", {"task_id": back, "max_lag_seconds": 30})
    assert home.code == 200, home.message
    done = switchover_ends(dr_daemon, back)
    assert done["state"] == "done" and done["reverse_task_id"] == ab, json.dumps(done)
    assert task(dr_daemon, ab)["state"] == "Running"
    a.insert(name, [_row(k) for k in range(70_000, 70_050)])
    wait_equal(a, b, name, "id", timeout=120)
    a.close()
    b.close()
