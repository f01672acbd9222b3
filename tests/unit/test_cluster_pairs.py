"""The cluster pair's rules (server/dr/pair.py, pair_rules.py) as pure changes of its record:
which verb applies in which state, one job per flow, claims that lapse, tasks deleted, and what
an earlier release left (a linked reverse task, a failover record)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from server.dr.pair import (
    CLAIM_SECONDS,
    FAILED_OVER,
    FAILING_BACK,
    REPLICATING,
    ClusterPair,
    PairConflictError,
    release,
    renewed,
)
from server.dr.pair_rules import claimed, pruned, verb_allowed

EMPTY = ClusterPair(("a", "b"))
BOTH = {"ab", "ba"}


def flow(pair: ClusterPair, task_id: str = "ab"):
    found = pair.flow_of(task_id)
    assert found is not None
    return found


def done(pair: ClusterPair, job_id: str, task_id: str = "ab", **changes) -> ClusterPair:
    return pair.with_flow(release(flow(pair, task_id), job_id, **changes))


def test_a_task_is_adopted_as_the_active_direction_and_one_job_runs_at_a_time():
    pair = claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing={"ab"})
    assert flow(pair).tasks == {"a": "ab"} and flow(pair).active == "a"
    assert flow(pair).job.job_id == "j1"
    running = r"switchover j1 \(running\) holds its cluster pair \(of task ab, on fleet member m1\)"
    with pytest.raises(PairConflictError, match=running):
        claimed(pair, "switchover", "ab", "a", "j2", "m2", existing={"ab"})
    with pytest.raises(PairConflictError, match="under way"):
        claimed(pair, "failover", "ab", "a", "j3", "m2", existing={"ab"})
    # the same job claiming again (a daemon taking it over) is allowed
    again = claimed(pair, "switchover", "ab", "a", "j1", "m2", existing={"ab"})
    assert flow(again).job.member == "m2"


def test_a_lapsed_claim_is_taken_and_its_old_holder_stops_at_its_next_renewal():
    pair = claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing={"ab"})
    stale = replace(flow(pair).job, renewed_at=time.time() - CLAIM_SECONDS - 1)
    pair = pair.with_flow(replace(flow(pair), job=stale))
    assert stale.expired()
    taken = claimed(pair, "switchover", "ab", "a", "j1", "m2", existing={"ab"})
    with pytest.raises(PairConflictError, match="no longer holds"):
        renewed(flow(taken), "j1", "m1")
    assert renewed(flow(taken), "j1", "m2").job.member == "m2"


def test_after_a_switchover_only_the_reverse_direction_switches_over_or_resumes():
    pair = claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing={"ab"})
    pair = done(pair, "j1", active="b", tasks={"a": "ab", "b": "ba"})
    assert flow(pair, "ba") == flow(pair, "ab") and flow(pair).job is None
    with pytest.raises(PairConflictError, match=r"a\+b is replicating b -> a \(task ba\)"):
        claimed(pair, "switchover", "ab", "a", "j2", "m1", existing=BOTH)
    with pytest.raises(PairConflictError, match="would run both directions"):
        verb_allowed(pair, "ab", "resume")
    verb_allowed(pair, "ba", "resume")
    back = claimed(pair, "switchover", "ba", "b", "j2", "m1", existing=BOTH)
    assert flow(back).job.kind == "switchover" and flow(back).job.task_id == "ba"


def test_failover_then_failback_reuses_the_flows_other_task():
    pair = done(
        claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing={"ab"}),
        "j1",
        active="b",
        tasks={"a": "ab", "b": "ba"},
    )
    # production on b; b is lost: the failover of ba
    pair = claimed(pair, "failover", "ba", "b", "f1", "m1", existing=BOTH)
    pair = done(pair, "f1", "ba", state=FAILED_OVER, active="a")
    with pytest.raises(PairConflictError, match="failed over to a: resume does not apply"):
        verb_allowed(pair, "ba", "resume")
    with pytest.raises(PairConflictError, match="failed over to a"):
        claimed(pair, "switchover", "ab", "a", "s1", "m1", existing=BOTH)
    again = claimed(pair, "failover", "ba", "b", "f2", "m1", existing=BOTH)  # asked again
    assert flow(again).job.job_id == "f2"
    with pytest.raises(PairConflictError, match="failback does not apply"):
        claimed(pair, "failback", "ab", "a", "x", "m1", existing=BOTH)
    back = claimed(pair, "failback", "ba", "b", "fb1", "m1", existing=BOTH)
    assert flow(back).reverse_of("ba") == "ab"  # the failback re-uses ab, never a third task
    assert len(flow(back).tasks) == 2
    syncing = done(back, "fb1", "ba", state=FAILING_BACK)
    # failing back, no job on it (the failback failed): ab, the reverse task, may run again
    verb_allowed(syncing, "ab", "resume")
    with pytest.raises(PairConflictError, match="failing back from a to b: resume does not"):
        verb_allowed(syncing, "ba", "resume")
    home = done(back, "fb1", "ba", state=REPLICATING, active="a")  # from the claim, in sync
    # in sync: production stays on a, and ab (a -> b) replicates it to b
    assert flow(home).active == "a" and flow(home).tasks == {"a": "ab", "b": "ba"}
    verb_allowed(home, "ab", "resume")
    with pytest.raises(PairConflictError, match="would run both directions"):
        verb_allowed(home, "ba", "resume")


def test_only_the_job_holding_the_flow_moves_its_tasks():
    pair = claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing={"ab"})
    pair = pair.with_flow(replace(flow(pair), tasks={"a": "ab", "b": "ba"}))
    verb_allowed(pair, "ab", "resume", job="j1", member="m1")  # the job's own roll back
    verb_allowed(pair, "ba", "delete", job="j1", member="m1")
    # the same job on another member (this one stalled, that one took it over) moves nothing
    with pytest.raises(PairConflictError, match=r"j1 no longer holds .* on fleet member m2"):
        verb_allowed(pair, "ab", "resume", job="j1", member="m2")
    for task_id in ("ab", "ba"):  # an operator (or a retry), whatever the task's reason says
        for verb in ("pause", "resume", "delete"):
            with pytest.raises(
                PairConflictError,
                match=rf"task {task_id}: switchover j1 \(reversing\) holds its cluster pair "
                rf"pairs/a\+b: {verb} of the flow's tasks waits for it",
            ):
                verb_allowed(pair, task_id, verb, job_state="reversing")
    # a job whose claim another daemon took (it stalled) moves nothing
    held = r"j0 no longer holds .* \(held by switchover j1 \(running\)"
    with pytest.raises(PairConflictError, match=held):
        verb_allowed(pair, "ab", "resume", job="j0")
    released = done(pair, "j1", "ab")
    with pytest.raises(PairConflictError, match=r"job j1 no longer holds .* \(held by nobody\)"):
        verb_allowed(released, "ab", "resume", job="j1")
    # a claim left by a dead daemon holds until the recover round, but a delete goes ahead
    stale = pair.with_flow(
        replace(flow(pair), job=replace(flow(pair).job, renewed_at=time.time() - 600))
    )
    with pytest.raises(PairConflictError, match="its daemon is gone"):
        verb_allowed(stale, "ab", "pause")
    verb_allowed(stale, "ab", "delete")


def test_deleted_tasks_leave_the_pair_and_their_claims_with_them():
    pair = claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing={"ab"})
    pair = pair.with_flow(replace(flow(pair), tasks={"a": "ab", "b": "ba"}))
    left = pruned(pair, {"ba"})
    assert flow(left, "ba").tasks == {"b": "ba"} and flow(left, "ba").job is None
    assert pruned(pair, set()).flows == {}
    assert pruned(pair, BOTH) is pair


def test_what_an_earlier_release_left_is_adopted():
    linked = claimed(EMPTY, "switchover", "ab", "a", "j1", "m1", existing=BOTH, linked="ba")
    assert flow(linked).tasks == {"a": "ab", "b": "ba"}
    failed = claimed(EMPTY, "failback", "ab", "a", "j1", "m1", existing={"ab"}, failed_over=True)
    assert flow(failed).state == FAILED_OVER and flow(failed).active == "b"
    with pytest.raises(PairConflictError, match="failback does not apply"):
        claimed(EMPTY, "failback", "ab", "a", "j1", "m1", existing={"ab"})


def test_the_record_reads_back_as_written():
    pair = claimed(EMPTY, "failover", "ab", "a", "f1", "m1", existing={"ab"})
    assert ClusterPair.from_bytes(pair.to_bytes()) == pair
    assert pair.key == "pairs/a+b" and ClusterPair(("b", "a")).key == "pairs/a+b"
