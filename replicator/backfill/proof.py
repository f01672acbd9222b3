"""A copied range proves itself before it is recorded as done.

After the copy of a range (in one partition), the source is asked, window by window over the
range, how many rows it holds now whose keys the copy did not write (a ``count(*)`` whose filter
excludes the written keys, as runs of consecutive integers or as lists; ``TERMS_PER_COUNT`` terms
a query). When every count is zero the range is done without reading a key. Otherwise the keys
the range holds on the source *now* are read again, in pages of another size than the copy's,
every key alive and not written is read again by key and written, and only then is the range
done.

Why this is the whole proof, even while the source is written: the task's stream replays the WAL
from positions saved before the copy read anything, writing inserts as upserts. A key alive at
those positions is either still alive when the check counts (or reads) the keys, or it was
deleted since (then the stream replays that delete). A key still alive is seen by the count of
its window, which asks to see every write made before the job started (so a lagging replica
cannot answer it from older data): if the copy did not write it, that count is not zero and the
keys are read again, so the key is written by the check (and the stream replays whatever
happened to it since). A key written by the check that the source changed or deleted afterwards
is corrected the same way. So "every key alive on the source after the copy was written to the
target" is what a correct copy must reach, and a copy that missed a key still alive on the
source (the bug of a reader taking a short page for the end, or a page that skips keys) cannot
pass it: the check writes that key instead of letting the range be marked done without it.

Concurrent writes can only make a count larger (a key inserted during the copy and not written
is counted: the keys are read again, which costs reads, never a key); a key deleted during the
copy is not counted, and needs nothing from the copy. No count can come out zero while a key the
copy did not write is alive in its window when it is counted, so a pass is never a silent miss.

Keys written by the check are either rows inserted on the source while the range was copied or
rows the copy missed; the check cannot tell which, and does not need to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from replicator.backfill.ranges import Key

# keys per by-key read of the check (an ``in [...]`` expression of this many literals)
KEYS_PER_READ = 1000
# runs of written keys per count (each run one term of the count's filter)
TERMS_PER_COUNT = 1000

# (first, last): every key from first to last was written (integers: all of them; strings:
# first == last)
Run = tuple[Key, Key]


class RangeSource(Protocol):
    """The source side of one range in one partition."""

    def alive_keys(self) -> Iterable[Key]:
        """Every key of the range on the source now (Strong consistency)."""
        ...

    def rows(self, keys: list[Key]) -> list[dict[str, Any]]:
        """The rows of ``keys`` that the source holds now; deleted keys are absent."""
        ...

    def count_unwritten(self, after: Key | None, upto: Key | None, runs: list[Run]) -> int:
        """How many rows of the range the source holds now with a key in ``(after, upto]``
        (None: no bound) that is in none of ``runs``, seeing every write made before the job
        started."""
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
    if not any(source.count_unwritten(after, upto, runs) for after, upto, runs in windows(written)):
        return 0
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


def windows(written: set[Key]) -> Iterator[tuple[Key | None, Key | None, list[Run]]]:
    """The range cut into windows ``(after, upto]`` that cover it whole (the first one without a
    lower bound, the last one without an upper bound), each with the runs of written keys in it,
    at most ``TERMS_PER_COUNT``."""
    runs = _runs(sorted(written))
    if not runs:
        yield None, None, []
        return
    after: Key | None = None
    for start in range(0, len(runs), TERMS_PER_COUNT):
        chunk = runs[start : start + TERMS_PER_COUNT]
        upto = chunk[-1][1] if start + TERMS_PER_COUNT < len(runs) else None
        yield after, upto, chunk
        after = upto


def _runs(keys: list[Key]) -> list[Run]:
    """Sorted keys as runs: consecutive integers as one run, every other key a run of its own."""
    runs: list[Run] = []
    for key in keys:
        if (
            runs
            and isinstance(key, int)
            and isinstance(runs[-1][1], int)
            and key == runs[-1][1] + 1
        ):
            runs[-1] = (runs[-1][0], key)
        else:
            runs.append((key, key))
    return runs
