"""The task supervisor: task lifecycle (create, pause, resume, delete) over the metastore, and
one runner per Running task.

State transitions (anything else is a 409 naming the current state)::

    create   -> Running, or Initial with disable_auto_start
    pause    Initial | Running | Failed -> Paused
    resume   Initial | Paused | Failed  -> Running
    delete   any state -> gone (the runner is stopped first)
    runner error        -> Failed, with the runner's reason

State changes are serialised by one lock; every write is compare-and-set on the task's
revision, so a daemon sharing the store with another never overwrites a newer state.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from metastore import (
    ConcurrentUpdateError,
    MetaStore,
    MetaStoreError,
    Position,
    TaskExistsError,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)
from metastore.sealed import secrets_problem
from replicator import RunnerFactory, TaskRunner
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.compare.state import VerifyJob
from replicator.errors import CdcError
from replicator.pipeline.selection import selection_of, selections_overlap
from server.api_models import (
    BackfillRequest,
    CreateRequest,
    VerifyRequest,
    public_view,
    target_identity,
    validate_backfill,
    validate_create,
    validate_verify,
)
from server.errors import ConflictError, NotFoundError, UnavailableError
from server.logs import SecretRedactor, log_context
from server.settings import CdcSettings
from server.verify import VerifyManager

log = logging.getLogger(__name__)
T = TypeVar("T")

PAUSED_BY_USER = "manually paused through the http interface"
TargetChecker = Callable[[dict[str, Any]], str]


class TaskSupervisor:
    def __init__(
        self,
        store: MetaStore,
        settings: CdcSettings,
        runner_factory: RunnerFactory,
        target_checker: TargetChecker,
        redactor: SecretRedactor | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._runner_factory = runner_factory
        self._target_checker = target_checker
        self._redactor = redactor or SecretRedactor()
        self._runners: dict[str, TaskRunner] = {}
        self._states: dict[str, TaskState] = {}
        self._lock = asyncio.Lock()
        self._verify = VerifyManager(store, settings)

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Bring every stored task back in its saved state; start the Running ones."""
        tasks = await self._io(self._store.list_tasks)
        await self._io(self._verify.load, [t.task_id for t in tasks])
        async with self._lock:
            for task in tasks:
                self._remember(task)
                if task.state is TaskState.RUNNING:
                    await self._start_runner(task)
        log.info("supervisor started with %d task(s)", len(tasks))

    async def drain(self, budget: float) -> None:
        """Stop every runner (each saves its positions); states stay as stored, so a restart
        resumes them. Runners still busy after ``budget`` seconds are abandoned."""
        async with self._lock:
            runners = list(self._runners.items())
            self._runners.clear()
        await self._io(self._verify.stop_all)
        if not runners:
            return
        results = await asyncio.wait(
            [asyncio.create_task(self._stop_runner(tid, r)) for tid, r in runners],
            timeout=budget,
        )
        if results[1]:
            log.warning(
                "drain budget of %.1f s spent; %d runner(s) abandoned", budget, len(results[1])
            )

    def state_counts(self) -> dict[TaskState, int]:
        return dict(Counter(self._states.values()))

    def task_states(self) -> dict[str, TaskState]:
        return dict(self._states)

    def progress(self, task_id: str) -> dict[str, Any] | None:
        """The runner's status while it runs, with the task's last verify under ``verify``
        (shown whatever the task's state)."""
        runner = self._runners.get(task_id)
        status = None if runner is None else runner.status()
        verify = self._verify.view(task_id)
        if verify is None:
            return status
        return {**(status or {}), "verify": verify}

    def all_progress(self) -> dict[str, dict[str, Any]]:
        task_ids = {*self._runners, *self._verify.task_ids()}
        return {
            task_id: progress
            for task_id in task_ids
            if (progress := self.progress(task_id)) is not None
        }

    # --- requests ----------------------------------------------------------------------------
    async def create(self, request: CreateRequest) -> TaskRecord:
        spec = validate_create(request, self._settings)
        task_id = request.task_id or uuid.uuid4().hex
        existing = await self._io(self._store.list_tasks)
        self._check_admission(task_id, spec, existing)
        self._redactor.add(*_secrets_of(spec))
        version = await self._io(self._target_checker, spec["milvus_connect_param"])
        log.info("target %s answered, version %s", _target_text(spec), version)
        now = time.time()
        auto_start = not spec["disable_auto_start"]
        record = TaskRecord(
            task_id=task_id,
            state=TaskState.INITIAL,
            reason="starting" if auto_start else "created with disable_auto_start",
            spec=spec,
            created_at=now,
            updated_at=now,
        )
        async with self._lock:
            # Again under the lock: another create may have been admitted meanwhile.
            self._check_admission(task_id, spec, await self._io(self._store.list_tasks))
            try:
                stored = await self._io(self._store.create_task, record)
            except TaskExistsError as exc:
                raise ConflictError(f"task_id: task {task_id} already exists") from exc
            self._remember(stored)
            with log_context(task_id=task_id):
                log.info("task created")
                if spec.get("backfill"):
                    job = BackfillJob.new(spec["backfill"]["collections"])
                    await self._io(BackfillState(self._store, task_id).save_job, job)
                    log.info("backfill %s of %s asked", job.job_id, job.requested)
                if auto_start:
                    try:
                        stored = await self._launch(stored)
                    except UnavailableError:
                        await self._io(self._store.delete_task, task_id)
                        self._states.pop(task_id, None)
                        raise
        return stored

    def _check_admission(
        self, task_id: str, spec: dict[str, Any], existing: list[TaskRecord]
    ) -> None:
        if any(t.task_id == task_id for t in existing):
            raise ConflictError(f"task_id: task {task_id} already exists")
        if len(existing) >= self._settings.maxTaskNum:
            raise ConflictError(
                f"the daemon already has {len(existing)} tasks, the limit set by maxTaskNum"
            )
        target = target_identity(spec["milvus_connect_param"])
        selection = selection_of(spec)
        for other in existing:
            if target_identity(other.spec["milvus_connect_param"]) != target:
                continue
            if selections_overlap(selection, selection_of(dict(other.spec))):
                raise ConflictError(
                    f"task {other.task_id} already replicates an overlapping set of collections "
                    f"to the target {target[0]}:{target[1]}"
                )

    async def get(self, task_id: str) -> TaskRecord:
        task = await self._io(self._store.get_task, task_id)
        if task is None:
            raise NotFoundError(f"task {task_id} not found")
        return task

    async def list(self) -> list[TaskRecord]:
        return await self._io(self._store.list_tasks)

    async def positions(self, task_id: str) -> dict[str, Position]:
        await self.get(task_id)
        return await self._io(self._store.get_positions, task_id)

    async def pause(self, task_id: str) -> TaskRecord:
        async with self._lock:
            task = await self.get(task_id)
            if task.state is TaskState.PAUSED:
                raise ConflictError(f"task {task_id} is already Paused")
            runner = self._runners.pop(task_id, None)
            if runner is not None:
                await self._stop_runner(task_id, runner)
                task = await self.get(task_id)  # a runner may record a warning until it stops
            return await self._set_state(task, TaskState.PAUSED, PAUSED_BY_USER)

    async def resume(self, task_id: str) -> TaskRecord:
        async with self._lock:
            task = await self.get(task_id)
            if task.state is TaskState.RUNNING:
                raise ConflictError(f"task {task_id} is already Running")
            return await self._launch(task)

    async def _launch(self, task: TaskRecord) -> TaskRecord:
        """Fix where a task without positions starts (a 503, and no change, when the source
        cannot be read), then set it Running and start its runner. A task whose secrets this
        daemon cannot decrypt is refused (409) and stays as it is."""
        problem = await self._io(secrets_problem, self._store, task)
        if problem is not None:
            raise ConflictError(f"task {task.task_id} cannot start: {problem}")
        runner = self._runner_factory(task, self._store, self._on_runner_failure)
        with log_context(task_id=task.task_id):
            try:
                await runner.prepare()
            except (CdcError, MetaStoreError, OSError) as exc:
                log.warning("start positions not fixed: %s", exc)
                raise UnavailableError(
                    f"task {task.task_id}: the source could not be read to fix where the task "
                    f"starts, so it was not started: {type(exc).__name__}: {exc}"
                ) from exc
        task = await self._set_state(task, TaskState.RUNNING, "")
        return await self._start_runner(task, runner)

    async def backfill(self, request: BackfillRequest) -> tuple[TaskRecord, str]:
        """Ask for a backfill of a task's collections: a Running task stops its workers (their
        positions are saved), copies, then streams again from those positions; any other
        state runs it at the next resume. 409 while another backfill of the task is under
        way. Returns the task and the backfill's job id."""
        async with self._lock:
            task = await self.get(request.task_id)
            names = validate_backfill(
                request.collections, selection_of(dict(task.spec)), self._settings, "collections"
            )
            state = BackfillState(self._store, task.task_id)
            current = await self._io(state.job)
            if current is not None and current.active:
                raise ConflictError(
                    f"task {task.task_id}: backfill {current.job_id} is {current.state}; wait for "
                    "it to finish"
                )
            job = BackfillJob.new(names)
            await self._io(state.save_job, job)
            with log_context(task_id=task.task_id):
                log.info("backfill %s of %s asked", job.job_id, job.requested)
            runner = self._runners.pop(task.task_id, None)
            if runner is not None:
                await self._stop_runner(task.task_id, runner)
                task = await self.get(task.task_id)
                if task.state is TaskState.RUNNING:
                    task = await self._start_runner(task)
            return task, job.job_id

    def verify_job(self, task_id: str) -> VerifyJob | None:
        """The task's last verify job, as the daemon knows it."""
        return self._verify.job(task_id)

    async def verify(
        self, request: VerifyRequest, sample: float = 1.0, scheduled: bool = False
    ) -> tuple[TaskRecord, str]:
        """Start a verify job of a task's collections (in any state: a task that does not run
        applies nothing, so its differences cannot settle and ranges end unsettled). 409 while
        another verify of the task runs. Returns the task and the job id."""
        async with self._lock:
            task = await self.get(request.task_id)
            names = validate_verify(
                request.collections, selection_of(dict(task.spec)), self._settings
            )
            if self._verify.running(task.task_id):
                current = self._verify.job(task.task_id)
                raise ConflictError(
                    f"task {task.task_id}: verify {current.job_id if current else ''} is "
                    "running; wait for it to finish"
                )
            job = VerifyJob.new(names, request.repair, sample, scheduled)
            await self._io(self._verify.start, task, job)
            with log_context(task_id=task.task_id):
                log.info(
                    "verify %s of %s asked%s%s",
                    job.job_id,
                    job.requested,
                    " with repair" if job.repair else "",
                    f" (scheduled, {sample:.0%} of the ranges)" if scheduled else "",
                )
            return task, job.job_id

    async def delete(self, task_id: str, ignore_not_found: bool = False) -> None:
        async with self._lock:
            await self._io(self._verify.forget, task_id)
            runner = self._runners.pop(task_id, None)
            if runner is not None:
                await self._stop_runner(task_id, runner)
            removed = await self._io(self._store.delete_task, task_id)
            self._states.pop(task_id, None)
        if not removed and not ignore_not_found:
            raise NotFoundError(f"task {task_id} not found")
        if removed:
            with log_context(task_id=task_id):
                log.info("task deleted")

    # --- internals ---------------------------------------------------------------------------
    def _remember(self, task: TaskRecord) -> None:
        self._states[task.task_id] = task.state
        self._redactor.add(*_secrets_of(dict(task.spec)))

    async def _set_state(self, task: TaskRecord, state: TaskState, reason: str) -> TaskRecord:
        try:
            updated = await self._io(
                self._store.update_task,
                task.task_id,
                state=state,
                reason=reason,
                expected_revision=task.revision,
            )
        except TaskNotFoundError as exc:
            raise NotFoundError(f"task {task.task_id} not found") from exc
        except ConcurrentUpdateError as exc:
            raise ConflictError(str(exc)) from exc
        self._remember(updated)
        with log_context(task_id=task.task_id):
            log.info(
                "task %s -> %s%s", task.state.value, state.value, f": {reason}" if reason else ""
            )
        return updated

    async def _start_runner(self, task: TaskRecord, runner: TaskRunner | None = None) -> TaskRecord:
        """Start the runner of a task stored as Running; a runner that cannot start, or a
        task whose secrets cannot be decrypted, fails it with the reason."""
        with log_context(task_id=task.task_id):
            problem = await self._io(secrets_problem, self._store, task)
            if problem is not None:
                log.error("task not started: %s", problem)
                # not a transient reason (retry.transientReasons): a retry cannot bring the key
                return await self._set_state(task, TaskState.FAILED, f"not started: {problem}")
        runner = runner or self._runner_factory(task, self._store, self._on_runner_failure)
        with log_context(task_id=task.task_id):
            try:
                await runner.start()
            except Exception as exc:
                log.exception("task runner did not start")
                return await self._set_state(task, TaskState.FAILED, f"cannot start: {exc}")
        self._runners[task.task_id] = runner
        return task

    async def _stop_runner(self, task_id: str, runner: TaskRunner) -> None:
        with log_context(task_id=task_id):
            try:
                await runner.stop()
            except Exception:
                log.exception("task runner did not stop cleanly")

    async def _on_runner_failure(self, task_id: str, reason: str) -> None:
        async with self._lock:
            runner = self._runners.pop(task_id, None)
            if runner is None:
                return  # already paused, deleted or drained
            task = await self._io(self._store.get_task, task_id)
            if task is not None:
                await self._set_state(task, TaskState.FAILED, reason)
        await self._stop_runner(task_id, runner)


def _secrets_of(spec: dict[str, Any]) -> list[str]:
    connect = spec.get("milvus_connect_param", {})
    found = [connect.get("password"), connect.get("token")]
    return [s for s in found if isinstance(s, str)]  # a secret that did not open is a mapping


def _target_text(spec: dict[str, Any]) -> str:
    host, port = target_identity(spec["milvus_connect_param"])
    return f"{host}:{port}"


def task_view(task: TaskRecord, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task as get and list show it (the Go tool's fields first; never a secret).
    ``progress`` is the runner's status while it runs (rows, bytes, lag, channels)."""
    view = public_view(dict(task.spec))
    return {
        "task_id": task.task_id,
        **view,
        "state": task.state.value,
        "reason": task.reason,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "progress": progress,
    }
