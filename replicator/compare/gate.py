"""When has the task applied everything written before a moment?

The task's saved positions carry the source time tick (a hybrid timestamp: physical
milliseconds << 18) up to which each DML channel is on the target. The task has applied
everything written before ``ts`` once every DML channel's saved tick is at or past ``ts``.
Moments are taken from this machine's clock; a source clock ahead of it makes the wait end
early, and the settled rule (:mod:`classify`) still keeps lag from being reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from metastore import MetaStore

LOGICAL_BITS = 18
POLL_SECONDS = 0.5

AppliedTs = Callable[[], int | None]


def now_ts() -> int:
    """This moment as a hybrid timestamp."""
    return int(time.time() * 1000) << LOGICAL_BITS


def applied_ts(store: MetaStore, task_id: str, skip: frozenset[str]) -> AppliedTs:
    """The lowest saved tick over the task's channels except ``skip`` (the replicate channel,
    which has no ticks); None before every channel has a position."""

    def lowest() -> int | None:
        ticks = [p.ts for ch, p in store.get_positions(task_id).items() if ch not in skip]
        return min(ticks) if ticks else None

    return lowest


def wait_applied(applied: AppliedTs, ts: int, timeout: float, stop: threading.Event) -> bool:
    """Wait until the task applied everything before ``ts``; False after ``timeout`` seconds
    or when stopped."""
    deadline = time.monotonic() + timeout
    while True:
        current = applied()
        if current is not None and current >= ts:
            return True
        if time.monotonic() >= deadline or stop.wait(POLL_SECONDS):
            return False
