"""A copied range proves itself: keys alive on the source and not written are written."""

from __future__ import annotations

from typing import Any

import pytest

from replicator.backfill import proof
from replicator.backfill.proof import ProofError, prove_range
from replicator.backfill.ranges import Key


class Source:
    """A range on a source: its rows by key; ``deleted_before_read`` keys vanish between the
    key read and the by-key read (a delete landing during the check)."""

    def __init__(self, keys: list[Key], deleted_before_read: set[Key] | None = None) -> None:
        self.table = {k: {"pk": k, "v": f"row {k}"} for k in keys}
        self.deleted_before_read = deleted_before_read or set()
        self.reads: list[list[Key]] = []

    def alive_keys(self) -> list[Key]:
        return sorted(self.table)

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


def test_a_complete_copy_writes_nothing_more() -> None:
    source, target = Source(list(range(1000))), Target()
    target.write(list(source.table.values()))
    assert prove_range(source, "pk", set(source.table), target.write) == 0
    assert target.writes == 1 and source.reads == []


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
