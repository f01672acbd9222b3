"""The cluster pairs as the disaster-recovery requests use them (:mod:`pair`, :mod:`pair_rules`):
claims of a task's flow for a verb, the check before a resume, which job needs a new daemon, and
the tending of every pair each ``recover`` round (deleted tasks forgotten, ownerless fences
lifted).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from metastore import MetaStoreError, TaskRecord
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec, UnreadableSpecError
from server.dr.claims import FlowClaim
from server.dr.fence_owners import PairFences
from server.dr.flows import injected_fault
from server.dr.job_effects import finished_jobs, settled
from server.dr.pair import ClusterPair, JobClaim, PairStore, refuse_if_held
from server.dr.pair_rules import claimed, pruned, verb_allowed, verb_renewed
from server.dr.record import (
    DR_PREFIX,
    FAILBACK_KEY,
    FAILOVER_KEY,
    LINK_KEY,
    load_job,
    load_json,
)
from server.dr.task_ops import TaskOperations

log = logging.getLogger(__name__)


class PairKeeper:
    def __init__(self, supervisor: TaskOperations, settings: CdcSettings) -> None:
        self.sup = supervisor
        self.settings = settings
        self.store = PairStore(supervisor.store)
        # whether this daemon still runs the job of a task (one at ``finished`` hands its flow
        # over itself: settling it early would free the reverse task before the job let go)
        self.running_here: Callable[[str], bool] = lambda _task_id: False

    def flow_claim(self, ends: tuple[str, str], task_id: str, job_id: str) -> FlowClaim:
        """The claim of ``job_id`` on ``task_id``'s flow, held by this daemon."""
        return FlowClaim(self.store, ends, task_id, job_id, self.sup.fleet.member_id)

    async def settle(self, ends: tuple[str, str]) -> ClusterPair:
        """The pair with the effects of every finished job still holding one of its flows
        applied (:mod:`job_effects`: a daemon killed between a job's end and the pair's
        update)."""
        pair = await asyncio.to_thread(self.store.get, *ends)
        found = await asyncio.to_thread(finished_jobs, self.sup.store, pair)
        me = self.sup.fleet.member_id
        finished = {
            job_id: found[job_id]
            for job_id, (_flow, _changes, held) in found.items()
            if not self._runs_here(held, me)
        }
        if not finished:
            return pair
        log.warning(
            "cluster pair %s: finished jobs still held flows (%s): their effects applied",
            pair.key,
            ", ".join(finished),
        )
        await injected_fault("settling", job="pair")  # found, not yet applied
        return await asyncio.to_thread(self.store.update, *ends, lambda p: settled(p, finished))

    async def claim(
        self, ends: tuple[str, str], verb: str, task_id: str, source: str, job_id: str
    ) -> ClusterPair:
        """Claim ``task_id``'s flow for ``verb`` (409 naming the pair's state where it does not
        apply, or another job runs there)."""
        await self.settle(ends)
        records = await asyncio.to_thread(self.sup.store.list_state, task_id, DR_PREFIX)
        linked = (
            str(json.loads(records[LINK_KEY]).get("reverse_of") or "")
            if LINK_KEY in records
            else ""
        )
        failed_over = FAILOVER_KEY in records
        me = self.sup.fleet.member_id

        def change(pair: ClusterPair) -> ClusterPair:
            return claimed(
                pair,
                verb,
                task_id,
                source,
                job_id,
                me,
                existing=self._stored(),  # read after the pair (see _stored)
                linked=linked,
                failed_over=failed_over,
                step=self._job_state,
            )

        return await asyncio.to_thread(self.store.update, *ends, change)

    async def refuse_if_held(self, ends: tuple[str, str], task_id: str, verb: str) -> None:
        """409 naming the job (kind, id, step) when a live job holds ``task_id``'s flow, asked
        before a DR verb's own checks of the task (its runner, its consistent-up-to), which a
        task of a held flow may fail for the job's sake: the refusal names the holder first.
        Reads only; the claim itself is taken by :meth:`claim`."""
        flow = (await self.settle(ends)).flow_of(task_id)
        if flow is not None:
            refuse_if_held(flow, verb, task_id, step=self._job_state)

    async def check_verb(self, task: TaskRecord, verb: str, job: str) -> None:
        """Refuse (409) pausing, resuming or deleting a task of a flow while a job other than
        ``job`` run here holds the flow's claim (naming the job and its step), and resuming a
        task where it would run both directions of its flow or undo a failover (the supervisor
        asks before each of these verbs). A job's own verb passes only while it holds the live
        claim on this member: checked and renewed in one compare-and-set of the pair."""
        try:
            spec = TaskSpec.of(task)
        except UnreadableSpecError:  # a spec this release cannot read has no pair here
            return
        if not spec.source_cluster or not spec.target_cluster:
            return
        ends = (spec.source_cluster, spec.target_cluster)
        pair = await self.settle(ends)
        me = self.sup.fleet.member_id
        flow = pair.flow_of(task.task_id)
        held = flow.job if flow is not None else None
        state = ""
        if held is not None and (held.job_id != job or held.member != me):
            state = await asyncio.to_thread(self._job_state, held)
        if not job:
            verb_allowed(pair, task.task_id, verb, job_state=state)
            return
        await asyncio.to_thread(
            self.store.update,
            *ends,
            lambda p: verb_renewed(p, task.task_id, verb, job, me, state),
        )

    def _runs_here(self, held: JobClaim | None, me: str) -> bool:
        return held is not None and held.member == me and self.running_here(held.task_id)

    def _job_state(self, held: JobClaim) -> str:
        """The step of the job holding a claim, as its record says ("" when unknown)."""
        store = self.sup.store
        if held.kind == "switchover":
            job = load_job(store, held.task_id)
            return job.state if job is not None and job.job_id == held.job_id else ""
        key = FAILBACK_KEY if held.kind == "failback" else FAILOVER_KEY
        record = load_json(store, held.task_id, key) or {}
        if record.get("job_id") != held.job_id:
            return "failing over" if held.kind == "failover" else ""
        return str(record.get("state") or "")

    def _stored(self) -> set[str]:
        """The ids of the tasks stored now. Read inside a pair's compare-and-set, after the
        pair: a task the pair names was created before the write that named it, so a task
        missing here is deleted (a list read before the pair may miss a task created since,
        and drop it, its claim with it, from a flow that names it now)."""
        return {t.task_id for t in self.sup.store.list_tasks()}

    async def tend(self) -> None:
        """Apply the effects of finished jobs still holding flows, forget deleted tasks in every
        pair (their claims with them) and lift the fences no running job holds; a lift that
        fails is tried again next round. A metastore error reading the pairs leaves them all
        for the next round: the round runs in the daemon's start too, which it never stops."""
        try:
            pairs = await asyncio.to_thread(self.store.all)
        except MetaStoreError as exc:
            log.warning("cluster pairs not tended: %s", exc)
            return
        for pair in pairs:
            try:
                await self.settle(pair.clusters)
                current = await asyncio.to_thread(
                    self.store.update, *pair.clusters, lambda p: pruned(p, self._stored())
                )
                await injected_fault("pair-tended", job="recover")  # deleted tasks forgotten
                if not current.fences:
                    continue
                fences = PairFences(self.store, self.settings, current.clusters)
                # which jobs run is read in the lift's own compare-and-set, not here: a job
                # may claim a flow and join a fence meanwhile
                for problem in await asyncio.to_thread(fences.lift_ownerless):
                    log.warning("cluster pair %s: %s", current.key, problem)
            except Exception as exc:  # noqa: BLE001 - one pair failing leaves the others
                log.warning("cluster pair %s not tended: %s", pair.key, exc)

    def views(self) -> list[dict[str, Any]]:
        """Every pair as stored (``GET /v1/pairs``)."""
        return [pair.view() for pair in self.store.all()]

    async def gone(self, one: str, other: str, task_id: str, member: str, alive: set[str]) -> bool:
        """Whether the job of ``task_id`` run by ``member`` needs a new daemon: its member is
        this daemon (restarted: it runs nothing of it) or not live, or its claim lapsed."""
        if member == self.sup.fleet.member_id or member not in alive:
            return True
        pair = await asyncio.to_thread(self.store.get, one, other)
        flow = pair.flow_of(task_id)
        return flow is not None and flow.job is not None and flow.job.expired()
