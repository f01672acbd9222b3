"""The task supervisor: task lifecycle (create, pause, resume, delete, backfill, verify) over
the metastore, and one runner per Running task held here.

State transitions (anything else is a 409 naming the current state)::

    create   -> Running, or Initial with disable_auto_start
    pause    Initial | Running | Failed -> Paused
    resume   Initial | Paused | Failed  -> Running
    delete   any state -> gone (the runner is stopped first)
    runner error        -> Failed, with the runner's reason

The supervisor is composed of collaborators it is given or builds from its arguments:

- :class:`~server.tasks.local_runs.LocalRuns`: the runners here, their fences, the lock that
  serialises state changes and the compare-and-set state writes;
- :class:`~server.tasks.creation.TaskCreation`: the create path and which tasks are shown;
- :class:`~server.tasks.fleet_rounds.FleetRounds`: heartbeats and lease rounds (which daemon
  runs a Running task);
- :class:`~server.tasks.verbs.TaskVerbs`: pause, resume (new target credentials), delete, with
  the verb checks disaster recovery adds;
- :class:`~server.tasks.verify.VerifyManager`: verify jobs.

A request may reach any daemon: pause and delete change the store, and the task's owner stops
its runner at its next round (pause waits for that, a few seconds at most). A daemon whose key
ring lacks a key the store's secrets are sealed with is not ready (``missing_keys``, shown by
``/readyz``), takes no task and changes none it cannot decrypt.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from metastore import MetaStore, Position, TaskRecord, TaskState
from metastore.sealed import MissingKeys
from replicator import RunnerFactory, TaskRunner
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.compare.state import VerifyJob
from replicator.config.settings import DEFAULT_SOURCE, CdcSettings
from replicator.config.task_spec import TaskSpec, UnreadableSpecError, without_secrets
from replicator.pipeline.timings import TaskTimings
from server.errors import BadRequestError, ConflictError
from server.logs import SecretRedactor, log_context
from server.tasks.cluster_target import as_configured
from server.tasks.creation import CREATING, TargetChecker, TaskCreation
from server.tasks.fleet import Membership
from server.tasks.fleet_rounds import FleetRounds, KeyCheck
from server.tasks.local_runs import LocalRuns
from server.tasks.requests import (
    BackfillRequest,
    CreateRequest,
    CredentialsUpdate,
    VerifyRequest,
)
from server.tasks.spec import validate_backfill, validate_verify
from server.tasks.verbs import OWNER_STOP_WAIT, PAUSED_BY_USER, TaskVerbs, VerbCheck
from server.tasks.verify import VerifyManager

log = logging.getLogger(__name__)


class ProgressSource(Protocol):
    """Jobs of other parts (disaster recovery) shown in a task's ``progress``."""

    def views(self, task_id: str) -> dict[str, Any]:
        """The task's job views by key (``switchover``, ``failover``, ...)."""

    def task_ids(self) -> list[str]:
        """The tasks it has a view of."""


class TaskSupervisor:
    """Task lifecycle over the metastore, and the runners of the tasks this daemon holds."""

    def __init__(
        self,
        store: MetaStore,
        settings: CdcSettings,
        runner_factory: RunnerFactory,
        target_checker: TargetChecker,
        redactor: SecretRedactor | None = None,
        key_check: KeyCheck | None = None,
    ) -> None:
        """``key_check``: the keys this daemon's ring lacks (``SealedMetaStore.missing_keys``)."""
        self._store = store
        self._settings = settings
        self.fleet = Membership(settings.fleet, settings.host_port[1])
        self.runs = LocalRuns(store, settings, runner_factory, self.fleet, redactor)
        self.creation = TaskCreation(self.runs, settings, target_checker)
        self.rounds = FleetRounds(self.runs, settings, self.creation.visible_tasks, key_check)
        self._verify = VerifyManager(store, settings, self.live_applied)
        self._progress_sources: list[ProgressSource] = []
        self.verbs = TaskVerbs(store, self.runs, self.creation, self._verify, self.fleet)

    def add_progress_source(self, source: ProgressSource) -> None:
        """Show ``source``'s jobs in the progress of the tasks it names (get, list, metrics)."""
        self._progress_sources.append(source)

    def add_verb_check(self, check: VerbCheck) -> None:
        """Ask ``check`` before a task is paused, resumed or deleted; it raises (an ApiError)
        to refuse."""
        self.verbs.add_verb_check(check)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the fleet and take this daemon's share of the Running tasks (all of them when
        it is alone), then keep doing so every ``fleet.checkSeconds``."""
        stored = await asyncio.to_thread(self._store.list_tasks)
        tasks = await self.creation.visible_tasks(stored, at_start=True)
        await asyncio.to_thread(self._verify.load, [t.task_id for t in tasks])
        for task in tasks:
            self.runs.remember_state(task)
        # before the fleet hears of this member
        self.rounds.note_missing_keys(await asyncio.to_thread(self.rounds.read_missing_keys))
        await self.rounds.renew()
        await self.rounds.reconcile()
        self.rounds.start_loops()
        log.info(
            "supervisor started with %d task(s); fleet member %s runs %d",
            len(tasks),
            self.fleet.member_id,
            len(self.runs.runners),
        )

    async def drain(self, budget: float) -> None:
        """Stop every runner (each saves its positions) and leave the fleet, so that other
        daemons take the tasks at once; states stay as stored, so a restart resumes them.
        Runners still busy after ``budget`` seconds are abandoned."""
        await self.rounds.stop_loops()
        async with self.runs.lock:
            runners = list(self.runs.runners.items())
            self.runs.runners.clear()
        await asyncio.to_thread(self._verify.stop_all)
        if runners:
            results = await asyncio.wait(
                [asyncio.create_task(self.runs.stop_runner(tid, r)) for tid, r in runners],
                timeout=budget,
            )
            if results[1]:
                log.warning(
                    "drain budget of %.1f s spent; %d runner(s) abandoned", budget, len(results[1])
                )
        for fence in self.runs.fences.values():
            fence.revoke()  # an abandoned runner writes nothing after the leases are dropped
        self.runs.fences.clear()
        await self.rounds.leave()

    # --- the fleet, through its rounds ---------------------------------------------------------
    @property
    def missing_keys(self) -> MissingKeys | None:
        """What this daemon's key ring lacks, as of the last round (None: nothing)."""
        return self.rounds.missing_keys

    @property
    def format_problem(self) -> str:
        """Why the store's format is past what this release reads, as of the last heartbeat."""
        return self.rounds.format_problem

    def left_alone(self) -> dict[str, str]:
        """The tasks this release can neither read nor run (a newer release's), and why: no
        lease of theirs is taken and none of them is changed."""
        return dict(self.runs.left_alone)

    async def renew(self) -> None:
        """One heartbeat (:meth:`FleetRounds.renew`)."""
        await self.rounds.renew()

    async def reconcile(self) -> None:
        """One fleet round (:meth:`FleetRounds.reconcile`)."""
        await self.rounds.reconcile()

    def fleet_view(self) -> dict[str, Any]:
        """This daemon and the fleet as of the last round (:meth:`FleetRounds.fleet_view`)."""
        return self.rounds.fleet_view()

    async def owners(self) -> dict[str, str]:
        """The member holding each task's lease (:meth:`FleetRounds.owners`)."""
        return await self.rounds.owners()

    # --- requests ----------------------------------------------------------------------------
    async def create(
        self, request: CreateRequest, start_positions: Mapping[str, Position] | None = None
    ) -> TaskRecord:
        """Create a task (:meth:`TaskCreation.create`)."""
        return await self.creation.create(request, start_positions)

    async def check_reachable(self, request: CreateRequest) -> None:
        """Whether the ends a create of ``request`` needs answer
        (:meth:`TaskCreation.check_reachable`)."""
        await self.creation.check_reachable(request)

    def runners_here(self) -> list[tuple[str, TaskSpec, TaskRunner]]:
        """(task id, spec, runner) of every task running on this daemon now (a named target
        cluster's Milvus as configured now)."""
        for task_id in set(self.runs.runner_specs) - set(self.runs.runners):
            self.runs.runner_specs.pop(task_id, None)
        return [
            (task_id, as_configured(self.runs.runner_specs[task_id], self._settings), runner)
            for task_id, runner in list(self.runs.runners.items())
            if task_id in self.runs.runner_specs
        ]

    def live_applied(self, task_id: str) -> dict[str, int] | None:
        """The source time each pchannel of a task running here has applied (its runner's
        figures, fresher than the saved positions); None when it runs elsewhere or not at
        all."""
        runner = self.runs.runners.get(task_id)
        if runner is None:
            return None
        return runner.applied_ticks()

    def state_counts(self) -> dict[TaskState, int]:
        return dict(Counter(self.runs.states.values()))

    def task_states(self) -> dict[str, TaskState]:
        return dict(self.runs.states)

    def progress(self, task_id: str, *, fleet: bool = True) -> dict[str, Any] | None:
        """The runner's status while it runs, with the task's last verify under ``verify``
        (shown whatever the task's state). ``fleet``: a task another member runs shows the
        summary that member published with its last heartbeat."""
        runner = self.runs.runners.get(task_id)
        status: dict[str, Any] | None
        if runner is not None:
            status = runner.status()
        else:
            status = self.rounds.remote.get(task_id) if fleet else None
        verify = self._verify.view(task_id)
        jobs: dict[str, Any] = {}
        for source in self._progress_sources:
            jobs.update(source.views(task_id))
        if verify is None and not jobs:
            return status
        if verify is not None:
            jobs["verify"] = verify
        return {**(status or {}), **jobs}

    def all_progress(self, *, fleet: bool = False) -> dict[str, dict[str, Any]]:
        """The progress of the tasks this daemon runs or verifies (its metrics and samples);
        ``fleet``: also the summaries other members publish of theirs (get and list)."""
        jobs = [task_id for source in self._progress_sources for task_id in source.task_ids()]
        task_ids = {
            *self.runs.runners,
            *self._verify.task_ids(),
            *jobs,
            *(self.rounds.remote if fleet else ()),
        }
        return {
            task_id: progress
            for task_id in task_ids
            if (progress := self.progress(task_id, fleet=fleet)) is not None
        }

    async def get(self, task_id: str) -> TaskRecord:
        """A shown task; 404 when there is none (:meth:`TaskVerbs.get`)."""
        return await self.verbs.get(task_id)

    async def list(self) -> list[TaskRecord]:
        return [
            t for t in await asyncio.to_thread(self._store.list_tasks) if CREATING not in t.extra
        ]

    async def positions(self, task_id: str) -> dict[str, Position]:
        await self.get(task_id)
        return await asyncio.to_thread(self._store.get_positions, task_id)

    @property
    def store(self) -> MetaStore:
        return self._store

    def runner_of(self, task_id: str) -> TaskRunner | None:
        """The runner of a task running here."""
        return self.runs.runners.get(task_id)

    def timings(self) -> dict[str, TaskTimings]:
        """Where the lag of each task running here goes (replicator/pipeline/timings.py);
        runners that keep none (test doubles) are left out."""
        found = {}
        for task_id, runner in list(self.runs.runners.items()):
            timings = getattr(runner, "timings", None)
            if isinstance(timings, TaskTimings):
                found[task_id] = timings
        return found

    async def live_members(self) -> set[str]:
        """The fleet members alive now (this daemon included)."""
        return await self.verbs.live_members()

    async def set_reason(self, task_id: str, reason: str) -> TaskRecord:
        """Change a task's reason, its state kept (:meth:`TaskVerbs.set_reason`)."""
        return await self.verbs.set_reason(task_id, reason)

    async def pause(
        self,
        task_id: str,
        reason: str = PAUSED_BY_USER,
        stop_wait: float = OWNER_STOP_WAIT,
        job: str = "",
    ) -> TaskRecord:
        """Pause a task wherever it runs (:meth:`TaskVerbs.pause`)."""
        return await self.verbs.pause(task_id, reason, stop_wait, job)

    async def runner_stopped(self, task_id: str) -> bool:
        """Whether no live fleet member runs the task (:meth:`TaskVerbs.runner_stopped`)."""
        return await self.verbs.runner_stopped(task_id)

    async def resume(
        self, task_id: str, credentials: CredentialsUpdate | None = None, job: str = ""
    ) -> TaskRecord:
        """Run a task again from its positions (:meth:`TaskVerbs.resume`)."""
        return await self.verbs.resume(task_id, credentials, job)

    async def backfill(self, request: BackfillRequest) -> tuple[TaskRecord, str]:
        """Ask for a backfill of a task's collections: a Running task stops its workers (their
        positions are saved), copies, then streams again from those positions; any other
        state runs it at the next resume. 409 while another backfill of the task is under
        way. Returns the task and the backfill's job id."""
        async with self.runs.lock:
            task = await self.get(request.task_id)
            owner = self.runs.owners.get(task.task_id)
            if task.task_id not in self.runs.runners and owner not in (None, self.fleet.member_id):
                raise ConflictError(
                    f"task {task.task_id} runs on fleet member {owner}: ask that daemon for "
                    "the backfill (or pause the task, ask here, and resume it)"
                )
            spec = TaskSpec.of(task)
            if spec.is_kafka:
                raise BadRequestError(f"task {task.task_id}: a Kafka target takes no backfill")
            names = validate_backfill(
                request.collections,
                spec.selection,
                self._settings,
                "collections",
                spec.source_cluster,
            )
            state = BackfillState(self._store, task.task_id)
            current = await asyncio.to_thread(state.job)
            if current is not None and current.active:
                raise ConflictError(
                    f"task {task.task_id}: backfill {current.job_id} is {current.state}; wait for "
                    "it to finish"
                )
            job = BackfillJob.new(names)
            await asyncio.to_thread(state.save_job, job)
            with log_context(task_id=task.task_id):
                log.info("backfill %s of %s asked", job.job_id, job.requested)
            self.runs.changes += 1
            runner = self.runs.runners.pop(task.task_id, None)
            if runner is not None:
                await self.runs.stop_runner(task.task_id, runner)
                task = await self.get(task.task_id)
                fence = self.runs.fences.get(task.task_id)
                # a lapsed lease is left to the next round, which reads whether it is held
                if task.state is TaskState.RUNNING and fence and fence.lease and not fence.revoked:
                    task = await self.runs.start_runner(task, lease=fence.lease)
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
        async with self.runs.lock:
            task = await self.get(request.task_id)
            spec = TaskSpec.of(task)
            if spec.is_kafka:
                raise BadRequestError(
                    f"task {task.task_id}: a Kafka target cannot be verified against the source"
                )
            names = validate_verify(
                request.collections, spec.selection, self._settings, spec.source_cluster
            )
            if self._verify.running(task.task_id):
                current = self._verify.job(task.task_id)
                raise ConflictError(
                    f"task {task.task_id}: verify {current.job_id if current else ''} is "
                    "running; wait for it to finish"
                )
            job = VerifyJob.new(names, request.repair, sample, scheduled)
            await asyncio.to_thread(self._verify.start, task, job)
            with log_context(task_id=task.task_id):
                log.info(
                    "verify %s of %s asked%s%s",
                    job.job_id,
                    job.requested,
                    " with repair" if job.repair else "",
                    f" (scheduled, {sample:.0%} of the ranges)" if scheduled else "",
                )
            return task, job.job_id

    async def delete(self, task_id: str, ignore_not_found: bool = False, job: str = "") -> None:
        """Delete a task, its runner stopped first (:meth:`TaskVerbs.delete`)."""
        await self.verbs.delete(task_id, ignore_not_found, job)


def task_view(
    task: TaskRecord, progress: dict[str, Any] | None = None, owner: str | None = None
) -> dict[str, Any]:
    """A task as get and list show it (the Go tool's fields first; never a secret).
    ``progress`` is the runner's status while it runs (rows, bytes, lag, channels); ``owner``
    the fleet member running it (None when no daemon holds it)."""
    try:
        view = TaskSpec.of(task).public_view()
    except UnreadableSpecError:  # a newer release's task: shown as stored, without secrets
        view = without_secrets(task.spec)
    return {
        "task_id": task.task_id,
        **view,
        # both ends by name (README "Disaster recovery"); target_cluster null: an address
        "source_cluster": view.get("source_cluster") or DEFAULT_SOURCE,
        "target_cluster": view.get("target_cluster"),
        "state": task.state.value,
        "reason": task.reason,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "owner": owner,
        "progress": progress,
    }
