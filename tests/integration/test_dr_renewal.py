"""Every long job renews its flow's claim on a timer while it runs (issue 48, faults 4 and 10): a
failback seeding (hours of backfill, then verifies of up to 6 h, save nothing) and a failover
waiting for a runner to stop. The claim's lapse is shortened to a second, its renewal to a
fifth of one; the daemon's supervisor and disaster recovery on a real etcd store
(tests/harness/dr_jobs.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from harness.dr_jobs import dr_world

from metastore import TaskState
from server.dr import claims, pair
from server.dr.failover import FailoverRequest
from server.dr.flows import FAULT_ENV
from server.dr.pair import FAILED_OVER
from server.dr.record import FAILOVER_KEY, load_json

pytestmark = pytest.mark.integration

LAPSE = 1.0  # seconds: a claim not renewed for this long may be taken over


@pytest.fixture
async def world(etcd_service, monkeypatch):
    monkeypatch.setattr(pair, "CLAIM_SECONDS", LAPSE)
    monkeypatch.setattr(claims, "RENEW_SECONDS", LAPSE / 5)
    async with dr_world(etcd_service.endpoint) as made:
        yield made


async def held_longer_than_its_lapse(world, task_id: str, job_id: str) -> None:
    """The flow stays claimed by ``job_id``, never lapsed, for three lapses."""
    end = time.monotonic() + 3 * LAPSE
    while time.monotonic() < end:
        job = world.pairs.get("a", "b").flow_of(task_id).job
        assert job is not None and job.job_id == job_id
        assert not job.expired(), f"the claim of {job_id} lapsed while the job ran"
        await asyncio.sleep(LAPSE / 4)


async def claimed_by(world, task_id: str) -> str:
    """The job that claims ``task_id``'s flow, once one does (10 s at most)."""
    for _ in range(200):
        flow = world.pairs.get("a", "b").flow_of(task_id)
        if flow is not None and flow.job is not None:
            return flow.job.job_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"no job claimed the flow of {task_id}")


async def test_a_failback_seeding_keeps_its_claim(world):
    # ab (a -> b) failed over to b; its failback's reverse task ab-back seeds a; its daemon
    # died and this one takes the failback over
    job_id = world.failback_left_seeding(TaskState.RUNNING)
    await world.disaster.recover()
    assert world.pairs.get("a", "b").flow_of("ab").job.member == world.supervisor.fleet.member_id
    await held_longer_than_its_lapse(world, "ab", job_id)


async def test_a_failover_waiting_for_its_runner_keeps_its_claim(world, monkeypatch):
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    # the failover held once the task is paused, as while it waits for another member's runner
    monkeypatch.setenv(FAULT_ENV, f"hold:failover-paused:{4 * LAPSE}")
    asked = asyncio.ensure_future(
        world.disaster.failover(FailoverRequest(task_id="ab", export_seconds=0))
    )
    job_id = await claimed_by(world, "ab")
    await held_longer_than_its_lapse(world, "ab", job_id)
    answer = await asyncio.wait_for(asked, 30)
    assert answer["job_id"] == job_id
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.job is None and flow.state == FAILED_OVER and flow.active == "b"


async def test_a_failover_whose_claim_is_let_go_for_it_after_its_save_answers_its_result(
    world, monkeypatch, tmp_path
):
    """The failover saved its record (done); a recover round hands the flow over for it and
    lets its claim go; its claim's renewal lands before the failover returns and finds the
    claim gone. The failover happened: answered with its saved result, not 409 "stalled past
    its claim" (held at ``failover_saved`` here; in service a window of milliseconds)."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    go = tmp_path / "go"
    monkeypatch.setenv(FAULT_ENV, f"hold:failover_saved:30:{go}")
    asked = asyncio.ensure_future(
        world.disaster.failover(FailoverRequest(task_id="ab", export_seconds=0))
    )
    job_id = await claimed_by(world, "ab")
    for _ in range(200):
        if (load_json(world.store, "ab", FAILOVER_KEY) or {}).get("job_id") == job_id:
            break
        await asyncio.sleep(0.05)
    await world.disaster.recover()  # the failover's effects applied, its claim let go
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.job is None and flow.state == FAILED_OVER and flow.active == "b"
    try:
        answer = await asyncio.wait_for(asked, 30)  # its next renewal finds the claim gone
    finally:
        go.touch()
    assert answer["job_id"] == job_id and answer["task_id"] == "ab"
    assert answer["failed_over_at"] and "consistent_up_to" in answer
    reason = world.store.get_task("ab").reason
    assert reason.startswith(f"failed over at {answer['failed_over_at']}: the target holds")
