"""When has the task applied everything written before a moment?

The task's saved positions carry the source time tick (a hybrid timestamp: physical
milliseconds << 18) up to which each DML channel is on the target. A channel with nothing to
apply saves its moving position only now and then (:mod:`save_budget`), so when the task
runs in this daemon its runner's in-memory figures (``live``) are read as well: per channel the
later of the two counts. The task has applied
everything of a collection written before ``ts`` once the applied tick of every pchannel the
collection is on is at or past ``ts``. (Only those: a 2.3 source sends ticks only on channels
that carry a collection, so another channel's tick may never move.)
Moments are taken from this machine's clock; a source clock ahead of it makes the wait end
early, and the settled rule (:mod:`classify`) still keeps lag from being reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from metastore import MetaStore
from replicator.hybrid_time import from_seconds

POLL_SECONDS = 0.5

AppliedTs = Callable[[], int | None]
# the source time each pchannel of a task has applied, as its runner in this daemon knows it;
# None when the task does not run here
LiveApplied = Callable[[], Mapping[str, int] | None]


def now_ts() -> int:
    """This moment as a hybrid timestamp."""
    return from_seconds(time.time())


def applied_ts(
    store: MetaStore,
    task_id: str,
    channels: frozenset[str] | None,
    live: LiveApplied = lambda: None,
) -> AppliedTs:
    """The lowest applied tick over ``channels`` (the pchannels of the collection compared),
    each the later of the saved one and the ``live`` one; a channel without either counts as
    nothing applied. ``channels`` None (not known): every channel of the task that has a tick,
    so the replicate channel (no ticks) and channels that never carried anything are left
    out."""

    def lowest() -> int | None:
        ticks = {ch: p.ts for ch, p in store.get_positions(task_id).items()}
        for ch, ts in (live() or {}).items():
            ticks[ch] = max(ticks.get(ch, 0), ts)
        if channels is None:
            known = [ts for ts in ticks.values() if ts > 0]
        else:
            known = [ticks.get(ch, 0) for ch in channels]
        return min(known) if known else None

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
