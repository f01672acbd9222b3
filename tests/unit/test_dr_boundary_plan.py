"""The boundary bench's plan (bench/dr_boundaries.py) and the suite's rotating draw
(tests/harness/dr_boundaries.py): which cases run, in which held worlds."""

from __future__ import annotations

import pytest
from harness.dr_boundaries import FAULTS, rotating

from bench.dr_boundaries import SINGLE, batches, planned
from server.dr.flows import BOUNDARIES

VERBS = [f for f in FAULTS if f not in SINGLE]


def test_a_plan_runs_its_groups_in_order_the_verbs_of_a_point_in_one_world():
    cases = planned("switchover:verbs,kill@claimed,fencing;failover:stall@failover_saved")
    runs = batches(cases)
    assert [[(c.point, c.fault) for c in run] for run in runs] == [
        [("claimed", "kill")],
        [("claimed", f) for f in VERBS],
        [("fencing", "kill")],
        [("fencing", f) for f in VERBS],
        [("failover_saved", "stall")],
    ]


def test_single_gives_every_verb_a_world_of_its_own():
    runs = batches(planned("switchover:pause:own,again@fence_written/single"))
    assert [[c.fault for c in run] for run in runs] == [["pause:own"], ["again"]]


def test_all_is_every_fault_at_every_boundary_of_the_job():
    cases = planned("failback:all")
    assert len(cases) == len(BOUNDARIES["failback"]) * len(FAULTS)
    assert sum(len(run) > 1 for run in batches(cases)) == len(BOUNDARIES["failback"])


@pytest.mark.parametrize("plan", ["switchover:explode", "nojob:kill", "failover:kill@claimed"])
def test_a_plan_naming_what_is_not_there_is_refused(plan):
    with pytest.raises(SystemExit, match="unknown"):
        planned(plan)


def test_the_suite_draws_a_verb_world_and_a_kill_at_two_boundaries():
    verbs, kill = rotating(20261206)
    points = {batch[0].point for batch in verbs} | {kill.point}
    assert len(verbs) == 1 and len(points) == 2
    wider, _ = rotating(20261206, batches=2)
    assert len({batch[0].point for batch in wider} | {kill.point}) == 3
    assert all([c.fault for c in batch] == VERBS for batch in verbs)
    assert kill.fault == "kill"
    assert rotating(20261206) == (verbs, kill)  # the same seed, the same draw
