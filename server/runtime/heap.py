"""The daemon's heap: what a catch-up frees goes back to the system.

A catch-up allocates and frees buffers of megabytes at a high rate (a RocksMQ or Kafka record
holding an insert of 2-3 MB, its decoded columns, the request to the target). glibc's malloc
keeps what is freed in its arenas for reuse, and how much it keeps grows with the length of the
run, not with the data alive at any moment: catching up 1,000,000 rows the live heap stayed at
120-190 MB while RSS reached 400 MB, and 5,000,000 rows reached 556 MB
(``bench/results/backlog.md``). Two measures bound it, both glibc's own (``mallopt``,
``malloc_trim``); on another C library nothing is done:

- **arenas**: at most ``memory.mallocArenas`` (2) instead of up to 8 per core; the daemon runs
  a thread per source channel and more, each of which could get an arena of its own. An
  operator's ``MALLOC_ARENA_MAX`` in the environment wins;
- **trim**: every ``memory.trimSeconds`` (1 s), when RSS grew more than ``memory.trimAboveMB``
  since the last trim and the arenas hold at least as much free, ``malloc_trim(0)`` gives
  their free pages back to the system.
  Unlike a low ``MALLOC_MMAP_THRESHOLD_`` (every large buffer mapped and unmapped: 1.4x the
  daemon's CPU in the same bench), the cost is one pass a second over the free lists.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from typing import Any

from replicator.config.daemon import MemorySettings

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # malloc.h


class _MallInfo2(ctypes.Structure):
    """``struct mallinfo2`` (glibc 2.33+), every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> Any | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if not all(hasattr(libc, fn) for fn in ("mallopt", "malloc_trim", "mallinfo2")):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


class HeapKeeper:
    """Applies ``settings`` to the process's malloc and runs the trim thread."""

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings
        self.trims = 0
        self.released_bytes = 0  # RSS given back, as /proc/self/statm saw it around each trim
        self._libc = _glibc()
        # RSS after the last trim, or the lowest seen since (read only where trims happen)
        self._floor = _rss_bytes() if self._libc is not None else 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._libc is not None

    def start(self) -> None:
        libc = self._libc
        if libc is None:
            log.info("not glibc: malloc's arenas and trimming left as they are")
            return
        arenas = self.settings.mallocArenas
        if arenas and "MALLOC_ARENA_MAX" not in os.environ:
            libc.mallopt(M_ARENA_MAX, arenas)
        if self.settings.trimSeconds > 0:
            self._thread = threading.Thread(target=self._run, name="heap-trim", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def stats(self) -> dict[str, int]:
        """What the process's memory is made of, for ``cdc_heap_*`` (server/runtime/metrics.py):
        Python's allocated object blocks and this keeper's trims; with glibc also the resident
        size and malloc's arenas (in use, free) and directly mapped blocks."""
        stats = {
            "python_blocks": sys.getallocatedblocks(),
            "trims": self.trims,
            "released_bytes": self.released_bytes,
        }
        if self._libc is not None:
            info = self._libc.mallinfo2()
            stats.update(
                resident_bytes=_rss_bytes(),
                malloc_arena_bytes=int(info.arena),
                malloc_in_use_bytes=int(info.uordblks),
                malloc_free_bytes=int(info.fordblks),
                malloc_mapped_bytes=int(info.hblkhd),
            )
        return stats

    def free_bytes(self) -> int:
        """What malloc's arenas hold free (mapped, not in use)."""
        return 0 if self._libc is None else int(self._libc.mallinfo2().fordblks)

    def trim_if_worth_it(self) -> bool:
        """Trim when RSS grew more than ``trimAboveMB`` over where the last trim left it (or
        the lowest seen since) and the arenas hold at least that much free: pages already
        given back still count as free to malloc, so its figure alone would trim every time."""
        if self._libc is None:
            return False
        rss = _rss_bytes()
        self._floor = min(self._floor, rss)
        above = self.settings.trimAboveMB * 2**20
        if rss - self._floor <= above or self.free_bytes() <= above:
            return False
        self._libc.malloc_trim(0)
        after = _rss_bytes()
        self.trims += 1
        self.released_bytes += max(0, rss - after)
        self._floor = after
        log.debug("heap trimmed: RSS %d -> %d MB", rss >> 20, after >> 20)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.settings.trimSeconds):
            try:
                self.trim_if_worth_it()
            except Exception:  # a trim that fails must not end the daemon
                log.exception("heap trim failed; no more trims")
                return


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
