"""The planned switchover of a task A -> B (README "Disaster recovery"), run as a job that holds
its cluster pair's claim (:mod:`pair`: one job per flow):

checking   the task is the active direction of its flow and runs here, its target is a named
           cluster, its lag is within the asked figure (else the request is refused at once and
           nothing changes)
fencing    writes stopped on A (an owned fence, :mod:`fence_owners`), and seen refused:
           ``fenced_at``
draining   every channel of the task applied up to ``fenced_at`` (its consistent-up-to)
verifying  every replicated collection compared (the verify engine), no difference allowed
reversing  the task paused (by this job: its reason names the job); A's WAL read from the
           task's saved positions to its end holds no change of its collections
           (``wal_quiet_at``: proof from the WAL that nothing slipped past the fence or the
           drain, else a roll back); then B's WAL end read and saved as the reverse flow's
           start with ``writers_may_move_at``: the point of no return.
           Writers may move to B from then on: every write B takes is after that start. The
           reverse task B -> A is created there (or, when the flow has one, that task started
           again there), then A's fence released (A must take the reverse flow's writes)
done       the flow's active direction is B -> A

A failure before the point of no return rolls back: the fence released, the task resumed if
this job paused it; the job ends ``failed`` with ``rolled_back``. After it, the job only goes
forward, retrying. Every step is saved first (:mod:`record`) with the claim renewed, so a daemon
killed mid-way (or stalled: its claim taken) leaves the job to the next ``recover`` round
(:mod:`manager`), which finishes or rolls it back; a stalled daemon stops at its next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from metastore import TaskState
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import from_seconds
from replicator.pipeline.status import consistent_view
from server.dr.claims import ClaimLostError, FlowClaim
from server.dr.fence import EtcdQuotaFence, FenceError, wait_in_effect
from server.dr.fence_owners import PairFences
from server.dr.flows import (
    awaited,
    flow_request,
    injected_fault,
    positions_of,
    reverse_request,
    verify_ended,
    wal_ends,
)
from server.dr.pair import REPLICATING, PairStore
from server.dr.record import LINK_KEY, SwitchoverJob, moment, save_job, save_json
from server.dr.stale_watch import arm, load_watch
from server.dr.task_ops import TaskOperations
from server.dr.wal_tail import unapplied_changes
from server.errors import ApiError, ConflictError
from server.logs import log_context
from server.tasks.engine import cluster_context
from server.tasks.requests import VerifyRequest

log = logging.getLogger(__name__)

POLL = 0.25  # seconds between looks at the task's consistent-up-to and the verify job
QUIET_SECONDS = 5.0  # without a fence: how long the WAL must show no row change
OPERATOR_FENCE = (
    "none set by the job: the operator stopped the writers, and the job waited for the "
    "source's WAL to show no row change of the task's collections"
)
FENCE_WAIT = 60.0  # seconds a fence may take to be in effect (Milvus reads its etcd config
# every few seconds, its quota centre pushes the rates to the proxies every few more)
RETRY_SECONDS = 2.0  # between attempts of a step past the point of no return
QUIET_PROOF_SECONDS = 60.0  # the read of the source's WAL after the pause, at most


class SwitchoverError(Exception):
    """A step that cannot be done; the job rolls back (or, past the point of no return,
    retries)."""


def paused_by(job: SwitchoverJob) -> str:
    """What the task's reason says while this job holds it paused (a roll back resumes the task
    only when its reason still says so)."""
    return f"(job {job.job_id},"


class SwitchoverRun:
    """One switchover job, driven from the daemon's event loop."""

    def __init__(
        self,
        supervisor: TaskOperations,
        settings: CdcSettings,
        job: SwitchoverJob,
        pairs: PairStore,
        fence_probe: Callable[[], bool] | None = None,
        on_save: Callable[[SwitchoverJob], None] | None = None,
        seen: bytes | None = None,
    ) -> None:
        self.sup = supervisor
        # the job's record as this run last read or wrote it: its saves compare against it
        self.seen = seen
        self.on_save = on_save
        self.settings = settings
        self.job = job
        self.pairs = pairs
        self.deadline = time.monotonic() + job.timeout_seconds
        self.ends = (job.source_cluster, job.target_cluster)
        self.fences = PairFences(pairs, settings, self.ends)
        self.fence = EtcdQuotaFence(
            job.source_cluster, settings.cluster(job.source_cluster), fence_probe
        )
        self.claim = FlowClaim(pairs, self.ends, job.task_id, job.job_id, job.member)
        self.stopped = False

    # --- the record ----------------------------------------------------------------------------
    async def _save(self, job: SwitchoverJob) -> None:
        await self.claim.keep()  # a daemon that lost the job (stalled) stops here
        # and one that stalled after the renewal, the job taken over and saved meanwhile,
        # finds the record changed (ClaimLostError): it writes nothing over the new holder's
        self.job = job
        self.seen = await asyncio.to_thread(save_job, self.sup.store, job, self.seen)
        if self.on_save is not None:
            self.on_save(job)
        log.info("switchover %s: %s", job.job_id, job.state)

    def _left(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SwitchoverError(f"timed out ({self.job.timeout_seconds:g} s) while {what}")
        return left

    async def run(self) -> SwitchoverJob:
        with log_context(task_id=self.job.task_id):
            try:
                await self._fence()
                await self._drain()
                await self._verify()
                await self._pause()
            except ClaimLostError:
                raise
            except Exception as exc:
                if not isinstance(exc, SwitchoverError | FenceError | ApiError | OSError):
                    log.exception("switchover %s failed", self.job.job_id)
                return await self.roll_back(f"{type(exc).__name__}: {exc}")
            return await self.reverse()

    # --- the steps ---------------------------------------------------------------------------
    async def _fence(self) -> None:
        if self.job.fence_mode == "operator":
            await self._save(self.job.to("fencing", fence=OPERATOR_FENCE))
            await injected_fault("fence_saved")
            quiet = await self._quiet()
            await self._save(self.job.with_(fenced_at=moment(quiet)))
            await injected_fault("fenced")
            return
        # saved before the fence is held: whoever finds this job releases its hold
        await self._save(self.job.to("fencing", fence_set=True, fence=self.fence.label))
        await injected_fault("fence_saved")
        await asyncio.to_thread(
            self.fences.acquire, self.job.source_cluster, self.job.job_id, self.job.member
        )
        seen = await asyncio.to_thread(
            wait_in_effect,
            self.fence,
            min(FENCE_WAIT, self._left("fencing")),
            lambda: self.stopped,
        )
        await self._save(self.job.with_(fenced_at=moment(seen)))
        await injected_fault("fenced")

    async def _quiet(self) -> float:
        """The operator stopped the writers: wait until the task's WAL shows no row change of
        its collections for QUIET_SECONDS, read and applied to their end; the end of that
        window (seconds) is the fence."""
        while True:
            runner = self.sup.runner_of(self.job.task_id)
            if runner is None:
                raise SwitchoverError(f"task {self.job.task_id} stopped running while fencing")
            rows = runner.status()["rows"]
            end = time.time() + QUIET_SECONDS
            while time.time() < end or runner.consistent_ts() < from_seconds(end):
                self._left(
                    "waiting for the source to be quiet (the operator stops its writers; rows "
                    f"kept arriving: {rows})"
                )
                await asyncio.sleep(POLL)
                if runner.status()["rows"] != rows:
                    break
            else:
                return end

    async def _drain(self) -> None:
        await self._save(self.job.to("draining"))
        await injected_fault("draining")
        target = int((self.job.fenced_at or {}).get("ts") or 0)
        while True:
            runner = self.sup.runner_of(self.job.task_id)
            if runner is None:
                raise SwitchoverError(f"task {self.job.task_id} stopped running while draining")
            consistent = runner.consistent_ts()
            if consistent >= target:
                await self._save(self.job.with_(consistent_up_to=consistent_view(consistent)))
                await injected_fault("drained")
                return
            self._left(
                f"draining: the task had applied up to {consistent_view(consistent)}, the "
                f"fence was at {self.job.fenced_at}"
            )
            runner.wake_idle_readers()  # idle channels read their latest ticks now
            await asyncio.sleep(POLL)

    async def start_verify(self, task_id: str, still: Callable[[], object] = lambda: None) -> str:
        """Start a verify of ``task_id``; one already running (scheduled, or an earlier
        switchover's stale-write check) is waited for first. ``still`` is called (and awaited)
        before each try: it raises to give up."""
        while True:
            await awaited(still())
            try:
                _, verify_id = await self.sup.verify(VerifyRequest(task_id=task_id))
                return verify_id
            except ConflictError:
                self._left(f"waiting for the verify of task {task_id} under way")
                await asyncio.sleep(POLL)

    async def _verify(self) -> None:
        await self._save(self.job.to("verifying"))
        await injected_fault("verify_saved")
        verify_id = await self.start_verify(self.job.task_id)
        await injected_fault("verifying")
        current = await verify_ended(
            self.sup,
            self.job.task_id,
            verify_id,
            self._left("verifying"),
            lambda: self._left(f"verifying ({verify_id})"),
        )
        divergent = sum(c.divergent for c in current.collections)
        unsettled = [r for c in current.collections for r in c.unsettled]
        result = {
            "job_id": verify_id,
            "state": current.state,
            "divergent_rows": divergent,
            "unsettled_ranges": len(unsettled),
            "collections": len(current.collections),
        }
        await self._save(self.job.with_(verify=result))
        await injected_fault("verified")
        if current.state != "done" or divergent or unsettled:
            raise SwitchoverError(
                f"verify {verify_id} did not find the target equal to the fenced source: "
                f"state {current.state}, {divergent} divergent row(s), {len(unsettled)} "
                f"unsettled range(s){': ' + current.reason if current.reason else ''}"
            )

    async def _pause(self) -> None:
        """Pause the task (only a Running one: one paused by someone else meanwhile stops the
        job), then fix where the reverse flow starts: B's WAL end now that the task no longer
        writes there. Saving that start is the point of no return."""
        job = self.job
        other = await self._other_direction()
        reverse_id = other or f"{job.task_id[:40]}-rev-{uuid.uuid4().hex[:8]}"
        # the flow's before it exists (and before the job names it): verbs on it wait for the
        # job; released with the claim (a roll back leaves no reverse task behind)
        await self.claim.reserve(reverse_id)
        await self._save(job.to("reversing", reverse_task_id=reverse_id, rearm=bool(other)))
        await injected_fault("reversing_saved")
        task = await self.sup.get(job.task_id)
        if task.state is not TaskState.RUNNING:
            raise SwitchoverError(
                f"task {job.task_id} is {task.state.value} ({task.reason}): paused by someone "
                "else while the job ran"
            )
        # saved first: a roll back resumes the task only while its reason names this job
        await self._save(self.job.with_(original_paused=True))
        await injected_fault("pausing")
        reason = (
            f"switched over to task {reverse_id} {paused_by(job)} writes fenced on "
            f"{job.source_cluster} at {(job.fenced_at or {}).get('time')})"
        )
        await self.sup.pause(job.task_id, reason=reason, job=job.job_id)
        await injected_fault("reversing")
        await self._prove_quiet()
        start = await asyncio.to_thread(wal_ends, self.settings, job.target_cluster)
        await self._save(
            self.job.with_(reverse_start=start, writers_may_move_at=moment(time.time()))
        )
        await injected_fault("no_return")  # a hold only: a failure here would roll back
        log.info(
            "switchover %s: writers may move to %s (the reverse flow starts at its WAL end)",
            job.job_id,
            job.target_cluster,
        )

    async def _prove_quiet(self) -> None:
        """The task stopped: read the source's WAL from its saved positions (what the target
        holds) to the end. Any row change or DDL of its collections there slipped past the
        fence (or the drain): the target lacks it, and the job rolls back (the resumed task
        applies it). Proof from the WAL, not from clocks."""
        job = self.job
        spec = TaskSpec.of(await self.sup.get(job.task_id))
        positions = await self.sup.positions(job.task_id)
        context = cluster_context(self.settings, job.source_cluster, shared_readers=False)
        found = await asyncio.to_thread(
            unapplied_changes,
            context,
            spec,
            positions,
            min(QUIET_PROOF_SECONDS, self._left("proving")),
        )
        if found:
            raise SwitchoverError(
                f"the source's WAL holds {sum(found.values())} change(s) of the task's "
                f"collections after where the task stopped ({found}): writes got past the fence"
            )
        await self._save(self.job.with_(wal_quiet_at=moment(time.time())))
        await injected_fault("quiet")

    async def reverse(self) -> SwitchoverJob:
        """Past the point of no return: create (or start again) the reverse flow at its saved
        start, retried until it runs, then finish."""
        await injected_fault("moving")
        while True:
            try:
                await self._ensure_reverse()
                break
            except ClaimLostError:
                raise
            except Exception as exc:  # noqa: BLE001 - forward only: shown, retried
                log.warning(
                    "switchover %s: the reverse task is not running yet: %s", self.job.job_id, exc
                )
                await self._save(self.job.with_(reason=f"retrying the reverse task: {exc}"))
                await injected_fault("retrying")
                await asyncio.sleep(RETRY_SECONDS)
        return await self.finish()

    async def _ensure_reverse(self) -> None:
        await self.claim.keep()  # a daemon that lost the job (stalled) creates nothing
        job = self.job
        reverse_id = job.reverse_task_id
        if await self.reverse_exists(reverse_id):
            return
        start = positions_of(job.reverse_start)
        if job.rearm:
            # the flow's other task (paused by an earlier switchover) runs again from B's end
            try:
                spec = TaskSpec.of(await self.sup.get(reverse_id))
                request = flow_request(
                    spec, reverse_id, source=spec.source_cluster, target=spec.target_cluster
                )
                await self.sup.delete(reverse_id, job=job.job_id)
                await injected_fault("reverse_deleted")
            except ApiError:  # deleted already by an attempt that stopped half-way
                spec = TaskSpec.of(await self.sup.get(job.task_id))
                request = reverse_request(spec, reverse_id)
            await self.sup.create(request, start)
            await injected_fault("reverse_created")
        else:
            spec = TaskSpec.of(await self.sup.get(job.task_id))
            await self.sup.create(reverse_request(spec, reverse_id), start)
            await injected_fault("reverse_created")
        for task_id, other in ((job.task_id, reverse_id), (reverse_id, job.task_id)):
            await asyncio.to_thread(
                save_json, self.sup.store, task_id, LINK_KEY, {"reverse_of": other}
            )
        await injected_fault("reversed")

    async def _other_direction(self) -> str:
        """The flow's task in the other direction, still stored; "" when there is none."""
        pair = await asyncio.to_thread(self.pairs.get, *self.ends)
        flow = pair.flow_of(self.job.task_id)
        other = flow.reverse_of(self.job.task_id) if flow is not None else ""
        if not other:
            return ""
        try:
            await self.sup.get(other)
        except ApiError:
            return ""
        return other

    async def reverse_exists(self, task_id: str) -> bool:
        try:
            task = await self.sup.get(task_id)
        except ApiError:
            return False
        return task.state is TaskState.RUNNING or task.state is TaskState.INITIAL

    async def _arm_watch(self) -> None:
        """The reverse task watches A's WAL for writes it does not make, from A's end now,
        while A is still fenced (:mod:`stale_watch`)."""
        reverse = self.job.reverse_task_id
        current = await asyncio.to_thread(load_watch, self.sup.store, reverse)
        if current is not None and current.job_id == self.job.job_id:
            return

        source = self.job.source_cluster
        context = cluster_context(self.settings, source, shared_readers=False)
        await asyncio.to_thread(
            arm, self.sup.store, context, reverse, source, self.job.target_cluster, self.job.job_id
        )

    async def finish(self) -> SwitchoverJob:
        """Arm the reverse task's stale-write watch, release A's fence (retried until it is
        lifted: the reverse flow must write to A), hand the flow to the reverse direction and
        end the job done."""
        await self.claim.keep()  # a daemon that lost the job (stalled) lifts nothing
        await self._arm_watch()
        await injected_fault("watch_armed")
        lifting = False
        while self.job.fence_set:
            try:
                lifting = await asyncio.to_thread(
                    self.fences.release, self.job.source_cluster, self.job.job_id, self.job.member
                )
                break
            except FenceError as exc:
                log.warning("switchover %s: fence not lifted yet: %s", self.job.job_id, exc)
                await asyncio.sleep(RETRY_SECONDS)
        lifted = None
        try:  # the reverse flow writes to the source cluster: see it take writes
            if lifting:
                lifted = await asyncio.to_thread(
                    wait_in_effect, self.fence, FENCE_WAIT, lambda: self.stopped, effect=False
                )
        except FenceError as exc:
            log.warning("switchover %s: %s", self.job.job_id, exc)
        done = await self._finish_state(
            "done", fence_set=False, lifted_at=None if lifted is None else moment(lifted)
        )
        await injected_fault("finished")  # done saved, the flow not handed over yet
        source = self.job.target_cluster
        await self.claim.release(active=source, state=REPLICATING, tasks=self._tasks_after(source))
        await injected_fault("released")
        log.info(
            "switchover %s done: %s -> %s, reverse task %s",
            done.job_id,
            done.source_cluster,
            done.target_cluster,
            done.reverse_task_id,
        )
        return done

    def _tasks_after(self, reverse_source: str) -> dict[str, str]:
        return {
            self.job.source_cluster: self.job.task_id,
            reverse_source: self.job.reverse_task_id,
        }

    async def _finish_state(self, state: str, **changes: Any) -> SwitchoverJob:
        job = self.job.to(state, **changes)  # type: ignore[arg-type]
        await self._save(job)
        return job

    async def roll_back(self, reason: str) -> SwitchoverJob:
        """Undo what the job did: release its fence, resume the task while it is paused by
        this job. Ends ``failed`` with ``rolled_back``; a step that fails is named in the
        reason, and a fence not lifted is lifted by the next ``recover`` round (it has no
        owner)."""
        await self.claim.keep()  # a daemon that lost the job (stalled) undoes nothing
        job = self.job
        log.warning("switchover %s failed, rolling back: %s", job.job_id, reason)
        problems: list[str] = []
        lifted = None
        if job.fence_set:
            try:
                # conditioned on the claim in the same compare-and-set: a member that stalled
                # after the check above, the job taken over meanwhile, lifts nothing
                lifted_here = await asyncio.to_thread(
                    self.fences.release, job.source_cluster, job.job_id, job.member
                )
                if lifted_here:
                    # rolled back means the source takes writes again: see it
                    seen = await asyncio.to_thread(
                        wait_in_effect, self.fence, FENCE_WAIT, lambda: False, effect=False
                    )
                    lifted = moment(seen)
            except ClaimLostError:
                raise
            except Exception as exc:  # noqa: BLE001 - a roll back tries every step
                problems.append(f"fence not lifted (the next round lifts it): {exc}")
        if job.original_paused:
            try:
                task = await self.sup.get(job.task_id)
                if task.state is TaskState.PAUSED and paused_by(job) in task.reason:
                    await self.sup.resume(job.task_id, job=job.job_id)
                    await injected_fault("rollback_resumed")
                elif task.state is not TaskState.RUNNING:
                    problems.append(
                        f"task left {task.state.value}: paused by someone else ({task.reason})"
                    )
            except Exception as exc:  # noqa: BLE001 - a roll back tries every step
                problems.append(f"task not resumed: {exc}")
        full = reason if not problems else f"{reason}; roll back incomplete: {'; '.join(problems)}"
        failed = await self._finish_state(
            "failed", reason=full, lifted_at=lifted, rolled_back=not problems, fence_set=False
        )
        await injected_fault("failed")
        await self.claim.release()
        await injected_fault("rollback_released")
        return failed
