"""What a finished job leaves on its flow, read from the job's own record: a job saves its end
(switchover ``done``/``failed``, failback ``in_sync``/``failed``, failover ``done``) before it
hands the flow back (the pair's record is another key: no one write holds both). A daemon killed
between the two, or whose compare-and-set failed, leaves the flow claimed by a finished job and
pointing the old way; whoever reads the pair next (a ``recover`` round, a verb's claim or check)
re-applies the job's effects first, in one compare-and-set conditioned on the claim still being
that job's, so applying them twice changes nothing. Only a record written by the member the
claim names counts: a member that stalled after checking its claim may write its record after
another member took the job over.
"""

from __future__ import annotations

from typing import Any

from metastore import MetaStore
from server.dr.pair import FAILED_OVER, REPLICATING, ClusterPair, Flow, JobClaim, release
from server.dr.record import FAILBACK_KEY, FAILOVER_KEY, SwitchoverJob, load_job, load_json


def finished_changes(store: MetaStore, pair: ClusterPair, flow: Flow) -> dict[str, Any] | None:
    """The changes the finished job holding ``flow`` makes to it as it lets go (``{}``: none
    but the release); None while the job runs (or its record is another job's). A claim whose
    job left no record of its own and that lapsed (its daemon died, or stalled past it, between
    the claim and the job's first save) is let go with no change: nothing else would ever take
    it up (a job that wakes finds its claim gone at its next step)."""
    held = flow.job
    if held is None:
        return None
    changes = _changes(store, pair, flow, held)
    if changes is None and held.expired() and not _recorded(store, held):
        return {}
    return changes


def _recorded(store: MetaStore, held: JobClaim) -> bool:
    """Whether the job holding a claim saved a record of its own (a failover saves its record
    only at its end: the claim is its record meanwhile)."""
    if held.kind == "switchover":
        job = load_job(store, held.task_id)
        return job is not None and job.job_id == held.job_id
    key = FAILBACK_KEY if held.kind == "failback" else FAILOVER_KEY
    return (load_json(store, held.task_id, key) or {}).get("job_id") == held.job_id


def _changes(
    store: MetaStore, pair: ClusterPair, flow: Flow, held: JobClaim
) -> dict[str, Any] | None:
    if held.kind == "switchover":
        job = load_job(store, held.task_id)
        # written by the member the claim names: a member that stalled after its claim check
        # and saved its end over the record of the member that took the job over has no say
        if job is None or job.job_id != held.job_id or job.member != held.member:
            return None
        return switchover_changes(job) if job.finished else None
    key = FAILBACK_KEY if held.kind == "failback" else FAILOVER_KEY
    record = load_json(store, held.task_id, key) or {}
    if record.get("job_id") != held.job_id or record.get("member", held.member) != held.member:
        return None
    if held.kind == "failback":
        return failback_changes(record)
    if record.get("state") != "done":
        return None
    return {"state": FAILED_OVER, "active": _target_of(pair, flow, held)}


def failback_changes(record: dict[str, Any]) -> dict[str, Any] | None:
    """What a failback leaves on its flow: the reverse direction replicating when in sync,
    nothing but the release when failed; None while it runs."""
    state = record.get("state")
    if state == "in_sync":
        return {"state": REPLICATING, "active": str(record["production_cluster"])}
    return {} if state == "failed" else None


def switchover_changes(job: SwitchoverJob) -> dict[str, Any]:
    """What a finished switchover leaves on its flow: handed to the reverse direction when
    done, nothing but the release when failed."""
    if job.state != "done":
        return {}
    return {
        "active": job.target_cluster,
        "state": REPLICATING,
        "tasks": {job.source_cluster: job.task_id, job.target_cluster: job.reverse_task_id},
    }


def _target_of(pair: ClusterPair, flow: Flow, held: JobClaim) -> str:
    source = flow.direction_of(held.task_id)
    return next(c for c in pair.clusters if c != source)


Finished = dict[str, tuple[str, dict[str, Any], JobClaim]]


def settled(pair: ClusterPair, finished: Finished) -> ClusterPair:
    """``pair`` with each finished job (job id -> its flow id, changes and claim as read)
    released, where the flow's claim is still that very claim (not renewed, not taken over)."""
    for job_id, (flow_id, changes, held) in finished.items():
        flow = pair.flows.get(flow_id)
        if flow is None or flow.job != held:
            continue
        pair = pair.with_flow(release(flow, job_id, **changes))
    return pair


def finished_jobs(store: MetaStore, pair: ClusterPair) -> Finished:
    """The finished jobs still holding a flow of ``pair``: job id -> its flow id, changes and
    claim."""
    found = {}
    for flow in pair.flows.values():
        changes = finished_changes(store, pair, flow)
        if changes is not None and flow.job is not None:
            found[flow.job.job_id] = (flow.flow_id, changes, flow.job)
    return found
