"""The completeness check of a copied range."""

from __future__ import annotations

import pytest

from replicator.backfill.complete import RangeIncompleteError, complete_range, missing
from replicator.backfill.ranges import Key


def test_missing_is_source_minus_target_in_key_order() -> None:
    assert missing([5, 1, 3, 9], [3, 9, 7]) == [1, 5]


def test_keys_the_copy_missed_are_copied_and_the_check_then_passes() -> None:
    source: set[Key] = set(range(100))
    target: set[Key] = set(range(100)) - {0, 49, 50, 99}  # rows lost at the range's edges

    def copy(keys: list[Key]) -> int:
        target.update(keys)
        return len(keys)

    result = complete_range(lambda: source, lambda: target, copy)
    assert target == source
    assert result == {"passes": 2, "repaired": 4}


def test_keys_deleted_on_the_source_are_left_to_the_stream() -> None:
    result = complete_range(lambda: {1, 2}, lambda: {1, 2, 3}, lambda keys: 0)
    assert result == {"passes": 1, "repaired": 0}


def test_a_target_that_never_gets_the_rows_fails_the_range() -> None:
    with pytest.raises(RangeIncompleteError, match="1 source keys still missing"):
        complete_range(lambda: {"a'\\ü"}, lambda: set(), lambda keys: len(keys), tries=3)
