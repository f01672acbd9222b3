"""Failback: bring a failed-over task's old source (A) back as a replica of the target (B) that
took production, then let a switchover move production home.

The failback holds its cluster pair's claim (:mod:`pair`) and re-uses the pair's flow: the
reverse task is the flow's task B -> A when it has one (made by an earlier switchover, paused
since: it is created again, the same id, with a backfill), else a new one. It creates the
reverse task B -> A with a backfill: B's rows are copied into A (the
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
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from metastore import TaskState
from replicator.backfill.state import BackfillState
from replicator.config.task_spec import TaskSpec
from server.dr.claims import ClaimLostError, FlowClaim
from server.dr.flows import VerifyWaitError, injected_fault, reverse_request, verify_ended
from server.dr.pair import FAILING_BACK, REPLICATING, ClusterPair
from server.dr.record import FAILBACK_KEY, LINK_KEY, iso, json_bytes, replace_record, save_json
from server.dr.task_ops import TaskOperations
from server.errors import ApiError, ConflictError
from server.tasks.requests import BackfillOption, CreateRequest, VerifyRequest

log = logging.getLogger(__name__)


class FailbackStoppedError(Exception):
    """The reverse task stopped under the failback; the message says what the operator does."""


POLL = 1.0  # seconds between looks at the reverse task's jobs
FINISHED = ("in_sync", "failed")
REPAIRS = 3  # verify-with-repair passes before the failback gives up
VERIFY_ATTEMPTS = 3  # verify jobs that end without a result (a restart) before it gives up
VERIFY_BUDGET = 6 * 3600.0  # seconds one verify job may take


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
        claim: FlowClaim,
        seen: bytes | None,
    ) -> None:
        self.sup = supervisor
        self.record = dict(record)
        self.on_save = on_save
        self.claim = claim
        self.seen = seen  # the record as this run last read or wrote it (:mod:`record`)

    @property
    def task_id(self) -> str:
        return str(self.record["task_id"])

    @property
    def job_id(self) -> str:
        return str(self.record["job_id"])

    @property
    def reverse_id(self) -> str:
        return str(self.record["reverse_task_id"])

    async def save(self, **changes: Any) -> None:
        await self.claim.keep()  # a daemon that lost the job (stalled) stops here
        if "state" in changes and changes["state"] != self.record.get("state"):
            steps = [
                *self.record.get("steps", []),
                {"state": changes["state"], "at": iso(time.time())},
            ]
            changes["steps"] = steps
        self.record.update(changes)
        # ClaimLostError where another daemon took the job over and saved since
        self.seen = await asyncio.to_thread(
            replace_record,
            self.sup.store,
            self.task_id,
            FAILBACK_KEY,
            json_bytes(self.record),
            self.seen,
            self.job_id,
        )
        self.on_save(self.task_id, dict(self.record))
        log.info("failback of %s: %s", self.task_id, self.record["state"])

    async def create(self, spec: TaskSpec) -> None:
        """Create the reverse task (its backfill starts with it); the flow's own task in that
        direction, when it has one, is created again under its id."""
        request = failback_request(spec, self.reverse_id)
        if self.record.get("reused"):
            # a target still down refuses the failback before the flow's task is deleted
            await self.sup.check_reachable(request)
            with contextlib.suppress(ApiError):  # gone already
                await self.sup.delete(self.reverse_id, job=self.job_id)
            await injected_fault("failback_reverse_deleted", job="failback")
        await self.claim.reserve(self.reverse_id)  # the flow's (the job's) before it exists
        await self.sup.create(request)
        await injected_fault("failback_created", job="failback")
        for task_id, other in ((self.reverse_id, self.task_id), (self.task_id, self.reverse_id)):
            await asyncio.to_thread(
                save_json, self.sup.store, task_id, LINK_KEY, {"reverse_of": other}
            )
        await injected_fault("failback_linked", job="failback")

    async def mark_failing_back(self) -> None:
        """The flow failing back, its task B -> A the reverse task (again after a restart: a
        daemon killed between the create and this write left the flow as it was)."""
        reverse, production = self.reverse_id, str(self.record["production_cluster"])

        def failing_back(pair: ClusterPair) -> ClusterPair:
            current = pair.flow_of(self.task_id)
            if current is None or current.job is None or current.job.job_id != self.job_id:
                return pair
            tasks = {**current.tasks, production: reverse}
            return pair.with_flow(replace(current, tasks=tasks, state=FAILING_BACK, pending=""))

        await asyncio.to_thread(self.claim.pairs.update, *self.claim.ends, failing_back)

    async def run(self) -> None:
        try:
            if self.record["state"] == "creating":  # a daemon stopped while creating it
                try:
                    await self.sup.get(self.reverse_id)
                except ApiError:
                    await self.save(state="failed", reason="the reverse task was not created")
                    await injected_fault("failback_failed", job="failback")
                    return
                await self.save(state="seeding")
                await injected_fault("seeding", job="failback")
            await self.mark_failing_back()
            await injected_fault("failback_flow", job="failback")
            while self.record["state"] not in FINISHED:
                step = getattr(self, f"_{self.record['state']}")
                await step()
        except ClaimLostError:
            raise
        except FailbackStoppedError as exc:
            await self.save(state="failed", reason=str(exc))
            await injected_fault("failback_failed", job="failback")
        except Exception as exc:  # noqa: BLE001 - whatever stopped it is its reason
            await self.save(state="failed", reason=f"{type(exc).__name__}: {exc}")
            await injected_fault("failback_failed", job="failback")
        if self.record["state"] == "in_sync":  # the reverse direction carries production
            production = str(self.record["production_cluster"])
            await self.claim.release(state=REPLICATING, active=production)
        else:
            await self.claim.release()
        await injected_fault("failback_released", job="failback")

    async def _seeding(self) -> None:
        state = BackfillState(self.sup.store, self.reverse_id)
        while True:
            job = await asyncio.to_thread(state.job)
            if job is None:
                raise ConflictError(f"task {self.reverse_id} has no backfill")
            if not job.active:
                break
            await self._reverse_running("seeding")
            await asyncio.sleep(POLL)
        if job.state != "done":
            await self.save(state="failed", reason=f"backfill {job.job_id}: {job.reason}")
            await injected_fault("failback_failed", job="failback")
            return
        await self.save(state="repairing", backfill=job.job_id)
        await injected_fault("failback_seeded", job="failback")

    async def _reverse_running(self, step: str) -> None:
        """FailbackStoppedError when the reverse task stopped (paused or failed): its backfill
        cannot finish, and nothing but the operator starts it again."""
        task = await self.sup.get(self.reverse_id)
        if task.state in (TaskState.RUNNING, TaskState.INITIAL):
            return
        raise FailbackStoppedError(
            f"task {self.reverse_id} is {task.state.value} while {step} ({task.reason}): its "
            f"backfill cannot finish. Ask the failback of {self.task_id} again: it creates "
            f"{self.reverse_id} anew and seeds again (resume {self.reverse_id} first to keep "
            "it streaming meanwhile)"
        )

    async def _repairing(self) -> None:
        result = await self._verify(repair=True, key="repair_job")
        if result is None:
            return
        passes = int(self.record.get("repairs", 0)) + 1
        await self.save(state="streaming", repairs=passes, repaired=result["repaired"])
        await injected_fault("repaired", job="failback")

    async def _streaming(self) -> None:
        result = await self._verify(repair=False, key="verify_job")
        if result is None:
            return
        if result["divergent"] == 0 and not result["unsettled"]:
            await self.save(state="in_sync", in_sync_at=iso(time.time()), verify=result)
            await injected_fault("in_sync", job="failback")
            return
        if int(self.record.get("repairs", 0)) >= REPAIRS:
            await self.save(
                state="failed",
                verify=result,
                reason=f"A still differs from B after {REPAIRS} repairs: {result}",
            )
            await injected_fault("failback_failed", job="failback")
            return
        await self.save(state="repairing", verify=result, repair_job="", verify_job="")
        await injected_fault("failback_seeded", job="failback")

    async def _verify(self, *, repair: bool, key: str) -> dict[str, Any] | None:
        """Run (or, after a restart, wait for) the reverse task's verify; its result, or None
        when the failback failed."""
        for attempt in range(VERIFY_ATTEMPTS):
            job_id = str(self.record.get(key) or "")
            current = self.sup.verify_job(self.reverse_id)
            if not job_id or current is None or current.job_id != job_id:
                await self.claim.keep()  # a daemon that lost the job (stalled) starts none
                _, job_id = await self.sup.verify(
                    VerifyRequest(task_id=self.reverse_id, repair=repair)
                )
                await injected_fault("failback_verify_started", job="failback")
                await self.save(**{key: job_id})
                await injected_fault("repairing" if repair else "streaming", job="failback")
            try:
                current = await verify_ended(
                    self.sup, self.reverse_id, job_id, VERIFY_BUDGET, poll=POLL
                )
            except VerifyWaitError as exc:
                log.warning("failback of %s: %s", self.task_id, exc)
                await self.save(**{key: ""})
                await injected_fault("failback_verify_reset", job="failback")
                continue
            if current.state == "done":
                break
            # ended without a result (a daemon restarting marks it failed): asked again
            log.warning("failback of %s: verify %s %s", self.task_id, job_id, current.reason)
            await self.save(**{key: ""}, last_verify_problem=f"{job_id}: {current.reason}")
            await injected_fault("failback_verify_reset", job="failback")
            if attempt + 1 == VERIFY_ATTEMPTS:
                await self.save(
                    state="failed",
                    reason=f"verify {job_id}: {current.reason} ({VERIFY_ATTEMPTS} attempts)",
                )
                await injected_fault("failback_failed", job="failback")
                return None
        else:
            await self.save(state="failed", reason=f"no verify ended in {VERIFY_ATTEMPTS} attempts")
            await injected_fault("failback_failed", job="failback")
            return None
        return {
            "job_id": job_id,
            "divergent": sum(c.divergent for c in current.collections),
            "repaired": sum(c.repaired for c in current.collections),
            "unsettled": sum(len(c.unsettled) for c in current.collections),
        }
