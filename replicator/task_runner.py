"""The contract between the daemon's supervisor and the engine that runs one task."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from metastore import MetaStore, TaskRecord

# Called by a runner that stopped on an error that needs an operator: (task_id, reason).
FailureCallback = Callable[[str, str], Coroutine[Any, Any, None]]


class TaskRunner(Protocol):
    async def prepare(self) -> None:
        """Decide and save where every channel of a new task starts (one that has no
        positions yet), so that every write the source acknowledges afterwards is replicated;
        raises when the source cannot be read, within the task's connect timeout (and half a
        second): a read still waiting then can write nothing when it returns. Nothing to do
        for a task that has positions."""

    async def start(self) -> None:
        """Begin replicating; return once running (errors here fail the task)."""

    async def stop(self) -> None:
        """Stop reading, flush what was read to the target, save positions, then return."""

    def wait_stopped(self, timeout: float) -> bool:
        """Block until the runner's work has ended after ``stop`` (one ``stop`` let go inside a
        blocking call ends when the call returns), ``timeout`` seconds at most; whether it
        ended."""

    @property
    def finished(self) -> bool:
        """Started, and its work has ended without a failure it reported (fenced off, or the
        task deleted): the supervisor may start the task again if it still holds it."""

    def status(self) -> dict[str, Any]:
        """Progress: rows, bytes, lag_seconds and per-channel details (JSON-able)."""

    def applied_ticks(self) -> dict[str, int]:
        """The source time (hybrid ts) up to which each pchannel is on the target, as of now
        (a saved position of an idle channel may be older)."""

    def wake_idle_readers(self) -> None:
        """Have idle channel readers return now, so ``consistent_ts`` is fresh (a drain)."""

    def consistent_ts(self) -> int:
        """The source time (hybrid ts) up to which every write of the task is on the target;
        0 while a channel has not told yet (``progress.consistent_up_to``)."""

    def read_to_end_since(self, moment: float) -> bool:
        """Whether every channel read to its end after ``moment`` (seconds), or has something
        waiting (its figure is then its applied tick, which no read moves)."""

    def unreachable(self, warnings: list[str]) -> None:
        """The endpoints (source queue, source etcd, target) the daemon cannot reach now, as
        warnings to show on the task; those shown before and not given again are withdrawn.
        Blocking (it writes the task's state): call it from a thread."""


RunnerFactory = Callable[[TaskRecord, MetaStore, FailureCallback], TaskRunner]
