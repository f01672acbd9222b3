"""Scheduled verification: a task verified every ``intervalHours`` (its create's
``verify.intervalHours``, else the daemon's ``verify.intervalHours``; 0: never), each time over
a random ``sampleFraction`` of the key ranges, so the cost of a run is bounded and every range
is drawn sooner or later. Run by the scheduler (server/runtime/jobs.py) every
``verify.scheduleCheckSeconds``; only Running tasks are verified (a stopped task applies
nothing, so its ranges could not settle).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from metastore import TaskRecord, TaskState
from replicator.compare.state import VerifyJob
from replicator.config.daemon import VerifySettings
from replicator.config.task_spec import TaskSpec, UnreadableSpecError
from server.errors import ApiError
from server.logs import log_context
from server.tasks.requests import VerifyRequest
from server.tasks.supervisor import TaskSupervisor

log = logging.getLogger(__name__)

HOUR = 3600.0


@dataclass(frozen=True)
class Schedule:
    interval_hours: float  # 0: not scheduled
    sample: float  # fraction of the ranges per run


def schedule_of(spec: TaskSpec, defaults: VerifySettings) -> Schedule:
    """The task's scheduled verifies: its own ``verify`` settings over the daemon's."""
    asked = spec.verify or {}
    return Schedule(
        float(asked.get("intervalHours") or defaults.intervalHours),
        float(asked.get("sampleFraction") or defaults.sampleFraction),
    )


def due(task: TaskRecord, last: VerifyJob | None, schedule: Schedule, now: float) -> bool:
    """A verify is due when the task is Running, has a schedule, none runs, and the last one
    (else the task's creation) is at least an interval old."""
    if task.state is not TaskState.RUNNING or schedule.interval_hours <= 0:
        return False
    if last is not None and last.active:
        return False
    since = max(task.created_at, last.created_at if last is not None else 0.0)
    return now - since >= schedule.interval_hours * HOUR


async def run_scheduled(
    supervisor: TaskSupervisor, defaults: VerifySettings, now: float
) -> list[str]:
    """Start the verifies that are due; the ids of their tasks."""
    started = []
    for task in await supervisor.list():
        try:
            spec = TaskSpec.of(task)
        except UnreadableSpecError:
            continue  # a task this release cannot read is left alone
        if spec.unrunnable_reason() or spec.is_kafka:
            continue  # nor one it cannot run; and a topic has nothing to compare with
        schedule = schedule_of(spec, defaults)
        if not due(task, supervisor.verify_job(task.task_id), schedule, now):
            continue
        with log_context(task_id=task.task_id):
            try:
                await supervisor.verify(
                    VerifyRequest(task_id=task.task_id), sample=schedule.sample, scheduled=True
                )
            except ApiError as exc:  # deleted, paused, or a verify asked meanwhile
                log.info("scheduled verify skipped: %s", exc.message)
                continue
        started.append(task.task_id)
    return started
