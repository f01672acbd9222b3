"""Fences with owners: the fence keys a cluster pair writes (:mod:`fence`), who holds each, and
how they are lifted (:mod:`pair` keeps the record).

- **acquire**: a job joins the owners of the fence on a cluster. The first owner writes the key,
  only where it is absent (one etcd transaction), and records the revision it wrote; a key that
  was already there is the operator's: recorded as such, and never lifted. An owner that finds
  its hold gone once the key is written (it stalled there, and another daemon rolled its job
  back and, finding no key, forgot the hold) deletes the key again: no fence without a record.
- **release**: a job leaves the owners. The last one marks the fence ``lifting`` (in the same
  compare-and-set), deletes the key in one transaction conditioned on the revision the pair
  wrote (a key someone rewrote since is theirs and stays), then removes the hold. A fence being
  lifted is not joined: a job waits until it is gone and writes it anew.
- **lift_ownerless**: a fence no job holds any more (its job failed half-way, its daemon died,
  its task was deleted) is lifted by the next ``recover`` round, whoever runs it; a lift that
  fails stays recorded and is tried again next round.

A job that stopped between recording itself as the writer and recording the revision leaves a
hold with ``written_after``: a key created after that etcd revision with the fence's value is
taken as the pair's (an operator setting the same key at that very moment would see it lifted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import replace

from replicator.config.settings import CdcSettings
from server.dr.claims import ClaimLostError
from server.dr.fence import FENCE_VALUE, EtcdQuotaFence, FenceError
from server.dr.flows import injected_fault_sync
from server.dr.pair import ClusterPair, FenceHold, PairStore

log = logging.getLogger(__name__)


def running(pair: ClusterPair) -> set[str]:
    """The jobs holding a flow's claim in ``pair``."""
    return {flow.job.job_id for flow in pair.flows.values() if flow.job is not None}


def taken_over(pair: ClusterPair, job_id: str, member: str) -> str:
    """Why ``job_id`` on ``member`` holds none of ``pair``'s flows any more ("": it still may):
    a flow's claim names the job on another member."""
    for flow in pair.flows.values():
        job = flow.job
        if job is not None and job.job_id == job_id and job.member != member:
            return f"job {job_id} is held by fleet member {job.member} now, not {member}"
    return ""


def holds(pair: ClusterPair, job_id: str, member: str) -> bool:
    """Whether a flow's claim in ``pair`` names ``job_id`` on ``member``."""
    return any(
        f.job is not None and f.job.job_id == job_id and f.job.member == member
        for f in pair.flows.values()
    )


JOIN_WAIT = 30.0  # seconds a job waits for a fence being lifted to be gone


class PairFences:
    def __init__(self, pairs: PairStore, settings: CdcSettings, pair: tuple[str, str]) -> None:
        self.pairs = pairs
        self.settings = settings
        self.pair = pair

    def fence(self, cluster: str) -> EtcdQuotaFence:
        return EtcdQuotaFence(cluster, self.settings.cluster(cluster))

    def _update(self, change: object) -> ClusterPair:
        return self.pairs.update(*self.pair, change)  # type: ignore[arg-type]

    def acquire(self, cluster: str, job_id: str, member: str = "") -> FenceHold:
        """Hold the fence on ``cluster`` for ``job_id``, writing its key when nobody holds it;
        the hold as recorded. FenceError when the key cannot be written, or a fence being
        lifted is not gone within ``JOIN_WAIT``. ``member``: the fleet member the job runs on;
        ClaimLostError (nothing joined) unless a flow's claim names the job on it, read in the
        join's compare-and-set (a member that stalled after its claim check, the job rolled
        back or taken over meanwhile, writes no fence)."""
        fence = self.fence(cluster)
        deadline = time.monotonic() + JOIN_WAIT
        while True:
            joined = self._join(cluster, job_id, fence.read()[3], member)
            injected_fault_sync("fence_joined")
            if joined is not None:
                break
            if time.monotonic() >= deadline:
                raise FenceError(
                    f"the fence on cluster {cluster} is being lifted and was not gone after "
                    f"{JOIN_WAIT:g} s"
                )
            time.sleep(0.5)
        hold, writes = joined
        if not writes:
            return hold
        injected_fault_sync("fence-joined")  # an owner recorded, the key not written yet
        revision = fence.create(hold.written_after)
        injected_fault_sync("fence_written")
        if revision:
            hold = replace(hold, revision=revision)
        else:
            value, _, _, _ = fence.read()
            if value is not None and value.strip().lower() != FENCE_VALUE:
                self.release(cluster, job_id)
                raise FenceError(
                    f"{fence.label} is set to {value.decode(errors='replace')!r} by someone "
                    "else: the job does not overwrite it"
                )
            hold = replace(hold, operator=True)  # there before: the operator's
            log.warning("%s was already set: the operator's fence, never lifted", fence.label)

        def record(pair: ClusterPair) -> ClusterPair:
            current = pair.fences.get(cluster)
            if current is None or job_id not in current.owners:
                return pair
            return pair.with_fence(
                cluster, replace(current, revision=hold.revision, operator=hold.operator)
            )

        current = self._update(record).fences.get(cluster)
        injected_fault_sync("fencing")
        if current is None or job_id not in current.owners:
            # the hold was given up while the key was written (this job stalled, another
            # daemon rolled it back and found no key): no fence stays without its record
            injected_fault_sync("fence-unheld")  # the key written, its hold found gone
            if hold.revision:
                fence.delete_if(hold.revision)
            raise FenceError(
                f"the fence on cluster {cluster} was released (job {job_id} rolled back by "
                f"another daemon) while {fence.label} was written: removed again"
            )
        return hold

    def _join(
        self, cluster: str, job_id: str, before: int, member: str = ""
    ) -> tuple[FenceHold, bool] | None:
        """``job_id`` among the owners, in one compare-and-set: the hold, and whether this job
        writes the key (it is the first owner); None while the fence is being lifted."""
        result: list[tuple[FenceHold, bool]] = []

        def join(pair: ClusterPair) -> ClusterPair:
            result.clear()
            if member and not holds(pair, job_id, member):
                raise ClaimLostError(
                    taken_over(pair, job_id, member) or f"job {job_id} holds no flow any more"
                )
            hold = pair.fences.get(cluster)
            if hold is not None and hold.lifting:
                return pair
            writes = hold is None
            if hold is None:
                hold = FenceHold(owners=(job_id,), written_after=before)
            elif job_id not in hold.owners:
                hold = replace(hold, owners=(*hold.owners, job_id))
            result.append((hold, writes))
            return pair.with_fence(cluster, hold)

        self._update(join)
        return result[0] if result else None

    def release(self, cluster: str, job_id: str, member: str = "") -> bool:
        """``job_id`` no longer holds the fence on ``cluster``; the last owner lifts it (True:
        this call lifted it; False: others hold it still, or it was the operator's).
        FenceError when the lift fails (the hold stays for ``lift_ownerless``).
        ``member``: the fleet member the job runs on; ClaimLostError (nothing changed) when a
        flow's claim names the job on another member, in the same compare-and-set (the job
        was taken over while this member stalled: the fence is the new member's to lift)."""

        def leave(pair: ClusterPair) -> ClusterPair:
            if member:
                taken = taken_over(pair, job_id, member)
                if taken:
                    raise ClaimLostError(taken)
            hold = pair.fences.get(cluster)
            if hold is None or job_id not in hold.owners:
                return pair
            owners = tuple(o for o in hold.owners if o != job_id)
            if owners:
                return pair.with_fence(cluster, replace(hold, owners=owners))
            if hold.operator:
                return pair.with_fence(cluster, None)
            return pair.with_fence(cluster, replace(hold, owners=(), lifting=True))

        pair = self._update(leave)
        injected_fault_sync("fence_left")
        hold = pair.fences.get(cluster)
        if hold is None or not hold.lifting:
            return False
        self._lift(cluster, hold)
        return True

    def lift_ownerless(self, live_jobs: Collection[str] = ()) -> list[str]:
        """Lift every fence of the pair whose owners are all gone; the problems of those that
        could not be lifted (retried next time). A job runs when it holds a flow's claim in the
        pair's record as the compare-and-set that marks the fence for lifting reads it (one
        that claimed a flow and joined the fence after the caller looked keeps it), or is in
        ``live_jobs``."""
        problems = []
        for cluster, hold in self.pairs.get(*self.pair).fences.items():
            if hold.lifting or not set(hold.owners) & set(live_jobs):

                def orphan(pair: ClusterPair, cluster: str = cluster) -> ClusterPair:
                    current = pair.fences.get(cluster)
                    if current is None or set(current.owners) & (running(pair) | set(live_jobs)):
                        return pair
                    if current.operator:
                        return pair.with_fence(cluster, None)
                    return pair.with_fence(cluster, replace(current, owners=(), lifting=True))

                current = self._update(orphan).fences.get(cluster)
                if current is None or not current.lifting:
                    continue
                log.warning(
                    "the fence on cluster %s has no running job (its owners: %s): lifting it",
                    cluster,
                    ", ".join(hold.owners) or "none",
                )
                try:
                    self._lift(cluster, current)
                except FenceError as exc:
                    problems.append(str(exc))
        return problems

    def _lift(self, cluster: str, hold: FenceHold) -> None:
        fence = self.fence(cluster)
        value, mod, created, _ = fence.read()
        # never recorded as written: its first owner may have stalled between its join and its
        # write; mark the hold given up (it then writes nothing), or lift the key it wrote just now
        unwritten = value is None and not hold.revision and bool(hold.written_after)
        if unwritten and not fence.cancel_unwritten(hold.written_after):
            value, mod, created, _ = fence.read()
        ours = value is not None and value.strip().lower() == FENCE_VALUE
        if value is None:
            pass  # gone already
        elif hold.revision and mod == hold.revision:
            fence.delete_if(mod)
        elif not hold.revision and ours and created > hold.written_after:
            fence.delete_if(mod)  # written by a job that stopped before recording it
        else:
            log.warning(
                "%s was changed by someone else since the pair wrote it: left as it is",
                fence.label,
            )
        injected_fault_sync("fence_deleted")

        def forget(pair: ClusterPair) -> ClusterPair:
            current = pair.fences.get(cluster)
            if current is None or not current.lifting:
                return pair
            return pair.with_fence(cluster, None)

        self._update(forget)
        injected_fault_sync("fence_lifted")
