"""A cluster pair: the two named clusters production moves between, and what it owns (README
"Disaster recovery", shaped as MirrorMaker 2 shapes replication between two clusters).

One record per pair of clusters (``pairs/<a>+<b>`` in the metastore's records, changed only by
compare-and-set) holds:

- its **flows**: a flow is one selection of collections replicated between the two, with at
  most two tasks, one per direction (the task and its reverse). Which direction carries
  production (``active``: its source cluster), and the flow's ``state``:

  ===============  ==========================================================================
  replicating      the active direction's task replicates to the other cluster
  failed_over      production moved to the active direction's target without a switchover
                   (its source was lost); no task of the flow runs
  failing_back     the reverse task re-seeds the lost cluster from the one that took over
  ===============  ==========================================================================

- the **job** running on each flow (switchover, failover or failback: one at a time), as a
  claim with the member that runs it, renewed while it runs: a claim not renewed for
  ``CLAIM_SECONDS`` may be taken over, and a job whose claim was taken stops at its next step;
- the **fences** on each cluster (:mod:`fence`): who holds one (jobs of any flow of the pair),
  the revision of the key the pair wrote, or that the key was the operator's (never lifted).
  A fence lives as long as an owner holds it; one without owners is lifted by the next
  ``recover`` round, whatever happened to the job or its task.

A verb that does not apply to the flow's state is refused (409) naming the state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from metastore import MetaStore
from server.errors import ConflictError

PAIR_PREFIX = "pairs/"
CLAIM_SECONDS = 60.0  # a job's claim not renewed for this long may be taken over
RENEW_SECONDS = 10.0  # how often a running job renews its claim
CAS_ATTEMPTS = 20

FlowState = str  # "replicating" | "failed_over" | "failing_back"
REPLICATING, FAILED_OVER, FAILING_BACK = "replicating", "failed_over", "failing_back"


class PairConflictError(ConflictError):
    """A verb that does not apply to the pair's state, or a job already running on the flow."""


@dataclass(frozen=True)
class JobClaim:
    kind: str  # switchover | failover | failback
    job_id: str
    task_id: str  # the task the verb was asked of
    member: str
    renewed_at: float

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) - self.renewed_at > CLAIM_SECONDS


@dataclass(frozen=True)
class Flow:
    flow_id: str
    tasks: dict[str, str]  # source cluster -> task id, at most one per direction
    active: str  # the source cluster of the direction carrying production
    state: FlowState = REPLICATING
    job: JobClaim | None = None
    # the reverse task the job holding the claim creates (its id reserved before the create,
    # released with the claim): the flow's, under the job's claim, before it exists
    pending: str = ""

    def direction_of(self, task_id: str) -> str | None:
        return next((src for src, tid in self.tasks.items() if tid == task_id), None)

    def reverse_of(self, task_id: str) -> str:
        """The flow's other task ("" when it has none yet)."""
        return next((tid for tid in self.tasks.values() if tid != task_id), "")


@dataclass(frozen=True)
class FenceHold:
    """A fence on one cluster as the pair holds it."""

    owners: tuple[str, ...] = ()  # job ids holding it
    revision: int = 0  # the etcd mod revision of the key the pair wrote (0: not written yet)
    # the etcd revision read just before the key was written: a key created after it with the
    # fence's value is the pair's even when the job stopped before recording ``revision``
    written_after: int = 0
    operator: bool = False  # the key was there before: the operator's, never lifted
    lifting: bool = False  # the last owner left: being lifted (joined by nobody meanwhile)


@dataclass(frozen=True)
class ClusterPair:
    clusters: tuple[str, str]
    flows: dict[str, Flow] = field(default_factory=dict)
    fences: dict[str, FenceHold] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return pair_key(*self.clusters)

    def flow_of(self, task_id: str) -> Flow | None:
        return next(
            (f for f in self.flows.values() if task_id in f.tasks.values() or f.pending == task_id),
            None,
        )

    def with_flow(self, flow: Flow) -> ClusterPair:
        return replace(self, flows={**self.flows, flow.flow_id: flow})

    def with_fence(self, cluster: str, hold: FenceHold | None) -> ClusterPair:
        fences = {k: v for k, v in self.fences.items() if k != cluster}
        if hold is not None:
            fences[cluster] = hold
        return replace(self, fences=fences)

    def live_job_ids(self, now: float | None = None) -> set[str]:
        return {f.job.job_id for f in self.flows.values() if f.job and not f.job.expired(now)}

    def view(self) -> dict[str, Any]:
        return {
            "clusters": list(self.clusters),
            "flows": {k: asdict(v) for k, v in self.flows.items()},
            "fences": {k: asdict(v) for k, v in self.fences.items()},
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.view(), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> ClusterPair:
        data = json.loads(raw)
        flows = {}
        for flow_id, flow in data.get("flows", {}).items():
            job = flow.get("job")
            flows[flow_id] = Flow(
                flow_id=flow_id,
                tasks=dict(flow["tasks"]),
                active=flow["active"],
                state=flow.get("state", REPLICATING),
                job=JobClaim(**job) if job else None,
                pending=str(flow.get("pending") or ""),
            )
        fences = {
            cluster: FenceHold(
                owners=tuple(hold.get("owners", ())),
                revision=int(hold.get("revision", 0)),
                written_after=int(hold.get("written_after", 0)),
                operator=bool(hold.get("operator", False)),
                lifting=bool(hold.get("lifting", False)),
            )
            for cluster, hold in data.get("fences", {}).items()
        }
        one, other = data["clusters"]
        return cls((one, other), flows, fences)


def pair_key(one: str, other: str) -> str:
    first, second = sorted((one, other))
    return f"{PAIR_PREFIX}{first}+{second}"


class PairStore:
    """The pairs' records in the metastore; every change is a compare-and-set, retried on a
    conflict with the change applied to what another daemon wrote meanwhile."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store

    def get(self, one: str, other: str) -> ClusterPair:
        found = self.store.get_record(pair_key(one, other))
        if found is None:
            return ClusterPair(tuple(sorted((one, other))))  # type: ignore[arg-type]
        return ClusterPair.from_bytes(found[0])

    def all(self) -> list[ClusterPair]:
        records = self.store.list_records(PAIR_PREFIX).values()
        return [ClusterPair.from_bytes(raw) for raw, _ in records]

    def update(
        self, one: str, other: str, change: Callable[[ClusterPair], ClusterPair]
    ) -> ClusterPair:
        """Apply ``change`` to the pair as stored and store the result in one compare-and-set;
        ``change`` may raise to refuse (nothing is written then)."""
        key = pair_key(one, other)
        for _ in range(CAS_ATTEMPTS):
            found = self.store.get_record(key)
            if found is None:
                current = ClusterPair(tuple(sorted((one, other))))  # type: ignore[arg-type]
                version = None
            else:
                current, version = ClusterPair.from_bytes(found[0]), found[1]
            changed = change(current)
            if changed == current and version is not None:
                return current
            if self.store.put_record(key, changed.to_bytes(), version) is not None:
                return changed
        raise PairConflictError(
            f"cluster pair {key}: changed by other daemons {CAS_ATTEMPTS} times"
        )


def adopt(pair: ClusterPair, task_id: str, source: str, reverse_id: str = "") -> Flow:
    """The flow of ``task_id`` (``source`` -> the other cluster of the pair): the stored one,
    else a new flow whose active direction is the task's (``reverse_id``: a task an earlier
    release linked as its reverse)."""
    flow = pair.flow_of(task_id)
    if flow is not None:
        return flow
    tasks = {source: task_id}
    other = pair.clusters[1] if pair.clusters[0] == source else pair.clusters[0]
    if reverse_id and pair.flow_of(reverse_id) is None:
        tasks[other] = reverse_id
    return Flow(flow_id=task_id, tasks=tasks, active=source)


def held_by(job: JobClaim, step: str = "") -> str:
    """How a refusal names the job holding a flow: its kind, id and step (``step``: as its
    record says; "running" when unknown)."""
    return f"{job.kind} {job.job_id} ({step or 'running'})"


def refuse_if_held(
    flow: Flow,
    kind: str,
    task_id: str,
    job_id: str = "",
    now: float | None = None,
    step: Callable[[JobClaim], str] | None = None,
) -> None:
    """PairConflictError naming the live job other than ``job_id`` that holds ``flow`` (its
    kind, id and step, ``step``: the step of a job as its record says), for ``kind`` asked of
    ``task_id``; nothing when none does (or its claim lapsed)."""
    now = time.time() if now is None else now
    job = flow.job
    if job is not None and job.job_id != job_id and not job.expired(now):
        raise PairConflictError(
            f"task {task_id}: {held_by(job, step(job) if step else '')} holds its cluster "
            f"pair (of task {job.task_id}, on fleet member {job.member}): {kind} waits for it "
            "while it is under way"
        )


def claim(
    flow: Flow,
    kind: str,
    job_id: str,
    task_id: str,
    member: str,
    now: float | None = None,
    step: Callable[[JobClaim], str] | None = None,
) -> Flow:
    """The flow with ``job_id`` running on it; PairConflictError when another job runs there
    (named with its step, ``step``: the step of a job as its record says)."""
    now = time.time() if now is None else now
    refuse_if_held(flow, kind, task_id, job_id, now, step)
    # a reverse task reserved by another job (its daemon gone) is not this job's
    pending = flow.pending if flow.job is not None and flow.job.job_id == job_id else ""
    return replace(flow, job=JobClaim(kind, job_id, task_id, member, now), pending=pending)


def release(flow: Flow, job_id: str, member: str = "", **changes: Any) -> Flow:
    """The flow without ``job_id``'s claim, with ``changes`` (active, state, tasks) applied;
    the reverse task it reserved goes with it (in ``tasks`` when the job handed the flow
    over). Unchanged unless the claim is ``job_id``'s (on ``member``, when given): a job whose
    effects another daemon applied already (:mod:`job_effects`), or that another member took
    over, changes nothing (the flow may have moved on since)."""
    job = flow.job
    if job is None or job.job_id != job_id or (member and job.member != member):
        return flow
    return replace(flow, job=None, pending="", **changes)


def reserved(flow: Flow, job_id: str, member: str, task_id: str) -> Flow:
    """The claim renewed with ``task_id`` reserved as the flow's reverse task (the job creates
    it next); PairConflictError when the claim is no longer ``job_id``'s."""
    flow = renewed(flow, job_id, member)
    return flow if task_id in flow.tasks.values() else replace(flow, pending=task_id)


def renewed(flow: Flow, job_id: str, member: str) -> Flow:
    """The claim renewed; PairConflictError when it is no longer ``job_id``'s on ``member``."""
    job = flow.job
    if job is None or job.job_id != job_id or job.member != member:
        holder = "nobody" if job is None else f"{job.kind} {job.job_id} on {job.member}"
        raise PairConflictError(f"job {job_id} no longer holds its cluster pair (held by {holder})")
    return replace(flow, job=replace(job, renewed_at=time.time()))
