"""The boundary table's merge (bench/dr_boundaries_merge.py): how a result row is counted, and
which run of a row counts, on result files written here."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.dr_boundaries import FAULTS

from bench.dr_boundaries_merge import kind_of, merge, table
from server.dr.flows import BOUNDARIES

HEADER = (
    "| job | point | fault | held | invariants | outcome | s |\n|---|---|---|---|---|---|---|\n"
)


HELD_AT_ONCE = (
    "failover t1: 0 TimeoutError: timed out; its own failover held at x too (the search holds "
    "every job passing the point): an accepted verb, its answer the hold's"
)
ROWS = [
    ("yes", "all held", "kill", "killed and started again; done", "held"),
    ("yes", "all held", "pause:own", "pause t1: 200 ; failed (...)", "held"),
    ("yes", "all held", "delete:other", "delete t1-rev: 204 ; failback in_sync", "held"),
    ("yes", "all held", "again", "switchover t1: 409 task t1: under way", "refused as expected"),
    ("yes", "all held", "resume:own", "resume t9: 404 no task t9", "refused as expected"),
    ("yes", "all held", "pause:own", "pause:own: not asked, no daemon serving", "not asked"),
    ("yes", "all held", "delete:other", "delete:other: the flow has no other task", "not asked"),
    ("yes", "all held", "failover:own", HELD_AT_ONCE, "held"),
    ("yes", "verb_409_names_state: 409 ...", "switchover:other", "switchover t1: 409", "broken"),
    ("no", "-", "stall", "the job never reached fencing", "not reached"),
]


@pytest.mark.parametrize(("held", "invariants", "fault", "outcome", "kind"), ROWS)
def test_a_row_is_counted_by_its_answer_and_its_invariants(held, invariants, fault, outcome, kind):
    assert kind_of(held, invariants, fault, outcome) == kind


def test_a_row_the_search_cannot_read_is_an_error_not_a_count():
    with pytest.raises(ValueError, match="no answer"):
        kind_of("yes", "all held", "pause:own", "something the search never writes")


def test_the_last_run_that_reached_a_row_counts(tmp_path: Path):
    first, second = tmp_path / "A.md", tmp_path / "B.md"
    first.write_text(
        HEADER
        + "| switchover | claimed | kill | yes | all held | killed and started again | 9 |\n"
        + "| switchover | claimed | again | yes | all held | switchover t1: 409 under way | 1 |\n"
    )
    second.write_text(
        HEADER
        + "| switchover | claimed | kill | no | - | not reached | 0 |\n"
        + "| switchover | claimed | again | yes | all held | switchover t1: 202 ; done | 5 |\n"
    )
    counted = merge([first, second])
    assert counted[("switchover", "claimed", "kill")] == ("held", "A")
    assert counted[("switchover", "claimed", "again")] == ("held", "B")
    text = table(counted)
    assert "| claimed | 2 | 0 | 0 | 0 | 0 | 13 | A,B |" in text
    combinations = sum(map(len, BOUNDARIES.values())) * len(FAULTS)  # every job x point x fault
    assert f"Totals over {combinations} rows: 2 held" in text
