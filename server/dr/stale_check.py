"""After a switchover: the check for writes of stale clients on the old primary. Nothing
fences the old primary once the reverse flow writes there, so a client still writing to it
writes rows the new primary never gets; a while after the switchover, a verify of the reverse
task compares the two and shows what it found in the job's ``stale_check``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from server.dr.claims import ClaimLostError
from server.dr.flows import verify_ended
from server.dr.record import SwitchoverJob, iso, save_job
from server.dr.switchover import SwitchoverRun

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
        verify_id = await run.start_verify(reverse)
        current = await verify_ended(run.sup, reverse, verify_id, run.job.timeout_seconds)
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
    try:
        run.seen = await asyncio.to_thread(save_job, run.sup.store, checked, run.seen)
    except ClaimLostError:
        # the record went with its task: a switch home deletes the task and creates it again
        # under its id (its reverse flow starts at the WAL's end). The check holds no claim and
        # is shown there, where the operator looks, unless another job's record is there now
        # (then this raises again, and the check is in the log above only)
        run.seen = await asyncio.to_thread(save_job, run.sup.store, checked, None)
    if run.on_save is not None:
        run.on_save(checked)
    return checked
