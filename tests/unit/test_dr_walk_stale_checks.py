"""The walk's stale-write check invariants (tests/harness/dr_walk_stale_checks.py) on job
records given by hand: what each of them holds a check to, and that each can fail."""

from __future__ import annotations

import time
from typing import Any

from harness.dr_walk_stale_checks import CHECK_GRACE, SECONDS_DRAWN, StaleChecks

MOVABLE = 1_800_000_000.0  # writers_may_move_at of the job, Unix seconds


def done_job(job_id: str = "j1", check: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "state": "done",
        "source_cluster": "a",
        "writers_may_move_at": {"ts": int(MOVABLE * 1000) << 18},
        "stale_check": check,
    }


def followed(seconds: float = 15.0) -> StaleChecks:
    checks = StaleChecks(seed=7)
    checks.asked("t1", "j1", seconds, "f1")
    checks.job_ended(done_job())
    return checks


def no_acks(flow: str, cluster: str, after: float) -> int:
    return 0


def test_a_seeds_draws_are_its_own_and_repeat():
    first, again = StaleChecks(seed=7), StaleChecks(seed=7)
    assert [first.draw() for _ in range(20)] == [again.draw() for _ in range(20)]
    drawn = {StaleChecks(seed=n).draw() for n in range(40)}
    assert drawn == set(SECONDS_DRAWN)


def test_a_check_of_a_rolled_back_job_or_none_asked_is_not_followed():
    checks = StaleChecks(seed=7)
    checks.asked("t1", "j0", 0.0, "f1")  # none asked
    checks.asked("t1", "j1", 15.0, "f1")
    checks.job_ended({"job_id": "j1", "state": "failed"})
    assert checks.checks == {} and checks.tally.asked == 0


def test_a_check_still_within_its_time_is_pending_and_an_overdue_one_fails():
    checks = followed()
    assert checks.look(lambda t: done_job(), no_acks) == ("", "")
    assert checks.pending()
    checks.checks["j1"].done_at = time.monotonic() - 15.0 - CHECK_GRACE - 1
    name, problem = checks.look(lambda t: done_job(), no_acks)
    assert name == "stale_check_ends" and "no result" in problem and "j1" in problem


def test_a_check_not_made_must_say_why():
    checks = followed()
    name, _ = checks.look(lambda t: done_job(check={"state": "not_checked"}), no_acks)
    assert name == "stale_check_ends"
    checks = followed()
    reason = {"state": "not_checked", "reason": "the reverse task t2 is Paused"}
    assert checks.look(lambda t: done_job(check=reason), no_acks) == ("", "")
    assert checks.tally.ended == {"not_checked": 1} and not checks.pending()
    assert "Paused" in checks.tally.not_done[0]


def test_divergent_rows_without_a_stale_writer_break_the_check_and_with_one_hold():
    found = {"state": "done", "divergent_rows": 3, "collections": {"c": {"extra": 3}}}
    checks = followed()
    name, problem = checks.look(lambda t: done_job(check=found), no_acks)
    assert name == "stale_check_truthful" and "3 divergent" in problem

    asked: list[tuple[str, str, float]] = []

    def one_stale_write(flow: str, cluster: str, after: float) -> int:
        asked.append((flow, cluster, after))
        return 1

    checks = followed()
    assert checks.look(lambda t: done_job(check=found), one_stale_write) == ("", "")
    assert asked == [("f1", "a", MOVABLE)] and checks.tally.stale_found == 1
    clean = {"state": "done", "divergent_rows": 0}
    checks = followed()
    assert checks.look(lambda t: done_job(check=clean), no_acks) == ("", "")
    assert checks.tally.ended == {"done": 1}


def test_a_record_replaced_by_a_later_switchover_counts_as_superseded():
    checks = followed()
    assert checks.look(lambda t: done_job(job_id="j2"), no_acks) == ("", "")
    assert checks.tally.superseded == 1 and not checks.pending()
    checks = followed()  # no answer from a daemon: still pending, nothing counted
    assert checks.look(lambda t: {}, no_acks) == ("", "") and checks.pending()
    checks.checks["j1"].done_at = time.monotonic() - 15.0 - CHECK_GRACE - 1  # ... for too long
    name, problem = checks.look(lambda t: {}, no_acks, wait=True)
    assert name == "stale_check_ends" and "no record" in problem


def test_the_walks_end_waits_for_a_check_to_end():
    checks = followed(seconds=1.0)
    answers = iter([done_job(), done_job(check={"state": "done", "divergent_rows": 0})])
    assert checks.look(lambda t: next(answers), no_acks, wait=True) == ("", "")
    assert checks.tally.ended == {"done": 1}
