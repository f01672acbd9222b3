"""Primary-key ranges of a collection: cut into equal-count pieces, each one Spark task.

A range is half open, ``lo <= pk < hi``; the first range has no lower bound and the last no upper
bound, so every key, including one written after the split, belongs to exactly one range. The
bounds are keys read from the collection: ``cut_ranges`` takes the keys in ascending order (a
query iterator returns them so) and keeps every ``range_rows``-th one, so only the bounds are
held in memory, never the keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Key = int | str


class KeyOrderError(ValueError):
    """The keys did not come in ascending order."""


@dataclass(frozen=True)
class KeyRange:
    index: int
    lo: Key | None  # inclusive; None: no lower bound
    hi: Key | None  # exclusive; None: no upper bound
    rows: int  # keys in the range when it was cut

    def contains(self, key: Key) -> bool:
        return (self.lo is None or key >= self.lo) and (self.hi is None or key < self.hi)  # type: ignore[operator]

    def filter(self, pk: str) -> str:
        """A Milvus boolean expression selecting the range ("" for everything)."""
        parts = []
        if self.lo is not None:
            parts.append(f"{pk} >= {literal(self.lo)}")
        if self.hi is not None:
            parts.append(f"{pk} < {literal(self.hi)}")
        return " and ".join(parts)

    def describe(self) -> str:
        lo = "-inf" if self.lo is None else repr(self.lo)
        hi = "+inf" if self.hi is None else repr(self.hi)
        return f"range {self.index} [{lo}, {hi})"

    def to_json(self) -> list[Any]:
        return [self.index, self.lo, self.hi, self.rows]

    @classmethod
    def from_json(cls, data: list[Any]) -> KeyRange:
        index, lo, hi, rows = data
        return cls(int(index), lo, hi, int(rows))


def literal(key: Key) -> str:
    """A key as a literal of a Milvus expression: strings quoted and escaped by JSON's rules
    (quotes, backslashes and control characters; Milvus refuses a raw NUL or newline inside a
    string literal), other characters as they are."""
    if isinstance(key, bool):
        raise TypeError("a primary key is an int64 or a varchar")
    if isinstance(key, int):
        return str(key)
    return json.dumps(key, ensure_ascii=False)


def cut_ranges(keys: Iterable[Key], range_rows: int) -> list[KeyRange]:
    """Equal-count ranges of about ``range_rows`` keys from ``keys`` in ascending order.

    The last range takes the remainder; when it would be under half of ``range_rows`` it is
    merged into the one before, so no range is tiny. No keys: one range covering everything
    (rows written later still have a range)."""
    if range_rows <= 0:
        raise ValueError("range_rows must be positive")
    bounds: list[Key] = []
    counts: list[int] = []
    previous: Key | None = None
    in_range = 0
    for key in keys:
        if previous is not None and key <= previous:  # type: ignore[operator]
            raise KeyOrderError(f"keys not in ascending order: {previous!r} then {key!r}")
        previous = key
        if in_range == range_rows:
            bounds.append(key)
            counts.append(in_range)
            in_range = 0
        in_range += 1
    counts.append(in_range)
    if len(counts) > 1 and counts[-1] * 2 < range_rows:
        remainder = counts.pop()
        counts[-1] += remainder
        bounds.pop()
    edges: list[Key | None] = [None, *bounds, None]
    return [KeyRange(i, edges[i], edges[i + 1], counts[i]) for i in range(len(counts))]


def ranges_for(total: int, range_rows: int) -> int:
    """How many ranges ``cut_ranges`` makes of ``total`` keys."""
    if total <= 0:
        return 1
    full, rest = divmod(total, range_rows)
    if full == 0:
        return 1
    return full if rest * 2 < range_rows else full + 1


def range_rows_for(total: int, ranges: int) -> int:
    """The ``range_rows`` that cuts ``total`` keys into about ``ranges`` ranges."""
    return max(1, math.ceil(total / max(1, ranges)))
