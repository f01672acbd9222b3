"""The planned switchover of a task A -> B (README "Disaster recovery"), run as a job:

checking   the task runs here, its target is a named cluster, its lag is within the asked
           figure (else the request is refused at once and nothing changes)
fencing    writes stopped on A (:mod:`fence`), and seen refused: ``fenced_at``
draining   every channel of the task applied up to ``fenced_at`` (its consistent-up-to)
verifying  every replicated collection compared (the verify engine), no difference allowed
reversing  the task paused, naming the reverse task; the reverse task B -> A created at B's
           WAL end (B has taken no write yet), or, when the task is itself a reverse flow, the
           task it reversed started again at A's end; then A's fence is lifted (A must take the
           reverse flow's writes) and any fence on B
done

A failure before the reverse task exists rolls back: the fence lifted, the task resumed; the
job ends ``failed`` with ``rolled_back``. Once the reverse task exists the job only goes
forward. Every step is saved first (:mod:`record`), so a daemon killed mid-way finishes or
rolls back the job when it starts again (:mod:`manager`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from metastore import TaskState
from replicator.compare.state import VerifyJob
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import from_seconds
from replicator.pipeline.status import consistent_view
from server.dr.fence import EtcdQuotaFence, FenceError, wait_in_effect
from server.dr.record import (
    LINK_KEY,
    SwitchoverJob,
    iso,
    load_json,
    moment,
    save_job,
    save_json,
)
from server.dr.stale_watch import arm, load_watch
from server.dr.task_ops import TaskOperations
from server.errors import ApiError, ConflictError
from server.logs import log_context
from server.tasks.engine import cluster_context
from server.tasks.requests import CreateRequest, VerifyRequest

log = logging.getLogger(__name__)

POLL = 0.25  # seconds between looks at the task's consistent-up-to and the verify job
QUIET_SECONDS = 5.0  # without a fence: how long the WAL must show no row change
OPERATOR_FENCE = (
    "none set by the job: the operator stopped the writers, and the job waited for the "
    "source's WAL to show no row change of the task's collections"
)
FENCE_WAIT = 60.0  # seconds a fence may take to be in effect (Milvus reads its etcd config
# every few seconds, its quota centre pushes the rates to the proxies every few more)


# Fault injection, for the tests of every step (tests/e2e/test_disaster_recovery.py); never set
# in service. "hold:<point>:<seconds>" holds the job there (a test kills the daemon meanwhile),
# "fail:<point>" makes it fail there. Points: "fencing" (the fence key written, not yet seen in
# effect), "draining", "verifying" (the verify job started), "reversing" (the task paused, the
# reverse task not created), "reversed" (the reverse task created, the fences still on).
FAULT_ENV = "MILVUS_CDC_TEST_SWITCHOVER"


class SwitchoverError(Exception):
    """A step that cannot be done; the job rolls back (or, past the reverse task, retries)."""


async def injected_fault(point: str) -> None:
    """What ``FAULT_ENV`` asks for at ``point``: nothing (it is unset in service), a hold or
    a failure."""
    kind, _, rest = os.environ.get(FAULT_ENV, "").partition(":")
    where, _, seconds = rest.partition(":")
    if where != point:
        return
    if kind == "hold":
        log.warning("switchover held at %s for %s s (%s)", point, seconds, FAULT_ENV)
        await asyncio.sleep(float(seconds or 60))
    elif kind == "fail":
        raise SwitchoverError(f"a fault injected at {point} ({FAULT_ENV})")


async def verify_ended(
    supervisor: TaskOperations,
    task_id: str,
    job_id: str,
    still: Callable[[], object] = lambda: None,
    poll: float = POLL,
) -> VerifyJob:
    """The verify job ``job_id`` of ``task_id`` once it has ended; ``still`` is called between
    looks (it raises to give up)."""
    while True:
        current = supervisor.verify_job(task_id)
        if current is not None and current.job_id == job_id and not current.active:
            return current
        still()
        await asyncio.sleep(poll)


def reverse_request(spec: TaskSpec, task_id: str) -> CreateRequest:
    """The create request of the flow B -> A that reverses ``spec`` (A -> B): the same
    collections, starting at B's WAL end."""
    return flow_request(spec, task_id, source=spec.target_cluster, target=spec.source_cluster)


def flow_request(
    spec: TaskSpec, task_id: str, *, source: str | None, target: str | None
) -> CreateRequest:
    """The create request of a flow from ``source`` to ``target`` (cluster names) with the
    collections and scheduled verifies of ``spec``, starting at the source's WAL end."""
    stored = spec.to_stored()
    selection: dict[str, Any] = {}
    if stored.get("collection_infos"):
        selection["collection_infos"] = stored["collection_infos"]
    else:
        selection["db_collections"] = stored.get("db_collections") or {}
    extra: dict[str, Any] = {}
    if stored.get("verify"):
        extra["verify"] = stored["verify"]
    return CreateRequest.model_validate(
        {
            "task_id": task_id,
            "source_cluster": source,
            "target_cluster": target,
            "start_at": "end",
            **selection,
            **extra,
        },
        strict=False,
    )


class SwitchoverRun:
    """One switchover job, driven from the daemon's event loop."""

    def __init__(
        self,
        supervisor: TaskOperations,
        settings: CdcSettings,
        job: SwitchoverJob,
        fence_probe: Callable[[], bool] | None = None,
        on_save: Callable[[SwitchoverJob], None] | None = None,
    ) -> None:
        self.sup = supervisor
        self.on_save = on_save
        self.settings = settings
        self.job = job
        self.deadline = time.monotonic() + job.timeout_seconds
        self.fence = EtcdQuotaFence(
            job.source_cluster, settings.cluster(job.source_cluster), fence_probe
        )
        self.stopped = False

    async def _save(self, job: SwitchoverJob) -> None:
        self.job = job
        await asyncio.to_thread(save_job, self.sup.store, job)
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
            except (SwitchoverError, FenceError, ApiError, OSError) as exc:
                return await self.roll_back(str(exc))
            except Exception as exc:
                log.exception("switchover %s failed", self.job.job_id)
                return await self.roll_back(f"{type(exc).__name__}: {exc}")
            return await self.reverse()

    # --- the steps ---------------------------------------------------------------------------
    async def _fence(self) -> None:
        if self.job.fence_mode == "operator":
            await self._save(self.job.to("fencing", fence=OPERATOR_FENCE))
            quiet = await self._quiet()
            await self._save(self.job.with_(fenced_at=moment(quiet)))
            return
        # saved before the key is written: whoever finds this job owns the fence
        await self._save(self.job.to("fencing", fence_set=True, fence=self.fence.label))
        await asyncio.to_thread(self.fence.set)
        await injected_fault("fencing")
        seen = await asyncio.to_thread(
            wait_in_effect,
            self.fence,
            min(FENCE_WAIT, self._left("fencing")),
            lambda: self.stopped,
        )
        await self._save(self.job.with_(fenced_at=moment(seen)))

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
                return
            self._left(
                f"draining: the task had applied up to {consistent_view(consistent)}, the "
                f"fence was at {self.job.fenced_at}"
            )
            runner.wake_idle_readers()  # idle channels read their latest ticks now
            await asyncio.sleep(POLL)

    async def _start_verify(self, task_id: str) -> str:
        """Start a verify of ``task_id``; one already running (scheduled, or an earlier
        switchover's stale-write check) is waited for first."""
        while True:
            try:
                _, verify_id = await self.sup.verify(VerifyRequest(task_id=task_id))
                return verify_id
            except ConflictError:
                self._left(f"waiting for the verify of task {task_id} under way")
                await asyncio.sleep(POLL)

    async def _verify(self) -> None:
        await self._save(self.job.to("verifying"))
        verify_id = await self._start_verify(self.job.task_id)
        await injected_fault("verifying")
        current = await verify_ended(
            self.sup, self.job.task_id, verify_id, lambda: self._left(f"verifying ({verify_id})")
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
        if current.state != "done" or divergent or unsettled:
            raise SwitchoverError(
                f"verify {verify_id} did not find the target equal to the fenced source: "
                f"state {current.state}, {divergent} divergent row(s), {len(unsettled)} "
                f"unsettled range(s){': ' + current.reason if current.reason else ''}"
            )

    async def reverse(self) -> SwitchoverJob:
        """Pause the task, create (or start again) the reverse flow, lift the fences. From the
        moment the reverse task exists, failures are retried, never rolled back."""
        job = self.job
        other = job.reverse_task_id or await self._other_direction()
        rearm = job.rearm if job.reverse_task_id else bool(other)
        reverse_id = other or f"{job.task_id[:40]}-rev-{uuid.uuid4().hex[:8]}"
        await self._save(job.to("reversing", reverse_task_id=reverse_id, rearm=rearm))
        reason = (
            f"switched over to task {reverse_id} (job {job.job_id}, writes fenced on "
            f"{job.source_cluster} at {(job.fenced_at or {}).get('time')})"
        )
        try:
            # saved first: a roll back resumes the task only if it is not Running
            await self._save(self.job.with_(original_paused=True))
            await self.sup.pause(job.task_id, reason=reason)
            await injected_fault("reversing")
            if rearm:
                await self._rearm(reverse_id)
            else:
                spec = TaskSpec.of(await self.sup.get(job.task_id))
                await self.sup.create(reverse_request(spec, reverse_id))
            await self._link_reverse_pair(job.task_id, reverse_id)
            await injected_fault("reversed")
        except Exception as exc:  # noqa: BLE001 - whatever stopped it, roll back or go on
            if await self.reverse_exists(reverse_id):
                log.warning("switchover %s: %s after the reverse task existed", job.job_id, exc)
            else:
                return await self.roll_back(f"the reverse task was not created: {exc}")
        return await self.finish()

    async def _other_direction(self) -> str:
        """The task flowing the other way between the same clusters, made by an earlier
        switchover (or failback) of this pair and still stored; "" when there is none."""
        link = await asyncio.to_thread(load_json, self.sup.store, self.job.task_id, LINK_KEY)
        other = str((link or {}).get("reverse_of") or "")
        if not other:
            return ""
        try:
            await self.sup.get(other)
        except ApiError:
            return ""
        return other

    async def _link_reverse_pair(self, one: str, other: str) -> None:
        """Each of the two tasks names the other: the next switchover of either starts the
        other again rather than creating a third."""
        for task_id, reverse in ((one, other), (other, one)):
            await asyncio.to_thread(
                save_json, self.sup.store, task_id, LINK_KEY, {"reverse_of": reverse}
            )

    async def _rearm(self, original_id: str) -> None:
        """The task reverses ``original_id`` (paused by an earlier switchover): that task runs
        again, from its source's WAL end, as the same task (its id, selection and settings)."""
        spec = TaskSpec.of(await self.sup.get(original_id))
        request = flow_request(
            spec, original_id, source=spec.source_cluster, target=spec.target_cluster
        )
        await self.sup.delete(original_id)
        await self.sup.create(request)

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
        """Arm the reverse task's stale-write watch, lift the fences (retried until they are:
        the reverse flow must write to A) and end the job done."""
        await self._arm_watch()
        target = self.settings.cluster(self.job.target_cluster)
        other = EtcdQuotaFence(self.job.target_cluster, target)
        while True:
            try:
                if self.job.fence_mode != "operator":
                    await asyncio.to_thread(self.fence.lift)
                await asyncio.to_thread(other.lift)
                break
            except FenceError as exc:
                log.warning("switchover %s: fence not lifted yet: %s", self.job.job_id, exc)
                await asyncio.sleep(2.0)
        try:  # the reverse flow writes to the source cluster: see it take writes
            lifted = await asyncio.to_thread(
                lambda: wait_in_effect(self.fence, FENCE_WAIT, lambda: self.stopped, effect=False)
            )
        except FenceError as exc:
            log.warning("switchover %s: %s", self.job.job_id, exc)
            lifted = None
        done = await self._finish_state(
            "done", fence_set=False, lifted_at=None if lifted is None else moment(lifted)
        )
        log.info(
            "switchover %s done: %s -> %s, reverse task %s",
            done.job_id,
            done.source_cluster,
            done.target_cluster,
            done.reverse_task_id,
        )
        if done.stale_check_seconds:
            return await self.check_stale_writes(done.stale_check_seconds)
        return done

    async def check_stale_writes(self, after: float) -> SwitchoverJob:
        """The old primary must take the reverse flow's writes, so nothing fences it any more: a
        client still writing there writes rows the new primary never gets. ``after`` seconds
        past the switchover, a verify of the reverse task compares the two; any row the old
        primary holds differently (or lacks) is shown in ``stale_check`` and logged as a
        warning, never kept silent."""
        await asyncio.sleep(after)
        reverse = self.job.reverse_task_id
        check: dict[str, Any] = {"reverse_task_id": reverse, "asked_at": iso(time.time())}
        self.deadline = time.monotonic() + self.job.timeout_seconds
        try:
            verify_id = await self._start_verify(reverse)
            current = await verify_ended(self.sup, reverse, verify_id)
            divergent = {
                c.collection: {k: c.of(k).count for k in ("missing", "extra", "different")}
                for c in current.collections
                if c.divergent
            }
            check.update(
                verify_job=verify_id,
                state=current.state,
                divergent_rows=sum(sum(v.values()) for v in divergent.values()),
                collections=divergent,
                reason=current.reason,
            )
        except (ApiError, SwitchoverError) as exc:
            check.update(state="not_checked", reason=str(exc))
        if check.get("divergent_rows"):
            log.warning(
                "switchover %s: %s holds %d row(s) %s does not, or holds them otherwise "
                "(writes the reverse flow did not make: stale clients?): %s",
                self.job.job_id,
                self.job.source_cluster,
                check["divergent_rows"],
                self.job.target_cluster,
                check["collections"],
            )
        checked = self.job.with_(stale_check=check)
        await self._save(checked)
        return checked

    async def _finish_state(self, state: str, **changes: Any) -> SwitchoverJob:
        job = self.job.to(state, **changes)  # type: ignore[arg-type]
        await self._save(job)
        return job

    async def roll_back(self, reason: str) -> SwitchoverJob:
        """Undo what the job did: lift its fence, resume the task it paused, remove a reverse
        task left half-created. Ends ``failed`` with ``rolled_back``."""
        job = self.job
        log.warning("switchover %s failed, rolling back: %s", job.job_id, reason)
        problems: list[str] = []
        if job.reverse_task_id and not job.rearm:
            try:
                await self.sup.delete(job.reverse_task_id, ignore_not_found=True)
            except Exception as exc:  # noqa: BLE001 - a roll back tries every step
                problems.append(f"reverse task not removed: {exc}")
        lifted = None
        if job.fence_set:
            try:
                await asyncio.to_thread(self.fence.lift)
                # rolled back means the source takes writes again: see it
                lifted = moment(
                    await asyncio.to_thread(
                        lambda: wait_in_effect(self.fence, FENCE_WAIT, lambda: False, effect=False)
                    )
                )
            except FenceError as exc:
                problems.append(f"fence not lifted: {exc}")
        if job.original_paused:
            try:
                task = await self.sup.get(job.task_id)
                if task.state is not TaskState.RUNNING:
                    await self.sup.resume(job.task_id)
            except Exception as exc:  # noqa: BLE001 - a roll back tries every step
                problems.append(f"task not resumed: {exc}")
        full = reason if not problems else f"{reason}; roll back incomplete: {'; '.join(problems)}"
        return await self._finish_state(
            "failed",
            reason=full,
            lifted_at=lifted,
            rolled_back=not problems,
            fence_set=bool(problems) and job.fence_set,
        )
