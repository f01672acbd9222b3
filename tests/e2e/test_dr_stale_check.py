"""The stale-write check after a switchover against the verbs that can overtake it, on two real
Milvus 2.3.5 clusters (``a`` on the Kafka mock, ``b`` on RocksMQ).

The check is a verify of the reverse task some seconds after the switchover; a switch home (the
switchover of that reverse task) verifies the same task and then pauses it. Whichever comes
first, the check ends — with its result, or ``not_checked`` naming what overtook it — and the
switch home is not held up by it.
"""

from __future__ import annotations

import json

import pytest
from harness.dr_clusters import consistent_known, job_of, row, switchover_ends, task
from harness.services import wait_until

from server.dr.flows import FAULT_ENV
from tests.e2e.test_disaster_recovery import (  # noqa: F401 - fixtures
    clusters,
    dr_daemon,
    replicated,
)
from tests.e2e.test_replication import wait_equal

pytestmark = pytest.mark.e2e


def stale_check_of(daemon, task_id: str, job_id: str) -> dict | None:
    job = job_of(daemon, task_id)
    return job.get("stale_check") if job.get("job_id") == job_id else None


@pytest.mark.parametrize("check_after", [2, 25])
def test_a_switch_home_during_the_stale_write_check_ends_the_check(
    check_after,
    dr_daemon,  # noqa: F811
    milvus_source,
    milvus_source_rocksmq,
):
    """``check_after`` 2: the check's verify runs when the switch home is asked; 25: the switch
    home's verify (or its pause of the reverse task) comes first."""
    name, a, b, ab = replicated(dr_daemon, milvus_source, milvus_source_rocksmq, "drs", range(50))
    asked = dr_daemon.call(
        "switchover", {"task_id": ab, "max_lag_seconds": 30, "stale_check_seconds": check_after}
    )
    assert asked.code == 200, asked.message
    first = switchover_ends(dr_daemon, ab)
    assert first["state"] == "done", json.dumps(first)
    ba = first["reverse_task_id"]
    consistent_known(dr_daemon, ba)
    if check_after < 10:
        wait_until(
            lambda: job_of(dr_daemon, ba, "verify").get("job_id"),
            60,
            "the check's verify asked",
            interval=0.2,
        )
    home = dr_daemon.call(
        "switchover", {"task_id": ba, "max_lag_seconds": 30, "stale_check_seconds": 0}
    )
    assert home.code == 200, home.message
    back = switchover_ends(dr_daemon, ba, timeout=300)
    assert back["state"] == "done", json.dumps(back)
    check = wait_until(
        lambda: stale_check_of(dr_daemon, ab, first["job_id"]),
        120,
        f"the stale-write check of {ab}'s switchover {first['job_id']}",
        interval=0.5,
    )
    if check_after < 10:
        # the check's verify came first: it ran to its end, the switch home waited for it
        assert check["state"] == "done" and check["divergent_rows"] == 0, check
        assert back["verify"]["job_id"] != check["verify_job"], (back, check)
    else:
        # the switch home came first: its verify compared the clusters, fenced, and it paused
        # the reverse task; the check names it and does not verify a task that no longer runs
        assert check["state"] == "not_checked", check
        assert check["overtaken_by"] == back["job_id"], (check, back)
        assert back["job_id"] in check["reason"], check
        assert "verify_job" not in check, check
    assert task(dr_daemon, ab)["state"] == "Running"
    assert task(dr_daemon, ba)["state"] == "Paused"
    a.insert(name, [row(k) for k in range(500, 510)])
    wait_equal(a, b, name, "id", timeout=120)
    a.close()
    b.close()


@pytest.mark.parametrize("point", ["stale_check_verifying", "stale_check_saved"])
def test_a_daemon_killed_during_the_stale_write_check_makes_it_when_it_starts_again(
    point,
    daemon_factory,
    clusters,  # noqa: F811
    milvus_source,
    milvus_source_rocksmq,
):
    """``kill -9`` with the check held at ``point`` (its verify started, or its result saved),
    then a start: the check asked ends with a result, made again when it had none (the job's
    record said done and the check stayed without a result for good before)."""
    daemon = daemon_factory("dr", clusters=clusters, verify={"settleSeconds": 20})
    daemon.env[FAULT_ENV] = f"hold:{point}:120"
    daemon.start()
    name, a, b, ab = replicated(daemon, milvus_source, milvus_source_rocksmq, "drk", range(50))
    asked = daemon.call(
        "switchover", {"task_id": ab, "max_lag_seconds": 30, "stale_check_seconds": 1}
    )
    assert asked.code == 200, asked.message
    wait_until(
        lambda: f"switchover held at {point}" in daemon.log_text(), 120, f"the check at {point}"
    )
    saved = job_of(daemon, ab)
    assert saved["state"] == "done", saved
    assert (saved["stale_check"] is None) == (point == "stale_check_verifying"), saved
    daemon.kill()
    del daemon.env[FAULT_ENV]
    daemon.start()
    check = wait_until(
        lambda: stale_check_of(daemon, ab, asked.data["job_id"]),
        120,
        f"the stale-write check of {ab} after the restart",
        interval=0.5,
    )
    assert check["state"] == "done" and check["divergent_rows"] == 0, check
    if point == "stale_check_verifying":
        assert "taken up again" in daemon.log_text()
    # the flow is b -> a, and carries writes
    ba = job_of(daemon, ab)["reverse_task_id"]
    assert task(daemon, ba)["state"] == "Running"
    b.insert(name, [row(k) for k in range(500, 510)])
    wait_equal(b, a, name, "id", timeout=120)
    a.close()
    b.close()
