"""Failover: the source cluster is lost. The task stops at once; the answer says up to when the
target holds every write the source acknowledged (``consistent_up_to``), and, when the source's
WAL can still be read (its queue survived the Milvus), writes every record of the task's
collections the target lacks to a file (:mod:`failover_export`).

Order: pause the task (its runner stops and saves its positions: exactly what the target
holds), wait until a runner the pause let go (a target write under way) has ended, then read
each DML channel from its saved position to its end (the flow's claim and the target's fence
are the manager's, :mod:`manager`). With the
WAL read, the figure is what its ticks prove; without it (``complete: false``), the saved
positions' ticks (every channel's figure at its last save).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from metastore import MetaStore, Position, TaskState
from replicator.compare.gate import applied_ts
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import to_seconds
from replicator.pipeline.runner_context import RunnerContext
from replicator.pipeline.status import consistent_view
from replicator.pipeline.task_state import RunnerState
from server.dr.failover_export import ChannelTail, Unreplicated, export_unapplied
from server.dr.flows import injected_fault
from server.dr.record import FAILOVER_KEY, iso, json_bytes, load_json, replace_record
from server.dr.task_ops import TaskOperations
from server.logs import log_context
from server.tasks.engine import cluster_context
from server.tasks.requests import TaskIdRequest

log = logging.getLogger(__name__)

# seconds a failover waits for a runner the pause let go inside a blocking call (a target
# write under way) to end: its write may land on the target after the positions are read
RUNNER_END_WAIT = 30.0


class FailoverRequest(TaskIdRequest):
    # seconds the export of what the target lacks may read the source's WAL (0: no export)
    export_seconds: float = Field(default=60.0, ge=0, le=3600)


async def run_failover(
    ops: TaskOperations, settings: CdcSettings, request: FailoverRequest, job: str = ""
) -> dict[str, Any]:
    """Stop the task at once and say what the target holds and what it lacks; the view kept
    as ``progress.failover`` (the answer, with ``state``). ``job``: the failover's id, holding
    the flow's claim (between named clusters)."""
    task = await ops.get(request.task_id)
    tid = task.task_id
    # the record is saved over the one read here: a failover that stalled past its claim
    # finds another's record saved since (ClaimLostError) and writes nothing over it
    seen = await asyncio.to_thread(ops.store.get_state, tid, FAILOVER_KEY)
    at = time.time()
    runner = ops.runner_of(tid)
    reason = f"failed over at {iso(at)}"
    if task.state is not TaskState.PAUSED:
        # a runner on another member stops at its next round: wait for it, a lease at most
        # (and the store's own lag in expiring it: etcd rounds a lease's TTL up to whole
        # seconds and looks for expired ones every half second)
        task = await ops.pause(tid, reason=reason, stop_wait=_owner_wait(settings), job=job)
        await injected_fault("failover-paused", job="failover")
    problems = []
    stopped = runner is not None or await ops.runner_stopped(tid)
    if not stopped:
        problems.append(
            f"the fleet member running the task had not stopped it "
            f"{_owner_wait(settings):g} s after the pause: it may still write to the target"
        )
    if runner is not None and not await asyncio.to_thread(runner.wait_stopped, RUNNER_END_WAIT):
        stopped = False
        problems.append(
            f"the task's runner was still writing {RUNNER_END_WAIT:g} s after the pause: "
            "records marked maybe_on_target may be on the target too"
        )
    spec = TaskSpec.of(task)
    saved = await asyncio.to_thread(applied_ts(ops.store, tid, None)) or 0
    export = None
    if request.export_seconds:
        context = cluster_context(settings, spec.source_name, shared_readers=False)
        positions = await ops.positions(tid)
        out = _export_path(settings, tid, at)
        export = await asyncio.to_thread(
            _read_tails, context, ops.store, tid, spec, positions, out, request.export_seconds
        )
        export.problems[:0] = problems
        export.complete = export.complete and not problems
    complete = export is not None and export.complete
    # the WAL read to its end proves the figure; otherwise the saved positions' ticks
    consistent = export.consistent_ts if export is not None and complete else saved
    answer: dict[str, Any] = {
        "task_id": tid,
        "failed_over_at": iso(at),
        "consistent_up_to": consistent_view(consistent),
        "rpo_seconds": round(at - to_seconds(consistent), 3) if consistent else None,
        "unapplied_from": consistent_view(export.unapplied_from) if export else None,
        "complete": complete,
        # whether the task's runner (here, or on the member that ran it) had stopped writing
        # when the figure was taken; the problems say why not
        "runner_stopped": stopped,
        "problems": problems,
        "unreplicated": export.view() if export is not None else None,
    }
    # the job's id: a recover round that finds the flow still claimed by it hands the flow over
    view = {**answer, "state": "done", "job_id": job}
    await asyncio.to_thread(
        replace_record, ops.store, tid, FAILOVER_KEY, json_bytes(view), seen, job or "failover"
    )
    await injected_fault("failover_saved", job="failover")
    up_to = (answer["consistent_up_to"] or {}).get("time", "unknown")
    await ops.set_reason(tid, failed_over_reason(view))
    await injected_fault("failover_reason", job="failover")
    with log_context(task_id=tid):
        log.warning("failed over: consistent up to %s%s", up_to, "" if complete else " (saved)")
    return view


def failed_over_reason(view: dict[str, Any]) -> str:
    """The reason of a task failed over (``view``: the failover's record): what the target
    holds."""
    up_to = (view.get("consistent_up_to") or {}).get("time", "unknown")
    return (
        f"failed over at {view['failed_over_at']}: the target holds every source write up to "
        f"{up_to}"
    )


async def saved_failover(ops: TaskOperations, tid: str, job: str) -> dict[str, Any] | None:
    """The record of failover ``job`` of task ``tid`` when it says done (the failover
    happened), its task's reason set as the failover sets it where the task still has the
    pause's; None otherwise."""
    saved = await asyncio.to_thread(load_json, ops.store, tid, FAILOVER_KEY)
    if saved is None or saved.get("job_id") != job or saved.get("state") != "done":
        return None
    task = await ops.get(tid)
    if (
        task.state is TaskState.PAUSED
        and task.reason == f"failed over at {saved['failed_over_at']}"
    ):
        await ops.set_reason(tid, failed_over_reason(saved))
    return saved


def _owner_wait(settings: CdcSettings) -> float:
    """Seconds a failover waits for another member's runner to stop: a lease, plus the store's
    lag in expiring a lease whose member stalled."""
    return settings.fleet.leaseSeconds + max(2.0, 2 * settings.fleet.checkSeconds)


def _export_path(settings: CdcSettings, tid: str, at: float) -> Path:
    """``data/failover/<task>-<time>.jsonl``, beside the backfill logs (made absolute by the
    export)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))
    return Path(settings.backfill.logDir).parent / "failover" / f"{tid}-{stamp}.jsonl"


def _read_tails(
    context: RunnerContext,
    store: MetaStore,
    tid: str,
    spec: TaskSpec,
    positions: dict[str, Position],
    out: Path,
    budget: float,
) -> Unreplicated:
    """Each DML channel of the task, from its saved position (and in-flight bound) to its
    end."""
    state = RunnerState(store, tid)
    tails = []
    for channel in context.channels:
        saved = positions.get(channel)
        tail = ChannelTail(channel, saved.ts if saved is not None else 0)
        tail.inflight_bound = state.inflight_bound(channel)
        tails.append(tail)
    return export_unapplied(context, spec, tails, positions, state.collections(), out, budget)
