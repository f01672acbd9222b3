"""The verbs that change one task's state wherever it runs: pause, resume (with its target's
new credentials, tried there first), delete, and a reason set with the state kept. Each pause,
resume and delete is asked of the verb checks first (disaster recovery's claims on a flow's
tasks: a job moves only the tasks it holds); state changes go through
:class:`~server.tasks.local_runs.LocalRuns` under its lock. :class:`TaskSupervisor` offers them
as its own methods (:mod:`supervisor`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from metastore import MetaStore, MetaStoreError, TaskRecord, TaskState
from replicator.config.task_spec import TaskSpec
from server.errors import ConflictError, NotFoundError
from server.logs import log_context
from server.tasks.creation import CREATING, TaskCreation
from server.tasks.credentials import with_credentials
from server.tasks.fleet import Membership
from server.tasks.local_runs import LocalRuns
from server.tasks.requests import CredentialsUpdate
from server.tasks.verify import VerifyManager

log = logging.getLogger(__name__)

PAUSED_BY_USER = "manually paused through the http interface"
# seconds a pause waits for the task's owner (another daemon) to stop its runner
OWNER_STOP_WAIT = 3.0


# asked before a pause, resume or delete: (the task, the verb, the disaster-recovery job asking:
# "" for an operator or the daemon's own retries); it raises (an ApiError) to refuse
VerbCheck = Callable[[TaskRecord, str, str], Awaitable[None]]


class TaskVerbs:
    """Pause, resume, delete and reason changes of one task, with the verb checks."""

    def __init__(
        self,
        store: MetaStore,
        runs: LocalRuns,
        creation: TaskCreation,
        verify: VerifyManager,
        fleet: Membership,
    ) -> None:
        self._store = store
        self.runs = runs
        self.creation = creation
        self._verify = verify
        self.fleet = fleet
        self._verb_checks: list[VerbCheck] = []

    def add_verb_check(self, check: VerbCheck) -> None:
        """Ask ``check`` before a task is paused, resumed or deleted; it raises (an ApiError)
        to refuse."""
        self._verb_checks.append(check)

    async def _check_verb(self, task: TaskRecord, verb: str, job: str) -> None:
        for check in self._verb_checks:
            await check(task, verb, job)

    async def get(self, task_id: str) -> TaskRecord:
        """A shown task (one still being created is not); 404 when there is none."""
        task = await asyncio.to_thread(self._store.get_task, task_id)
        if task is None or CREATING in task.extra:
            raise NotFoundError(f"task {task_id} not found")
        return task

    async def live_members(self) -> set[str]:
        """The fleet members alive now (this daemon included)."""
        members = await asyncio.to_thread(self._store.members)
        return {m.member_id for m in members} | {self.fleet.member_id}

    async def set_reason(self, task_id: str, reason: str) -> TaskRecord:
        """Change a task's reason, its state kept (a failover says what the target holds)."""
        async with self.runs.lock:
            task = await self.get(task_id)
            return await self.runs.set_state(task, task.state, reason)

    async def pause(
        self,
        task_id: str,
        reason: str = PAUSED_BY_USER,
        stop_wait: float = OWNER_STOP_WAIT,
        job: str = "",
    ) -> TaskRecord:
        """Pause a task wherever it runs: here, its runner stops first; on another member, the
        state is stored and the call waits (``stop_wait`` seconds at most) for that member's
        next round to stop its runner and give up the lease (:meth:`runner_stopped` tells
        whether it did). ``reason``: why (a switchover names the reverse task); ``job``: the
        disaster-recovery job pausing it ("" for an operator)."""
        async with self.runs.lock:
            self.runs.changes += 1
            task = await self.get(task_id)
            if task.state is TaskState.PAUSED:
                raise ConflictError(f"task {task_id} is already Paused")
            await self._check_verb(task, "pause", job)
            runner = self.runs.runners.pop(task_id, None)
            if runner is not None:
                await self.runs.stop_runner(task_id, runner)
                task = await self.get(task_id)  # a runner may record a warning until it stops
            paused = await self.runs.set_state(task, TaskState.PAUSED, reason)
            await self.runs.release_lease(task_id)
        if runner is None:
            await self._wait_owner_stops(task_id, stop_wait)
        return paused

    async def runner_stopped(self, task_id: str) -> bool:
        """Whether no live fleet member holds the task's lease (none runs it: a member that
        died holds it until it expires, and runs nothing meanwhile)."""
        holder = (await asyncio.to_thread(self._store.leases)).get(task_id)
        return holder is None or holder.owner not in await self.live_members()

    async def _wait_owner_stops(self, task_id: str, wait: float) -> None:
        """Until no member holds the task's lease (its runner stopped), ``wait`` seconds at
        most: a member that died holds it until it expires, and runs nothing meanwhile."""
        deadline = time.monotonic() + wait
        while True:
            try:
                holder = (await asyncio.to_thread(self._store.leases)).get(task_id)
            except MetaStoreError:
                return
            if holder is None:
                self.runs.owners.pop(task_id, None)
                return
            if time.monotonic() >= deadline:
                log.warning(
                    "task %s paused; fleet member %s has not stopped its runner yet",
                    task_id,
                    holder.owner,
                )
                return
            await asyncio.sleep(0.1)

    async def resume(
        self, task_id: str, credentials: CredentialsUpdate | None = None, job: str = ""
    ) -> TaskRecord:
        """Run a task again from its positions. ``credentials``: its target's new ones
        (server/tasks/credentials.py), tried on the target first (a refusal is a 400 naming
        why, nothing changed); a Running task is paused for them, then resumed. ``job``: the
        disaster-recovery job resuming it ("" for an operator or the daemon's retries)."""
        if credentials is not None:
            given = TaskSpec.from_stored(with_credentials(await self.get(task_id), credentials))
            self.runs.redactor.add(*given.secrets())
            await asyncio.to_thread(self.creation.target_checker, given.target_param)
            if (await self.get(task_id)).state is TaskState.RUNNING:
                await self.pause(task_id, "pausing to take new credentials for the target")
        async with self.runs.lock:
            self.runs.changes += 1
            task = await self.get(task_id)
            if task.state is TaskState.RUNNING:
                raise ConflictError(f"task {task_id} is already Running")
            await self._check_verb(task, "resume", job)
            if credentials is not None:  # on the task as it is now (its revision guards it)
                spec = with_credentials(task, credentials)
                task = await asyncio.to_thread(
                    self._store.replace_spec, task_id, spec, expected_revision=task.revision
                )
                log.info("task %s: its target's credentials replaced", task_id)
            return await self.runs.launch(task)

    async def delete(self, task_id: str, ignore_not_found: bool = False, job: str = "") -> None:
        """Delete a task, its runner stopped first; ``job``: the disaster-recovery job deleting
        it ("" for an operator)."""
        async with self.runs.lock:
            self.runs.changes += 1
            stored = await asyncio.to_thread(self._store.get_task, task_id)
            if stored is not None:
                await self._check_verb(stored, "delete", job)
            await asyncio.to_thread(self._verify.forget, task_id)
            runner = self.runs.runners.pop(task_id, None)
            if runner is not None:
                await self.runs.stop_runner(task_id, runner)
            # its lease goes with it: a runner on another member is refused its next write
            # (the task is gone) and stopped at that member's next round
            removed = await asyncio.to_thread(self._store.delete_task, task_id)
            self.runs.states.pop(task_id, None)
            self.runs.fences.pop(task_id, None)
            self.runs.owners.pop(task_id, None)
        if not removed and not ignore_not_found:
            raise NotFoundError(f"task {task_id} not found")
        if removed:
            with log_context(task_id=task_id):
                log.info("task deleted")
