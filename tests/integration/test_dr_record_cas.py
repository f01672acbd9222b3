"""A job's record is written by compare-and-set (issue 48): a member that renewed its claim,
then stalled past it while another member took the job over and saved, cannot write its stale
step over the new holder's record; and a takeover whose record the stalled member wrote in
between goes on from that step. The daemon's own disaster recovery on a real etcd store
(tests/harness/dr_jobs.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import pytest
from harness.dr_jobs import DrWorld, dr_world, seed_job

from metastore import MetaStoreUnavailableError, TaskState
from server.dr.claims import ClaimLostError, FlowClaim
from server.dr.failback import FailbackRun
from server.dr.flows import FAULT_ENV
from server.dr.pair_rules import claimed
from server.dr.record import FAILBACK_KEY, SWITCHOVER_KEY, SwitchoverJob, load_job, load_json

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(etcd_service):
    async with dr_world(etcd_service.endpoint) as made:
        yield made


def draining(world: DrWorld, member: str) -> SwitchoverJob:
    """A switchover of ab (a -> b) saved at ``draining`` by ``member``, which holds its
    claim."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    job = SwitchoverJob.new("ab", member, 30, 600, ("a", "b")).to("draining")
    seed_job(world.store, job)
    world.pairs.update(
        "a", "b", lambda p: claimed(p, "switchover", "ab", "a", job.job_id, member, existing={"ab"})
    )
    return job


async def test_a_member_that_stalls_after_renewing_its_claim_cannot_overwrite_the_new_holder(
    world,
):
    """D1 renews its claim for its next step (verifying), stalls; this daemon's recover round
    takes the job over (d1 is no live member) and rolls it back to ``failed``. D1 wakes and
    saves ``verifying``: refused, the new holder's record stands (it was written over, the
    job back at a step it had left, its flow free)."""
    job = draining(world, "d1")
    stalled = world.run_of(job, fenced=True)
    renew = stalled.claim.keep

    async def renewed_then_stalled() -> None:
        await renew()
        await world.disaster.recover()  # meanwhile: the job taken over and rolled back
        await world.disaster._runs["ab"]

    stalled.claim.keep = renewed_then_stalled  # type: ignore[method-assign]
    with pytest.raises(ClaimLostError, match="written by another daemon"):
        await stalled._save(job.to("verifying"))
    stored = load_job(world.store, "ab")
    assert stored is not None
    assert (stored.state, stored.member) == ("failed", world.supervisor.fleet.member_id), (
        f"the stalled member's step is the record now: {stored.state} by {stored.member}"
    )
    assert stored.rolled_back and world.pairs.get("a", "b").flow_of("ab").job is None


async def test_a_takeover_goes_on_from_the_step_its_stalled_member_saved_in_between(
    world, monkeypatch, tmp_path
):
    """The recover round read the record (draining by d1) and claimed the job; before its save
    d1 wakes and saves ``verifying`` (its record unchanged since its last save). The takeover
    does not write the older step over it: it reads the record again, goes on from
    ``verifying`` (rolled back: before the point of no return) and keeps the step."""
    job = draining(world, "d1")
    go = tmp_path / "go"
    monkeypatch.setenv(FAULT_ENV, f"hold:takeover_claimed:60:{go}")
    recovering = asyncio.ensure_future(world.disaster.recover())
    me = world.supervisor.fleet.member_id
    for _ in range(400):
        held = world.pairs.get("a", "b").flow_of("ab").job
        if held is not None and held.member == me:
            break
        await asyncio.sleep(0.05)
    assert held is not None and held.member == me, "the recover round did not claim the job"
    seed_job(world.store, job.to("verifying"))  # d1's save, its claim renewed before
    go.touch()
    await recovering
    await world.disaster._runs["ab"]
    stored = load_job(world.store, "ab")
    assert stored is not None and (stored.state, stored.member) == ("failed", me)
    assert [s["state"] for s in stored.steps] == ["checking", "draining", "verifying", "failed"]


async def test_a_stalled_failbacks_save_after_a_takeover_is_refused(world):
    """The failback's daemon (gone from the fleet) renewed its claim and stalled; this daemon's
    recover round takes the failback over (its record saved at once, this member its member).
    The stalled daemon's next save (``repairing``) is refused; the record stays this one's."""
    job_id = world.failback_left_seeding(TaskState.RUNNING)
    raw = world.store.get_state("ab", FAILBACK_KEY)
    assert raw is not None
    existing = {"ab", "ab-back"}
    world.pairs.update(
        "a",
        "b",
        lambda p: claimed(p, "failback", "ab", "a", job_id, "dead-member", existing=existing),
    )
    claim = FlowClaim(world.pairs, ("a", "b"), "ab", job_id, "dead-member")
    record = load_json(world.store, "ab", FAILBACK_KEY) or {}
    stalled = FailbackRun(world.supervisor, record, lambda _t, _r: None, claim, raw)

    async def renewed_then_stalled() -> None:
        await world.disaster.recover()  # the failback taken over meanwhile

    stalled.claim.keep = renewed_then_stalled  # type: ignore[method-assign]
    try:
        with pytest.raises(ClaimLostError, match="written by another daemon"):
            await stalled.save(state="repairing", backfill="b-1")
        saved = load_json(world.store, "ab", FAILBACK_KEY) or {}
        me = world.supervisor.fleet.member_id
        assert (saved.get("state"), saved.get("member")) == ("seeding", me), saved
    finally:
        for run in world.disaster.failbacks.stop():
            run.cancel()


async def test_a_record_an_earlier_release_wrote_is_taken_over(world):
    """A switchover's record as an earlier release wrote it (written as is, its own layout of
    the JSON, not this release's bytes): the recover round's compare-and-set is against the
    bytes it read, so the job is taken over and rolled back as before."""
    world.add_task("ab", "a", "b", TaskState.RUNNING)
    job = SwitchoverJob.new("ab", "gone-member", 30, 600, ("a", "b")).to("draining")
    earlier = json.dumps(asdict(job), indent=1).encode()  # keys unsorted, indented
    assert earlier != job.to_bytes()
    world.store.put_state("ab", SWITCHOVER_KEY, earlier)
    await world.disaster.recover()
    await world.disaster._runs["ab"]
    stored = load_job(world.store, "ab")
    assert stored is not None and stored.state == "failed" and stored.rolled_back
    assert stored.member == world.supervisor.fleet.member_id


async def test_a_save_whose_answer_was_lost_after_it_landed_is_not_taken_for_a_takeover(world):
    """The store writes the job's record, then its answer is lost (the connection drops): the
    save reads the record back and counts it as stored, so the job's next save compares with
    what is there; asked again after an error that left the write unknown, the same save is
    stored, not refused as another daemon's (before: the first save raised the store's error
    and the job's next save, compared with the record before it, was refused as another
    daemon's: the job stopped until its claim lapsed and a recover round took it up)."""
    job = draining(world, "d1")
    run = world.run_of(job, fenced=True)
    store = world.store
    replace = store.replace_state
    lost = {"answers": 1}

    def landed_then_lost(task_id, key, value, expected):
        done = replace(task_id, key, value, expected)
        if lost["answers"]:
            lost["answers"] -= 1
            raise MetaStoreUnavailableError("etcd: the connection dropped before the answer")
        return done

    store.replace_state = landed_then_lost  # type: ignore[method-assign]
    try:
        await run._save(job.to("verifying"))
        await run._save(job.to("verifying").to("reversing"))
    finally:
        store.replace_state = replace  # type: ignore[method-assign]
    stored = load_job(store, "ab")
    assert stored is not None and stored.state == "reversing", stored
    assert stored.member == "d1"
