"""Disaster-recovery requests (switchover, failover, failback) and the switchover jobs a
stopped daemon left behind (README "Disaster recovery").

Every verb claims its task's flow in the cluster pair's record (:mod:`pair`, :mod:`pair_rules`):
one job per flow, and only where the verb applies. A switchover runs here as a job
(:mod:`switchover`) on the daemon that runs the task; its record is the task's ``dr/switchover``
state. Every ``recover`` round (at start, then on the scheduler) takes over a job that is not
finished and whose claim is not held by a live daemon (its daemon died, restarted, or stalled
past its claim): it goes forward past the point of no return, else it is rolled back. Each task's
records are taken up apart: one that does not read (another release's) is shown, never stops
the round. Then the fences no running job holds are lifted (:mod:`fence_owners`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any, Literal

from pydantic import Field

from metastore import MetaStoreError, TaskRecord, TaskState
from replicator.config.settings import DEFAULT_SOURCE, CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import to_seconds
from server.dr.claims import ClaimLostError
from server.dr.failbacks import FailbackRequest, Failbacks
from server.dr.failover import FailoverRequest, run_failover, saved_failover
from server.dr.flows import injected_fault
from server.dr.pair import FAILED_OVER
from server.dr.pair_keeper import PairKeeper
from server.dr.record import (
    DR_PREFIX,
    FAILBACK_KEY,
    FAILOVER_KEY,
    SWITCHOVER_KEY,
    SwitchoverJob,
    load_job,
    save_job,
)
from server.dr.stale_check import check_again, check_left, check_stale_writes
from server.dr.stale_watch import (
    WATCH_KEY,
    WatchState,
)
from server.dr.switchover import SwitchoverRun
from server.dr.takeover import save_taken_over, switchover
from server.dr.task_ops import TaskOperations
from server.dr.views import JobViews
from server.dr.watches import StaleWatches
from server.errors import ConflictError
from server.logs import log_context
from server.tasks.requests import TaskIdRequest

log = logging.getLogger(__name__)


class SwitchoverRequest(TaskIdRequest):
    max_lag_seconds: float = Field(default=30.0, gt=0)
    timeout_seconds: float = Field(default=600.0, gt=0, le=86400)
    # "etcd": the job stops writes on the source (quotaAndLimits.limitWriting.forceDeny in its
    # etcd); "operator": the operator has stopped the writers (a cluster whose quotas are off),
    # and the job waits for the source's WAL to be quiet
    fence: Literal["etcd", "operator"] = "etcd"
    # seconds after the switchover when a verify of the reverse task looks for writes of stale
    # clients on the old primary (0: none)
    stale_check_seconds: float = Field(default=60.0, ge=0, le=86400)


async def _logged(run: SwitchoverRun, work: Awaitable[SwitchoverJob]) -> SwitchoverJob:
    try:
        job = await run.claim.run_while_held(work)
        if check_left(job):
            # the flow is the reverse direction's now: the check holds no claim
            job = await check_stale_writes(run, job.stale_check_seconds)
        return job
    except ClaimLostError:
        with log_context(task_id=run.job.task_id):
            log.warning("switchover %s: another daemon holds it now", run.job.job_id)
        return run.job
    except Exception:
        with log_context(task_id=run.job.task_id):
            log.exception(
                "switchover %s stopped at %s; the next round takes it up",
                run.job.job_id,
                run.job.state,
            )
        return run.job


class DisasterRecovery:
    def __init__(self, supervisor: TaskOperations, settings: CdcSettings) -> None:
        self.sup = supervisor
        self.settings = settings
        self.pairs = PairKeeper(supervisor, settings)
        self.pairs.running_here = self._running
        self._runs: dict[str, asyncio.Task[SwitchoverJob]] = {}  # task id -> its job here
        # the tasks whose switchover is being asked here (claimed, maybe saved, its run not
        # started yet): the recover round of this daemon leaves them to the request
        self._asking: set[str] = set()
        self._views = JobViews()
        self.watches = StaleWatches(supervisor, settings, self._views)
        self.failbacks = Failbacks(supervisor, settings, self.pairs, self._views, self.watches)

    # --- views -------------------------------------------------------------------------------
    def views(self, task_id: str) -> dict[str, Any]:
        """``progress.switchover``, ``failover``, ``failback`` and ``stale_writes`` of a task, as
        last known here."""
        return self._views.of(task_id)

    def task_ids(self) -> list[str]:
        return self._views.task_ids()

    def _remember_view(self, task_id: str, key: str, view: dict[str, Any]) -> None:
        self._views.remember(task_id, key, view)

    async def failback(self, request: FailbackRequest) -> dict[str, Any]:
        """Start a failback (:mod:`failbacks`)."""
        return await self.failbacks.ask(request)

    # --- switchover --------------------------------------------------------------------------
    async def switchover(self, request: SwitchoverRequest) -> dict[str, Any]:
        """Start a switchover job, or refuse at once (409) naming why, changing nothing."""
        task = await self.sup.get(request.task_id)
        spec = TaskSpec.of(task)
        tid = task.task_id
        if tid in self._asking or (tid in self._runs and not self._runs[tid].done()):
            named = await self._running_here(tid)
            raise ConflictError(
                f"task {tid}: {named} of it is under way here: switchover waits for it"
            )
        if task.state is not TaskState.RUNNING:
            raise ConflictError(
                f"task {tid} is {task.state.value}: only a Running task switches over"
            )
        if not spec.target_cluster:
            raise ConflictError(
                f"task {tid} writes to an address, not a named cluster: a switchover needs its "
                'target as target_cluster (README "Disaster recovery")'
            )
        if not spec.source_cluster:
            raise ConflictError(
                f"task {tid} reads {DEFAULT_SOURCE}: a switchover needs the source named in "
                "clusters, with its Milvus endpoint, to reverse the flow into it"
            )
        if spec.name_mapping:
            raise ConflictError(f"task {tid} renames collections: a switchover cannot reverse it")
        ends = (spec.source_cluster, spec.target_cluster)
        await self.pairs.refuse_if_held(ends, tid, "switchover")
        runner = self.sup.runner_of(tid)
        if runner is None:
            owner = (await self.sup.owners()).get(tid)
            raise ConflictError(
                f"task {tid} runs on fleet member {owner}: ask that daemon for the switchover"
            )
        consistent = runner.consistent_ts()
        if not consistent:
            raise ConflictError(
                f"task {tid}: its consistent-up-to time is not known yet (a channel has not "
                "been read to its end); try again in a few seconds"
            )
        lag = max(0.0, time.time() - to_seconds(consistent))
        if lag > request.max_lag_seconds:
            raise ConflictError(
                f"task {tid}: lag {lag:.1f} s is above max_lag_seconds "
                f"{request.max_lag_seconds:g}: the target is not close enough to switch over"
            )
        job = SwitchoverJob.new(
            tid,
            self.sup.fleet.member_id,
            request.max_lag_seconds,
            request.timeout_seconds,
            (spec.source_cluster, spec.target_cluster),
            request.fence,
            request.stale_check_seconds,
        )
        self._asking.add(tid)
        try:
            return await self._start_switchover(job, ends, lag)
        finally:
            self._asking.discard(tid)

    async def _start_switchover(
        self, job: SwitchoverJob, ends: tuple[str, str], lag: float
    ) -> dict[str, Any]:
        """The switchover ``job`` claimed, saved and started (:meth:`switchover`, which keeps
        this daemon's recover round off it meanwhile)."""
        tid = job.task_id
        await self.pairs.claim(ends, "switchover", tid, ends[0], job.job_id)
        await injected_fault("claimed")
        run = SwitchoverRun(
            self.sup, self.settings, job, self.pairs.store, on_save=self._on_switchover_saved
        )
        try:  # over the task's last switchover (ended, or left to no live claim: the flow's ours)
            run.seen = await asyncio.to_thread(self.sup.store.get_state, tid, SWITCHOVER_KEY)
            run.seen = await asyncio.to_thread(save_job, self.sup.store, job, run.seen)
        except ClaimLostError as exc:
            await run.claim.release()
            raise ConflictError(
                f"task {tid}: its switchover record was written by another daemon meanwhile; "
                "try again"
            ) from exc
        except BaseException:
            await run.claim.release()
            raise
        await injected_fault("checking")
        self._start_switchover_step(run, "run")
        with log_context(task_id=tid):
            log.info("switchover %s asked (lag %.2f s)", job.job_id, lag)
        return {"task_id": tid, "job_id": job.job_id, "switchover": job.view()}

    def _on_switchover_saved(self, job: SwitchoverJob) -> None:
        self._remember_view(job.task_id, "switchover", job.view())
        if job.state == "done" and job.reverse_task_id:
            self.watches.start(job.reverse_task_id)

    def _start_switchover_step(self, run: SwitchoverRun, step: str) -> None:
        """Run the job (``step``: "run", "forward", or the reason of a roll back) as a task of
        the loop; a job that ends on an error is left for the next ``recover`` round."""
        self._on_switchover_saved(run.job)
        work = run.run() if step == "run" else run.reverse() if step == "forward" else None
        if work is None:
            work = run.roll_back(step)
        self._runs[run.job.task_id] = asyncio.get_running_loop().create_task(_logged(run, work))

    async def recover(self) -> None:
        """Take over the jobs whose daemon is gone (this one, restarted, or a fleet member no
        longer live, or stalled past its claim); remember the others' views; then tend the
        pairs. Each task's records are taken up apart."""
        try:
            tasks = await self.sup.list()
            alive = await self.sup.live_members()
        except MetaStoreError as exc:
            log.warning("disaster-recovery jobs not looked at: %s", exc)
            return
        for task in tasks:
            try:
                await self._recover_task(task, alive)
            except Exception as exc:  # noqa: BLE001 - one task's records never stop the round
                with log_context(task_id=task.task_id):
                    log.warning("disaster-recovery records not taken up: %s", exc)
                self._remember_view(
                    task.task_id,
                    "switchover",
                    {"state": "unreadable", "reason": f"{type(exc).__name__}: {exc}"},
                )
        await self.pairs.tend()

    async def _recover_task(self, task: TaskRecord, alive: set[str]) -> None:
        me = self.sup.fleet.member_id
        tid = task.task_id
        try:  # one read per task: its dr/ records
            records = await asyncio.to_thread(self.sup.store.list_state, tid, DR_PREFIX)
        except MetaStoreError:
            return
        if FAILOVER_KEY in records:
            self._remember_view(tid, "failover", json.loads(records[FAILOVER_KEY]))
        if FAILBACK_KEY in records:
            await self.failbacks.recover(task, records[FAILBACK_KEY], me, alive)
        if WATCH_KEY in records and not self.watches.start(tid):  # shown as last saved
            watch = WatchState.from_bytes(records[WATCH_KEY])
            self._remember_view(tid, "stale_writes", watch.view())
        if SWITCHOVER_KEY not in records:
            return
        job = SwitchoverJob.from_bytes(records[SWITCHOVER_KEY])
        # a switchover asked here and not started yet is the request's (its member is this
        # daemon, but it is not left by a restart)
        running = tid in self._runs and not self._runs[tid].done()
        if job.finished or tid in self._asking or running:
            if tid in self._asking:
                with log_context(task_id=tid):
                    log.info("switchover %s is being asked here: left to its request", job.job_id)
            if tid not in self._runs:
                self._on_switchover_saved(job)
                if check_left(job) and (job.member == me or job.member not in alive):
                    self._check_again(job, records[SWITCHOVER_KEY])
            return
        if not await self.pairs.gone(
            job.source_cluster, job.target_cluster, tid, job.member, alive
        ):
            self._on_switchover_saved(job)  # its daemon runs it
            return
        await self._take_over_switchover(task, job.with_(member=me), records[SWITCHOVER_KEY])

    def _check_again(self, job: SwitchoverJob, seen: bytes) -> None:
        """The stale-write check of a done job, left unended by its daemon (this one before a
        restart, or a member no longer live), made here (:func:`check_again`)."""
        run = self._run_of(job, seen)
        self._runs[job.task_id] = asyncio.get_running_loop().create_task(check_again(run))

    def _run_of(self, job: SwitchoverJob, seen: bytes) -> SwitchoverRun:
        """A run of a job found in the store (``seen``: its record as read)."""
        return SwitchoverRun(
            self.sup,
            self.settings,
            job,
            self.pairs.store,
            on_save=self._on_switchover_saved,
            seen=seen,
        )

    async def _take_over_switchover(
        self, task: TaskRecord, job: SwitchoverJob, seen: bytes
    ) -> None:
        """Claim the job (``seen``: its record as read) and go on with it; a step its stalled
        daemon saved meanwhile is read again and gone on from (:mod:`takeover`)."""
        with log_context(task_id=task.task_id):
            log.warning(
                "switchover %s was left at %s by its daemon: taking it over", job.job_id, job.state
            )
            ends = (job.source_cluster, job.target_cluster)
            spec = TaskSpec.of(task)
            # made first: a cluster no longer configured stops it here, nothing claimed
            run = self._run_of(job, seen)
            await self.pairs.claim(
                ends, "switchover", task.task_id, spec.source_cluster or "", job.job_id
            )
            await injected_fault("takeover_claimed")
            stored = await save_taken_over(
                self.sup.store, run.claim, SWITCHOVER_KEY, job.to_bytes(), seen, switchover(job)
            )
            await injected_fault("taken_over")
            if stored is None:
                return
            job = SwitchoverJob.from_bytes(stored)
            run.job, run.seen = job, stored
            forward = job.state == "reversing" and (
                job.reverse_start is not None or await run.reverse_exists(job.reverse_task_id)
            )
            if forward:
                self._start_switchover_step(run, "forward")
            else:
                self._start_switchover_step(
                    run, f"the daemon running the job stopped while {job.state}"
                )

    # --- failover ----------------------------------------------------------------------------
    async def failover(self, request: FailoverRequest) -> dict[str, Any]:
        """Stop the task at once and say what the target holds (and what it lacks). Between
        named clusters the failover claims the flow (409 where it does not apply, or while
        another job runs there) and leaves it ``failed_over`` to the target, with no task
        running; a fence on the target no running job holds is lifted (the target takes
        writes now), and one that stays (the operator's, or one that could not be lifted) is
        named in the answer."""
        task = await self.sup.get(request.task_id)
        tid = task.task_id
        run = self._runs.get(tid)
        if run is not None and not run.done():
            named = await self._running_here(tid)
            raise ConflictError(
                f"task {tid}: {named} of it is under way here: failover waits for it"
            )
        spec = TaskSpec.of(task)
        if not spec.source_cluster or not spec.target_cluster:
            return await self._fail_over(task, request)
        ends = (spec.source_cluster, spec.target_cluster)
        job_id = f"failover-{uuid.uuid4().hex[:8]}"
        await self.pairs.claim(ends, "failover", tid, spec.source_cluster, job_id)
        await injected_fault("failover_claimed", job="failover")
        claim = self.pairs.flow_claim(ends, tid, job_id)
        try:  # its claim renewed while it waits for a runner and reads the WAL
            answer = await claim.run_while_held(self._fail_over(task, request, job_id))
        except ClaimLostError as exc:
            # lost after its record was saved (a recover round handed the flow over for the
            # failover done, its renewal then found the claim gone): it happened, answered so
            saved = await saved_failover(self.sup, tid, job_id)
            if saved is None:
                raise ConflictError(
                    f"task {tid}: failover {job_id} stalled past its claim on the cluster pair "
                    f"and another daemon holds it now ({exc}); see progress.failover"
                ) from exc
            self._remember_view(tid, "failover", saved)
            answer = {key: value for key, value in saved.items() if key != "state"}
        except BaseException:
            await claim.release()
            raise
        await claim.release(state=FAILED_OVER, active=spec.target_cluster)
        await injected_fault("failover_released", job="failover")
        await self.pairs.tend()
        pair = await asyncio.to_thread(self.pairs.store.get, *ends)
        hold = pair.fences.get(spec.target_cluster)
        if hold is not None:
            answer["target_fenced"] = (
                f"cluster {spec.target_cluster} is fenced "
                + (
                    "by the operator"
                    if hold.operator
                    else f"(held by {', '.join(hold.owners) or 'nobody: its lift failed, retried'})"
                )
                + ": it refuses writes until that is lifted"
            )
        return answer

    async def _fail_over(
        self, task: TaskRecord, request: FailoverRequest, job: str = ""
    ) -> dict[str, Any]:
        """The task stopped, what its target holds and lacks (:mod:`failover`)."""
        try:
            view = await run_failover(self.sup, self.settings, request, job)
        except ClaimLostError as exc:
            if job:  # the claim's: the caller answers
                raise
            raise ConflictError(f"task {task.task_id}: failover not saved: {exc}") from exc
        self._remember_view(task.task_id, "failover", view)
        return {key: value for key, value in view.items() if key != "state"}

    async def _running_here(self, task_id: str) -> str:
        """The switchover of the task this daemon runs, named with its step as the pair's
        refusals name a job."""
        job = await asyncio.to_thread(load_job, self.sup.store, task_id)
        return f"switchover {job.job_id} ({job.state})" if job is not None else "a switchover"

    def _running(self, task_id: str) -> bool:
        """Whether this daemon runs the switchover of ``task_id`` now."""
        run = self._runs.get(task_id)
        return run is not None and not run.done()

    def stop(self) -> None:
        for run in [*self._runs.values(), *self.failbacks.stop(), *self.watches.stop()]:
            run.cancel()
