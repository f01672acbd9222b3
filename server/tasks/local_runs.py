"""The runners this daemon runs, under their tasks' leases, and the state writes that go with them.

One ``LocalRuns`` is shared by the supervisor's collaborators (task creation, the fleet's
rounds, the requests): it holds the lock that serialises state changes, the runner, fence and
lease owner of each task running here, and the count of state changes made here (a fleet round
read before one is stale). Every state write is compare-and-set on the task's revision, so a
daemon sharing the store with another never overwrites a newer state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from metastore import (
    ConcurrentUpdateError,
    FencedError,
    Lease,
    MetaStore,
    MetaStoreError,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)
from metastore.fenced import Fence, FencedStore
from metastore.sealed import secrets_problem
from replicator import RunnerFactory, TaskRunner
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import (
    TaskSpec,
    UnreadableSpecError,
    spec_problem,
    stored_secrets,
)
from replicator.errors import CdcError, SourceUnavailableError
from server.errors import ConflictError, NotFoundError, UnavailableError
from server.logs import SecretRedactor, log_context
from server.tasks import state_history
from server.tasks.fleet import Membership
from server.tasks.reachability import source_endpoints

log = logging.getLogger(__name__)

# seconds past its connect timeout the supervisor waits for a runner's prepare (which keeps
# to the connect timeout by itself) before answering without it
PREPARE_GUARD = 3.0
# writes of a state change tried when a write that kept the state came first (set_state)
CONFLICT_ATTEMPTS = 3


class LocalRuns:
    """The runners of the tasks this daemon runs, their fences, and the task state writes."""

    def __init__(
        self,
        store: MetaStore,
        settings: CdcSettings,
        runner_factory: RunnerFactory,
        fleet: Membership,
        redactor: SecretRedactor | None = None,
    ) -> None:
        self.store = store
        self.fleet = fleet
        self._settings = settings
        self._runner_factory = runner_factory
        self._redactor = redactor or SecretRedactor()
        self.lock = asyncio.Lock()  # serialises state changes made here
        self.changes = 0  # state changes made here: a round read before one is stale
        self.runners: dict[str, TaskRunner] = {}
        self.runner_specs: dict[str, TaskSpec] = {}  # the spec each runner runs
        self.fences: dict[str, Fence] = {}  # the fence (and lease) of each runner
        self.states: dict[str, TaskState] = {}
        self.creating: set[str] = set()  # tasks whose create is under way here
        self.owners: dict[str, str] = {}  # task -> the member holding its lease
        # tasks this release can neither read nor run (a newer release's), and why: it takes
        # no lease of theirs and changes nothing of them (``/readyz`` names them)
        self.left_alone: dict[str, str] = {}

    @property
    def redactor(self) -> SecretRedactor:
        return self._redactor

    def remember_state(self, task: TaskRecord) -> None:
        self.states[task.task_id] = task.state
        try:
            secrets = TaskSpec.of(task).secrets()
        except UnreadableSpecError:
            secrets = stored_secrets(task.spec)
        self._redactor.add(*secrets)

    def note_spec_problem(self, task: TaskRecord) -> str:
        """Why this release cannot run ``task`` ("" when it can); said once in the log and
        kept in ``left_alone`` while it lasts."""
        problem = spec_problem(task)
        if not problem:
            self.left_alone.pop(task.task_id, None)
            return ""
        if self.left_alone.get(task.task_id) != problem:
            with log_context(task_id=task.task_id):
                log.warning(
                    "task left alone: %s; a daemon of a release that reads it runs it", problem
                )
        self.left_alone[task.task_id] = problem
        return problem

    async def set_state(
        self,
        task: TaskRecord,
        state: TaskState,
        reason: str,
        lease: Lease | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        """Store a state change; ``lease``: only while this daemon holds the task (a runner's
        failure), a 409 once another member does; ``extra``: the record's new extra.

        A write that came first and left the state as it was (a runner recording a warning in
        the reason until it stops: one stuck on a hung source is abandoned, not stopped) does
        not refuse the change: it is made on the record as read again. A write that changed the
        state (another member's verb) or an ``extra`` computed from the record read is a 409,
        read it again."""
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                updated = await asyncio.to_thread(
                    self.store.update_task,
                    task.task_id,
                    state=state,
                    reason=reason,
                    expected_revision=task.revision,
                    lease=lease,
                    extra=extra,
                )
                break
            except TaskNotFoundError as exc:
                raise NotFoundError(f"task {task.task_id} not found") from exc
            except ConcurrentUpdateError as exc:
                fresh = await asyncio.to_thread(self.store.get_task, task.task_id)
                if fresh is None:
                    raise NotFoundError(f"task {task.task_id} not found") from exc
                if (
                    fresh.state is not task.state
                    or extra is not None
                    or attempt + 1 == CONFLICT_ATTEMPTS
                ):
                    raise ConflictError(str(exc)) from exc
                task = fresh
            except FencedError as exc:
                raise ConflictError(f"task {task.task_id} runs on another fleet member") from exc
        self.remember_state(updated)
        with log_context(task_id=task.task_id):
            log.info(
                "task %s -> %s%s", task.state.value, state.value, f": {reason}" if reason else ""
            )
        await asyncio.to_thread(
            state_history.record,
            self.store,
            task.task_id,
            kind="state",
            to=state.value,
            reason=reason,
            by=self.fleet.member_id,
            **{"from": task.state.value},
        )
        return updated

    def install_fence(self, task_id: str, lease: Lease) -> Fence:
        fence = Fence(f"the runner of task {task_id}", lease, self.fleet.clock)
        self.fences[task_id] = fence
        self.owners[task_id] = lease.owner
        return fence

    async def launch(self, task: TaskRecord) -> TaskRecord:
        """Take the task's lease, fix where a task without positions starts (a 503, and no
        change, when the source cannot be read), then set it Running and start its runner
        here. A task whose secrets this daemon cannot decrypt is refused (409) and stays as
        it is. When another member still holds the lease (it has not yet stopped after a
        pause), the task is set Running and that member runs it."""
        self.changes += 1
        lease = await self.take_lease(task)
        if lease is None:
            return await self.set_state(task, TaskState.RUNNING, "")
        fence = self.install_fence(task.task_id, lease)
        try:
            runner = await self.prepared_runner(task, fence, "started")
        except BaseException:
            await self.release_lease(task.task_id)
            raise
        task = await self.set_state(task, TaskState.RUNNING, "")
        started = await self.start_runner(task, runner, lease=lease)
        # a round that read the leases while this one was being taken is stale too (its
        # count was read after the one above): without this it stopped the new runner as
        # "lease lost" (seen right after a create)
        self.changes += 1
        return started

    async def take_lease(self, task: TaskRecord) -> Lease | None:
        """The task's lease for this member (None while another holds it); a 409 when this
        daemon cannot decrypt the task's secrets, which then stays as it is."""
        problem = await asyncio.to_thread(secrets_problem, self.store, task)
        if problem is not None:
            raise ConflictError(f"task {task.task_id} cannot start: {problem}")
        if unrunnable := self.note_spec_problem(task):
            raise ConflictError(f"task {task.task_id} cannot start here: {unrunnable}")
        fleet = self.fleet
        return await asyncio.to_thread(
            self.store.acquire_lease, task.task_id, fleet.member_id, fleet.lease_seconds
        )

    async def prepared_runner(self, task: TaskRecord, fence: Fence, verb: str) -> TaskRunner:
        """The task's runner, writing under ``fence``, once it has fixed where the task starts
        (``_prepare``); on any failure the fence is revoked first: a read that returns late
        writes nothing."""
        runner = self._runner_factory(task, FencedStore(self.store, fence), self.on_runner_failure)
        try:
            await self._prepare_start(task, runner, verb)
        except BaseException:
            fence.revoke()
            raise
        return runner

    async def _prepare_start(self, task: TaskRecord, runner: TaskRunner, verb: str) -> None:
        """Fix where the task starts (``runner.prepare``), within its connect timeout (and a
        little more); a 503 naming the source when it cannot be read, ``verb``: what did not
        happen to the task then ("created", "started")."""
        spec = TaskSpec.of(task)
        bound = spec.connect_timeout
        with log_context(task_id=task.task_id):
            try:
                # the runner keeps to the bound; this guards the answer should it not
                await asyncio.wait_for(runner.prepare(), bound + PREPARE_GUARD)
                return
            except TimeoutError:
                failure: BaseException = SourceUnavailableError(
                    f"the source did not answer within {bound:g} s"
                )
            except (CdcError, MetaStoreError, OSError) as exc:
                failure = exc
            log.warning("start positions not fixed: %s", failure)
        where = ", ".join(
            f"{e.role} {e.label}" for e in source_endpoints(self._settings.source_of(spec))
        )
        raise UnavailableError(
            self._redactor.scrub(
                f"task {task.task_id}: the source ({where}) could not be read to fix where the "
                f"task starts, so it was not {verb}: {type(failure).__name__}: {failure}"
            )
        ) from failure

    async def start_runner(
        self, task: TaskRecord, runner: TaskRunner | None = None, *, lease: Lease
    ) -> TaskRecord:
        """Start the runner of a task stored as Running, under ``lease``; a runner that cannot
        start fails it with the reason. A task whose secrets this daemon cannot decrypt stays
        as it is: its lease is given up, for a daemon that can."""
        fence = self.fences.get(task.task_id)
        if fence is None or fence.lease != lease or fence.revoked:
            fence = self.install_fence(task.task_id, lease)
        with log_context(task_id=task.task_id):
            problem = await asyncio.to_thread(secrets_problem, self.store, task)
            if problem is not None:
                log.warning("task not started here, its lease given up: %s", problem)
            if problem is not None or self.note_spec_problem(task):
                await self.release_lease(task.task_id)
                self.owners.pop(task.task_id, None)
                return task
        if runner is None:
            store = FencedStore(self.store, fence)
            runner = self._runner_factory(task, store, self.on_runner_failure)
        with log_context(task_id=task.task_id):
            try:
                await runner.start()
            except Exception as exc:
                log.exception("task runner did not start")
                return await self.fail(task, f"cannot start: {exc}")
        self.runners[task.task_id] = runner
        self.runner_specs[task.task_id] = TaskSpec.of(task)
        return task

    async def fail(self, task: TaskRecord, reason: str) -> TaskRecord:
        """Set a task this daemon holds Failed and give its lease up."""
        fence = self.fences.get(task.task_id)
        try:
            failed = await self.set_state(
                task, TaskState.FAILED, reason, None if fence is None else fence.lease
            )
        finally:
            await self.release_lease(task.task_id)
        return failed

    async def stop_runner(self, task_id: str, runner: TaskRunner) -> None:
        with log_context(task_id=task_id):
            try:
                await runner.stop()
            except Exception:
                log.exception("task runner did not stop cleanly")

    async def stop_local_runner(self, task_id: str, *, revoke: bool) -> None:
        """Stop this daemon's runner of a task; ``revoke``: its lease is lost, so it may not
        write even what it is finishing."""
        runner = self.runners.pop(task_id, None)
        fence = self.fences.pop(task_id, None)
        if revoke and fence is not None:
            fence.revoke()
        if runner is not None:
            with log_context(task_id=task_id):
                log.info(
                    "runner stops on fleet member %s%s",
                    self.fleet.member_id,
                    " (lease lost)" if revoke else "",
                )
            await self.stop_runner(task_id, runner)

    async def release_lease(self, task_id: str) -> None:
        """Give up the lease of a task this daemon no longer runs (its runner stopped)."""
        fence = self.fences.pop(task_id, None)
        if fence is not None and fence.lease is not None:
            try:
                await asyncio.to_thread(self.store.release_lease, fence.lease)
            except MetaStoreError as exc:
                log.warning("lease of task %s not released (it expires): %s", task_id, exc)

    async def on_runner_failure(self, task_id: str, reason: str) -> None:
        async with self.lock:
            self.changes += 1
            runner = self.runners.pop(task_id, None)
            if runner is None:
                return  # already paused, deleted or drained
            task = await asyncio.to_thread(self.store.get_task, task_id)
            if task is not None:
                try:
                    await self.fail(task, reason)
                except (ConflictError, NotFoundError) as exc:
                    with log_context(task_id=task_id):
                        log.warning("runner failure not recorded (%s): %s", exc, reason)
        await self.stop_runner(task_id, runner)
