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
from typing import Any

from metastore import (
    ConcurrentUpdateError,
    MetaStoreError,
    Position,
    TaskExistsError,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)
from metastore.fenced import Fence
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec, UnreadableSpecError
from replicator.pipeline.selection import selections_overlap
from server.errors import ConflictError, NotFoundError, UnavailableError
from server.logs import log_context
from server.tasks import state_history
from server.tasks.local_runs import LocalRuns
from server.tasks.requests import CreateRequest
from server.tasks.spec import validate_create
from server.tasks.target_check import check_kafka_reachable, check_source_milvus

log = logging.getLogger(__name__)

# A task being created is stored with this mark in its record's ``extra`` ({"by": the member
# creating it, "until": a time}) until its start is fixed: no view, metric or fleet round sees
# it. A mark whose time has passed belongs to a create whose daemon died: the next fleet round
# (or that daemon's restart) removes the record with its positions and state.
CREATING = "creating"
# seconds past a create's connect timeout before its record counts as abandoned
CREATE_GRACE = 5.0

TargetChecker = Callable[[dict[str, Any]], str]


def _shown(task: TaskRecord) -> dict[str, Any]:
    """The record's extra without the mark of a task being created."""
    return {key: value for key, value in task.extra.items() if key != CREATING}


class TaskCreation:
    """Creates tasks (``POST /cdc`` create) on the daemon's :class:`LocalRuns`, and tells which
    stored tasks are shown (not those being created, nor abandoned creates)."""

    def __init__(
        self, runs: LocalRuns, settings: CdcSettings, target_checker: TargetChecker
    ) -> None:
        self._runs = runs
        self._store = runs.store
        self._settings = settings
        self.target_checker = target_checker
        self.fleet = runs.fleet

    async def check_reachable(self, request: CreateRequest) -> None:
        """What ``create`` asks of the request's ends before it stores anything (the target
        answers; a backfill's source Milvus answers), asked on its own: a job that must undo
        something to make room for the task (a failback re-creating the flow's reverse task)
        asks first, so that a target still down changes nothing."""
        await self._check_reachable(validate_create(request, self._settings))

    async def _check_reachable(self, spec: TaskSpec) -> None:
        self._runs.redactor.add(*spec.secrets())
        if spec.is_kafka:
            version = await asyncio.to_thread(check_kafka_reachable, spec.target_param)
        else:
            version = await asyncio.to_thread(self.target_checker, spec.target_param)
        log.info("target %s answered, version %s", spec.target_label(), version)
        if spec.backfill_collections:  # its Spark executors read the source Milvus
            source = self._settings.source_of(spec)
            key = f"clusters.{spec.source_cluster}" if spec.source_cluster else "sourceConfig"
            await asyncio.to_thread(check_source_milvus, source, key, spec.connect_timeout)

    async def create(
        self, request: CreateRequest, start_positions: Mapping[str, Position] | None = None
    ) -> TaskRecord:
        """Create a task (``POST /cdc`` create). ``start_positions``: where its channels start
        (by channel; a switchover's reverse flow starts where the old target's WAL stood when
        the original stopped writing to it), saved before its start is fixed; channels it does
        not name start as the request says."""
        spec = validate_create(request, self._settings)
        task_id = request.task_id or uuid.uuid4().hex
        existing = await asyncio.to_thread(self._store.list_tasks)
        self._check_admission(task_id, spec, existing)
        await self._check_reachable(spec)
        auto_start = not spec.disable_auto_start
        async with self._runs.lock:
            # Again under the lock: another create may have been admitted meanwhile.
            self._check_admission(task_id, spec, await asyncio.to_thread(self._store.list_tasks))
            now = time.time()
            record = TaskRecord(
                task_id=task_id,
                state=TaskState.INITIAL,
                reason="starting" if auto_start else "created with disable_auto_start",
                spec=spec.to_stored(),
                created_at=now,
                updated_at=now,
                # until it is shown: see CREATING
                extra={
                    CREATING: {
                        "by": self.fleet.member_id,
                        "until": round(now + spec.connect_timeout + CREATE_GRACE, 3),
                    }
                },
            )
            try:
                stored = await asyncio.to_thread(self._store.create_task, record)
            except TaskExistsError as exc:
                raise ConflictError(f"task_id: task {task_id} already exists") from exc
            self._runs.creating.add(task_id)
        shown = False
        try:
            await asyncio.to_thread(
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
                for position in (start_positions or {}).values():
                    await asyncio.to_thread(self._store.save_position, task_id, position, None)
                if spec.backfill_collections:
                    job = BackfillJob.new(list(spec.backfill_collections))
                    await asyncio.to_thread(BackfillState(self._store, task_id).save_job, job)
                    log.info("backfill %s of %s asked", job.job_id, job.requested)
                if auto_start:
                    stored = await self._launch_new(stored)
                else:
                    async with self._runs.lock:
                        stored = await self._show(stored)
                shown = True
                log.info("task created")
        finally:
            self._runs.creating.discard(task_id)
            if not shown:  # whatever stopped it (a 503, the store, a cancelled request)
                await self._forget_created(task_id)
        return stored

    async def _launch_new(self, task: TaskRecord) -> TaskRecord:
        """``_launch`` of a task being created: its start is fixed outside the lock (it is
        shown nowhere meanwhile, so no request or fleet round changes it; its lease is left
        alone by the rounds), within its connect timeout; then, under the lock, it is shown,
        Running, in one write, and its runner starts here."""
        lease = await self._runs.take_lease(task)
        fleet = self.fleet
        if lease is None:
            raise UnavailableError(
                f"task {task.task_id} was not created: another fleet member holds its lease"
            )
        # the runner's fence, kept apart until the task is shown (a round would stop a runner
        # of a task it does not see)
        fence = Fence(f"the runner of task {task.task_id}", lease, fleet.clock)
        try:
            runner = await self._runs.prepared_runner(task, fence, "created")
        except BaseException:
            with contextlib.suppress(MetaStoreError):
                await asyncio.to_thread(self._store.release_lease, lease)
            raise
        async with self._runs.lock:
            self._runs.changes += 1
            self._runs.fences[task.task_id] = fence
            self._runs.owners[task.task_id] = lease.owner
            try:
                task = await self._runs.set_state(task, TaskState.RUNNING, "", extra=_shown(task))
            except (ConflictError, NotFoundError) as exc:
                fence.revoke()
                await self._runs.release_lease(task.task_id)
                self._runs.owners.pop(task.task_id, None)
                raise UnavailableError(
                    f"task {task.task_id} was not created: it was removed while its start was "
                    f"fixed ({exc})"
                ) from exc
            started = await self._runs.start_runner(task, runner, lease=lease)
            self._runs.changes += 1  # as in _launch
            return started

    async def _show(self, task: TaskRecord) -> TaskRecord:
        """Show a task created with disable_auto_start (the same state, without the mark)."""
        try:
            shown = await asyncio.to_thread(
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
        self._runs.remember_state(shown)
        return shown

    async def _forget_created(self, task_id: str) -> None:
        """Remove a task whose create did not finish (its positions and state with it), unless
        it was shown already (a request cancelled just after); when the store does not
        answer, a fleet round removes it once its time is up."""
        try:
            task = await asyncio.to_thread(self._store.get_task, task_id)
            if task is not None and CREATING not in task.extra:
                return
            await asyncio.to_thread(self._store.delete_task, task_id)
        except MetaStoreError as exc:
            with log_context(task_id=task_id):
                log.warning("task not created, not removed yet (a fleet round will): %s", exc)
        self._runs.states.pop(task_id, None)
        self._runs.fences.pop(task_id, None)
        self._runs.owners.pop(task_id, None)

    async def visible_tasks(
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
            elif task.task_id not in self._runs.creating and (
                now > float(mark.get("until") or 0)
                or (at_start and mark.get("by") == self.fleet.member_id)
            ):
                await self._remove_abandoned(task, str(mark.get("by")))
        return visible

    async def _remove_abandoned(self, task: TaskRecord, creator: str) -> None:
        try:
            # a compare-and-set first: should its creator still be at work, its own write (of
            # the revision it stored) then fails, and it answers 503 rather than show the task
            await asyncio.to_thread(
                self._store.update_task,
                task.task_id,
                state=task.state,
                reason="its create did not finish",
                expected_revision=task.revision,
            )
            await asyncio.to_thread(self._store.delete_task, task.task_id)
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

    def _check_admission(self, task_id: str, spec: TaskSpec, existing: list[TaskRecord]) -> None:
        """Refuse (409) a task whose id is taken, past ``maxTaskNum``, or replicating a
        collection another task replicates to the same target."""
        if any(t.task_id == task_id for t in existing):
            raise ConflictError(f"task_id: task {task_id} already exists")
        if len(existing) >= self._settings.maxTaskNum:
            raise ConflictError(
                f"the daemon already has {len(existing)} tasks, the limit set by maxTaskNum"
            )
        target = spec.target_key()
        for other in existing:
            try:
                other_spec = TaskSpec.of(other)
            except UnreadableSpecError:
                continue  # a newer release's task: its own release checks what it overlaps
            if other_spec.target_key() != target:
                continue
            if selections_overlap(spec.selection, other_spec.selection):
                raise ConflictError(
                    f"task {other.task_id} already replicates an overlapping set of collections "
                    f"to the target {spec.target_label()}"
                )
