"""Which verb applies to a flow in which state (:mod:`pair`), as compare-and-set changes of the
pair record: a verb claims the flow (one job at a time) only where it applies, else it is
refused (409) naming the pair's state; ``resume`` of a task is refused where it would run the
flow's two directions at once, or undo a failover; and while a job holds the flow, ``pause``,
``resume`` and ``delete`` of its tasks are the job's alone (:func:`verb_allowed`).

=========  =================================================================================
verb       applies when
=========  =================================================================================
switchover the flow replicates and the task is its active direction
failover   the flow replicates and the task is its active direction; or it failed over
           already to the task's target (asked again)
failback   the flow failed over (or a failback of it failed) to the task's target
resume     no job runs on the flow, the flow replicates or fails back, and the task is its
           active direction (failing back: the reverse task)
pause,     no job runs on the flow (or the job asking holds it; a delete also once the job's
delete     daemon is gone)
=========  =================================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from server.dr.pair import (
    FAILED_OVER,
    FAILING_BACK,
    REPLICATING,
    ClusterPair,
    Flow,
    JobClaim,
    PairConflictError,
    adopt,
    claim,
    held_by,
    renewed,
)


def pruned(pair: ClusterPair, existing: Collection[str]) -> ClusterPair:
    """The pair without the tasks no longer stored (deleted), their claims with them; a flow
    left without tasks is removed. A fence held only by a removed claim has no owner then, and
    the next round lifts it."""
    flows = {}
    for flow_id, flow in pair.flows.items():
        tasks = {src: tid for src, tid in flow.tasks.items() if tid in existing}
        if not tasks:
            continue
        job = flow.job if flow.job is not None and flow.job.task_id in existing else None
        pending = flow.pending if job is not None else ""
        flows[flow_id] = Flow(flow_id, tasks, flow.active, flow.state, job, pending)
    if flows == pair.flows:
        return pair
    return ClusterPair(pair.clusters, flows, pair.fences)


def describe(pair: ClusterPair, flow: Flow) -> str:
    other = next(c for c in pair.clusters if c != flow.active) if flow.active else "?"
    if flow.state == FAILED_OVER:
        return f"failed over to {flow.active}"
    if flow.state == FAILING_BACK:
        return f"failing back from {flow.active} to {other}"
    active = flow.tasks.get(flow.active, "")
    return f"replicating {flow.active} -> {other} (task {active or 'none'})"


def check(pair: ClusterPair, flow: Flow, verb: str, task_id: str) -> None:
    """PairConflictError when ``verb`` does not apply to ``task_id``'s flow now."""
    source = flow.direction_of(task_id) or ""
    target = next(c for c in pair.clusters if c != source)
    replicating_here = flow.state == REPLICATING and flow.active == source
    failed_to_target = flow.state == FAILED_OVER and flow.active == target
    # failing back: the reverse task (from the cluster carrying production) runs, not its
    # other direction
    failing_back_here = flow.state == FAILING_BACK and flow.active == source
    applies = {
        "switchover": replicating_here,
        "resume": replicating_here or failing_back_here,
        "failover": replicating_here or failed_to_target,
        "failback": flow.state in (FAILED_OVER, FAILING_BACK) and flow.active == target,
    }
    if applies[verb]:
        return
    hint = {
        "switchover": "switch over the task of the active direction",
        "failover": "fail over the task of the active direction",
        "failback": "a failback follows a failover of the task",
        "resume": "it would run both directions of the flow"
        if flow.state in (REPLICATING, FAILING_BACK)
        else "production moved: fail back instead",
    }[verb]
    raise PairConflictError(
        f"task {task_id}: its cluster pair {pair.key} is {describe(pair, flow)}: {verb} does "
        f"not apply ({hint})"
    )


def claimed(
    pair: ClusterPair,
    verb: str,
    task_id: str,
    source: str,
    job_id: str,
    member: str,
    *,
    existing: Collection[str],
    linked: str = "",
    failed_over: bool = False,
    step: Callable[[JobClaim], str] | None = None,
) -> ClusterPair:
    """The pair with ``job_id`` claiming ``task_id``'s flow for ``verb``; PairConflictError when
    the verb does not apply or another job runs there (named with its step: ``step``).
    ``linked``: the reverse task an earlier release linked to the task; ``failed_over``: the
    task failed over under an earlier release (both only read when the pair does not know the
    task yet)."""
    pair = pruned(pair, existing)
    flow = pair.flow_of(task_id)
    if flow is None:
        flow = adopt(pair, task_id, source, linked)
        if failed_over:
            target = next(c for c in pair.clusters if c != source)
            flow = Flow(flow.flow_id, flow.tasks, target, FAILED_OVER)
    if flow.job is not None and flow.job.job_id != job_id:
        # the flow's tasks (the reverse task the job creates among them) are the job's until
        # it lets go: named first, whatever the verb
        claim(flow, verb, job_id, task_id, member, step=step)
    if flow.job is None or flow.job.job_id != job_id:
        check(pair, flow, verb, task_id)
    return pair.with_flow(claim(flow, verb, job_id, task_id, member))


def verb_allowed(
    pair: ClusterPair,
    task_id: str,
    verb: str,
    job: str = "",
    job_state: str = "",
    member: str = "",
) -> None:
    """PairConflictError when ``verb`` (pause, resume or delete) of ``task_id`` would break its
    flow's rules. While a job holds the flow's claim, only that job moves the flow's tasks
    (``job``: the job asking, "" for an operator or the daemon's retries; ``member``: the fleet
    member it runs on; ``job_state``: the holding job's step, named in the refusal). The
    asker must hold the live claim itself: the job id AND the member the claim names (a
    stalled member whose job another took over, same id, moves nothing). A claim left by a
    job whose daemon died holds until the next ``recover`` round takes the job up (a delete,
    though, goes ahead: it removes the task from the flow, the claim with it). Without a job,
    a resume must fit the flow's state (:func:`check`)."""
    flow = pair.flow_of(task_id)
    if flow is None:
        return
    held = flow.job
    if job:
        if held is None or held.job_id != job or held.member != member:
            holder = (
                "nobody"
                if held is None
                else f"{held_by(held, job_state)} on fleet member {held.member}"
            )
            raise PairConflictError(
                f"task {task_id}: job {job} no longer holds its cluster pair {pair.key} on "
                f"fleet member {member or '?'} (held by {holder}): it moves none of the flow's "
                "tasks"
            )
        return
    if held is not None and not (verb == "delete" and held.expired()):
        left = " (its daemon is gone: the next recover round takes it up)" if held.expired() else ""
        raise PairConflictError(
            f"task {task_id}: {held_by(held, job_state)} holds its cluster pair "
            f"{pair.key}{left}: {verb} of the flow's tasks waits for it"
        )
    if verb == "resume":
        check(pair, flow, "resume", task_id)


def verb_renewed(
    pair: ClusterPair, task_id: str, verb: str, job: str, member: str, job_state: str = ""
) -> ClusterPair:
    """The pair with the claim of ``job`` on ``member`` renewed, as a job's own verb on one of
    its flow's tasks is let through (:func:`verb_allowed`): checked and renewed in one
    compare-and-set, so the asker holds the live claim at that instant and for
    ``CLAIM_SECONDS`` after it (no other member takes a fresh claim over)."""
    verb_allowed(pair, task_id, verb, job, job_state, member)
    flow = pair.flow_of(task_id)
    if flow is None or flow.job is None:
        return pair
    return pair.with_flow(renewed(flow, job, member))
