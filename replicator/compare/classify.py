"""Which keys of a range differ between the source and the target, and which differences are
settled (the same on two reads, so not replication lag).

A read of a range is ``{key: row hash}`` for each side. A key is *missing* when only the source
holds it, *extra* when only the target does, *different* when both hold it with different
rows. Under writes, a key can differ only because the stream has not applied its last write
yet; such a key changes between two reads. A difference is *settled* when the key differs on
both reads and neither side's row changed in between: the second read is taken after the task
applied everything written before the first one, so a settled difference is not lag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from replicator.backfill.ranges import Key

Kind = Literal["missing", "extra", "different"]
KINDS: tuple[Kind, ...] = ("missing", "extra", "different")
Hashes = Mapping[Key, int]


@dataclass(frozen=True)
class Divergence:
    missing: frozenset[Key] = frozenset()
    extra: frozenset[Key] = frozenset()
    different: frozenset[Key] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.different)

    def of(self, kind: Kind) -> frozenset[Key]:
        found: frozenset[Key] = getattr(self, kind)
        return found

    @property
    def keys(self) -> frozenset[Key]:
        return self.missing | self.extra | self.different

    def only(self, keys: Iterable[Key]) -> Divergence:
        kept = frozenset(keys)
        return Divergence(self.missing & kept, self.extra & kept, self.different & kept)


def classify(source: Hashes, target: Hashes) -> Divergence:
    """Every key on which the two reads of a range disagree, by kind."""
    source_keys, target_keys = source.keys(), target.keys()
    return Divergence(
        frozenset(source_keys - target_keys),
        frozenset(target_keys - source_keys),
        frozenset(k for k in source_keys & target_keys if source[k] != target[k]),
    )


@dataclass(frozen=True)
class RangeRead:
    """Both sides of a range as read once."""

    source: Hashes
    target: Hashes
    divergence: Divergence = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "divergence", classify(self.source, self.target))


def settled(before: RangeRead, after: RangeRead) -> tuple[Divergence, frozenset[Key]]:
    """(the settled divergence, the keys still moving) of ``after``, a read taken once the task
    applied what was written before ``before``. A key that differs on ``after`` is settled when
    its rows (or their absence) on both sides are the ones ``before`` saw; otherwise it moved
    and is to be read again."""
    steady = [
        key
        for key in after.divergence.keys
        if before.source.get(key) == after.source.get(key)
        and before.target.get(key) == after.target.get(key)
        and key in before.divergence.keys
    ]
    return after.divergence.only(steady), after.divergence.keys - frozenset(steady)


def sample(keys: Iterable[Key], limit: int) -> list[Key]:
    """Up to ``limit`` keys, lowest first (ints before strings when a set mixes them)."""
    return sorted(keys, key=lambda k: (isinstance(k, str), k))[:limit]
