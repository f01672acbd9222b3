"""Milvus's hybrid timestamps (its TSO): physical milliseconds since the epoch in the high bits,
a logical counter in the low ``LOGICAL_BITS`` (``tsoutil.ComposeTS`` in Milvus)."""

from __future__ import annotations

LOGICAL_BITS = 18


def physical_ms(ts: int) -> int:
    """The physical part of ``ts``: milliseconds since the epoch."""
    return ts >> LOGICAL_BITS


def to_seconds(ts: int) -> float:
    """``ts`` as seconds since the epoch (the logical part dropped)."""
    return physical_ms(ts) / 1000


def from_ms(ms: int) -> int:
    """The first hybrid timestamp of millisecond ``ms`` (also: a duration in hybrid units)."""
    return ms << LOGICAL_BITS


def from_seconds(seconds: float) -> int:
    """The first hybrid timestamp of the millisecond ``seconds`` (since the epoch) falls in."""
    return from_ms(int(seconds * 1000))
