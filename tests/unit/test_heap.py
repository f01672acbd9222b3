"""Freed memory malloc keeps is given back to the system (server/runtime/heap.py)."""

from __future__ import annotations

import ctypes

import pytest

from replicator.config.daemon import MemorySettings
from server.runtime.heap import HeapKeeper, _rss_bytes
from server.runtime.metrics import DaemonMetrics

CHUNK = 64 * 1024  # under malloc's mmap threshold: served from, and freed into, an arena
CHUNKS = 3200  # 200 MB


@pytest.fixture
def keeper() -> HeapKeeper:
    keeper = HeapKeeper(MemorySettings(trimSeconds=0, trimAboveMB=16))
    if not keeper.available:
        pytest.skip("not glibc")
    return keeper


def test_memory_freed_into_the_arenas_goes_back_to_the_system(keeper: HeapKeeper) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    keeper.trim_if_worth_it()  # whatever the test process kept before
    blocks = [libc.malloc(CHUNK) for _ in range(CHUNKS)]
    for block in blocks:
        ctypes.memset(block, 1, CHUNK)  # touched: resident
    guard = libc.malloc(CHUNK)  # keeps the freed blocks off the heap's top (no automatic trim)
    resident = _rss_bytes()
    for block in blocks:
        libc.free(block)
    assert keeper.free_bytes() >= CHUNKS * CHUNK * 0.9
    assert _rss_bytes() > resident - 20 * 2**20  # free, but still the process's
    metrics = DaemonMetrics(dict, dict, heap=keeper.stats).registry
    assert metrics.get_sample_value("cdc_heap_malloc_free_bytes") >= CHUNKS * CHUNK * 0.9
    assert metrics.get_sample_value("cdc_heap_resident_bytes") > resident - 20 * 2**20

    assert keeper.trim_if_worth_it()
    assert _rss_bytes() < resident - 150 * 2**20
    assert keeper.trims == 1 and keeper.released_bytes >= 150 * 2**20
    assert metrics.get_sample_value("cdc_heap_trims_total") == 1
    assert metrics.get_sample_value("cdc_heap_released_bytes_total") >= 150 * 2**20
    assert metrics.get_sample_value("cdc_heap_resident_bytes") < resident - 150 * 2**20
    assert not keeper.trim_if_worth_it()  # RSS has not grown since: no pass
    libc.free(guard)


def test_settings_bound_what_an_operator_can_ask() -> None:
    with pytest.raises(ValueError, match="trimSeconds"):
        MemorySettings(trimSeconds=-1)
    with pytest.raises(ValueError, match="mallocArenas"):
        MemorySettings(mallocArenas=1000)
