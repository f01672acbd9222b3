"""The check that makes a copied range prove itself (not called by ``copy_range`` yet: during a
backfill the target collection is not loaded until the stream replays its LoadCollection, so the
target cannot be queried then).

After a range is copied, its keys on the source are compared with its keys on the target; the
rows of keys the target lacks are read from the source again and written, and the check runs
again, until a pass finds nothing missing or the tries are spent (then the range fails and is
not recorded as done).

Why it is sound under concurrent writes: streaming replays the WAL from the positions recorded
before the copy, as upserts. A key on the target but no longer on the source was deleted since
(the stream deletes it). A key on the source but not on the target is either a row the copy
missed or one written since; copying it now is harmless (the stream upserts or deletes it
again later, in WAL order). So "every key alive on the source is on the target" is the
condition to reach, and it cannot hold when the copy missed a row that is still alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from replicator.backfill.ranges import Key

# passes of the check after a copy; each copies what the one before found missing
CHECK_TRIES = 5


class RangeIncompleteError(RuntimeError):
    """The target still lacks source keys of a range after every pass."""


def missing(source_keys: Iterable[Key], target_keys: Iterable[Key]) -> list[Key]:
    """Keys on the source and not on the target, in key order."""
    return sorted(set(source_keys) - set(target_keys))


def complete_range(
    source_keys: Callable[[], Iterable[Key]],
    target_keys: Callable[[], Iterable[Key]],
    copy_keys: Callable[[list[Key]], int],
    tries: int = CHECK_TRIES,
) -> dict[str, Any]:
    """Copy what the target lacks until nothing is missing; returns how many passes ran and how
    many rows they copied. Raises ``RangeIncompleteError`` when keys are still missing after
    ``tries`` passes (a writer faster than the check, or a target that drops writes)."""
    copied = 0
    lacking: list[Key] = []
    for attempt in range(1, tries + 1):
        lacking = missing(source_keys(), target_keys())
        if not lacking:
            return {"passes": attempt, "repaired": copied}
        copied += copy_keys(lacking)
    raise RangeIncompleteError(
        f"{len(lacking)} source keys still missing on the target after {tries} passes "
        f"(first: {lacking[:3]!r})"
    )
