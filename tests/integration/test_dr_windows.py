"""The smaller windows the review of issue 48's fixes left (the daemon's own supervisor and
disaster recovery on a real etcd store, tests/harness/dr_jobs.py):

- a job's own verb passes only while the job holds the live claim on the member asking, checked
  and renewed in one compare-and-set of the pair (a stalled member whose job another member
  took over, same job id, moves nothing);
- a job that saved its end while another member applied its effects (a verb asked there) lets
  go of nothing when it wakes: the flow may have moved on since;
- every 409 of a verb refused because a job holds the flow names the job's kind, id and step.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from harness.dr_jobs import DrWorld, ScriptedRunner, dr_world, seed_job

from metastore import TaskState
from replicator.hybrid_time import from_seconds
from server.dr.claims import ClaimLostError
from server.dr.failover import FailoverRequest
from server.dr.fence_owners import PairFences
from server.dr.flows import FAULT_ENV
from server.dr.manager import SwitchoverRequest
from server.dr.pair import CLAIM_SECONDS, REPLICATING, release
from server.dr.pair_rules import claimed
from server.dr.record import SwitchoverJob, load_job
from server.dr.switchover import paused_by
from server.errors import ConflictError

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(etcd_service):
    async with dr_world(etcd_service.endpoint) as made:
        yield made


def claim_for(world: DrWorld, task_id: str, source: str, job_id: str, member: str) -> None:
    existing = {t.task_id for t in world.store.list_tasks()}
    world.pairs.update(
        "a",
        "b",
        lambda p: claimed(p, "switchover", task_id, source, job_id, member, existing=existing),
    )


def reversing(world: DrWorld, member: str) -> SwitchoverJob:
    """A switchover of ab (a -> b) at ``reversing``, a -> b paused by it, b -> a created, its
    claim held by ``member``."""
    job = SwitchoverJob.new("ab", member, 30, 600, ("a", "b"))
    world.add_task("ab", "a", "b", TaskState.PAUSED, f"switched over {paused_by(job)} ...)")
    world.add_task("ab-rev", "b", "a", TaskState.RUNNING)
    job = job.to("reversing", reverse_task_id="ab-rev", original_paused=True)
    seed_job(world.store, job)
    claim_for(world, "ab", "a", job.job_id, member)
    world.pairs.update(
        "a", "b", lambda p: p.with_flow(replace(p.flow_of("ab"), tasks={"a": "ab", "b": "ab-rev"}))
    )
    return job


async def test_a_jobs_verb_passes_only_on_the_member_holding_its_live_claim(world):
    """The job's id alone let a stalled member through: D1 (this daemon) ran the job, another
    member took it over (same job id, that member named in the claim); D1 wakes and resumes
    a -> b while the other member runs b -> a."""
    me = world.supervisor.fleet.member_id
    job = reversing(world, "other-member")
    with pytest.raises(
        ConflictError,
        match=rf"job {job.job_id} no longer holds its cluster pair pairs/a\+b on fleet member "
        rf"{me} \(held by switchover {job.job_id} \(reversing\) on fleet member other-member\)",
    ):
        await world.supervisor.resume("ab", job=job.job_id)
    with pytest.raises(ConflictError, match="no longer holds"):
        await world.supervisor.delete("ab-rev", job=job.job_id)
    assert world.state("ab") is TaskState.PAUSED and world.state("ab-rev") is TaskState.RUNNING
    # held here (this member took it back): the verb passes, and the claim is renewed in the
    # same compare-and-set (the asker holds it, fresh, as its verb takes effect)
    claim_for(world, "ab", "a", job.job_id, me)
    old = time.time() - 50
    world.pairs.update(
        "a",
        "b",
        lambda p: p.with_flow(
            replace(p.flow_of("ab"), job=replace(p.flow_of("ab").job, renewed_at=old))
        ),
    )
    await world.supervisor.resume("ab", job=job.job_id)
    assert world.state("ab") is TaskState.RUNNING
    assert world.pairs.get("a", "b").flow_of("ab").job.renewed_at > old + 40


async def test_a_job_that_finished_while_another_member_settled_it_lets_go_of_nothing(
    world, monkeypatch, tmp_path, caplog
):
    """D1 saves the switchover ``done`` and stalls before handing the flow over; a verb asked
    on this daemon (another member) applies the job's effects (b -> a carries production), and
    the flow moves on (a switchover back to a, done). D1 wakes: its hand-over must not point
    the flow at b again (it did: the release applied its changes to a flow no job held)."""
    job = reversing(world, "d1")
    job = job.with_(reverse_start={}, writers_may_move_at={"time": "x"})
    seed_job(world.store, job)
    run = world.run_of(job, fenced=False)

    async def armed() -> None:  # the stale-write watch (needs the clusters' Milvus) is not
        return None  # what this test is about

    run._arm_watch = armed  # type: ignore[method-assign]
    wake = tmp_path / "wake"
    monkeypatch.setenv(FAULT_ENV, f"hold:finished:30:{wake}")
    finishing = asyncio.ensure_future(run.finish())
    for _ in range(200):
        if "held at finished" in caplog.text:
            break
        await asyncio.sleep(0.05)
    assert "held at finished" in caplog.text
    stored = load_job(world.store, "ab")
    assert stored is not None and stored.state == "done"
    # a resume of a -> b asked here is judged with the job's effects applied
    with pytest.raises(ConflictError, match="would run both directions"):
        await world.supervisor.resume("ab")
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.job is None and flow.active == "b" and flow.state == REPLICATING
    # the flow moves on: a switchover of b -> a (another job) ends with a active again
    back = "switchover-back"
    claim_for(world, "ab-rev", "b", back, "d2")
    world.pairs.update(
        "a",
        "b",
        lambda p: p.with_flow(release(p.flow_of("ab"), back, active="a", state=REPLICATING)),
    )
    wake.touch()
    await asyncio.wait_for(finishing, 30)
    flow = world.pairs.get("a", "b").flow_of("ab")
    assert flow.active == "a", "the woken job pointed the flow at b again"
    assert flow.job is None


async def test_the_recover_round_keeps_the_flow_of_a_task_created_after_it_listed_the_tasks(
    world, monkeypatch, tmp_path, caplog
):
    """A recover round lists the tasks, takes up their jobs (here: a failback whose daemon is
    gone, held once taken over), then forgets the pairs' deleted tasks. A task created
    meanwhile, its flow claimed by a switchover, is not deleted: the round dropped its flow,
    the switchover's claim with it (it pruned with the list it read before)."""
    world.failback_left_seeding(TaskState.RUNNING)
    wake = tmp_path / "wake"
    monkeypatch.setenv(FAULT_ENV, f"hold:failback_taken_over:30:{wake}")
    recovering = asyncio.ensure_future(world.disaster.recover())
    for _ in range(200):
        if "held at failback_taken_over" in caplog.text:
            break
        await asyncio.sleep(0.05)
    assert "held at failback_taken_over" in caplog.text
    world.add_task("cd", "a", "b", TaskState.RUNNING)
    claim_for(world, "cd", "a", "switchover-cd", "m")
    wake.touch()
    await asyncio.wait_for(recovering, 30)
    flow = world.pairs.get("a", "b").flow_of("cd")
    assert flow is not None, "the recover round dropped the flow of a task created meanwhile"
    assert flow.job is not None and flow.job.job_id == "switchover-cd"


async def test_a_member_that_stalls_after_its_claim_check_lifts_no_fence_of_the_new_member(
    world,
):
    """D1 rolls the switchover back: its claim is checked (still its own), then D1 stalls and
    D2 takes the job over (the same job, D2 named), going on with the fence on a held. D1
    wakes: it lifted D2's fence (the fence's owners are job ids; the release did not look at
    the claim). The release now checks the claim in its own compare-and-set."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    job = SwitchoverJob.new("ab", "d1", 30, 600, ("a", "b"))
    job = job.to("draining", fence_set=True)
    seed_job(world.store, job)
    claim_for(world, "ab", "a", job.job_id, "d1")
    PairFences(world.pairs, world.settings, ("a", "b")).acquire("a", job.job_id)
    run = world.run_of(job, fenced=False)
    checked = run.claim.keep

    async def checked_then_stalled() -> None:
        await checked()  # the claim is D1's here; D2 takes the job over right after
        claim_for(world, "ab", "a", job.job_id, "d2")

    run.claim.keep = checked_then_stalled  # type: ignore[method-assign]
    with pytest.raises(ClaimLostError):
        await run.roll_back("its step failed, then it stalled")
    assert world.fence_value("a") == b"true", "the stalled member lifted the new member's fence"
    assert world.pairs.get("a", "b").fences["a"].owners == (job.job_id,)


async def test_a_lapsed_claim_whose_job_saved_nothing_is_let_go_by_the_recover_round(world):
    """A daemon killed between a switchover's claim and its job record (its first save): the
    claim lapses, and nothing takes the job up (there is none to take). Every pause and
    resume of the flow's tasks was refused for good, "the next recover round takes it up"."""
    world.add_task("ab", "a", "b", TaskState.PAUSED, "paused by the operator")
    claim_for(world, "ab", "a", "switchover-never-saved", "dead-member")
    world.pairs.update(
        "a",
        "b",
        lambda p: p.with_flow(
            replace(
                p.flow_of("ab"),
                job=replace(p.flow_of("ab").job, renewed_at=time.time() - CLAIM_SECONDS - 5),
            )
        ),
    )
    await world.disaster.recover()
    assert world.pairs.get("a", "b").flow_of("ab").job is None
    await world.supervisor.resume("ab")  # refused before: "... the next recover round ..."
    assert world.state("ab") is TaskState.RUNNING


async def test_a_dr_verb_refused_while_this_daemon_runs_the_switchover_names_it_and_its_step(
    world,
):
    """The daemon's own refusal (before the pair's claim is asked): a failover or a second
    switchover while this daemon runs the task's switchover."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    job = SwitchoverJob.new("ab", world.supervisor.fleet.member_id, 30, 600, ("a", "b"))
    seed_job(world.store, job.to("draining"))
    world.disaster._runs["ab"] = running = asyncio.ensure_future(asyncio.sleep(30))
    try:
        failover = FailoverRequest(task_id="ab")
        switchover = SwitchoverRequest(task_id="ab")
        for verb, ask in (
            ("failover", lambda: world.disaster.failover(failover)),
            ("switchover", lambda: world.disaster.switchover(switchover)),
        ):
            named = rf"switchover {job.job_id} \(draining\) of it is under way here: {verb} waits"
            with pytest.raises(ConflictError, match=named):
                await ask()
    finally:
        running.cancel()


async def test_an_end_saved_by_a_member_that_lost_the_job_is_not_applied(world):
    """D1 checked its claim, stalled, and saved its roll back's end (``failed``) over the
    record of D2, which had taken the job over meanwhile and goes on with it. A verb asked
    elsewhere settled the job as failed: D2's claim released under it (D2 then stopped at its
    next step, and the flow was free mid-switchover)."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    job = SwitchoverJob.new("ab", "d1", 30, 600, ("a", "b")).to("failed", reason="stale")
    seed_job(world.store, job)  # D1's late write
    claim_for(world, "ab", "a", job.job_id, "d2")  # D2 holds the job
    with pytest.raises(ConflictError, match=rf"switchover {job.job_id} \(failed\) holds"):
        await world.supervisor.pause("ab")
    held = world.pairs.get("a", "b").flow_of("ab").job
    assert held is not None and held.member == "d2"
    assert world.state("ab") is TaskState.RUNNING


async def test_a_member_that_stalls_after_its_claim_check_writes_no_fence(world):
    """D1 saves ``fencing`` (its claim checked), stalls; D2 takes the job over and rolls it
    back (nothing to lift yet), letting the flow go. D1 wakes and joins the fence: it wrote
    the key, a fence no running job holds until the next recover round lifts it (writes
    refused on a meanwhile). The join now checks the claim in its compare-and-set."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    job = SwitchoverJob.new("ab", "d1", 30, 600, ("a", "b"))
    seed_job(world.store, job)
    claim_for(world, "ab", "a", job.job_id, "d1")
    run = world.run_of(job, fenced=True)
    checked = run.claim.keep
    stalls = [True]

    async def checked_then_stalled() -> None:
        await checked()
        if stalls.pop() if stalls else False:  # D2 took the job over and rolled it back
            claim_for(world, "ab", "a", job.job_id, "d2")
            world.pairs.update(
                "a", "b", lambda p: p.with_flow(release(p.flow_of("ab"), job.job_id))
            )

    run.claim.keep = checked_then_stalled  # type: ignore[method-assign]
    with pytest.raises(ClaimLostError):
        await run._fence()
    assert world.fence_value("a") is None, "the stalled member wrote a fence nobody holds"
    assert "a" not in world.pairs.get("a", "b").fences


async def test_a_switchover_being_asked_is_not_taken_over_by_its_own_daemons_recover_round(
    world, monkeypatch, tmp_path, caplog
):
    """A recover round of the daemon asked a switchover, between the job's first save
    (``checking``, this member its member) and the start of its run, took it for a job its own
    restart left and rolled it back ("the daemon running the job stopped while checking"); the
    request's run then stopped at its first save. The same window as a failback's (boundary
    search on 1447c5d, failback_failed, run J): the round leaves it to the request now."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)

    class CaughtUp(ScriptedRunner):
        def consistent_ts(self) -> int:
            return from_seconds(time.time())

    runner = CaughtUp(world.store.get_task("ab"), None, None)
    monkeypatch.setattr(world.supervisor, "runner_of", lambda _task_id: runner)
    wake = tmp_path / "wake"
    monkeypatch.setenv(FAULT_ENV, f"hold:checking:30:{wake}")
    asked = asyncio.ensure_future(world.disaster.switchover(SwitchoverRequest(task_id="ab")))
    for _ in range(200):
        if "held at checking" in caplog.text:
            break
        await asyncio.sleep(0.05)
    job = load_job(world.store, "ab")
    assert job is not None and job.state == "checking"
    await world.disaster.recover()  # the daemon's round, every RECOVER_SECONDS
    for _ in range(40):  # a roll back (before the fix) is saved at once: given the time to
        saved = load_job(world.store, "ab")
        if saved is None or saved.state != "checking":
            break
        await asyncio.sleep(0.05)
    assert "taking it over" not in caplog.text
    saved = load_job(world.store, "ab")
    assert saved is not None and saved.job_id == job.job_id
    assert saved.state == "checking" and not saved.rolled_back, saved
    wake.touch()
    answer = await asyncio.wait_for(asked, 30)
    assert answer["job_id"] == job.job_id
