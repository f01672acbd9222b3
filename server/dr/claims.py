"""A job's claim on its flow (:mod:`pair`), kept while the job runs: renewed at every saved step
and every ``RENEW_SECONDS`` in between; a job whose claim another daemon took (this one stalled
past ``CLAIM_SECONDS``, or was taken for dead) is cancelled and touches nothing more. Once the
job lets go of the claim itself (its last step), nothing renews it: a renewal that ran while the
job released found the claim gone and took the job for lost, which cut off its end (a done
switchover's stale-write check was never made).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from server.dr.pair import RENEW_SECONDS, ClusterPair, PairStore, release, renewed, reserved
from server.errors import ApiError

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClaimLostError(Exception):
    """The job's claim on its cluster pair is another daemon's now: this one stops touching it."""


class FlowClaim:
    """The claim of job ``job_id`` (run by ``member``) on the flow of ``task_id`` in the pair of
    clusters ``ends``."""

    def __init__(
        self, pairs: PairStore, ends: tuple[str, str], task_id: str, job_id: str, member: str
    ) -> None:
        self.pairs = pairs
        self.ends = ends
        self.task_id = task_id
        self.job_id = job_id
        self.member = member
        # the job lets go of its claim (release called): a renewal that finds it gone from
        # then on is the job's own doing, not another daemon's
        self.releasing = False

    def _renew(self, pair: ClusterPair, reverse: str = "") -> ClusterPair:
        flow = pair.flow_of(self.task_id)
        if flow is None:
            raise ClaimLostError(f"task {self.task_id} is in no flow of {pair.key}")
        try:
            if reverse:
                return pair.with_flow(reserved(flow, self.job_id, self.member, reverse))
            return pair.with_flow(renewed(flow, self.job_id, self.member))
        except ApiError as exc:
            raise ClaimLostError(str(exc)) from exc

    async def keep(self) -> None:
        """Renew the claim; ClaimLostError when another daemon holds it now."""
        await asyncio.to_thread(self.pairs.update, *self.ends, self._renew)

    async def reserve(self, reverse_id: str) -> None:
        """Renew the claim with ``reverse_id`` (the reverse task the job creates) put in the
        flow before it exists: verbs on it wait for the job like those on the flow's tasks."""
        await asyncio.to_thread(
            self.pairs.update, *self.ends, lambda pair: self._renew(pair, reverse_id)
        )

    async def release(self, **changes: Any) -> None:
        """The flow without this job's claim, with ``changes`` (its direction and state after
        the job); left alone unless this job on this member holds the claim (another daemon
        that applied the finished job's effects already let go for it, and the flow may have
        moved on since: a stalled member waking here undoes nothing)."""

        def change(pair: ClusterPair) -> ClusterPair:
            flow = pair.flow_of(self.task_id)
            if flow is None:
                return pair
            return pair.with_flow(release(flow, self.job_id, self.member, **changes))

        self.releasing = True
        await asyncio.to_thread(self.pairs.update, *self.ends, change)

    async def run_while_held(self, work: Awaitable[T]) -> T:
        """Run ``work``, renewing the claim every ``RENEW_SECONDS``; cancel it (ClaimLostError)
        once the claim is lost."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=RENEW_SECONDS)
                if done:
                    return task.result()
                if self.releasing:  # the job let go of the claim: it only finishes
                    return await task
                try:
                    await self.keep()
                except ClaimLostError:
                    if self.releasing:  # released while this renewal ran: by the job
                        return await task
                    log.warning("job %s lost its claim: stopping it here", self.job_id)
                    task.cancel()
                    raise
                except Exception as exc:  # noqa: BLE001 - the store failing: the next try
                    log.warning("job %s: its claim not renewed: %s", self.job_id, exc)
        finally:
            if not task.done():
                task.cancel()
