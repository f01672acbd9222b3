"""Where a task's replication lag goes, measured inside the daemon: histograms its channel
workers fill and ``/metrics`` shows (``cdc_read_delay_seconds``, ``cdc_tick_wait_seconds``,
``cdc_target_write_seconds``, ``cdc_apply_delay_seconds``, and the daemon's own part:
``cdc_read_wait_seconds``, ``cdc_decode_seconds``, ``cdc_hold_seconds``,
``cdc_position_save_seconds``, ``cdc_own_delay_seconds``).

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

The daemon's own part, per data event, from the moment the WAL took the time tick that
releases it (an event can be applied no earlier; the source decides when that tick comes):

- read wait: that tick's WAL time (Kafka's message timestamp) to its read by the worker
  (fetching, the shared reader's hand-off, waiting for a thread);
- decode: the event's own record, decoded;
- hold: the tick's read to the start of the write that holds the event (the rest of the
  read, the in-flight bound);
- target write (above, per write) and position save: the target's acknowledgement to the
  position saved;
- own delay: the tick's WAL time to the position saved, all of the above together.

Read wait and own delay need the backend's record time (Kafka; a record without one is not
counted) and compare the broker's clock (or the producer's) with the daemon's.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

# seconds; fine where replication lag usually is (tens to hundreds of milliseconds), finer
# around the daemon's own part (aim: 50 ms)
BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
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
    read_wait: LatencyHistogram = field(default_factory=LatencyHistogram)
    decode: LatencyHistogram = field(default_factory=LatencyHistogram)
    hold: LatencyHistogram = field(default_factory=LatencyHistogram)
    position_save: LatencyHistogram = field(default_factory=LatencyHistogram)
    own_delay: LatencyHistogram = field(default_factory=LatencyHistogram)

    def views(self) -> dict[str, HistogramView]:
        return {
            "read_delay": self.read_delay.view(),
            "tick_wait": self.tick_wait.view(),
            "target_write": self.target_write.view(),
            "apply_delay": self.apply_delay.view(),
            "read_wait": self.read_wait.view(),
            "decode": self.decode.view(),
            "hold": self.hold.view(),
            "position_save": self.position_save.view(),
            "own_delay": self.own_delay.view(),
        }


@dataclass
class Releases:
    """The data a read's ticks released, for the daemon's own part (see the module doc): per
    releasing tick, its read (``time.time()``), its WAL time (0.0: unknown) and how many data
    events it released."""

    ticks: list[tuple[float, float, int]] = field(default_factory=list)

    def add(self, read_at: float, appended_at: float, events: int, timings: TaskTimings) -> None:
        if events:
            self.ticks.append((read_at, appended_at, events))
            if appended_at:
                wait = read_at - appended_at
                for _ in range(events):
                    timings.read_wait.observe(wait)

    def written(
        self, timings: TaskTimings, write_started: float, written_at: float, saved_at: float
    ) -> None:
        """The released events are on the target (acknowledged at ``written_at``, after a
        write from ``write_started``) and the position saved at ``saved_at``."""
        ticks, self.ticks = self.ticks, []
        if not ticks:
            return
        timings.position_save.observe(saved_at - written_at)
        for read_at, appended_at, events in ticks:
            for _ in range(events):
                timings.hold.observe(write_started - read_at)
                if appended_at:
                    timings.own_delay.observe(saved_at - appended_at)

    def clear(self) -> None:
        self.ticks = []
