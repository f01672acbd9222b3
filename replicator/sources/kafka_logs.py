"""librdkafka's own log lines, through Python's logging: without a ``logger`` in a client's
settings librdkafka prints them on stderr (``%3|1700000000.123|FAIL|rdkafka#consumer-1| ...``),
outside the daemon's JSON log, about 20 a second while a broker turns the client away.

Each distinct line is logged at most once every ``REPEAT_SECONDS`` (the repeats are counted and
the count said with the next one logged); the timing librdkafka appends (" (after 0ms in state
SSL_HANDSHAKE)") is dropped, so repeats read alike. A connection's failure that is a refusal
(a TLS handshake or a SASL login that failed, such as a TLS client at a plaintext listener:
"SSL handshake failed: Disconnected: ... connecting to a PLAINTEXT broker listener?") is kept
for the client's error: librdkafka reports some of them only in its log.
"""

from __future__ import annotations

import logging
import re
import threading
import time

log = logging.getLogger("librdkafka")

REPEAT_SECONDS = 30.0
_KEPT = 1000  # distinct lines remembered; past that the oldest are forgotten

# the timing and repeat count librdkafka appends to a broker's error (rdkafka_broker.c)
TIMING = re.compile(r" \(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)$")
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")
_REFUSAL = re.compile(r": (SSL handshake failed|SASL authentication (error|failed))")


class _Repeats:
    """When each distinct line was last logged, and how many repeats were not since."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._said: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def admit(self, key: str) -> int | None:
        """None: a repeat left out; else the number of repeats left out before this one."""
        now = time.monotonic()
        with self._lock:
            last = self._said.get(key)
            if last is not None and now - last < REPEAT_SECONDS:
                self._left_out[key] = self._left_out.get(key, 0) + 1
                return None
            if len(self._said) >= _KEPT and key not in self._said:
                oldest = min(self._said, key=self._said.__getitem__)
                self._said.pop(oldest)
                self._left_out.pop(oldest, None)
            self._said[key] = now
            return self._left_out.pop(key, 0)


_REPEATS = _Repeats()  # shared: clients made again at every attempt repeat one another


class LibrdkafkaLog:
    """The ``logger`` setting of a confluent-kafka client (it calls ``log``)."""

    def __init__(self) -> None:
        self.failure = ""  # the last refusal a broker's connection failed with, if any

    def log(self, level: int, fmt: str, *args: object) -> None:
        if len(args) == 3:  # confluent-kafka's "%s [%s] %s": facility, client name, text
            facility, text = str(args[0]), str(args[2])
        else:
            facility, text = "", fmt % args if args else fmt
        text = TIMING.sub("", _THREAD.sub("", text))
        if facility == "FAIL" and _REFUSAL.search(text):
            self.failure = text
        left_out = _REPEATS.admit(f"{facility} {text}")
        if left_out is None:
            return
        more = f" ({left_out} more like it in the last {REPEAT_SECONDS:.0f} s)" if left_out else ""
        log.log(level, "%s: %s%s", facility or "librdkafka", text, more)


__all__ = ["REPEAT_SECONDS", "TIMING", "LibrdkafkaLog"]
