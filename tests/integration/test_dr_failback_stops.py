"""A failback whose reverse task stops while it seeds (issue 48, fault 8): the failback fails
with a reason an operator can act on, instead of waiting forever with every verb a 409; the
flow failing back then takes the verbs the README's state table gives it. The daemon's
supervisor and disaster recovery on a real etcd store (tests/harness/dr_jobs.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from harness.dr_jobs import dr_world

from metastore import TaskState
from server.dr.failbacks import FailbackRequest
from server.dr.pair import FAILED_OVER, FAILING_BACK, Flow
from server.dr.record import FAILBACK_KEY, FAILOVER_KEY, load_json, save_json
from server.errors import ConflictError, TargetUnreachableError

pytestmark = pytest.mark.integration


@pytest.fixture
async def world(etcd_service):
    async with dr_world(etcd_service.endpoint) as made:
        yield made


@pytest.mark.parametrize("stopped", [TaskState.PAUSED, TaskState.FAILED])
async def test_a_failback_whose_reverse_task_stopped_while_seeding_fails_saying_what_to_do(
    world, stopped
):
    # ab (a -> b) failed over to b; its failback's reverse task ab-back stopped while its
    # backfill seeded a (its daemon died meanwhile: this one takes the failback over)
    world.failback_left_seeding(stopped, "the target refused a write")
    await world.disaster.recover()
    for _ in range(200):  # the failback taken over looks at its reverse task, and ends
        saved = load_json(world.store, "ab", FAILBACK_KEY) or {}
        if saved.get("state") == "failed" and world.pairs.get("a", "b").flow_of("ab").job is None:
            break
        await asyncio.sleep(0.05)
    assert saved["state"] == "failed", f"the failback waits on at {saved.get('state')}"
    assert saved["reason"] == (
        f"task ab-back is {stopped.value} while seeding (the target refused a write): its "
        "backfill cannot finish. Ask the failback of ab again: it creates ab-back anew and "
        "seeds again (resume ab-back first to keep it streaming meanwhile)"
    )
    pair = world.pairs.get("a", "b")
    assert pair.flow_of("ab").job is None and pair.flow_of("ab").state == FAILING_BACK
    # the state table: failing back from b, resume of b->a only, failback again
    with pytest.raises(ConflictError, match="failing back from b to a: resume does not apply"):
        await world.supervisor.resume("ab")
    await world.supervisor.resume("ab-back")
    assert world.state("ab-back") is TaskState.RUNNING
    again = await world.disaster.pairs.claim(("a", "b"), "failback", "ab", "a", "failback-0002")
    assert again.flow_of("ab").job.job_id == "failback-0002"


async def test_a_failback_refused_for_a_target_still_down_leaves_the_flows_reverse_task(
    etcd_service,
):
    # both clusters name a Milvus address; nothing is asked of it (the checker says "down")
    async with dr_world(etcd_service.endpoint, milvus="http://127.0.0.1:9") as world:
        # ab (a -> b) failed over to b; the flow's reverse task ab-back (b -> a) is paused. A
        # failback asked while a is still down is refused, and ab-back is still there, its flow
        # as it was (before: the failback deleted ab-back first, then its create was refused)
        world.add_task("ab", "a", "b", TaskState.PAUSED, "failed over at ...")
        world.add_task("ab-back", "b", "a", TaskState.PAUSED, "paused by the operator")
        flow = Flow("ab", {"a": "ab", "b": "ab-back"}, active="b", state=FAILED_OVER)
        world.pairs.update("a", "b", lambda p: p.with_flow(flow))
        save_json(world.store, "ab", FAILOVER_KEY, {"task_id": "ab", "job_id": "failover-0001"})

        def down(connect: dict[str, Any]) -> str:
            raise TargetUnreachableError(f"target Milvus at {connect} is not reachable")

        world.supervisor.creation.target_checker = down
        with pytest.raises(TargetUnreachableError, match="is not reachable"):
            await world.disaster.failback(FailbackRequest(task_id="ab"))
        assert world.state("ab-back") is TaskState.PAUSED
        after = world.pairs.get("a", "b").flow_of("ab")
        assert after.tasks == {"a": "ab", "b": "ab-back"} and after.state == FAILED_OVER
        assert after.job is None
        assert (load_json(world.store, "ab", FAILBACK_KEY) or {}).get("state") == "failed"
