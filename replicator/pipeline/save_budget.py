"""How often the daemon's idle channels save their moving positions.

A channel with nothing to apply saves its position every ``IDLE_SAVE_SECONDS``: that keeps it
inside the queue's retention, a restart's re-read short, and a verify run by another daemon of
the fleet (which reads saved positions) waiting little. Each save is a metastore transaction;
with many tasks they become most of an idle daemon's work (100 tasks x 16 channels: 53 a
second). So the channels of one daemon share a budget of ``IDLE_SAVES_PER_SECOND``: a channel
whose save is due takes a token or tries again at its next read. Up to a few hundred channels
nothing changes; beyond, each idle channel saves less often (1,600 channels: about every 80 s).
Saves that go with data or DDL never wait for the budget.
"""

from __future__ import annotations

import threading
import time

IDLE_SAVE_SECONDS = 30.0
IDLE_SAVES_PER_SECOND = 20.0


class SaveBudget:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float = IDLE_SAVES_PER_SECOND, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = rate if burst is None else burst
        self._tokens = self.burst
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """A token, if one is left now."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


# every task's channels in this process (one daemon)
IDLE_SAVES = SaveBudget()
