"""What disaster recovery needs of the task lifecycle: a small interface, not the supervisor.

Disaster recovery drives tasks (pause one, create its reverse, verify it, resume or delete) but
does not own them. It depends on this :class:`TaskOperations` protocol, which
:class:`~server.tasks.supervisor.TaskSupervisor` satisfies; the application wires the two
together, so neither holds the other and ``server.tasks`` never imports ``server.dr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from metastore import MetaStore, Position, TaskRecord
from replicator.compare.state import VerifyJob
from replicator.task_runner import TaskRunner
from server.tasks.fleet import Membership
from server.tasks.requests import CreateRequest, VerifyRequest


class TaskOperations(Protocol):
    """The task operations a switchover, failover or failback uses."""

    fleet: Membership  # this daemon as a fleet member (its member id)

    @property
    def store(self) -> MetaStore:
        """The metastore, for the jobs' own records."""

    async def get(self, task_id: str) -> TaskRecord:
        """A shown task; 404 when there is none."""

    async def list(self) -> list[TaskRecord]:
        """Every shown task."""

    async def create(
        self, request: CreateRequest, start_positions: Mapping[str, Position] | None = None
    ) -> TaskRecord:
        """Create a task as ``POST /cdc`` create does (``start_positions``: where channels
        start, by channel)."""

    async def check_reachable(self, request: CreateRequest) -> None:
        """Raise what a create of ``request`` would raise for an end that does not answer,
        storing nothing."""

    async def delete(self, task_id: str, ignore_not_found: bool = False, job: str = "") -> None:
        """Delete a task, its runner stopped first; ``job``: the job deleting it (a flow's
        tasks are moved only by the job holding its claim)."""

    async def pause(
        self, task_id: str, reason: str = ..., stop_wait: float = ..., job: str = ""
    ) -> TaskRecord:
        """Pause a task wherever it runs, with ``reason``, waiting ``stop_wait`` seconds at most
        for another member's runner to stop; ``job``: the job pausing it."""

    async def runner_stopped(self, task_id: str) -> bool:
        """Whether no live fleet member runs the task."""

    async def resume(self, task_id: str, *, job: str = "") -> TaskRecord:
        """Resume a task; ``job``: the job resuming it."""

    async def set_reason(self, task_id: str, reason: str) -> TaskRecord:
        """Change a task's reason, its state kept."""

    async def positions(self, task_id: str) -> dict[str, Position]:
        """A task's saved positions by channel."""

    async def owners(self) -> dict[str, str]:
        """The member holding each task's lease."""

    async def live_members(self) -> set[str]:
        """The fleet members alive now."""

    def runner_of(self, task_id: str) -> TaskRunner | None:
        """The runner of a task running on this daemon."""

    async def verify(
        self, request: VerifyRequest, sample: float = 1.0, scheduled: bool = False
    ) -> tuple[TaskRecord, str]:
        """Start a verify job; the task and the job id."""

    def verify_job(self, task_id: str) -> VerifyJob | None:
        """The task's last verify job."""
