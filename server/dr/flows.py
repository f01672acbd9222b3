"""What switchover, failover and failback ask of tasks: the create requests of a pair's flows,
where a reverse flow starts, the end of a verify job (with a deadline), and the fault points the
tests use.
"""

from __future__ import annotations

import asyncio
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

# Fault injection, for the tests of every step (tests/e2e/test_disaster_recovery.py); never set
# in service. "hold:<point>:<seconds>[:<file>]" holds the job there (a test kills the daemon,
# or acts as an operator, meanwhile; with a file, the hold ends as soon as the file exists),
# "fail:<point>" makes it fail there; several, comma-separated, are done in their order.
# Switchover points: "fencing" (the fence key written, not yet seen in effect), "draining",
# "verifying" (the verify job started), "reversing" (the task paused, the reverse start not
# fixed), "moving" (the point of no return passed: writers may move, the reverse task not
# created yet), "reversed" (the reverse task created, the fence still on), "finished" (``done``
# saved, the flow not yet handed to the reverse direction). Failback points:
# "repairing" and "streaming" (the step's verify job started). Failover point: "failover-paused"
# (the task paused, its runner not yet seen stopped nor its WAL read).
# Fence point (any job): "fence-joined" (the job recorded as the fence's owner, the key not
# written yet), "fence-unheld" (the key written, the owner's hold found gone, the key not yet
# removed again). Recover points: "settling" (a finished job still holding its flow found, its
# effects not yet applied), "pair-tended" (a pair's deleted tasks forgotten, its ownerless
# fences not yet lifted).
# A failure fires once per process: past the point of no return the job retries the step.
FAULT_ENV = "MILVUS_CDC_TEST_SWITCHOVER"
_FAILED: set[str] = set()  # the points whose failure fired


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
    for directive in os.environ.get(FAULT_ENV, "").split(","):
        kind, _, rest = directive.strip().partition(":")
        where, _, rest = rest.partition(":")
        seconds, _, until = rest.partition(":")
        if where != point:
            continue
        if kind == "hold":
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
    """The verify job ``job_id`` of ``task_id`` once it has ended; ``still`` is called between
    looks (it raises to give up). VerifyWaitError after ``budget`` seconds, or when the task's
    latest verify is another job (``job_id`` was replaced: its result is not known)."""
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
        still()
        await asyncio.sleep(poll)


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
