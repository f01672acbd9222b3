"""The stale-write checks the walk's switchovers ask (:mod:`harness.dr_walk`), followed to their
ends and held to two invariants.

Each switchover of the walk asks a check after ``stale_check_seconds`` drawn from
``SECONDS_DRAWN`` (none; at once after the job, while the next step may already run; or later,
so a switch home, a failover or a kill may come first), from a random generator of its own, so a
seed's steps are those it drew before the checks were in the walk. The invariants:

- ``stale_check_ends``: the check of every switchover job that ended ``done`` shows a result
  (``done`` or ``failed`` with its verify, ``not_checked`` with its reason) within
  ``CHECK_GRACE`` seconds of its due time, whatever the steps after it did (a switch home, a
  failover, a daemon killed, a fleet member gone). A record the same task's later switchover
  replaced before the walk saw the result is counted as superseded, not failed: the check's
  record is the task's job record;
- ``stale_check_truthful``: a check ``done`` shows divergent rows only when the flow's writer
  had written to the old primary after the job said writers may move (a stale client: the
  walk's writers move when they see that, so only a slow look makes one); otherwise a divergent
  row is a verify that compared a flow still moving, or rows the reverse flow lost. A check
  that did not end ``done`` names why (``reason``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.dr_clusters import seconds_of

SECONDS_DRAWN = (0.0, 1.0, 15.0)  # a switchover's stale_check_seconds, drawn
CHECK_GRACE = 300.0  # seconds a check may take past its due time (its verify: settle x tries)
ENDS = ("done", "failed", "not_checked")

JobReader = Callable[[str], dict[str, Any]]  # task id -> progress.switchover ({} if none)
# (flow, cluster, after: Unix seconds) -> the writes of the flow's writer that cluster
# acknowledged after then
AckCounter = Callable[[str, str, float], int]


@dataclass
class AskedCheck:
    """The check one switchover job asked, as the walk follows it."""

    task_id: str
    job_id: str
    seconds: float
    flow: str
    done_at: float = 0.0  # when the walk saw the job done (monotonic; 0: not seen done)
    old_primary: str = ""  # the job's source cluster, the reverse task's target
    movable_at: float = 0.0  # the job's writers_may_move_at, Unix seconds
    result: dict[str, Any] | None = None  # its record's stale_check ({}: superseded)


@dataclass
class CheckTally:
    """What the checks ended as, for the walk's result."""

    asked: int = 0
    ended: dict[str, int] = field(default_factory=dict)  # state -> checks
    superseded: int = 0
    not_done: list[str] = field(default_factory=list)  # job: state, reason (failed/not_checked)
    stale_found: int = 0  # checks done that found the writes of a writer slow to move


class StaleChecks:
    """Draws each switchover's ``stale_check_seconds`` and follows the checks to their ends."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"stale-checks-{seed}")
        self.checks: dict[str, AskedCheck] = {}  # job id -> its check
        self.tally = CheckTally()

    def draw(self) -> float:
        return self._rng.choice(SECONDS_DRAWN)

    def asked(self, task_id: str, job_id: str, seconds: float, flow: str) -> None:
        if seconds > 0:
            self.checks[job_id] = AskedCheck(task_id, job_id, seconds, flow)
            self.tally.asked += 1

    def job_ended(self, job: dict[str, Any]) -> None:
        """A switchover job the walk saw end: a check is due only after a ``done`` one."""
        check = self.checks.get(str(job.get("job_id")))
        if check is None:
            return
        if job.get("state") != "done":
            del self.checks[check.job_id]  # rolled back: no check asked of it
            self.tally.asked -= 1
            return
        check.done_at = check.done_at or time.monotonic()
        check.old_primary = str(job.get("source_cluster") or "")
        check.movable_at = seconds_of(job.get("writers_may_move_at"))

    def pending(self) -> list[AskedCheck]:
        return [c for c in self.checks.values() if c.done_at and c.result is None]

    def look(
        self, read_job: JobReader, acked_on: AckCounter, wait: bool = False
    ) -> tuple[str, str]:
        """Each due check's record read: ("", "") when every one that ended holds, else the
        broken invariant's name and what broke. ``wait``: until every check ended (at most its
        grace), as the walk's end does."""
        while True:
            for check in self.pending():
                problem = self._read(check, read_job, acked_on)
                if problem[0]:
                    return problem
            left = self.pending()
            if not left or not wait:
                return "", ""
            time.sleep(1.0)

    def _read(
        self, check: AskedCheck, read_job: JobReader, acked_on: AckCounter
    ) -> tuple[str, str]:
        job = read_job(check.task_id)
        late = time.monotonic() - check.done_at - check.seconds
        if job.get("job_id") != check.job_id:
            if job.get("job_id"):  # a later switchover of the task replaced the record
                check.result = {}
                self.tally.superseded += 1
            elif late > CHECK_GRACE:  # no daemon answered all along: never wait for ever
                return (
                    "stale_check_ends",
                    f"switchover {check.job_id} of {check.task_id}: no record of its task "
                    f"read {late:.0f} s past its stale-write check's due time",
                )
            return "", ""
        result = job.get("stale_check")
        if not result:
            if late > CHECK_GRACE:
                return (
                    "stale_check_ends",
                    f"switchover {check.job_id} of {check.task_id} (flow {check.flow}) asked a "
                    f"stale-write check {check.seconds:g} s after it; no result "
                    f"{late:.0f} s past that (the job: {job.get('state')})",
                )
            return "", ""
        check.result = dict(result)
        state = str(result.get("state"))
        self.tally.ended[state] = self.tally.ended.get(state, 0) + 1
        if state not in ENDS or (state != "done" and not result.get("reason")):
            return (
                "stale_check_ends",
                f"switchover {check.job_id} of {check.task_id}: its stale-write check ended "
                f"{state!r} without a reason: {result}",
            )
        if state != "done":
            self.tally.not_done.append(
                f"{check.job_id} ({check.task_id}): {state}, {str(result.get('reason'))[:200]}"
            )
            return "", ""
        if not result.get("divergent_rows"):
            return "", ""
        stale = acked_on(check.flow, check.old_primary, check.movable_at)
        if stale:
            self.tally.stale_found += 1
            return "", ""
        return (
            "stale_check_truthful",
            f"switchover {check.job_id} of {check.task_id} (flow {check.flow}): its stale-write "
            f"check found {result['divergent_rows']} divergent row(s) "
            f"({result.get('collections')}) though the flow's writer wrote nothing to the old "
            f"primary {check.old_primary} after writers_may_move_at",
        )
