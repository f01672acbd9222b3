"""Where a task's replication lag goes, measured inside the daemon: histograms its channel
workers fill and ``/metrics`` shows (``cdc_read_delay_seconds``, ``cdc_tick_wait_seconds``,
``cdc_target_write_seconds``, ``cdc_apply_delay_seconds``).

Per data event (an Insert or Delete of a selected collection):

- read delay: its source time (the physical part of its hybrid timestamp) to its read by the
  channel's worker: the source's write, the queue and the reader;
- tick wait: its read to the read of the time tick that makes it final (the source sends DML
  ticks about every 200 ms, and a tick is sent some time after the moment it stands for);
- apply delay: its source time to the target's acknowledgement of the write that holds it,
  the daemon's own measure of what a reader of the target waits.

Per write: the target write, from the request to its acknowledgement (a batch of every event
the ticks of one read released). The two delays from source time compare the source's clock
with the daemon's: on different hosts, their offset is in them.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

# seconds; fine where replication lag usually is (tens to hundreds of milliseconds)
BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.35,
    0.4,
    0.45,
    0.5,
    0.6,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True)
class HistogramView:
    """A histogram as Prometheus shows it: cumulative counts per upper bound (``+Inf`` last)."""

    buckets: tuple[tuple[float, int], ...]
    total: float
    count: int


class LatencyHistogram:
    """Seconds observed by the channel workers of a task (one lock: workers are threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)
        self._total = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)  # two clocks: a source a little ahead is no negative lag
        slot = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            self._counts[slot] += 1
            self._total += seconds

    def view(self) -> HistogramView:
        with self._lock:
            counts, total = list(self._counts), self._total
        cumulative, running = [], 0
        for bound, count in zip((*BUCKETS, float("inf")), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramView(tuple(cumulative), total, running)


@dataclass
class TaskTimings:
    """The task's histograms (see the module doc)."""

    read_delay: LatencyHistogram = field(default_factory=LatencyHistogram)
    tick_wait: LatencyHistogram = field(default_factory=LatencyHistogram)
    target_write: LatencyHistogram = field(default_factory=LatencyHistogram)
    apply_delay: LatencyHistogram = field(default_factory=LatencyHistogram)

    def views(self) -> dict[str, HistogramView]:
        return {
            "read_delay": self.read_delay.view(),
            "tick_wait": self.tick_wait.view(),
            "target_write": self.target_write.view(),
            "apply_delay": self.apply_delay.view(),
        }
