"""Only the job holding a flow's claim moves the flow's tasks (issue 48, fault 1): the daemon's
own supervisor and disaster recovery on a real etcd store (tests/harness/dr_jobs.py), a
switchover left at a step as a job leaves it, then an operator's verbs and a stalled member
waking up."""

from __future__ import annotations

from dataclasses import replace

import pytest
from harness.dr_jobs import DrWorld, dr_world

from metastore import TaskState
from server.dr.claims import ClaimLostError
from server.dr.fence_owners import PairFences
from server.dr.pair_rules import claimed
from server.dr.record import SwitchoverJob, save_job
from server.dr.switchover import SwitchoverRun, paused_by
from server.errors import ConflictError

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(etcd_service):
    async with dr_world(etcd_service.endpoint) as made:
        yield made


def switchover_at(world: DrWorld, state: str, member: str, **changes) -> SwitchoverJob:
    """A switchover of ab (a -> b) saved at ``state``, its claim held by ``member``."""
    job = SwitchoverJob.new("ab", member, 30, 600, ("a", "b")).to(state, **changes)  # type: ignore[arg-type]
    save_job(world.store, job)
    existing = {t.task_id for t in world.store.list_tasks()}
    world.pairs.update(
        "a",
        "b",
        lambda p: claimed(p, "switchover", "ab", "a", job.job_id, member, existing=existing),
    )
    return job


async def test_no_verb_but_the_jobs_own_moves_a_flow_task_while_the_job_holds_the_claim(world):
    me = world.supervisor.fleet.member_id
    job = SwitchoverJob.new("ab", me, 30, 600, ("a", "b"))
    reason = f"switched over to task ab-rev {paused_by(job)} writes fenced on a at ...)"
    world.add_task("ab", "a", "b", TaskState.PAUSED, reason)
    world.add_task("ab-rev", "b", "a", TaskState.RUNNING)
    job = switchover_at(world, "reversing", me, reverse_task_id="ab-rev", original_paused=True)
    job_id = job.job_id
    world.pairs.update(
        "a", "b", lambda p: p.with_flow(replace(p.flow_of("ab"), tasks={"a": "ab", "b": "ab-rev"}))
    )
    refused = rf"switchover {job_id} \(reversing\) holds its cluster pair .*a\+b"
    # the operator's resume of a->b while the job reverses (its reason names the job: it was
    # let through before, and the job then ran b->a as well)
    with pytest.raises(ConflictError, match=refused + ": resume"):
        await world.supervisor.resume("ab")
    with pytest.raises(ConflictError, match=refused + ": pause"):
        await world.supervisor.pause("ab-rev")
    for task_id in ("ab", "ab-rev"):
        with pytest.raises(ConflictError, match=refused + ": delete"):
            await world.supervisor.delete(task_id)
    assert world.state("ab") is TaskState.PAUSED and world.state("ab-rev") is TaskState.RUNNING
    # the job's own verbs go through
    await world.supervisor.resume("ab", job=job_id)
    assert world.state("ab") is TaskState.RUNNING
    # a job that does not hold the claim moves nothing
    with pytest.raises(ConflictError, match="job other-job no longer holds"):
        await world.supervisor.pause("ab", job="other-job")


async def test_a_stalled_member_that_wakes_up_rolls_nothing_back(world):
    """D1 fenced a and paused ab, then stalled; D2's recover round took the job over (same job,
    D2 the member). D1 wakes, its step fails: its roll back must neither lift D2's fence nor
    resume ab (D2 may be past the point of no return, running b->a)."""
    job = SwitchoverJob.new("ab", "d1", 30, 600, ("a", "b"))
    world.add_task("ab", "a", "b", TaskState.PAUSED, f"switched over {paused_by(job)} ...)")
    job = job.to("reversing", fence_set=True, original_paused=True, reverse_task_id="ab-rev")
    save_job(world.store, job)
    existing = {"ab"}
    world.pairs.update(
        "a", "b", lambda p: claimed(p, "switchover", "ab", "a", job.job_id, "d1", existing=existing)
    )
    PairFences(world.pairs, world.settings, ("a", "b")).acquire("a", job.job_id)
    assert world.fence_value("a") == b"true"
    # D2 takes the job over: the same job, its member D2
    world.pairs.update(
        "a", "b", lambda p: claimed(p, "switchover", "ab", "a", job.job_id, "d2", existing=existing)
    )
    stalled = SwitchoverRun(
        world.supervisor, world.settings, job, world.pairs, fence_probe=lambda: False
    )
    with pytest.raises(ClaimLostError):
        await stalled.roll_back("its step failed after the stall")
    assert world.fence_value("a") == b"true", "the stalled member lifted the fence D2 holds"
    assert world.pairs.get("a", "b").fences["a"].owners == (job.job_id,)
    assert world.state("ab") is TaskState.PAUSED, "the stalled member resumed a->b"
