"""Progress of a backfill: rows and ranges done out of the plan, rate and time left.

Pure functions over what the job records in the metastore (the plan of each collection and the
ranges done), so the daemon, the CLI and the tests compute the same numbers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

# rate over the last RATE_WINDOW seconds of samples: recent enough to follow a slowdown,
# long enough to smooth ranges finishing in bursts
RATE_WINDOW = 60.0


@dataclass(frozen=True)
class CollectionProgress:
    collection: str
    rows_total: int
    ranges_total: int
    rows_done: int = 0
    ranges_done: int = 0

    def view(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "rows_done": self.rows_done,
            "rows_total": self.rows_total,
            "ranges_done": self.ranges_done,
            "ranges_total": self.ranges_total,
        }


def percent(done: int, total: int, ranges_done: int, ranges_total: int) -> float:
    """Rows done over rows planned, capped at 100 (rows written during the backfill can make a
    range larger than planned); 100 only once every range is done."""
    if ranges_total and ranges_done >= ranges_total:
        return 100.0
    if total <= 0:
        return 0.0
    return min(99.9, 100.0 * done / total)


@dataclass
class RateMeter:
    """Rows per second from (time, rows done) samples in a sliding window."""

    window: float = RATE_WINDOW
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, now: float, rows_done: int) -> None:
        if self.samples and rows_done < self.samples[-1][1]:
            self.samples.clear()  # a new job: the count started again
        self.samples.append((now, rows_done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, r0), (t1, r1) = self.samples[0], self.samples[-1]
        if t1 - t0 <= 0:
            return None
        return (r1 - r0) / (t1 - t0)


def eta_seconds(rows_done: int, rows_total: int, rate: float | None) -> float | None:
    """Seconds left at ``rate``; None while there is no rate yet; 0 when nothing is left."""
    left = max(0, rows_total - rows_done)
    if left == 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return left / rate


def summary(collections: list[CollectionProgress], rate: float | None) -> dict[str, Any]:
    rows_done = sum(c.rows_done for c in collections)
    rows_total = sum(c.rows_total for c in collections)
    ranges_done = sum(c.ranges_done for c in collections)
    ranges_total = sum(c.ranges_total for c in collections)
    eta = eta_seconds(rows_done, rows_total, rate)
    return {
        "rows_done": rows_done,
        "rows_total": rows_total,
        "ranges_done": ranges_done,
        "ranges_total": ranges_total,
        "percent": round(percent(rows_done, rows_total, ranges_done, ranges_total), 1),
        "rows_per_second": None if rate is None else round(rate, 1),
        "eta_seconds": None if eta is None else round(eta, 1),
        "collections": [c.view() for c in collections],
    }


def bar(fraction: float, width: int = 30) -> str:
    """A text progress bar: ``[#########.........]``."""
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"
