"""The contract between the daemon's supervisor and the engine that runs one task."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from metastore import MetaStore, TaskRecord

# Called by a runner that stopped on an error that needs an operator: (task_id, reason).
FailureCallback = Callable[[str, str], Awaitable[None]]


class TaskRunner(Protocol):
    async def start(self) -> None:
        """Begin replicating; return once running (errors here fail the task)."""

    async def stop(self) -> None:
        """Stop reading, flush what was read to the target, save positions, then return."""


RunnerFactory = Callable[[TaskRecord, MetaStore, FailureCallback], TaskRunner]


class NoEngineRunner:
    """Holds a task's Running state while no replication engine is wired in.

    The foundation (task API, metastore, service) ships before the engine; this runner moves no
    data and says so in the log, so a task's lifecycle can be driven and tested end to end.
    """

    def __init__(self, task: TaskRecord, store: MetaStore, on_failure: FailureCallback) -> None:
        self.task_id = task.task_id
        self.running = False

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False


def no_engine_factory(
    task: TaskRecord, store: MetaStore, on_failure: FailureCallback
) -> TaskRunner:
    return NoEngineRunner(task, store, on_failure)
