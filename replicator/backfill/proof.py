"""A copied range proves itself before it is recorded as done.

After the copy of a range (in one partition), the keys the range holds on the source *now* are
read again, in pages of another size than the copy's, and compared with the keys the copy wrote.
Every key alive on the source and not written is read again by key and written; only then is
the range done.

Why this is the whole proof, even while the source is written: the task's stream replays the WAL
from positions saved before the copy read anything, writing inserts as upserts. A key alive at
those positions is either still alive when the check reads the keys (then it was written by the
copy or by the check, and the stream replays whatever happened to it since), or it was deleted
since (then the stream replays that delete). A key written by the check that the source changed
or deleted afterwards is corrected the same way. So "every key alive on the source after the copy
was written to the target" is what a correct copy must reach, and a copy that missed a key still
alive on the source (the bug of a reader taking a short page for the end) cannot pass it: the
check writes that key instead of letting the range be marked done without it.

Keys written by the check are either rows inserted on the source while the range was copied or
rows the copy missed; the check cannot tell which, and does not need to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from replicator.backfill.ranges import Key

# keys per by-key read of the check (an ``in [...]`` expression of this many literals)
KEYS_PER_READ = 1000


class RangeSource(Protocol):
    """The source side of one range in one partition."""

    def alive_keys(self) -> Iterable[Key]:
        """Every key of the range on the source now (Strong consistency)."""
        ...

    def rows(self, keys: list[Key]) -> list[dict[str, Any]]:
        """The rows of ``keys`` that the source holds now; deleted keys are absent."""
        ...


class ProofError(RuntimeError):
    """The source answered the check with something it was not asked for."""


def prove_range(
    source: RangeSource,
    pk: str,
    written: set[Key],
    write: Callable[[list[dict[str, Any]]], None],
) -> int:
    """Write the rows of every key alive on the source and not in ``written``; the number of
    rows written. ``written`` is updated with them."""
    lacking = [key for key in source.alive_keys() if key not in written]
    added = 0
    for start in range(0, len(lacking), KEYS_PER_READ):
        asked = lacking[start : start + KEYS_PER_READ]
        rows = source.rows(asked)
        strays = {row[pk] for row in rows} - set(asked)
        if strays:
            raise ProofError(
                f"a read of {len(asked)} keys by {pk} returned keys not asked for: "
                f"{sorted(strays)[:3]!r}"
            )
        if rows:
            write(rows)
            written.update(row[pk] for row in rows)
            added += len(rows)
    return added
