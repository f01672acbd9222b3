"""A copied range proves itself: keys alive on the source and not written are written; a range
whose every key alive on the source was written passes on counts, without a key read."""

from __future__ import annotations

from typing import Any

import pytest

from replicator.backfill import proof
from replicator.backfill.proof import ProofError, Run, prove_range, windows
from replicator.backfill.ranges import Key


class Source:
    """A range on a source: its rows by key; ``deleted_before_read`` keys vanish between the
    key read and the by-key read (a delete landing during the check)."""

    def __init__(self, keys: list[Key], deleted_before_read: set[Key] | None = None) -> None:
        self.table = {k: {"pk": k, "v": f"row {k}"} for k in keys}
        self.deleted_before_read = deleted_before_read or set()
        self.reads: list[list[Key]] = []
        self.key_reads = 0
        self.counts: list[tuple[Key | None, Key | None, int]] = []

    def alive_keys(self) -> list[Key]:
        self.key_reads += 1
        return sorted(self.table)

    def count_unwritten(self, after: Key | None, upto: Key | None, runs: list[Run]) -> int:
        def in_runs(key: Key) -> bool:
            return any(first <= key <= last for first, last in runs)  # type: ignore[operator]

        found = sum(
            1
            for k in self.table
            if (after is None or k > after)  # type: ignore[operator]
            and (upto is None or k <= upto)  # type: ignore[operator]
            and not in_runs(k)
        )
        self.counts.append((after, upto, len(runs)))
        return found

    def rows(self, keys: list[Key]) -> list[dict[str, Any]]:
        self.reads.append(keys)
        gone = self.deleted_before_read
        return [self.table[k] for k in keys if k in self.table and k not in gone]


class Target:
    def __init__(self) -> None:
        self.rows: dict[Key, dict[str, Any]] = {}
        self.writes = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writes += 1
        for row in rows:
            self.rows[row["pk"]] = row


@pytest.mark.parametrize(
    "keys",
    [list(range(-50, 2500)), [f'k"{i}\\ü{i:04}' for i in range(1200)] + ["", "中"]],
)
def test_keys_the_copy_missed_are_written(keys: list[Key]) -> None:
    source, target = Source(keys), Target()
    # a copy that took short pages for the end: it wrote only some of the range
    copied = [k for i, k in enumerate(sorted(keys)) if i % 7 and i < len(keys) - 100]
    target.write([source.table[k] for k in copied])
    written = set(copied)

    added = prove_range(source, "pk", written, target.write)

    assert added == len(keys) - len(copied)
    assert target.rows == source.table
    assert written == set(keys)
    assert all(len(read) <= proof.KEYS_PER_READ for read in source.reads)


def test_a_complete_copy_writes_nothing_more_and_reads_no_key() -> None:
    source, target = Source(list(range(1000))), Target()
    target.write(list(source.table.values()))
    assert prove_range(source, "pk", set(source.table), target.write) == 0
    assert target.writes == 1 and source.reads == [] and source.key_reads == 0
    # consecutive keys: one run, one count
    assert source.counts == [(None, None, 1)]


@pytest.mark.parametrize(
    "keys",
    [list(range(0, 20_000, 3)), [f"k{i:06}" for i in range(2500)]],
)
@pytest.mark.parametrize("missed", ["first", "middle", "last"])
def test_a_key_missed_anywhere_is_counted(
    keys: list[Key], missed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The windows cover the range whole (below the first key written, between the counts'
    windows, above the last), so one key missed anywhere makes a count non-zero."""
    monkeypatch.setattr(proof, "TERMS_PER_COUNT", 100)
    source, target = Source(keys), Target()
    gone = {"first": keys[0], "middle": keys[len(keys) // 2], "last": keys[-1]}[missed]
    written = set(keys) - {gone}
    assert prove_range(source, "pk", written, target.write) == 1
    assert list(target.rows) == [gone] and source.key_reads == 1
    assert len(list(windows(written))) > 20


def test_a_key_inserted_during_the_copy_is_written_a_deleted_one_passes() -> None:
    keys = list(range(100))
    source, target = Source(keys), Target()
    written = set(keys)
    # deleted on the source after the copy wrote it: the counts are zero, nothing to do
    del source.table[40]
    assert prove_range(source, "pk", written, target.write) == 0 and source.key_reads == 0
    # inserted on the source during the copy and not written (as a key the copy missed): counted
    source.table[1000] = {"pk": 1000, "v": "new"}
    assert prove_range(source, "pk", written, target.write) == 1
    assert target.rows[1000] == {"pk": 1000, "v": "new"}


def test_windows_are_contiguous_and_runs_compress_consecutive_integers() -> None:
    assert list(windows(set())) == [(None, None, [])]
    assert list(windows({1, 2, 3, 7, 9, 10})) == [(None, None, [(1, 3), (7, 7), (9, 10)])]
    assert list(windows({"b", "a"})) == [(None, None, [("a", "a"), ("b", "b")])]
    cut = list(windows(set(range(0, 4 * proof.TERMS_PER_COUNT + 10, 2))))
    assert [(after, upto) for after, upto, _ in cut] == [
        (None, 2 * proof.TERMS_PER_COUNT - 2),
        (2 * proof.TERMS_PER_COUNT - 2, 4 * proof.TERMS_PER_COUNT - 2),
        (4 * proof.TERMS_PER_COUNT - 2, None),
    ]


def test_keys_deleted_during_the_check_are_left_to_the_stream() -> None:
    source, target = Source(list(range(100)), deleted_before_read={5, 6}), Target()
    written = set(range(5))
    assert prove_range(source, "pk", written, target.write) == 93
    assert 5 not in target.rows and 6 not in target.rows and 99 in target.rows


def test_rows_not_asked_for_are_an_error() -> None:
    source = Source([1, 2, 3])
    source.rows = lambda keys: [{"pk": 42}]  # type: ignore[method-assign]
    with pytest.raises(ProofError, match="42"):
        prove_range(source, "pk", {1}, Target().write)
