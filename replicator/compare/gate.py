"""When has the task applied everything written before a moment?

The task's saved positions carry the source time tick (a hybrid timestamp: physical
milliseconds << 18) up to which each DML channel is on the target. The task has applied
everything of a collection written before ``ts`` once the saved tick of every pchannel the
collection is on is at or past ``ts``. (Only those: a 2.3 source sends ticks only on channels
that carry a collection, so another channel's tick may never move.)
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


def applied_ts(store: MetaStore, task_id: str, channels: frozenset[str] | None) -> AppliedTs:
    """The lowest saved tick over ``channels`` (the pchannels of the collection compared); a
    channel without a saved tick counts as nothing applied. ``channels`` None (not known):
    every channel of the task that has a tick, so the replicate channel (no ticks) and channels
    that never carried anything are left out."""

    def lowest() -> int | None:
        positions = store.get_positions(task_id)
        if channels is None:
            ticks = [p.ts for p in positions.values() if p.ts > 0]
        else:
            ticks = [positions[ch].ts if ch in positions else 0 for ch in channels]
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
