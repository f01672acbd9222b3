"""Failback requests (:mod:`failback` runs the job): started here on request, taken over by the
next ``recover`` round when the daemon that ran one is gone, and, once in sync, the old primary
watched for writes of stale clients (:mod:`watches`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from metastore import MetaStoreError, TaskRecord
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from server.dr.claims import ClaimLostError
from server.dr.failback import FINISHED as FAILBACK_FINISHED
from server.dr.failback import FailbackRun
from server.dr.flows import injected_fault
from server.dr.pair_keeper import PairKeeper
from server.dr.record import FAILBACK_KEY, iso, json_bytes, load_json
from server.dr.stale_watch import arm, load_watch
from server.dr.takeover import failback, save_taken_over
from server.dr.task_ops import TaskOperations
from server.dr.views import JobViews
from server.dr.watches import StaleWatches
from server.errors import ApiError, ConflictError
from server.logs import log_context
from server.tasks.engine import cluster_context
from server.tasks.requests import TaskIdRequest

log = logging.getLogger(__name__)


class FailbackRequest(TaskIdRequest):
    pass


async def _held(run: FailbackRun) -> None:
    """Run the failback, its claim renewed every ``RENEW_SECONDS`` (its seeding and verifies
    save nothing for hours); it stops once another daemon took the claim."""
    try:
        await run.claim.run_while_held(run.run())
    except ClaimLostError:
        with log_context(task_id=run.task_id):
            log.warning("failback %s: another daemon holds it now", run.job_id)


class Failbacks:
    """The failbacks of this daemon, by original task id."""

    def __init__(
        self,
        supervisor: TaskOperations,
        settings: CdcSettings,
        pairs: PairKeeper,
        views: JobViews,
        watches: StaleWatches,
    ) -> None:
        self.sup = supervisor
        self.settings = settings
        self.pairs = pairs
        self.views = views
        self.watches = watches
        self._runs: dict[str, asyncio.Task[None]] = {}
        # the tasks whose failback is being asked here (claimed and saved, its run not started
        # yet): the recover round of this daemon leaves them to the request
        self._asking: set[str] = set()

    async def ask(self, request: FailbackRequest) -> dict[str, Any]:
        """Start re-seeding a failed-over task's old source from its target: the flow's task
        in the other direction when it has one (re-used, whatever happened before), else a new
        one. 409 naming the pair's state when the flow did not fail over to the task's target,
        or a job runs on it."""
        task = await self.sup.get(request.task_id)
        tid = task.task_id
        spec = TaskSpec.of(task)
        if not spec.source_cluster or not spec.target_cluster:
            raise ConflictError(f"task {tid}: a failback needs both ends as named clusters")
        running = self._runs.get(tid)
        current = await asyncio.to_thread(load_json, self.sup.store, tid, FAILBACK_KEY)
        if (
            tid in self._asking
            or (running is not None and not running.done())
            or (current is not None and current.get("state") not in FAILBACK_FINISHED)
        ):
            named = (
                f"failback {current.get('job_id')} ({current.get('state')})"
                if current is not None
                else "a failback"
            )
            raise ConflictError(f"task {tid}: {named} of it is under way: failback waits for it")
        self._asking.add(tid)
        try:
            return await self._start(tid, spec, (spec.source_cluster, spec.target_cluster))
        finally:
            self._asking.discard(tid)

    async def _start(self, tid: str, spec: TaskSpec, ends: tuple[str, str]) -> dict[str, Any]:
        """The failback asked of ``tid`` (``ends``: its source and target clusters) claimed,
        its record saved, the reverse task created and its run started (:meth:`ask`, which
        keeps this daemon's recover round off it meanwhile)."""
        job_id = f"failback-{uuid.uuid4().hex[:8]}"
        pair = await self.pairs.claim(ends, "failback", tid, ends[0], job_id)
        await injected_fault("failback_claimed", job="failback")
        claim = self.pairs.flow_claim(ends, tid, job_id)
        flow = pair.flow_of(tid)
        reused = flow.reverse_of(tid) if flow is not None else ""
        now = time.time()
        record = {
            "task_id": tid,
            "job_id": job_id,
            "reverse_task_id": reused or f"{tid[:40]}-back-{uuid.uuid4().hex[:8]}",
            "reused": bool(reused),
            "production_cluster": ends[1],
            "member": self.sup.fleet.member_id,
            "state": "creating",
            "steps": [{"state": "creating", "at": iso(now)}],
            "started_at": iso(now),
            "reason": "",
        }
        # over the task's last failback (ended: checked above, the claim now ours)
        seen = await asyncio.to_thread(self.sup.store.get_state, tid, FAILBACK_KEY)
        run = FailbackRun(self.sup, record, self._saved, claim, seen)
        try:
            await run.save()
            await injected_fault("failback_creating", job="failback")
            await run.create(spec)
        except Exception as exc:
            if not reused:
                with contextlib.suppress(ApiError, MetaStoreError):
                    await self.sup.delete(run.reverse_id, ignore_not_found=True, job=job_id)
            with contextlib.suppress(Exception):
                await run.save(state="failed", reason=f"the reverse task was not created: {exc}")
            await claim.release()
            if isinstance(exc, ClaimLostError):  # its record written by another daemon
                raise ConflictError(f"task {tid}: failback {job_id} stopped: {exc}") from exc
            raise

        try:
            await run.mark_failing_back()
            await injected_fault("failback_flow", job="failback")
            await run.save(state="seeding")
        except ClaimLostError as exc:  # let go meanwhile: what it did is the holder's now
            raise ConflictError(f"task {tid}: failback {job_id} stopped: {exc}") from exc
        await injected_fault("seeding", job="failback")
        self._runs[tid] = asyncio.get_running_loop().create_task(_held(run))
        with log_context(task_id=tid):
            log.info("failback asked: reverse task %s seeds %s", run.reverse_id, ends[0])
        return {"task_id": tid, "reverse_task_id": run.reverse_id, "failback": dict(run.record)}

    def _saved(self, task_id: str, record: dict[str, Any]) -> None:
        self.views.remember(task_id, "failback", record)
        reverse = str(record.get("reverse_task_id") or "")
        if record.get("state") == "in_sync" and reverse:
            asyncio.get_running_loop().create_task(self._watch_after_failback(reverse))

    async def _watch_after_failback(self, reverse_id: str) -> None:
        """A failback in sync: the old primary (the reverse task's target) is watched for
        writes of stale clients from now on, as after a switchover."""

        try:
            if await asyncio.to_thread(load_watch, self.sup.store, reverse_id) is None:
                spec = TaskSpec.of(await self.sup.get(reverse_id))
                watched, peer = spec.target_cluster, spec.source_name
                if watched is None:  # a reverse task names its target cluster
                    raise ConflictError(f"task {reverse_id} names no target cluster to watch")
                context = cluster_context(self.settings, watched, shared_readers=False)
                await asyncio.to_thread(
                    arm, self.sup.store, context, reverse_id, watched, peer, "failback"
                )
            self.watches.start(reverse_id)
        except (ApiError, MetaStoreError) as exc:
            log.warning("the stale-write watch of %s is not armed yet: %s", reverse_id, exc)

    async def recover(self, task: TaskRecord, raw: bytes, me: str, alive: set[str]) -> None:
        """Take the failback of ``task`` (``raw``: its record as read) over when its daemon is
        gone; remember its view otherwise."""
        tid = task.task_id
        record = json.loads(raw)
        running = self._runs.get(tid)
        # a failback asked here and not started yet is the request's: its member is this
        # daemon, but it is not left by a restart
        asking = tid in self._asking
        if (
            record.get("state") in FAILBACK_FINISHED
            or asking
            or (running is not None and not running.done())
        ):
            if asking:
                with log_context(task_id=tid):
                    log.info(
                        "failback %s is being asked here: left to its request", record.get("job_id")
                    )
            if running is None:
                self._saved(tid, record)
            return
        spec = TaskSpec.of(task)
        ends = (spec.source_cluster or "", spec.target_cluster or "")
        member = str(record.get("member") or "")
        if not await self.pairs.gone(*ends, tid, member, alive):
            self._saved(tid, record)
            return
        job_id = str(record.get("job_id") or f"failback-{uuid.uuid4().hex[:8]}")
        with log_context(task_id=tid):
            log.warning(
                "failback %s was left at %s by its daemon %s: taking it over",
                job_id,
                record.get("state"),
                member or "?",
            )
        await self.pairs.claim(ends, "failback", tid, ends[0], job_id)
        await injected_fault("failback_taken_over", job="failback")
        record.update(member=me, job_id=job_id)
        record.setdefault("production_cluster", ends[1])
        claim = self.pairs.flow_claim(ends, tid, job_id)
        adopt = failback(job_id, me)
        stored = await save_taken_over(
            self.sup.store, claim, FAILBACK_KEY, json_bytes(record), raw, adopt
        )
        await injected_fault("failback_taken_over_saved", job="failback")
        if stored is None:
            return
        record = json.loads(stored)
        run = FailbackRun(self.sup, record, self._saved, claim, stored)
        self._saved(tid, record)
        self._runs[tid] = asyncio.get_running_loop().create_task(_held(run))

    def stop(self) -> list[asyncio.Task[None]]:
        """The failbacks running here, to cancel."""
        return list(self._runs.values())
