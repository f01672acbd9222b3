"""The search over every boundary of the disaster-recovery jobs (issue 48, Build item 2): for
each job (switchover, failover, failback) x each boundary (``server.dr.flows.BOUNDARIES``: a
point right after each durable write) x each fault, the job is held at the boundary, the fault
applied, the hold released; then the walk's invariants (:mod:`harness.dr_walk`, its own checks),
and the flow is driven home by verbs alone and checked again.

The faults (``FAULTS``):

=================  =============================================================================
kill               ``kill -9`` of the daemon running the job, then it is started again (its
                   recover round finds the job)
stall              the daemon stopped (SIGSTOP) past the job's claim (``CLAIM_SECONDS``) while a
                   second fleet member runs (its recover round may take the job over), then
                   continued (SIGCONT): it must touch nothing it lost
<verb>:own         an operator's verb (pause, resume, delete, switchover, failover, failback) on
<verb>:other       the task the job was asked of, or on the flow's other task
again              the job's own request asked a second time
=================  =============================================================================

After the fault (and the job's end): ``at_most_two_tasks``, ``no_ownerless_fence``,
``acknowledged_on_primary``, ``target_plus_export``, ``export_disjoint_from_target`` of the walk,
and ``never_both_directions`` (no two tasks of the flow Running); every verb answered 2xx, or
409 naming the state (``verb_409_names_state``; 404 only for a task that is not there). Then
``driven_home``: by verbs alone (wait for a job under way; fail back a failed-over flow; resume
the active direction; switch over to the home cluster) the flow replicates from its home
cluster again, and every invariant of the walk holds (``one_direction_running`` and
``equal_in_sync`` with them).

One cluster pair, one flow and one fleet serve every case (:class:`BoundarySearch`): each case
starts from the flow replicating from home, as the last left it. The daemon runs with a hold at
every point, each released by a file (all present: nothing holds); a case removes the file of
its point, and creates it again to release the hold. Points a plain job does not pass are
reached by a ``ROUTE``: a failure injected earlier (the roll back's points, a retry), or a
kill and a recover round (a take-over's points).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

from harness.daemon import Daemon
from harness.dr_clusters import consistent_known
from harness.dr_walk import Walk
from harness.dr_walk_model import (
    Flow,
    InvariantError,
    log_size,
    logged_since,
    writers_follow,
    writers_may_move,
)
from metastore import TaskState
from metastore.etcd import EtcdMetaStore
from metastore.etcd_connect import connect_etcd
from replicator.backfill.state import BackfillState
from replicator.compare.state import VerifyState
from server.dr.flows import BOUNDARIES, FAULT_ENV
from server.dr.pair import CLAIM_SECONDS, FAILED_OVER, FAILING_BACK, PairStore
from server.dr.pair import Flow as PairFlow
from server.dr.record import FAILBACK_KEY, FAILOVER_KEY, State, load_job, load_json

SEED_ENV = "CDC_BOUNDARY_SEED"
VERBS = ("pause", "resume", "delete", "switchover", "failover", "failback")
FAULTS = ("kill", "stall", *(f"{v}:{r}" for v in VERBS for r in ("own", "other")), "again")
HOLD_SECONDS = 900  # a hold the search forgets to release ends by itself
REACH_SECONDS = 150.0  # a job reaches its point within this
# a failback reaches its points from repairing on (and failback_failed by the route through
# repairing) only after its backfill, which took 3 min at load 20 (run B1 of dr-diag3)
FAILBACK_REACH_SECONDS = 600.0
JOB_SECONDS = 300.0
# a daemon's start: its imports alone took 30 s at load 21 (six benches and two helpers on two
# cores), and the daemon.start default of 30 s gave up 0.4 s before it served
START_SECONDS = 120.0
FAILBACK_SECONDS = 900.0
DRIVE_SECONDS = 1500.0
AFTER_BROKEN = 3  # refusals a drive home goes on after (each one broke driven_home)
# how a point a plain job does not pass is reached: a failure injected at an earlier point
# ("fail:<point>"), or the job held there, its daemon killed and started again ("kill:<point>")
ROUTE = {
    "retrying": "fail:reverse_created",
    "rollback_resumed": "fail:reversing",
    "failed": "fail:reversing",
    "rollback_released": "fail:reversing",
    "takeover_claimed": "kill:verify_saved",
    "taken_over": "kill:verify_saved",
    "failback_failed": "fail:repairing",
    # the daemon killed while the verify with repair runs: started again, it marks the verify
    # failed (ended without a result), and the failback it recovers forgets it and asks again
    "failback_verify_reset": "kill:repairing",
    "failback_taken_over": "kill:seeding",
    "failback_taken_over_saved": "kill:seeding",
    # m1 stopped past its claim right after it wrote the fence key (not recorded yet), m2 rolls
    # the job back (the key written after the hold's join: lifted, the hold forgotten), m1
    # continued finds its hold gone. (Stalled before the write, since 7ce3cc2 the roll back
    # marks the hold given up and m1 writes nothing: it never reaches fence-unheld that way.)
    "fence-unheld": "stall:fence_written",
}
# the states a 409 may name: the flow's, a task's, a job's (or a job under way)
STATE_WORDS = (
    "replicating",
    "failed over",
    "failing back",
    "under way",
    "holds its cluster pair",  # the job that holds the flow, with its step
    *(state.value for state in TaskState),
    *(f"({state})" for state in get_args(State)),
    *(f"({state})" for state in ("creating", "seeding", "repairing", "streaming", "in_sync")),
)
# what a row's outcome says when its verb was not asked (bench/dr_boundaries_merge.py counts
# rows by these): no daemon served, or the flow had no other task for an ``:other`` verb
NO_DAEMON_SERVING = "not asked, no daemon serving"
NO_OTHER_TASK = "the flow has no other task"
# ... and when the verb's own job was held at the same point: accepted, its answer the hold's
HELD_TOO = "an accepted verb, its answer the hold's"
# a refusal that says to wait for a job: asked again while driving home
WAIT_WORDS = (
    "under way",
    "waits for it",
    "next recover round",
    "consistent-up-to",
    "max_lag",
)


@dataclass(frozen=True)
class Case:
    job: str
    point: str
    fault: str

    def label(self) -> str:
        return f"{self.job} @ {self.point} x {self.fault}"


@dataclass
class CaseResult:
    case: Case
    held: bool = False
    outcome: str = ""
    answers: list[str] = field(default_factory=list)  # each verb asked by the fault, answered
    broke: list[str] = field(default_factory=list)  # "check: what broke"
    seconds: float = 0.0


def all_cases(jobs: Sequence[str] = tuple(BOUNDARIES)) -> list[Case]:
    return [Case(j, p, f) for j in jobs for p in BOUNDARIES[j] for f in FAULTS]


def boundary_seed() -> int:
    """``CDC_BOUNDARY_SEED``, else today's date (the suite's subset rotates daily)."""
    value = os.environ.get(SEED_ENV, "").strip()
    return int(value) if value else int(datetime.now(UTC).strftime("%Y%m%d"))


def rotating(
    seed: int, jobs: Sequence[str] = ("switchover",), batches: int = 1
) -> tuple[list[list[Case]], Case]:
    """Drawn by ``seed``: every verb fault at each of ``batches`` boundaries (each judged in
    one held world while refused) and a kill at one more; stalls (a minute each) are left to
    the bench."""
    rng = random.Random(seed)
    points = rng.sample([(job, point) for job in jobs for point in BOUNDARIES[job]], batches + 1)
    verbs = [[Case(j, p, f) for f in FAULTS if f not in ("kill", "stall")] for j, p in points[1:]]
    job, point = points[0]
    return verbs, Case(job, point, "kill")


class _Asked(threading.Thread):
    """A request that may be held (its answer waits for the job): sent from a thread."""

    def __init__(self, daemon: Daemon, method: str, path: str, body: Any = None) -> None:
        super().__init__(daemon=True)
        self.args_ = (daemon, method, path, body)
        self.status = 0
        self.answer: Any = None
        self.start()

    def run(self) -> None:
        daemon, method, path, body = self.args_
        try:
            self.status, _, self.answer = daemon.request(method, path, body, timeout=600)
        except Exception as exc:  # noqa: BLE001 - a daemon killed under the request
            self.answer = f"{type(exc).__name__}: {exc}"

    def result(self, timeout: float) -> tuple[int, Any]:
        self.join(timeout)
        return self.status, self.answer


class _WriterMover(threading.Thread):
    """Moves the flow's writer to the switchover's target once its job says writers may move,
    while the job is held and faulted (the README's operator: the writers follow
    ``writers_may_move_at``, not the job's end)."""

    def __init__(
        self, search: BoundarySearch, task_id: str, previous: str, target: str = ""
    ) -> None:
        super().__init__(daemon=True)
        self.search, self.task_id, self.previous = search, task_id, previous
        self.target = target  # the task's target ("": the model's replica)
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        flow = self.search.flow
        target = self.target or self.search.other_cluster(flow.primary)
        while not self.done.wait(0.3):
            try:
                view = self.search.view("switchover", self.task_id)
            except Exception:  # noqa: BLE001 - the store answering again next time
                continue
            fresh = bool(view.get("job_id")) and view.get("job_id") != self.previous
            if fresh and writers_may_move(view):
                flow.writer.move_to(target)
                return


class BoundarySearch:
    """The cases over one walk set up with one flow (``f1``) at home on a restartable cluster."""

    def __init__(self, walk: Walk, holds: Path, say: Callable[[str], None] = print) -> None:
        self.walk = walk
        self.holds = holds
        self.say = say
        holds.mkdir(parents=True, exist_ok=True)
        self.points = [p for points in BOUNDARIES.values() for p in points]
        for point in self.points:
            self._release(point)
        config = walk.fleet._config["metaStoreConfig"]
        self.store = EtcdMetaStore(connect_etcd([walk.etcd_endpoint]), config["rootPath"])
        self.pairs = PairStore(self.store)
        self._killed_at = self._asked_at = 0.0
        self._killed = ""  # the cluster _killed_at is the kill of
        self._failovers: set[str] = set()  # failed_over_at of the failovers in the model
        self._mover: _WriterMover | None = None
        self._movers: list[_WriterMover] = []  # those of operators' switchovers
        self._repaired: set[str] = set()  # tasks rebuilt from production, repaired once
        # a drive home's refusals that broke driven_home and were driven on (the next case's
        # world made from where they leave the flow): at most AFTER_BROKEN per drive
        self._refused_on = 0

    # --- the fleet ---------------------------------------------------------------------------
    def env(self, route: str = "") -> str:
        """The faults the daemon runs with: a hold at every point (released by its file), and
        the route's failure."""
        holds = [f"hold:{p}:{HOLD_SECONDS}:{self.holds / p}" for p in self.points]
        return ",".join(([route] if route.startswith("fail:") else []) + holds)

    def prepare_fleet(self) -> None:
        """Before ``walk.setup``: m1 starts with the holds."""
        self.walk.fleet.member("m1").env[FAULT_ENV] = self.env()

    @property
    def m1(self) -> Daemon:
        return self.walk.fleet.member("m1")

    def restart(
        self, daemon: Daemon, route: str = "", kill: bool = False, wait: bool = True
    ) -> None:
        """Stop (or kill) and start the daemon; ``wait=False``: not waiting until it serves (a
        recover round held at a point during its start)."""
        if daemon.process is not None and daemon.process.poll() is None:
            if kill:
                daemon.kill()
            else:
                daemon.stop()
        daemon.env[FAULT_ENV] = self.env(route)
        if wait:
            daemon.start(START_SECONDS)
        else:
            daemon.launch()

    def _hold(self, point: str) -> None:
        (self.holds / point).unlink(missing_ok=True)

    def _release(self, point: str) -> None:
        (self.holds / point).touch()

    # --- the flow ----------------------------------------------------------------------------
    @property
    def flow(self) -> Flow:
        return self.walk.model.flows["f1"]

    def pair_flow(self) -> PairFlow | None:
        """The pair's flow of the model's tasks."""
        pair = self.pairs.get(*self.walk.model.pair)
        mine = set(self.flow.tasks.values())
        return next((f for f in pair.flows.values() if mine & set(f.tasks.values())), None)

    def tasks(self) -> dict[str, dict[str, Any]]:
        """The flow's tasks; ConnectionError when no daemon serves: the only one is held in
        the recover round of its start (it listens from before it, answering 503 until then)."""
        try:
            listed = self.walk.invariants.flow_tasks()["f1"]
        except AssertionError as exc:
            if "the daemon is starting" in str(exc):
                raise ConnectionError(f"no daemon serving: {exc}") from exc
            raise
        return {t["task_id"]: t for t in listed}

    def other_cluster(self, label: str) -> str:
        return next(c for c in self.walk.model.pair if c != label)

    def verb(self, verb: str, task_id: str) -> tuple[int, str]:
        """An operator's verb; (status, the refusal's detail)."""
        status, answer = self.ask(verb, task_id)
        detail = answer.get("detail", "") if isinstance(answer, dict) else answer
        return status, str(detail or "")

    def ask(self, verb: str, task_id: str) -> tuple[int, Any]:
        """An operator's verb; (status, answer)."""
        path = f"/v1/tasks/{task_id}" + ("" if verb == "delete" else f"/{verb}")
        body: dict[str, Any] = {}
        if verb == "switchover":
            body = {"max_lag_seconds": 60, "timeout_seconds": 240, "stale_check_seconds": 0}
        elif verb == "failover":
            body = {"export_seconds": 30}
        method = "DELETE" if verb == "delete" else "POST"
        try:
            daemon = self.walk.fleet.any()
            if verb == "switchover" and len(self.walk.fleet.live()) > 1:
                # asked of the member running the task, as the refusal says (a stall's m2)
                with contextlib.suppress(Exception):
                    daemon = self.walk.fleet.owner_of(task_id, timeout=5)
            status, _, answer = daemon.request(method, path, body, timeout=120)
        except Exception as exc:  # noqa: BLE001 - shown as the answer
            return 0, f"{type(exc).__name__}: {exc}"
        return status, answer

    # --- one case ----------------------------------------------------------------------------
    def run(self, case: Case) -> CaseResult:
        result = CaseResult(case)
        began = time.monotonic()
        before = len(self.walk.result.failures)
        self.say(f"case {case.label()}")
        try:
            self._case(case, result)
        except InvariantError:
            pass  # recorded by the walk (keep_going) or below
        except Exception as exc:  # noqa: BLE001 - a wait that never ended is a result
            self.step_failed(exc)
        finally:
            self.clean_up()
        result.broke = [f"{f.check}: {f.detail[:400]}" for f in self.walk.result.failures[before:]]
        result.seconds = time.monotonic() - began
        self.say(
            f"  -> {'held' if result.held else 'not held'}; {result.outcome}; "
            f"broke {result.broke or 'nothing'} ({result.seconds:.0f} s)"
        )
        return result

    def run_verbs(self, cases: Sequence[Case]) -> list[CaseResult]:
        """The verb cases of one job and point, judged in as few held worlds as they allow
        (:mod:`harness.dr_verb_batch`)."""
        from harness.dr_verb_batch import run_verbs

        return run_verbs(self, list(cases))

    def round_trip(self) -> str:
        """A switchover there and back by verbs: the flow has a task each way (a fresh flow
        has one, and a case's "other task" would not be there)."""
        said: list[str] = []
        for _ in range(2):
            active = self._own_task("switchover")
            previous = self._job_id("switchover", active)
            consistent_known(self.m1, active)
            if self._drive("switchover", active, said):
                said.append(self._settle("switchover", active, previous))
        return "; ".join(said)

    def clean_up(self) -> None:
        """After a case: the writer's mover stopped, every hold released, m1 alone, serving."""
        if self._mover is not None:
            self._mover.done.set()
            self._mover = None
        for mover in self._movers:
            mover.done.set()
        self._movers.clear()
        for point in self.points:
            self._release(point)
        self._one_member()

    def step_failed(self, exc: Exception) -> None:
        """A step that raised: its start in the row, the whole error in the run's output (a
        daemon that exited names its log's tail there: the row's excerpt cut it off)."""
        text = str(exc)
        self._broke("step_completed", f"{type(exc).__name__}: {text[:300]}")
        if len(text) > 300:
            self.say(f"  the whole error: {text}")

    def _broke(self, check: str, detail: str) -> None:
        failure = InvariantError(check, detail, self.walk.seed, self.walk.result.steps)
        self.walk.result.failures.append(failure)
        self.walk.result.failure = self.walk.result.failure or failure
        self.say(f"  broke {check}: {detail[:2000]}")  # the row keeps 300

    def _case(self, case: Case, result: CaseResult) -> None:
        reached = self.reach(case, result)
        if reached is None:
            return
        own, previous, asked = reached
        if result.held:
            self._apply(case, own, result)
        self.end(case, result, own, previous, asked)

    def reach(self, case: Case, result: CaseResult) -> tuple[str, str, _Asked] | None:
        """The job asked and held at the case's point (``result.held``; "not reached" when it
        did not get there in time): (its task, the job id before it, the request); None when
        no route reaches the point or the route's first point was not reached."""
        route = ROUTE.get(case.point, "")
        if case.point in ROUTE and not route:
            result.outcome = "no route reaches this point"
            return None
        self._wait_no_job(JOB_SECONDS)  # the last case's job ended
        if case.job == "failback":
            self._failed_over_first()
        if route.startswith("fail:"):
            self.restart(self.m1, route)
        own = self._own_task(case.job)
        previous = self._job_id(case.job, own)
        first = route.split(":", 1)[1] if route.startswith(("kill:", "stall:")) else ""
        self._hold(first or case.point)
        offset = log_size(self.m1)
        asked = self._ask(case.job, own, case.point)
        if case.job == "switchover":
            self._mover = _WriterMover(self, own, previous)
        if first:
            if not self._wait_held(self.m1, first, offset, case.job):
                result.outcome = f"the route's point {first} not reached"
                return None
            self._hold(case.point)
            offset = log_size(self.m1)
            if route.startswith("kill:"):
                self._release(first)
                self.restart(self.m1, kill=True, wait=False)
            else:  # stopped past the claim, released while stopped, continued
                result.outcome = self._stall(case, own, first, previous) + "; "
        result.held = self._wait_held(self.m1, case.point, offset, case.job)
        if not result.held:
            result.outcome = "not reached"
        return own, previous, asked

    def end(
        self, case: Case, result: CaseResult, own: str, previous: str, asked: _Asked | None
    ) -> None:
        """The hold released, the job's end, the walk's invariants, the flow driven home by
        verbs alone and every invariant again."""
        self._release(case.point)
        self.m1.wait_ready(START_SECONDS)
        result.outcome = (result.outcome + "; " if result.outcome else "") + self._settle(
            case.job, own, previous, asked
        )
        if self._movers:  # an operator's switchover accepted meanwhile: its end, followed
            self._wait_no_job(JOB_SECONDS)
            flow = self.pair_flow()
            if flow is not None and flow.state == "replicating":
                self._model_replicating(flow)
        self.walk.check_invariants(
            only=(
                "at_most_two_tasks",
                "no_ownerless_fence",
                "acknowledged_on_primary",
                "target_plus_export",
                "export_disjoint_from_target",
            )
        )
        self._never_both_directions()
        self.drive_home(result)
        self.walk.check_invariants()

    def _own_task(self, job: str) -> str:
        if job == "failback":
            return self.flow.failovers[-1].task_id
        active = self.flow.active_task
        assert active is not None, self.flow
        return active

    def _job_id(self, job: str, task_id: str) -> str:
        if job == "failover":
            return ""
        return str(self.view(job, task_id).get("job_id") or "")

    def view(self, job: str, task_id: str) -> dict[str, Any]:
        """The job's record as the metastore holds it ({} when none): what every member reads,
        not the view one member last remembered."""
        if job == "switchover":
            saved = load_job(self.store, task_id)
            return saved.view() if saved is not None else {}
        key = FAILBACK_KEY if job == "failback" else FAILOVER_KEY
        return load_json(self.store, task_id, key) or {}

    def _ask(self, job: str, task_id: str, point: str = "") -> _Asked:
        body: dict[str, Any] = {}
        if job == "switchover":
            # asked of the member running the task, once its consistent-up-to is known; with a
            # stale-write check only where the case's point is the check's
            self.walk.fleet.owner_of(task_id)
            consistent_known(self.m1, task_id)
            check = 1 if point.startswith("stale_check") else 0
            body = {"max_lag_seconds": 60, "timeout_seconds": 240, "stale_check_seconds": check}
        elif job == "failover":
            self._lose_primary()
            body = {"export_seconds": 30}
        self._asked_at = time.time()
        return _Asked(self.m1, "POST", f"/v1/tasks/{task_id}/{job}", body)

    def _lose_primary(self) -> None:
        label = self.flow.primary
        handle = self.walk.clusters[label]
        assert handle.restartable is not None, f"{label} cannot be killed"
        self._killed_at = time.time()
        self._killed = label
        handle.restartable.kill()
        self.walk._drop_client(label)
        self.say(f"  {label} killed (kill -9)")

    def _wait_held(self, daemon: Daemon, point: str, offset: int, job: str = "") -> bool:
        text = f"held at {point} for"
        reach = FAILBACK_REACH_SECONDS if job == "failback" else REACH_SECONDS
        deadline = time.monotonic() + reach
        while time.monotonic() < deadline:
            if logged_since(daemon, offset, text):
                return True
            time.sleep(0.3)
        return False

    # --- the faults --------------------------------------------------------------------------
    def _apply(self, case: Case, own: str, result: CaseResult) -> None:
        if case.fault == "kill":
            self.m1.kill()
            self._release(case.point)  # the job is not held again where it was killed
            self.restart(self.m1)
            result.outcome = "killed and started again"
        elif case.fault == "stall":
            result.outcome = self._stall(case, own)
        else:
            self.apply_verb(case, own, result)

    def apply_verb(self, case: Case, own: str, result: CaseResult) -> bool:
        """The case's operator verb asked and its answer judged; True when it may have changed
        the world (2xx, or no answer at all), False when it was refused or not asked."""
        verb, _, role = case.fault.partition(":")
        try:
            listed = self.tasks()
        except OSError:  # the only daemon held in the recover round of its start
            result.outcome = f"{case.fault}: {NO_DAEMON_SERVING} (held starting)"
            return False
        # the flow's other task is its collection's other task (the pair learns a reverse
        # task only when the switchover hands the flow over)
        other = next((t for t in listed if t != own), "")
        task_id = own if case.fault == "again" or role == "own" else other
        verb = case.job if case.fault == "again" else verb
        if not task_id:
            result.outcome = f"{case.fault}: {NO_OTHER_TASK}"
            return False
        exists = task_id in listed
        previous = self._job_id("switchover", task_id) if verb == "switchover" else ""
        members = list(self.walk.fleet.members.values())
        offsets = [log_size(member) for member in members]
        asked_at = time.time()
        status, reply = self.ask(verb, task_id)
        if verb == "switchover" and 200 <= status < 300:
            # an operator's switchover accepted: the writers follow its writers_may_move_at too
            target = str(listed[task_id].get("target_cluster") or "")
            self._movers.append(_WriterMover(self, task_id, previous, target))
        detail = str((reply.get("detail", "") if isinstance(reply, dict) else reply) or "")
        answer = f"{verb} {task_id}: {status} {detail[:200]}"
        result.answers.append(answer)
        result.outcome = answer
        held_too = f"{verb} held at {case.point} for"
        if verb == case.job and any(
            logged_since(m, o, held_too) for m, o in zip(members, offsets, strict=True)
        ):
            # the search holds by point, not by job: the verb's own job, accepted, passed the
            # point too and was held there; whatever it answers after the hold (a failover's
            # 409 "stalled past its claim" once a recover round applied its saved record and
            # let its claim go) is the hold's, not the daemon's. Its world goes on as a case
            # of its own, as an accepted verb's does.
            result.outcome += (
                f"; its own {verb} held at {case.point} too (the search holds every job "
                f"passing the point): {HELD_TOO}"
            )
            return True
        self._judge(verb, status, detail, exists)
        if verb == "failover" and status == 200 and isinstance(reply, dict):
            # the operator failed over a live primary: the writers follow at its answer; the
            # writes the old primary took after the failover was asked are the operator's (as
            # those after a kill are), so the failover counts from the moment it was asked
            lost = str(listed[task_id].get("source_cluster") or self.flow.primary)
            killed = self._killed_at
            if self.walk.clusters[lost].alive:
                self._killed_at = 0.0  # not killed: the failover's own time counts
            try:
                result.outcome += "; " + self._record_failover(lost, task_id, reply, asked_at)
            finally:
                self._killed_at = killed
        return status == 0 or 200 <= status < 300

    def _judge(self, verb: str, status: int, detail: str, exists: bool) -> None:
        """A verb is done (2xx), or refused with 409 naming the state; 404 only for a task
        that is not there; 400 only for a target that is down (a failback to the lost cluster
        before it is back: the target check refuses it before anything changes, 6f2cf58)."""
        if 200 <= status < 300 or (status == 404 and not exists):
            return
        if status == 400 and "is not reachable" in detail:
            down = [c.milvus.uri for c in self.walk.clusters.values() if not c.alive]
            if any(f"{uri} is not reachable" in detail for uri in down):
                return
        if status == 0:  # no answer: a daemon held in the recover round of its start
            return
        if status == 409 and any(word in detail for word in STATE_WORDS):
            return
        self._broke("verb_409_names_state", f"{verb}: {status} {detail}")

    def _stall(self, case: Case, own: str, release: str = "", previous: str = "") -> str:
        """m1 stopped until m2 took its job over, then continued; ``release``: a point whose
        hold ends while m1 is stopped (and the wait ends once m2 ended the job, not
        ``previous``)."""
        spare = self.walk.fleet.member("m2")
        if spare.process is None or spare.process.poll() is not None:
            spare.env.pop(FAULT_ENV, None)
            spare.start(START_SECONDS)
        pid = self.m1.process.pid if self.m1.process else 0
        os.kill(pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + CLAIM_SECONDS + 45
            taken = ""
            while time.monotonic() < deadline:
                flow = self.pair_flow()
                held = flow.job if flow is not None else None
                taken_by_m2 = (held is not None and held.member == "m2") or self.view(
                    case.job, own
                ).get("member") == "m2"
                if taken_by_m2 and not release:
                    taken = f"; m2 took the {case.job} over"
                    break
                view = self.view(case.job, own) if release else {}
                if view.get("job_id") != previous and view.get("state") in ("failed", "done"):
                    taken = f"; m2 ended the {case.job} ({view['state']})"
                    break
                time.sleep(0.5)
        finally:
            if release:
                self._release(release)
            os.kill(pid, signal.SIGCONT)
        return f"m1 stopped {CLAIM_SECONDS:g} s and more{taken}, continued"

    def _one_member(self) -> None:
        spare = self.walk.fleet.members.get("m2")
        if spare is not None and spare.process is not None and spare.process.poll() is None:
            self._wait_no_job(JOB_SECONDS)
            spare.stop()
        m1 = self.m1
        if m1.process is None or m1.process.poll() is not None or m1.env[FAULT_ENV] != self.env():
            self.restart(m1)

    # --- the job's end -----------------------------------------------------------------------
    def _settle(self, job: str, own: str, previous: str, asked: _Asked | None = None) -> str:
        """Wait for the job to end, moving the writer as the README says; the model after it."""
        if job == "failover":
            assert asked is not None
            status, answer = asked.result(JOB_SECONDS)
            if status == 200:
                lost = self.flow.primary
                return "failover answered; " + self._record_failover(lost, own, answer)
            return f"failover not answered ({status} {str(answer)[:160]})"
        deadline = time.monotonic() + (FAILBACK_SECONDS if job == "failback" else JOB_SECONDS)
        ended = ("in_sync", "failed") if job == "failback" else ("done", "failed")
        view: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                view = self.view(job, own)
            except Exception:  # noqa: BLE001 - a daemon starting
                time.sleep(1.0)
                continue
            if not view and self._deleted(own):
                flow = self.pair_flow() if job == "switchover" else None
                if flow is not None and flow.state == "replicating":
                    self._model_replicating(flow)  # the job may have handed the flow over
                return f"{job}: task {own} deleted, the job's record with it"
            fresh = bool(view.get("job_id")) and view.get("job_id") != previous
            follow = writers_follow(self.flow, view, self.walk.model.pair) if fresh else ""
            if job == "switchover" and follow:
                self.flow.writer.move_to(follow)
            if fresh and view.get("state") in ended:
                break
            if not fresh and asked is not None and asked.status and asked.status != 202:
                return f"{job} refused: {asked.status} {str(asked.answer)[:200]}"
            if not fresh and asked is not None and not asked.is_alive() and not asked.status:
                return f"{job} not answered: {str(asked.answer)[:160]}"
            time.sleep(0.25)
        else:
            self._broke("step_completed", f"{job} of {own} not ended: {view}")
            return f"{job} not ended"
        if job == "switchover":
            return self.walk._settle(self.flow, view)
        if view["state"] == "in_sync":
            self.flow.tasks[self.flow.primary] = str(view["reverse_task_id"])
            self.flow.state = "replicating"
        return f"failback {view['state']} {str(view.get('reason', ''))[:160]}"

    def _deleted(self, task_id: str) -> bool:
        """``task_id`` is not among the tasks (False when no daemon answers)."""
        try:
            return task_id not in self.tasks()
        except OSError:
            return False

    def _wait_no_job(self, budget: float) -> None:
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            flow = self.pair_flow()
            if flow is None or flow.job is None or flow.job.expired():
                return
            time.sleep(0.25)

    def _never_both_directions(self) -> None:
        running = [t for t, v in self.tasks().items() if v["state"] == "Running"]
        if len(running) > 1:
            self._broke("never_both_directions", f"flow f1: {running} all Running")

    # --- home, by verbs alone ----------------------------------------------------------------
    def _failed_over_first(self) -> None:
        """A failback case starts from the flow failed over, its lost cluster back."""
        own = self._own_task("switchover")
        lost = self.flow.primary
        self._lose_primary()
        at = time.time()
        status, answer = self.ask("failover", own)
        if status != 200:
            self._broke("verb_accepted", f"failover {own}: {status} {answer}")
            raise InvariantError("verb_accepted", str(answer), self.walk.seed, [])
        self._record_failover(lost, own, answer, at)
        self.walk._step_restart_lost(lost, "")

    def drive_home(self, result: CaseResult) -> None:
        """Verbs only, until the flow replicates from home: ``driven_home`` breaks when they
        cannot bring it there."""
        home = self.flow.home
        deadline = time.monotonic() + DRIVE_SECONDS
        said: list[str] = []
        self._refused_on = 0
        while time.monotonic() < deadline:
            self._wait_no_job(JOB_SECONDS)
            flow = self.pair_flow()
            tasks = self.tasks()
            if flow is None:  # a task no verb claimed yet (the pair adopts it at the first)
                self._restart_lost(said)
                mine = self.flow.tasks.get(self.flow.primary, "")
                if mine not in tasks:
                    said.append(self._rebuild(tasks, source=self.flow.primary))
                elif tasks[mine]["state"] != "Running":
                    self._drive("resume", mine, said)
                elif self.flow.primary != home:  # rebuilt from production: switched home
                    if mine not in self._repaired:  # home's own writes the target lacks
                        said.append(self._repair(mine))
                    previous = self._job_id("switchover", mine)
                    consistent_known(self.m1, mine)
                    if self._drive("switchover", mine, said):
                        said.append(self._settle("switchover", mine, previous))
                else:
                    break
                continue
            if flow.state in (FAILED_OVER, FAILING_BACK):
                failed = flow.tasks.get(self.other_cluster(flow.active), "")
                if failed not in tasks:  # the failed-over task deleted: no failback of it
                    self._model_failed_over(flow.active, failed)
                    self._restart_lost(said)
                    said.append(self._rebuild(tasks, source=flow.active))
                    continue
                self._model_failed_over(flow.active, failed)  # the writer moved first
                self._restart_lost(said)
                previous = self._job_id("failback", failed)
                if self._drive("failback", failed, said):
                    said.append(self._settle("failback", failed, previous))
                continue
            active = flow.tasks.get(flow.active, "")
            if active not in tasks:  # production's task deleted: rebuilt from production
                said.append(self._rebuild(tasks, source=flow.active))
                continue
            others = [t for t in flow.tasks.values() if t != active and t in tasks]
            running = [t for t, v in tasks.items() if v["state"] == "Running"]
            if active not in running and "failed over" in str(tasks[active].get("reason")):
                said.append(self._fail_over_again(flow, active))  # a failover not finished
                continue
            self._restart_lost(said)
            for other in others:
                if other in running:
                    self._drive("pause", other, said)
            if active not in running:
                self._drive("resume", active, said)
                continue
            self._model_replicating(flow)
            if flow.active != home:
                previous = self._job_id("switchover", active)
                if self._drive("switchover", active, said):
                    said.append(self._settle("switchover", active, previous))
                continue
            break
        else:
            self._broke("driven_home", f"not home after {DRIVE_SECONDS:g} s: {said}")
            return
        self.flow.writer.move_to(home)
        result.outcome += f"; home by: {', '.join(said) or 'nothing to do'}"

    def _restart_lost(self, said: list[str]) -> None:
        """A killed cluster started again (once the writer left it, if it failed over)."""
        for label, handle in self.walk.clusters.items():
            if not handle.alive:
                said.append(self.walk._step_restart_lost(label, "").split(";")[0])

    def _fail_over_again(self, flow: PairFlow, active: str) -> str:
        """The active task paused by a failover whose answer was lost: the failover asked
        again (it applies to a failed-over task), its answer kept for the invariants."""
        at = time.time()
        status, answer = self.ask("failover", active)
        if status != 200:
            detail = answer.get("detail") if isinstance(answer, dict) else answer
            if not any(w in str(detail) for w in WAIT_WORDS):
                self._broke("driven_home", f"failover {active} again: {status} {detail}")
                raise InvariantError("driven_home", str(detail), self.walk.seed, [])
            time.sleep(2.0)
            return f"failover {active} {status}"
        self._record_failover(flow.active, active, answer, at)
        return f"failover {active} again: 200"

    def note_failover(self, job: str, own: str) -> None:
        """Before a verb that may delete the task: a failover its record says done is put in
        the model (the record goes with the task; the request's answer may be lost)."""
        if job != "failover":
            return
        view = self.view("failover", own)
        if view.get("state") == "done" and view.get("failed_over_at"):
            self.say(f"  failover of {own} known from its view: {view['failed_over_at']}")
            self.say("  " + self._record_failover(self.flow.primary, own, view))

    def _record_failover(self, lost: str, task_id: str, answer: Any, at: float = 0.0) -> str:
        """A failover's answer (or its view, the answer saved) in the model, once."""
        when = str(answer.get("failed_over_at") or "")
        if when in self._failovers:
            return "failover known"
        self._failovers.add(when)
        at = at or self._asked_at or datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        # the kill counts only for the cluster killed: a failover of another (live) cluster's
        # task counts from its own time (its source takes writes until then, as an operator's)
        killed = (self._killed_at if self._killed == lost else 0.0) or at
        return self.walk.failed_over(self.flow, lost, killed, at, task_id, answer)

    def _rebuild(self, tasks: dict[str, dict[str, Any]], source: str = "") -> str:
        """The flow's active task was deleted (an operator's delete that applied), or the
        failed-over task of a failed-over flow: its other task deleted too, and a new task
        from ``source`` (production, where the writers are; home by default) created with a
        backfill (verbs); the drive home repairs it and switches over."""
        for other in tasks:
            self._drive("delete", other, [])
        home = source or self.flow.home
        replica = self.other_cluster(home)
        task_id = f"f1-{int(time.time())}"
        body = {
            "task_id": task_id,
            "source_cluster": home,
            "target_cluster": replica,
            "collection_infos": [{"name": self.flow.collection}],
            "backfill": {},
        }
        status, _, answer = self.walk.fleet.any().request("POST", "/v1/tasks", body, timeout=120)
        if status != 201:
            self._broke("driven_home", f"create {task_id}: {status} {answer}")
            raise InvariantError("driven_home", str(answer), self.walk.seed, [])
        self.flow.tasks = {home: task_id}
        self.flow.state, self.flow.primary = "replicating", home
        self.flow.writer.move_to(home)
        return f"the active task gone ({sorted(tasks)} left, deleted): {task_id} created"

    def _repair(self, task_id: str) -> str:
        """A task rebuilt from production after a failover: its backfill waited for, then a
        verify with repair (verbs), so that home loses the writes it took that production
        never had (the failover's export keeps them), as a failback's repair does."""
        self._repaired.add(task_id)
        deadline = time.monotonic() + JOB_SECONDS
        while time.monotonic() < deadline:
            backfill = BackfillState(self.store, task_id).job()
            if backfill is None or not backfill.active:
                break
            time.sleep(0.5)
        before = VerifyState(self.store, task_id).job()
        path = f"/v1/tasks/{task_id}/verify"
        status, _, answer = self.walk.fleet.any().request(
            "POST", path, {"repair": True}, timeout=120
        )
        if status != 202:
            return f"verify with repair of {task_id}: {status} {str(answer)[:160]}"
        while time.monotonic() < deadline:
            job = VerifyState(self.store, task_id).job()
            fresh = job is not None and (before is None or job.job_id != before.job_id)
            if job is not None and fresh and not job.active:
                repaired = sum(c.repaired for c in job.collections)
                return f"verify with repair of {task_id}: {job.state}, {repaired} repaired"
            time.sleep(0.5)
        return f"verify with repair of {task_id}: not ended"

    def _drive(self, verb: str, task_id: str, said: list[str]) -> bool:
        """Ask ``verb``; a refusal while a job is under way (or a lag) is waited out and asked
        again; any other breaks ``driven_home``."""
        for _ in range(100):
            status, detail = self.verb(verb, task_id)
            said.append(f"{verb} {task_id} {status}")
            if 200 <= status < 300:
                return True
            if status == 400 and any(
                f"{c.milvus.uri} is not reachable" in detail
                for c in self.walk.clusters.values()
                if c.alive
            ):  # a cluster just started again: the daemon's channel to it may be backing off
                time.sleep(2.0)
                continue
            if not any(w in detail for w in WAIT_WORDS):
                self._broke("driven_home", f"{verb} {task_id}: {status} {detail}")
                if self._refused_on >= AFTER_BROKEN:
                    raise InvariantError("driven_home", detail, self.walk.seed, [])
                # broken (the row says so); driven on from where the flow is, so that the
                # next case starts from home (a failback answered 409 "stopped" whose job
                # went on in the same daemon's recover round left every later case unmade)
                self._refused_on += 1
                said.append("broken, driven on")
                time.sleep(2.0)
                return False
            time.sleep(2.0)
        return False

    def _model_replicating(self, flow: PairFlow) -> None:
        """The model follows the pair: the flow replicates from its active cluster."""
        model = self.flow
        if model.state != "replicating" or model.primary != flow.active:
            model.state = "replicating"
            model.primary = flow.active
            model.writer.move_to(flow.active)
        model.tasks = dict(flow.tasks)

    def _model_failed_over(self, production: str, failed: str) -> None:
        """The model follows the pair: failed over to ``production`` by ``failed``'s failover
        (its answer, saved as the task's view, kept when the request's was lost)."""
        model = self.flow
        view = self.view("failover", failed)
        if view.get("failed_over_at") and view["failed_over_at"] not in self._failovers:
            self.say(f"  failover of {failed} known from its view: {view['failed_over_at']}")
            self._record_failover(self.other_cluster(production), failed, view)
        if model.state != "failed_over" or model.primary != production:
            model.state = "failed_over"
            model.primary = production
            model.writer.move_to(production)


def table(results: Sequence[CaseResult]) -> list[str]:
    """The results as a Markdown table, a row per case."""
    lines = [
        "| job | point | fault | held | invariants | outcome | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        broke = " ".join(("; ".join(r.broke) if r.broke else "all held").split())
        outcome = " ".join(r.outcome.replace("|", "/").split())[:220]
        lines.append(
            f"| {r.case.job} | {r.case.point} | {r.case.fault} | {'yes' if r.held else 'no'} | "
            f"{broke.replace('|', '/')[:300]} | {outcome} | {r.seconds:.0f} |"
        )
    return lines
