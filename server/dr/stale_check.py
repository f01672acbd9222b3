"""After a switchover: the check for writes of stale clients on the old primary. Nothing
fences the old primary once the reverse flow writes there, so a client still writing to it
writes rows the new primary never gets; a while after the switchover, a verify of the reverse
task compares the two and shows what it found in the job's ``stale_check``.

The check answers for the reverse task only while that task is the flow's running direction.
A switch home (a switchover of the reverse task) verifies the same two clusters with them fenced
and then pauses it; a task paused or deleted applies nothing, so a verify of it cannot settle
and says nothing of stale clients. Once either is seen — before the check's verify, while it
waits for another verify of the task, or while its own runs — the check ends ``not_checked``
and names what overtook it, at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from metastore import TaskNotFoundError, TaskState
from server.dr.claims import ClaimLostError
from server.dr.flows import injected_fault, verify_ended
from server.dr.record import SwitchoverJob, iso, load_job, save_job
from server.dr.switchover import SwitchoverRun
from server.errors import ApiError
from server.logs import log_context

log = logging.getLogger(__name__)


async def check_stale_writes(run: SwitchoverRun, after: float) -> SwitchoverJob:
    """The old primary must take the reverse flow's writes, so nothing fences it any more: a
    client still writing there writes rows the new primary never gets. ``after`` seconds
    past the switchover, a verify of the reverse task compares the two; any row the old
    primary holds differently (or lacks) is shown in ``stale_check`` and logged as a
    warning, never kept silent."""
    await asyncio.sleep(after)
    reverse = run.job.reverse_task_id
    check: dict[str, Any] = {"reverse_task_id": reverse, "asked_at": iso(time.time())}
    run.deadline = time.monotonic() + run.job.timeout_seconds
    try:
        verify_id = await run.start_verify(reverse, lambda: still_the_flow(run, reverse, True))
        await injected_fault("stale_check_verifying")
        current = await verify_ended(
            run.sup,
            reverse,
            verify_id,
            run.job.timeout_seconds,
            lambda: still_the_flow(run, reverse, False),
        )
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
    except CheckOvertakenError as exc:
        check.update(state="not_checked", reason=str(exc), overtaken_by=exc.job_id or None)
        log.info("switchover %s: stale-write check not made: %s", run.job.job_id, exc)
    except Exception as exc:  # noqa: BLE001 - the check is shown, whatever stopped it
        check.update(state="not_checked", reason=f"{type(exc).__name__}: {exc}")
    if check.get("divergent_rows"):
        log.warning(
            "switchover %s: %s holds %d row(s) %s does not, or holds them otherwise "
            "(writes the reverse flow did not make: stale clients?): %s",
            run.job.job_id,
            run.job.source_cluster,
            check["divergent_rows"],
            run.job.target_cluster,
            check["collections"],
        )
    checked = run.job.with_(stale_check=check)
    run.job = checked
    await save_check(run, checked)
    await injected_fault("stale_check_saved")
    return checked


async def save_check(run: SwitchoverRun, checked: SwitchoverJob) -> None:
    """The job's record with its check, then shown; only logged when its task was deleted
    meanwhile."""
    try:
        try:
            run.seen = await asyncio.to_thread(save_job, run.sup.store, checked, run.seen)
        except ClaimLostError:
            # the record went with its task: a switch home deletes the task and creates it
            # again under its id (its reverse flow starts at the WAL's end). The check holds no
            # claim and is shown there, where the operator looks, unless another job's record
            # is there now (then this raises again, and the check is in the log above only)
            run.seen = await asyncio.to_thread(save_job, run.sup.store, checked, None)
    except TaskNotFoundError:
        log.info(
            "switchover %s: stale-write check %s not saved (its task was deleted)",
            checked.job_id,
            checked.stale_check,
        )
        return
    if run.on_save is not None:
        run.on_save(checked)


def check_left(job: SwitchoverJob) -> bool:
    """Whether ``job`` is done and its stale-write check was asked and has no result yet."""
    return job.state == "done" and bool(job.stale_check_seconds) and job.stale_check is None


async def check_again(run: SwitchoverRun) -> SwitchoverJob:
    """The check of a done job whose daemon stopped before it ended (a restart, or a fleet
    member gone): made now, at the time it was due (at once when that has passed), so a
    check asked always ends with a result or ``not_checked``."""
    job = run.job
    due = job.finished_at + job.stale_check_seconds - time.time()
    with log_context(task_id=job.task_id):
        log.info("switchover %s: its stale-write check taken up again", job.job_id)
        try:
            return await check_stale_writes(run, max(0.0, due))
        except Exception:
            log.exception("switchover %s: the stale-write check stopped", job.job_id)
            return run.job


class CheckOvertakenError(Exception):
    """The reverse task is no longer the flow's running direction (``job_id``: the switchover
    of it that overtook the check, when one did)."""

    def __init__(self, message: str, job_id: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id


async def still_the_flow(run: SwitchoverRun, reverse: str, before_verify: bool) -> None:
    """Raise CheckOvertakenError once ``reverse`` is not running, or (``before_verify``: the
    check's own verify not started yet) once a switchover of it started after this job: its
    verify of the same clusters comes first, and then it pauses the task. While the check's
    verify runs, a switchover of the task waits for it, so only the task's state is looked
    at."""
    try:
        task = await run.sup.get(reverse)
    except ApiError as exc:
        raise CheckOvertakenError(f"the reverse task {reverse} is gone ({exc.message})") from None
    if task.state is TaskState.RUNNING and not before_verify:
        return  # the check's verify runs: no job record to read at every look
    other = await asyncio.to_thread(load_job, run.sup.store, reverse)
    home = other if other is not None and other.started_at >= run.job.started_at else None
    if task.state is not TaskState.RUNNING:
        by = f"; switched over by job {home.job_id} ({home.state})" if home else ""
        raise CheckOvertakenError(
            f"the reverse task {reverse} is {task.state.value} ({task.reason}){by}: it no "
            "longer carries the flow, so a verify of it says nothing of stale clients",
            home.job_id if home else "",
        )
    if before_verify and home is not None and not home.finished:
        raise CheckOvertakenError(
            f"switchover {home.job_id} of the reverse task {reverse} is under way "
            f"({home.state}): its own verify compares the two clusters, fenced",
            home.job_id,
        )
