"""The first save of a job taken over from a daemon gone (or stalled past its claim): the job's
record (:mod:`record`) written with this member, by compare-and-set against the record as the
``recover`` round read it. A stalled daemon may have woken and saved a step in between (it
stops at its next one: the claim is this daemon's now): the record is read again and the job
goes on from that step, or, when that step was the job's end, the flow is let go with the
finished job's effects (:mod:`job_effects`), as its daemon would have."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from metastore import MetaStore
from server.dr.claims import ClaimLostError, FlowClaim
from server.dr.failback import FINISHED as FAILBACK_FINISHED
from server.dr.job_effects import failback_changes, switchover_changes
from server.dr.pair import CAS_ATTEMPTS
from server.dr.record import SwitchoverJob, json_bytes, replace_record

log = logging.getLogger(__name__)

# a record read again -> (its value with this member, to go on from; None) or, when there is
# nothing to go on with, (None; the flow's changes as the claim is let go: the finished job's
# effects, ``{}`` for none)
Adopt = Callable[[bytes], tuple[bytes | None, dict[str, Any]]]


async def save_taken_over(
    store: MetaStore, claim: FlowClaim, key: str, value: bytes, seen: bytes, adopt: Adopt
) -> bytes | None:
    """Save ``value`` (the job's record, this member its member) over ``seen``; what is stored
    then, or None when the job is not this daemon's to go on with (the claim let go)."""
    current: bytes | None = seen
    for _ in range(CAS_ATTEMPTS):
        try:
            return await asyncio.to_thread(
                replace_record, store, claim.task_id, key, value, current, claim.job_id
            )
        except ClaimLostError as exc:
            log.warning("job %s not taken over as read: %s; reading it again", claim.job_id, exc)
        current = await asyncio.to_thread(store.get_state, claim.task_id, key)
        adopted, changes = adopt(current) if current is not None else (None, {})
        if adopted is None:
            await claim.release(**changes)
            return None
        value = adopted
    await claim.release()
    return None


def switchover(job: SwitchoverJob) -> Adopt:
    """How a switchover taken over (``job``, with this member) reads its record again."""

    def adopt(raw: bytes) -> tuple[bytes | None, dict[str, Any]]:
        latest = SwitchoverJob.from_bytes(raw)
        if latest.job_id != job.job_id:
            return None, {}
        if latest.finished:
            return None, switchover_changes(latest)
        return latest.with_(member=job.member).to_bytes(), {}

    return adopt


def failback(job_id: str, member: str) -> Adopt:
    """How a failback taken over (``job_id``, by ``member``) reads its record again."""

    def adopt(raw: bytes) -> tuple[bytes | None, dict[str, Any]]:
        latest = json.loads(raw)
        if latest.get("job_id") != job_id:
            return None, {}
        if latest.get("state") in FAILBACK_FINISHED:
            return None, failback_changes(latest) or {}
        return json_bytes({**latest, "member": member}), {}

    return adopt
