"""The interpreter's settings for the daemon's work, made in the daemon and in each channel
group's process alike (a group runs the same pipeline in a fresh interpreter: without them it
ran with Python's defaults, a 5 ms lock turn and the young generation collected every 700
allocations)."""

from __future__ import annotations

import gc
import sys

from replicator.config.settings import CdcSettings


def tune_interpreter(settings: CdcSettings) -> None:
    """The interpreter lock's switch interval (``gilSwitchMs``): while a catch-up keeps every
    core busy, a longer turn per thread means fewer hand-overs of the lock between the task
    threads and less CPU spent on them; a thread waiting for I/O gets the lock back as soon as
    the one holding it waits for something itself."""
    sys.setswitchinterval(settings.gilSwitchMs / 1000)


def tune_gc() -> None:
    """Keep garbage-collection pauses out of request latency.

    Everything alive after start-up (imported modules, settings, the app) is moved out of the
    collector's reach with ``gc.freeze()``, and the young generation is collected less often: a
    ``list`` of 1,000 tasks allocates ~100k short-lived objects, and with the defaults its full
    collections rescanned every module object (bench/list_latency.py, SQLite: p99 54 -> 20 ms).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


__all__ = ["tune_gc", "tune_interpreter"]
