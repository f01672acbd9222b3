"""One member's round (server/tasks/fleet.py):
what it stops, releases, starts and takes,
from what the store says and what it runs."""

from __future__ import annotations

from metastore import Lease, TaskState
from server.tasks.fleet import plan_round

R, P = TaskState.RUNNING, TaskState.PAUSED


def lease(task_id: str, owner: str, token: int = 1) -> Lease:
    return Lease(task_id, owner, token)


def test_alone_a_member_takes_every_running_task_and_nothing_else():
    states = {"t1": R, "t2": R, "t3": P}
    plan = plan_round("a", states, {}, 1, {})
    assert sorted(plan.take) == ["t1", "t2"]
    assert (plan.stop, plan.release, plan.start, plan.share) == ([], [], [], 2)


def test_a_new_member_takes_its_share_and_the_busy_one_hands_over_the_rest():
    states = {f"t{i}": R for i in range(6)}
    held = {t: lease(t, "a") for t in states}
    # a ran all six alone; b joined: a keeps three and hands three over
    busy = plan_round("a", states, held, 2, held)
    assert busy.share == 3
    assert len(busy.release) == 3 and sorted(busy.stop) == sorted(x.task_id for x in busy.release)
    assert not busy.take and not busy.start
    # once released, b takes exactly those three
    left = {t: x for t, x in held.items() if x not in busy.release}
    joined = plan_round("b", states, left, 2, {})
    assert sorted(joined.take) == sorted(x.task_id for x in busy.release)


def test_each_member_of_three_ends_with_one_of_three_tasks():
    states = {"t1": R, "t2": R, "t3": R}
    leases: dict[str, Lease] = {}
    for member in ("a", "b", "c"):  # in turn, each taking what its round offers
        plan = plan_round(member, states, leases, 3, {})
        assert len(plan.take) == 1
        leases[plan.take[0]] = lease(plan.take[0], member)
    assert sorted(x.owner for x in leases.values()) == ["a", "b", "c"]


def test_a_paused_or_deleted_task_is_stopped_and_its_lease_released():
    running = {"t1": lease("t1", "a"), "t2": lease("t2", "a")}
    stored = {"t1": running["t1"]}  # t2 was deleted, and its lease with it
    plan = plan_round("a", {"t1": P}, stored, 1, running)
    assert sorted(plan.stop) == ["t1", "t2"]
    assert plan.release == [running["t1"]]  # t2 is gone with its lease
    assert not plan.take and not plan.start


def test_a_runner_whose_lease_changed_hands_is_stopped_and_not_started_again():
    ours = lease("t1", "a", token=1)
    plan = plan_round("a", {"t1": R}, {"t1": lease("t1", "b", token=2)}, 2, {"t1": ours})
    assert plan.stop == ["t1"]
    assert not plan.start and not plan.take and not plan.release


def test_a_lease_held_without_a_runner_gets_one():
    held = lease("t1", "a", token=7)
    plan = plan_round("a", {"t1": R}, {"t1": held}, 1, {})
    assert plan.start == [held]
    assert not plan.stop and not plan.take


def test_a_runner_under_an_older_token_of_its_own_is_replaced():
    old, new = lease("t1", "a", token=1), lease("t1", "a", token=2)
    plan = plan_round("a", {"t1": R}, {"t1": new}, 1, {"t1": old})
    assert plan.stop == ["t1"] and plan.start == [new]


def test_tasks_other_members_hold_are_left_alone():
    leases = {"t1": lease("t1", "b"), "t2": lease("t2", "c")}
    plan = plan_round("a", {"t1": R, "t2": R}, leases, 3, {})
    assert (plan.stop, plan.release, plan.start, plan.take) == ([], [], [], [])
