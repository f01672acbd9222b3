"""Only the job holding a flow's claim moves the flow's tasks (issue 48, fault 1): the daemon's
own supervisor and disaster recovery on a real etcd store (tests/harness/dr_jobs.py), a
switchover left at a step as a job leaves it, then an operator's verbs and a stalled member
waking up."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from harness.dr_jobs import DrWorld, dr_world, seed_job

from metastore import TaskState
from server.dr.claims import ClaimLostError
from server.dr.fence_owners import PairFences
from server.dr.flows import FAULT_ENV
from server.dr.pair import FAILED_OVER, REPLICATING
from server.dr.pair_rules import claimed
from server.dr.record import FAILBACK_KEY, FAILOVER_KEY, SwitchoverJob, save_json
from server.dr.switchover import paused_by
from server.errors import ConflictError

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(etcd_service):
    async with dr_world(etcd_service.endpoint) as made:
        yield made


def switchover_at(world: DrWorld, state: str, member: str, **changes) -> SwitchoverJob:
    """A switchover of ab (a -> b) saved at ``state``, its claim held by ``member``."""
    job = SwitchoverJob.new("ab", member, 30, 600, ("a", "b")).to(state, **changes)  # type: ignore[arg-type]
    seed_job(world.store, job)
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
    seed_job(world.store, job)
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
    stalled = world.run_of(job, fenced=False)
    with pytest.raises(ClaimLostError):
        await stalled.roll_back("its step failed after the stall")
    assert world.fence_value("a") == b"true", "the stalled member lifted the fence D2 holds"
    assert world.pairs.get("a", "b").fences["a"].owners == (job.job_id,)
    assert world.state("ab") is TaskState.PAUSED, "the stalled member resumed a->b"


async def test_a_finished_jobs_effects_reach_the_pair_after_a_kill_before_its_hand_over(world):
    """A daemon killed between a job's end (saved) and the pair's update (issue 48, fault 2):
    the next recover round, or the next verb, hands the flow over as the job would have."""
    # a switchover of ab done, the flow still claimed by it and pointing a -> b
    world.add_task("ab", "a", "b", TaskState.PAUSED, "switched over to task ab-rev (job ...)")
    world.add_task("ab-rev", "b", "a", TaskState.RUNNING)
    switchover_at(world, "done", "dead-member", reverse_task_id="ab-rev", fence_set=False)
    await world.disaster.recover()
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.job is None and flow.active == "b" and flow.state == REPLICATING
    assert flow.tasks == {"a": "ab", "b": "ab-rev"}
    with pytest.raises(ConflictError, match="would run both directions"):
        await world.supervisor.resume("ab")
    # applied once only: a switchover of the reverse direction then finds it as it is
    assert world.pairs.get("a", "b").flow_of("ab") == flow
    # a failover of ab-rev, its answer saved, the flow still claimed by it
    failover = "failover-0001"
    save_json(world.store, "ab-rev", FAILOVER_KEY, {"state": "done", "job_id": failover})
    world.pairs.update(
        "a",
        "b",
        lambda p: claimed(
            p, "failover", "ab-rev", "b", failover, "dead", existing={"ab", "ab-rev"}
        ),
    )
    # the next verb asked finds the flow failed over to a (here: a resume, 409 naming it)
    with pytest.raises(ConflictError, match="failed over to a: resume does not apply"):
        await world.supervisor.resume("ab")
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.job is None and flow.state == FAILED_OVER and flow.active == "a"
    # a failback of ab-rev in sync, the flow still claimed by it: production stays on a
    back = "failback-0001"
    record = {"state": "in_sync", "job_id": back, "production_cluster": "a"}
    save_json(world.store, "ab-rev", FAILBACK_KEY, record)
    world.pairs.update(
        "a",
        "b",
        lambda p: claimed(p, "failback", "ab-rev", "b", back, "dead", existing={"ab", "ab-rev"}),
    )
    await world.supervisor.resume("ab")  # a -> b carries production again
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.job is None and flow.state == REPLICATING and flow.active == "a"


async def test_the_recover_round_leaves_a_fence_a_job_joined_after_it_looked(
    world, monkeypatch, tmp_path, caplog
):
    """A fence on a whose owner is gone; the recover round reads the pair, and meanwhile a
    switchover claims its flow and joins that fence (issue 48, fault 9: the round lifted it
    with the job ids it had read before, and the job's source took writes while it drained)."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    fences = PairFences(world.pairs, world.settings, ("a", "b"))
    fences.acquire("a", "job-of-a-deleted-task")
    wake = tmp_path / "wake"
    monkeypatch.setenv(FAULT_ENV, f"hold:pair-tended:30:{wake}")
    tending = asyncio.ensure_future(world.disaster.pairs.tend())
    for _ in range(200):  # the round has read the pair
        if "held at pair-tended" in caplog.text:
            break
        await asyncio.sleep(0.05)
    assert "held at pair-tended" in caplog.text
    job = "switchover-1"
    world.pairs.update(
        "a", "b", lambda p: claimed(p, "switchover", "ab", "a", job, "m", existing={"ab"})
    )
    fences.acquire("a", job)  # joins the fence on a
    wake.touch()
    await asyncio.wait_for(tending, 30)
    assert world.fence_value("a") == b"true", "the round lifted the fence the switchover holds"
    assert world.pairs.get("a", "b").fences["a"].owners == ("job-of-a-deleted-task", job)


async def test_a_recover_round_whose_pair_read_fails_lets_the_daemon_start(
    world, monkeypatch, caplog
):
    """The recover round runs inside the daemon's start: a metastore error reading the pairs
    (etcd slow to answer a member just continued after a stall) leaves the pairs for the next
    round, as an error reading the tasks does; it never stops the start (one way the boundary
    search's `switchover @ takeover_claimed x stall` could exit with code 1 during its start)."""
    from metastore import MetaStoreError

    world.add_task("ab", "a", "b", TaskState.RUNNING)

    def unreadable() -> list:
        raise MetaStoreError("etcd: deadline exceeded reading pairs/")

    monkeypatch.setattr(world.disaster.pairs.store, "all", unreadable)
    await world.disaster.recover()  # raised before: the daemon's start failed with it
    assert "cluster pairs not tended: etcd: deadline exceeded" in caplog.text
