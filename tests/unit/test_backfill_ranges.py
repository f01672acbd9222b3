"""Key ranges of a backfill and the progress numbers shown to operators."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.backfill.__main__ import spark_master
from replicator.backfill.progress import (
    CollectionProgress,
    RateMeter,
    bar,
    eta_seconds,
    percent,
    summary,
)
from replicator.backfill.ranges import (
    KeyOrderError,
    KeyRange,
    cut_ranges,
    literal,
    range_rows_for,
    ranges_for,
)


def test_equal_count_ranges_cover_every_key_once():
    ranges = cut_ranges(range(0, 100, 2), 10)  # 50 keys
    assert [r.rows for r in ranges] == [10] * 5
    assert ranges[0].lo is None and ranges[-1].hi is None
    assert [(r.lo, r.hi) for r in ranges[1:3]] == [(20, 40), (40, 60)]
    for key in range(-5, 120):
        assert sum(r.contains(key) for r in ranges) == 1


def test_a_small_remainder_joins_the_last_range():
    assert [r.rows for r in cut_ranges(range(24), 10)] == [10, 14]
    assert [r.rows for r in cut_ranges(range(25), 10)] == [10, 10, 5]


def test_no_keys_is_one_range_over_everything():
    (only,) = cut_ranges([], 10)
    assert (only.lo, only.hi, only.rows) == (None, None, 0)
    assert only.filter("id") == ""


@given(st.sets(st.integers(-(2**63), 2**63 - 1), max_size=300), st.integers(1, 50))
def test_ranges_partition_any_int64_keys(keys, range_rows):
    ordered = sorted(keys)
    ranges = cut_ranges(ordered, range_rows)
    assert len(ranges) == ranges_for(len(ordered), range_rows)
    assert sum(r.rows for r in ranges) == len(ordered)
    for key in ordered:
        (owner,) = [r for r in ranges if r.contains(key)]
        assert owner.rows > 0
    assert all(r.rows >= min(range_rows, len(ordered)) // 2 for r in ranges)


@given(st.sets(st.text(max_size=8), max_size=200), st.integers(1, 30))
def test_ranges_partition_varchar_keys(keys, range_rows):
    ordered = sorted(keys)
    ranges = cut_ranges(ordered, range_rows)
    for key in ordered:
        assert sum(r.contains(key) for r in ranges) == 1


def test_keys_out_of_order_are_refused():
    with pytest.raises(KeyOrderError):
        cut_ranges([1, 3, 2], 1)
    with pytest.raises(KeyOrderError):
        cut_ranges([1, 1], 1)


def test_filters_escape_varchar_keys():
    assert KeyRange(1, 10, 20, 5).filter("id") == "id >= 10 and id < 20"
    assert KeyRange(0, None, 7, 5).filter("id") == "id < 7"
    assert literal('a"b\\c') == '"a\\"b\\\\c"'
    # control characters escaped (a raw NUL or newline breaks the expression), the rest kept
    assert literal("a\x00b\n\t\x1f") == '"a\\u0000b\\n\\t\\u001f"'
    assert literal("é中🙂") == '"é中🙂"'
    assert KeyRange(2, 'k"', None, 1).filter("key") == 'key >= "k\\""'
    assert KeyRange.from_json(KeyRange(3, "a", "b", 4).to_json()) == KeyRange(3, "a", "b", 4)
    assert KeyRange(3, 5, None, 1).describe() == "range 3 [5, +inf)"


def test_range_rows_for_a_number_of_ranges():
    assert range_rows_for(200_000, 8) == 25_000
    assert ranges_for(200_000, range_rows_for(200_000, 8)) == 8
    assert range_rows_for(0, 4) == 1


def test_progress_numbers():
    assert percent(50, 200, 1, 4) == 25.0
    assert percent(250, 200, 3, 4) == 99.9  # rows written meanwhile: not 100 until every range
    assert percent(250, 200, 4, 4) == 100.0
    assert percent(0, 0, 0, 0) == 0.0
    assert eta_seconds(100, 300, 50.0) == 4.0
    assert eta_seconds(300, 300, None) == 0.0
    assert eta_seconds(100, 300, None) is None
    view = summary(
        [CollectionProgress("db.a", 100, 2, 50, 1), CollectionProgress("db.b", 300, 3, 0, 0)],
        25.0,
    )
    assert view["rows_done"] == 50 and view["rows_total"] == 400
    assert view["ranges_done"] == 1 and view["ranges_total"] == 5
    assert view["percent"] == 12.5 and view["eta_seconds"] == 14.0
    assert view["collections"][1] == {
        "collection": "db.b",
        "rows_done": 0,
        "rows_total": 300,
        "ranges_done": 0,
        "ranges_total": 3,
    }


def test_rate_over_a_sliding_window():
    meter = RateMeter(window=10)
    assert meter.rate() is None
    meter.add(0, 0)
    meter.add(5, 500)
    assert meter.rate() == 100.0
    meter.add(20, 700)  # the window moves on: the first sample is dropped
    assert meter.rate() == pytest.approx(200 / 15)
    meter.add(21, 10)  # a new job started counting again
    assert meter.rate() is None


def test_bar():
    assert bar(0.5, 10) == "[#####.....]"
    assert bar(2, 4) == "[####]"


def test_spark_master_retries_failed_tasks_in_local_mode():
    assert spark_master("local[*]", 4) == ("local[*,4]", {})
    assert spark_master("local[2]", 3) == ("local[2,3]", {})
    assert spark_master("local", 2) == ("local[1,2]", {})
    assert spark_master("local[2,5]", 3) == ("local[2,5]", {})
    assert spark_master("spark://h:7077", 4) == ("spark://h:7077", {"spark.task.maxFailures": "4"})
