"""Hybrid timestamps as Milvus composes them (``tsoutil.ComposeTS``: physical << 18 | logical)."""

from __future__ import annotations

from replicator.hybrid_time import from_ms, from_seconds, physical_ms, to_seconds

PHYSICAL = 1_795_000_000_123  # ms: 2026-11-18


def test_the_physical_part_drops_the_logical_counter():
    ts = (PHYSICAL << 18) | 262_143  # the largest logical value
    assert physical_ms(ts) == PHYSICAL
    assert to_seconds(ts) == 1_795_000_000.123


def test_times_become_the_first_timestamp_of_their_millisecond():
    assert from_ms(PHYSICAL) == PHYSICAL << 18
    assert from_seconds(1_795_000_000.1234) == PHYSICAL << 18
    assert physical_ms(from_seconds(to_seconds(PHYSICAL << 18) + 1)) == PHYSICAL + 1000
