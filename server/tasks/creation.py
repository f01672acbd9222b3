"""Creating a task (the supervisor's ``create``): admitted, checked against its target, stored
hidden, its start fixed within its connect timeout, then shown in one write.

A task being created is never seen: not by get or list, the REST views, the metrics, the
dashboard or a fleet round (which leaves its lease alone). A create that fails is removed; one
abandoned by a daemon killed mid-way is removed at that daemon's restart or, once its time is
up, by any fleet round, with its positions and state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from metastore import (
    ConcurrentUpdateError,
    Lease,
    MetaStore,
    MetaStoreError,
    TaskExistsError,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)
from metastore.fenced import Fence, FencedStore
from metastore.sealed import secrets_problem
from replicator import RunnerFactory, TaskRunner
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.config.settings import CdcSettings
from replicator.errors import CdcError, SourceUnavailableError
from replicator.pipeline.selection import selection_of, selections_overlap
from replicator.sinks.targets import connect_timeout, is_kafka
from server.errors import ConflictError, NotFoundError, UnavailableError
from server.logs import SecretRedactor, log_context
from server.tasks import state_history
from server.tasks.fleet import Membership
from server.tasks.reachability import source_endpoints
from server.tasks.requests import (
    CreateRequest,
    target_key,
    target_label,
    validate_create,
)
from server.tasks.target_check import check_kafka_reachable

log = logging.getLogger(__name__)
T = TypeVar("T")

# A task being created is stored with this mark in its record's ``extra`` ({"by": the member
# creating it, "until": a time}) until its start is fixed: no view, metric or fleet round sees
# it. A mark whose time has passed belongs to a create whose daemon died: the next fleet round
# (or that daemon's restart) removes the record with its positions and state.
CREATING = "creating"
# seconds past a create's connect timeout before its record counts as abandoned
CREATE_GRACE = 5.0
# seconds past its connect timeout the supervisor waits for a runner's prepare (which keeps
# to the connect timeout by itself) before answering without it
PREPARE_GUARD = 3.0


def _shown(task: TaskRecord) -> dict[str, Any]:
    """The record's extra without the mark of a task being created."""
    return {key: value for key, value in task.extra.items() if key != CREATING}


def secrets_of(spec: dict[str, Any]) -> list[str]:
    """The clear secrets of a task's spec, for the log redactor."""
    connect = spec.get("milvus_connect_param") or {}
    sasl = (spec.get("kafka_connect_param") or {}).get("sasl") or {}
    found = [connect.get("password"), connect.get("token"), sasl.get("password")]
    return [s for s in found if isinstance(s, str)]  # a secret that did not open is a mapping


class TaskCreation:
    """The create path of ``TaskSupervisor`` (server/tasks/supervisor.py), which provides the state
    and the helpers declared here."""

    _store: MetaStore
    _settings: CdcSettings
    _redactor: SecretRedactor
    _lock: asyncio.Lock
    _creating: set[str]  # tasks whose create is under way here
    _changes: int
    _fences: dict[str, Fence]
    _owners: dict[str, str]
    _states: dict[str, TaskState]
    _runner_factory: RunnerFactory
    _target_checker: Callable[[dict[str, Any]], str]
    fleet: Membership

    if TYPE_CHECKING:

        async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

        async def _set_state(
            self,
            task: TaskRecord,
            state: TaskState,
            reason: str,
            lease: Lease | None = None,
            extra: Mapping[str, Any] | None = None,
        ) -> TaskRecord: ...

        async def _start_runner(
            self, task: TaskRecord, runner: TaskRunner | None = None, *, lease: Lease
        ) -> TaskRecord: ...

        async def _release(self, task_id: str) -> None: ...

        def _remember(self, task: TaskRecord) -> None: ...

        async def _on_runner_failure(self, task_id: str, reason: str) -> None: ...

    async def create(self, request: CreateRequest) -> TaskRecord:
        spec = validate_create(request, self._settings)
        task_id = request.task_id or uuid.uuid4().hex
        existing = await self._io(self._store.list_tasks)
        self._check_admission(task_id, spec, existing)
        self._redactor.add(*secrets_of(spec))
        if is_kafka(spec):
            version = await self._io(check_kafka_reachable, spec["kafka_connect_param"])
        else:
            version = await self._io(self._target_checker, spec["milvus_connect_param"])
        log.info("target %s answered, version %s", target_label(spec), version)
        auto_start = not spec["disable_auto_start"]
        async with self._lock:
            # Again under the lock: another create may have been admitted meanwhile.
            self._check_admission(task_id, spec, await self._io(self._store.list_tasks))
            now = time.time()
            record = TaskRecord(
                task_id=task_id,
                state=TaskState.INITIAL,
                reason="starting" if auto_start else "created with disable_auto_start",
                spec=spec,
                created_at=now,
                updated_at=now,
                # until it is shown: see CREATING
                extra={
                    CREATING: {
                        "by": self.fleet.member_id,
                        "until": round(now + connect_timeout(spec) + CREATE_GRACE, 3),
                    }
                },
            )
            try:
                stored = await self._io(self._store.create_task, record)
            except TaskExistsError as exc:
                raise ConflictError(f"task_id: task {task_id} already exists") from exc
            self._creating.add(task_id)
        shown = False
        try:
            await self._io(
                state_history.record,
                self._store,
                task_id,
                kind="state",
                to=stored.state.value,
                reason=stored.reason,
                by=self.fleet.member_id,
                **{"from": None},
            )
            with log_context(task_id=task_id):
                if spec.get("backfill"):
                    job = BackfillJob.new(spec["backfill"]["collections"])
                    await self._io(BackfillState(self._store, task_id).save_job, job)
                    log.info("backfill %s of %s asked", job.job_id, job.requested)
                if auto_start:
                    stored = await self._launch_new(stored)
                else:
                    async with self._lock:
                        stored = await self._show(stored)
                shown = True
                log.info("task created")
        finally:
            self._creating.discard(task_id)
            if not shown:  # whatever stopped it (a 503, the store, a cancelled request)
                await self._forget_created(task_id)
        return stored

    async def _take_lease(self, task: TaskRecord) -> Lease | None:
        """The task's lease for this member (None while another holds it); a 409 when this
        daemon cannot decrypt the task's secrets, which then stays as it is."""
        problem = await self._io(secrets_problem, self._store, task)
        if problem is not None:
            raise ConflictError(f"task {task.task_id} cannot start: {problem}")
        fleet = self.fleet
        return await self._io(
            self._store.acquire_lease, task.task_id, fleet.member_id, fleet.lease_seconds
        )

    async def _launch_new(self, task: TaskRecord) -> TaskRecord:
        """``_launch`` of a task being created: its start is fixed outside the lock (it is
        shown nowhere meanwhile, so no request or fleet round changes it; its lease is left
        alone by the rounds), within its connect timeout; then, under the lock, it is shown,
        Running, in one write, and its runner starts here."""
        lease = await self._take_lease(task)
        fleet = self.fleet
        if lease is None:
            raise UnavailableError(
                f"task {task.task_id} was not created: another fleet member holds its lease"
            )
        # the runner's fence, kept apart until the task is shown (a round would stop a runner
        # of a task it does not see)
        fence = Fence(f"the runner of task {task.task_id}", lease, fleet.clock)
        try:
            runner = await self._prepared_runner(task, fence, "created")
        except BaseException:
            with contextlib.suppress(MetaStoreError):
                await self._io(self._store.release_lease, lease)
            raise
        async with self._lock:
            self._changes += 1
            self._fences[task.task_id] = fence
            self._owners[task.task_id] = lease.owner
            try:
                task = await self._set_state(task, TaskState.RUNNING, "", extra=_shown(task))
            except (ConflictError, NotFoundError) as exc:
                fence.revoke()
                await self._release(task.task_id)
                self._owners.pop(task.task_id, None)
                raise UnavailableError(
                    f"task {task.task_id} was not created: it was removed while its start was "
                    f"fixed ({exc})"
                ) from exc
            started = await self._start_runner(task, runner, lease=lease)
            self._changes += 1  # as in _launch
            return started

    async def _prepared_runner(self, task: TaskRecord, fence: Fence, verb: str) -> TaskRunner:
        """The task's runner, writing under ``fence``, once it has fixed where the task starts
        (``_prepare``); on any failure the fence is revoked first: a read that returns late
        writes nothing."""
        runner = self._runner_factory(
            task, FencedStore(self._store, fence), self._on_runner_failure
        )
        try:
            await self._prepare(task, runner, verb)
        except BaseException:
            fence.revoke()
            raise
        return runner

    async def _prepare(self, task: TaskRecord, runner: TaskRunner, verb: str) -> None:
        """Fix where the task starts (``runner.prepare``), within its connect timeout (and a
        little more); a 503 naming the source when it cannot be read, ``verb``: what did not
        happen to the task then ("created", "started")."""
        bound = connect_timeout(task.spec)
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
            f"{e.role} {e.label}" for e in source_endpoints(self._settings.source_of(task.spec))
        )
        raise UnavailableError(
            self._redactor.scrub(
                f"task {task.task_id}: the source ({where}) could not be read to fix where the "
                f"task starts, so it was not {verb}: {type(failure).__name__}: {failure}"
            )
        ) from failure

    async def _show(self, task: TaskRecord) -> TaskRecord:
        """Show a task created with disable_auto_start (the same state, without the mark)."""
        try:
            shown = await self._io(
                self._store.update_task,
                task.task_id,
                state=task.state,
                reason=task.reason,
                expected_revision=task.revision,
                extra=_shown(task),
            )
        except (TaskNotFoundError, ConcurrentUpdateError) as exc:
            raise UnavailableError(
                f"task {task.task_id} was not created: it was removed meanwhile ({exc})"
            ) from exc
        self._remember(shown)
        return shown

    async def _forget_created(self, task_id: str) -> None:
        """Remove a task whose create did not finish (its positions and state with it), unless
        it was shown already (a request cancelled just after); when the store does not
        answer, a fleet round removes it once its time is up."""
        try:
            task = await self._io(self._store.get_task, task_id)
            if task is not None and CREATING not in task.extra:
                return
            await self._io(self._store.delete_task, task_id)
        except MetaStoreError as exc:
            with log_context(task_id=task_id):
                log.warning("task not created, not removed yet (a fleet round will): %s", exc)
        self._states.pop(task_id, None)
        self._fences.pop(task_id, None)
        self._owners.pop(task_id, None)

    async def _visible(
        self, tasks: list[TaskRecord], *, at_start: bool = False
    ) -> list[TaskRecord]:
        """The tasks that are shown: not those being created. A record whose create was
        abandoned (its time is up, or at start: this member's own, from before a restart) is
        removed, with its positions and state."""
        now = time.time()
        visible = []
        for task in tasks:
            mark = task.extra.get(CREATING)
            if mark is None:
                visible.append(task)
            elif task.task_id not in self._creating and (
                now > float(mark.get("until") or 0)
                or (at_start and mark.get("by") == self.fleet.member_id)
            ):
                await self._remove_abandoned(task, str(mark.get("by")))
        return visible

    async def _remove_abandoned(self, task: TaskRecord, creator: str) -> None:
        try:
            # a compare-and-set first: should its creator still be at work, its own write (of
            # the revision it stored) then fails, and it answers 503 rather than show the task
            await self._io(
                self._store.update_task,
                task.task_id,
                state=task.state,
                reason="its create did not finish",
                expected_revision=task.revision,
            )
            await self._io(self._store.delete_task, task.task_id)
        except (TaskNotFoundError, ConcurrentUpdateError):
            return  # shown or removed meanwhile
        except MetaStoreError as exc:
            log.warning("abandoned create of task %s not removed yet: %s", task.task_id, exc)
            return
        with log_context(task_id=task.task_id):
            log.warning(
                "task removed: its create (on fleet member %s) did not finish, the daemon "
                "stopped while fixing where it starts",
                creator,
            )

    def _check_admission(
        self, task_id: str, spec: dict[str, Any], existing: list[TaskRecord]
    ) -> None:
        if any(t.task_id == task_id for t in existing):
            raise ConflictError(f"task_id: task {task_id} already exists")
        if len(existing) >= self._settings.maxTaskNum:
            raise ConflictError(
                f"the daemon already has {len(existing)} tasks, the limit set by maxTaskNum"
            )
        target = target_key(spec)
        selection = selection_of(spec)
        for other in existing:
            if target_key(dict(other.spec)) != target:
                continue
            if selections_overlap(selection, selection_of(dict(other.spec))):
                raise ConflictError(
                    f"task {other.task_id} already replicates an overlapping set of collections "
                    f"to the target {target_label(spec)}"
                )
