"""What switchover, failover and failback ask of tasks: the create requests of a pair's flows,
where a reverse flow starts, the end of a verify job (with a deadline), and the fault points the
tests use.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from metastore import Position
from replicator.compare.state import VerifyJob
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from server.dr.task_ops import TaskOperations
from server.dr.wal_tail import end_positions
from server.tasks.engine import cluster_context
from server.tasks.requests import CreateRequest

log = logging.getLogger(__name__)

POLL = 0.25  # seconds between looks at a verify job

# Fault injection, for the tests of every step (tests/e2e/test_disaster_recovery.py) and the
# search over every boundary (tests/harness/dr_boundaries.py); never set in service, and inert
# while unset. "hold:<point>:<seconds>[:<file>]" holds the job there (a test kills the daemon,
# stops it, or acts as an operator, meanwhile; with a file, the hold ends as soon as the file
# exists), "fail:<point>" makes it fail there; several, comma-separated, are done in their order.
# A failure fires once per process: past the point of no return the job retries the step.
# The jobs' points are BOUNDARIES below; the recover round's: "settling" (a finished job still
# holding its flow found, its effects not yet applied), "pair-tended" (a pair's deleted tasks
# forgotten, its ownerless fences not yet lifted).
FAULT_ENV = "MILVUS_CDC_TEST_SWITCHOVER"
_FAILED: set[str] = set()  # the points whose failure fired

# The boundaries: a point right after each durable write of a job (its record saved, the pair
# record's compare-and-set, a fence key written or deleted, a task's state written, a watch
# armed), in the order a job that goes well passes them; the roll back's last. A point may
# stand after more than one write (the same step taken up by a recover round, or retried).
# tests/unit/test_dr_boundary_points.py reads the code: every durable write of a job is followed by
# a point, and the points the code names are these.
BOUNDARIES: dict[str, tuple[str, ...]] = {
    "switchover": (
        "claimed",  # the request: the flow claimed for the job (pair record)
        "checking",  # the request: the job record saved
        "fence_saved",  # state fencing saved, fence_set (before the fence is held)
        "fence_joined",  # the job among the fence's owners (pair record), each attempt
        "fence-joined",  # the job the first owner: it writes the key next
        "fence_written",  # the fence key created in the source's etcd
        "fence-unheld",  # the key written, the job's hold found gone: the key not removed yet
        "fencing",  # the key's revision (or the operator's) recorded (pair record)
        "fenced",  # fenced_at saved
        "draining",  # state draining saved
        "drained",  # consistent_up_to saved
        "verify_saved",  # state verifying saved
        "verifying",  # the verify job started (the task's verify record)
        "verified",  # the verify's result saved
        "reversing_saved",  # state reversing saved, with the reverse task's id
        "pausing",  # original_paused saved (before the pause)
        "reversing",  # the task paused (its state)
        "quiet",  # wal_quiet_at saved
        "no_return",  # reverse_start and writers_may_move_at saved: the point of no return
        "moving",  # the forward steps begin (also a recover round's, taking the job over)
        "reverse_deleted",  # (a flow with a task that way) that task deleted, to be made anew
        "reverse_created",  # the reverse task created
        "reversed",  # the two tasks linked (dr/link of each)
        "retrying",  # an attempt at the reverse task that failed, saved
        "watch_armed",  # the reverse task's stale-write watch armed
        "fence_left",  # the job left the fence's owners, the last: lifting (pair record)
        "fence_deleted",  # the fence key deleted
        "fence_lifted",  # the fence forgotten (pair record)
        "finished",  # state done saved, the flow not handed over yet
        "released",  # the flow handed to the reverse direction, the claim released
        "stale_check_verifying",  # the stale-write check's verify started (its record)
        "stale_check_saved",  # the check's result saved in the job's record
        "takeover_claimed",  # a recover round: the job claimed by another daemon
        "taken_over",  # a recover round: the job saved by its new daemon
        "rollback_resumed",  # the roll back resumed the task
        "failed",  # state failed saved (rolled back)
        "rollback_released",  # the roll back's claim released
    ),
    "failover": (
        "failover_claimed",  # the flow claimed for the failover (pair record)
        "failover-paused",  # the task paused (its state)
        "failover_saved",  # dr/failover saved
        "failover_reason",  # the task's reason says what the target holds
        "failover_released",  # the flow failed_over to the target, the claim released
    ),
    "failback": (
        "failback_claimed",  # the flow claimed for the failback (pair record)
        "failback_creating",  # dr/failback saved, state creating
        "failback_reverse_deleted",  # (the flow's task that way, re-used) deleted
        "failback_created",  # the reverse task created, its backfill with it
        "failback_linked",  # the two tasks linked (dr/link of each)
        "failback_flow",  # the flow failing_back with the reverse task (pair record)
        "seeding",  # state seeding saved
        "failback_seeded",  # state repairing saved (the backfill done, or A differed still)
        "failback_verify_started",  # a verify of the reverse task started (its record)
        "repairing",  # the verify with repair started, its id saved
        "failback_verify_reset",  # a verify that ended without a result forgotten
        "repaired",  # state streaming saved
        "streaming",  # the verify without repair started, its id saved
        "in_sync",  # state in_sync saved
        "failback_failed",  # state failed saved
        "failback_released",  # the flow handed over (in sync) or the claim released
        "failback_taken_over",  # a recover round: the failback claimed by another daemon
        "failback_taken_over_saved",  # dr/failback saved by that daemon, its member
    ),
}


class InjectedFaultError(Exception):
    """A failure asked for by ``FAULT_ENV``."""


async def injected_fault(point: str, job: str = "switchover") -> None:
    """What ``FAULT_ENV`` asks for at ``point``: nothing (it is unset in service), holds and
    failures, in their order."""
    for seconds, until in _holds(point, job):
        await asyncio.to_thread(_hold, seconds, until)


def injected_fault_sync(point: str, job: str = "switchover") -> None:
    """:func:`injected_fault` for code that runs in a worker thread (the fence owners)."""
    for seconds, until in _holds(point, job):
        _hold(seconds, until)


def _holds(point: str, job: str) -> Iterator[tuple[float, str]]:
    """The holds ``FAULT_ENV`` asks for at ``point`` (seconds, file), its failures raised
    (InjectedFaultError, once per process and point) in their order among them."""
    directives = os.environ.get(FAULT_ENV, "")
    if not directives:
        return
    for directive in directives.split(","):
        kind, _, rest = directive.strip().partition(":")
        where, _, rest = rest.partition(":")
        seconds, _, until = rest.partition(":")
        if where != point:
            continue
        if kind == "hold":
            if until and os.path.exists(until):
                continue  # released already: passed without a word
            log.warning("%s held at %s for %s s (%s)", job, point, seconds, FAULT_ENV)
            yield float(seconds or 60), until
        elif kind == "fail" and point not in _FAILED:
            _FAILED.add(point)
            raise InjectedFaultError(f"a fault injected at {point} ({FAULT_ENV})")


def _hold(seconds: float, until: str) -> None:
    """Sleep ``seconds``, or until the file ``until`` exists."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and os.path.exists(until)):
        time.sleep(0.1)


class VerifyWaitError(Exception):
    """A verify job did not end in time, or another job replaced it."""


async def verify_ended(
    supervisor: TaskOperations,
    task_id: str,
    job_id: str,
    budget: float,
    still: Callable[[], object] = lambda: None,
    poll: float = POLL,
) -> VerifyJob:
    """The verify job ``job_id`` of ``task_id`` once it has ended; ``still`` is called (and
    awaited, when it answers an awaitable) between looks: it raises to give up.
    VerifyWaitError after ``budget`` seconds, or when the task's latest verify is another job
    (``job_id`` was replaced: its result is not known)."""
    deadline = time.monotonic() + budget
    while True:
        current = supervisor.verify_job(task_id)
        if current is not None and current.job_id == job_id and not current.active:
            return current
        if current is not None and current.job_id != job_id and current.started_at:
            raise VerifyWaitError(
                f"verify {job_id} of task {task_id} was replaced by {current.job_id}"
            )
        if time.monotonic() >= deadline:
            raise VerifyWaitError(f"verify {job_id} of task {task_id} not ended in {budget:g} s")
        await awaited(still())
        await asyncio.sleep(poll)


async def awaited(answer: object) -> None:
    """Wait for ``answer`` when it is awaitable (a callback that may be a coroutine function)."""
    if inspect.isawaitable(answer):
        await answer


def reverse_request(spec: TaskSpec, task_id: str) -> CreateRequest:
    """The create request of the flow B -> A that reverses ``spec`` (A -> B): the same
    collections, starting at B's WAL end."""
    return flow_request(spec, task_id, source=spec.target_cluster, target=spec.source_cluster)


def flow_request(
    spec: TaskSpec, task_id: str, *, source: str | None, target: str | None
) -> CreateRequest:
    """The create request of a flow from ``source`` to ``target`` (cluster names) with the
    collections and scheduled verifies of ``spec``, starting at the source's WAL end."""
    stored = spec.to_stored()
    selection: dict[str, Any] = {}
    if stored.get("collection_infos"):
        selection["collection_infos"] = stored["collection_infos"]
    else:
        selection["db_collections"] = stored.get("db_collections") or {}
    extra: dict[str, Any] = {}
    if stored.get("verify"):
        extra["verify"] = stored["verify"]
    return CreateRequest.model_validate(
        {
            "task_id": task_id,
            "source_cluster": source,
            "target_cluster": target,
            "start_at": "end",
            **selection,
            **extra,
        },
        strict=False,
    )


def wal_ends(settings: CdcSettings, cluster: str) -> dict[str, Any]:
    """Where each DML channel of ``cluster`` ends now (Position JSON by channel): a flow from
    the cluster that starts there reads every write the cluster takes from now on."""
    context = cluster_context(settings, cluster, shared_readers=False)
    return {ch: p.to_json() for ch, p in end_positions(context).items()}


def positions_of(saved: dict[str, Any] | None) -> dict[str, Position]:
    return {ch: Position.from_json(p) for ch, p in (saved or {}).items()}
