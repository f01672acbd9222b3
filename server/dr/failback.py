"""Failback: bring a failed-over task's old source (A) back as a replica of the target (B) that
took production, then let a switchover move production home.

The failback creates the reverse task B -> A with a backfill: B's rows are copied into A (the
copy upserts, so a row A holds in another version is overwritten), and the task streams B's
writes from the moment it was created. A still holds what it acknowledged after the failover's
consistent point and never sent to B (its unreplicated tail, the failover's export): a verify
with repair of the reverse task removes those rows (and fixes any other difference), then a
plain verify must find A equal to B. ``progress.failback`` shows the job::

    seeding     the reverse task's backfill copies B into A
    repairing   a verify with repair removes from A what B does not hold
    streaming   a verify without repair checks A against B while the task streams
    in_sync     that verify found A equal to B: a switchover of the reverse task moves
                production back to A (it starts the original task again, from A's WAL end)
    failed      with the reason

Each step is saved (``dr/failback`` on the original task) and taken up again after a restart;
the backfill and the verify jobs are the reverse task's own and survive restarts themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from replicator.backfill.state import BackfillState
from replicator.config.task_spec import TaskSpec
from server.dr.record import FAILBACK_KEY, LINK_KEY, iso, save_json
from server.dr.switchover import reverse_request, verify_ended
from server.dr.task_ops import TaskOperations
from server.errors import ApiError, ConflictError
from server.tasks.requests import BackfillOption, CreateRequest, VerifyRequest

log = logging.getLogger(__name__)

POLL = 1.0  # seconds between looks at the reverse task's jobs
FINISHED = ("in_sync", "failed")
REPAIRS = 3  # verify-with-repair passes before the failback gives up


def failback_request(spec: TaskSpec, task_id: str) -> CreateRequest:
    """The reverse task of a failed-over task: B -> A, seeded by a backfill of B."""
    request = reverse_request(spec, task_id)
    return request.model_copy(update={"start_at": "creation", "backfill": BackfillOption()})


class FailbackRun:
    """One failback, driven from the daemon's event loop; ``record`` is its saved state."""

    def __init__(
        self,
        supervisor: TaskOperations,
        record: dict[str, Any],
        on_save: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self.sup = supervisor
        self.record = dict(record)
        self.on_save = on_save

    @property
    def task_id(self) -> str:
        return str(self.record["task_id"])

    @property
    def reverse_id(self) -> str:
        return str(self.record["reverse_task_id"])

    async def save(self, **changes: Any) -> None:
        if "state" in changes and changes["state"] != self.record.get("state"):
            steps = [
                *self.record.get("steps", []),
                {"state": changes["state"], "at": iso(time.time())},
            ]
            changes["steps"] = steps
        self.record.update(changes)
        await asyncio.to_thread(save_json, self.sup.store, self.task_id, FAILBACK_KEY, self.record)
        self.on_save(self.task_id, dict(self.record))
        log.info("failback of %s: %s", self.task_id, self.record["state"])

    async def create(self, spec: TaskSpec) -> None:
        """Create the reverse task (its backfill starts with it)."""
        await self.sup.create(failback_request(spec, self.reverse_id))
        for task_id, other in ((self.reverse_id, self.task_id), (self.task_id, self.reverse_id)):
            await asyncio.to_thread(
                save_json, self.sup.store, task_id, LINK_KEY, {"reverse_of": other}
            )

    async def run(self) -> None:
        try:
            if self.record["state"] == "creating":  # a daemon stopped while creating it
                try:
                    await self.sup.get(self.reverse_id)
                except ApiError:
                    await self.save(state="failed", reason="the reverse task was not created")
                    return
                await self.save(state="seeding")
            while self.record["state"] not in FINISHED:
                step = getattr(self, f"_{self.record['state']}")
                await step()
        except (ApiError, OSError) as exc:
            await self.save(state="failed", reason=str(exc))

    async def _seeding(self) -> None:
        state = BackfillState(self.sup.store, self.reverse_id)
        while True:
            job = await asyncio.to_thread(state.job)
            if job is None:
                raise ConflictError(f"task {self.reverse_id} has no backfill")
            if not job.active:
                break
            await asyncio.sleep(POLL)
        if job.state != "done":
            await self.save(state="failed", reason=f"backfill {job.job_id}: {job.reason}")
            return
        await self.save(state="repairing", backfill=job.job_id)

    async def _repairing(self) -> None:
        result = await self._verify(repair=True, key="repair_job")
        if result is None:
            return
        passes = int(self.record.get("repairs", 0)) + 1
        await self.save(state="streaming", repairs=passes, repaired=result["repaired"])

    async def _streaming(self) -> None:
        result = await self._verify(repair=False, key="verify_job")
        if result is None:
            return
        if result["divergent"] == 0 and not result["unsettled"]:
            await self.save(state="in_sync", in_sync_at=iso(time.time()), verify=result)
            return
        if int(self.record.get("repairs", 0)) >= REPAIRS:
            await self.save(
                state="failed",
                verify=result,
                reason=f"A still differs from B after {REPAIRS} repairs: {result}",
            )
            return
        await self.save(state="repairing", verify=result, repair_job="", verify_job="")

    async def _verify(self, *, repair: bool, key: str) -> dict[str, Any] | None:
        """Run (or, after a restart, wait for) the reverse task's verify; its result, or None
        when the failback failed."""
        job_id = str(self.record.get(key) or "")
        current = self.sup.verify_job(self.reverse_id)
        if not job_id or current is None or current.job_id != job_id:
            _, job_id = await self.sup.verify(VerifyRequest(task_id=self.reverse_id, repair=repair))
            await self.save(**{key: job_id})
        current = await verify_ended(self.sup, self.reverse_id, job_id, poll=POLL)
        if current.state != "done":
            await self.save(state="failed", reason=f"verify {job_id}: {current.reason}")
            return None
        return {
            "job_id": job_id,
            "divergent": sum(c.divergent for c in current.collections),
            "repaired": sum(c.repaired for c in current.collections),
            "unsettled": sum(len(c.unsettled) for c in current.collections),
        }
