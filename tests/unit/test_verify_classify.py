"""Classifying a range's differing keys, telling settled differences from lag, and the job's
record as kept in the metastore."""

from __future__ import annotations

from replicator.compare.classify import Divergence, RangeRead, classify, sample, settled
from replicator.compare.state import SAMPLE_KEYS, CollectionResult, KindResult, VerifyJob
from server.cli.verify import verify_line, verify_result

AWKWARD = ['q"uote', "back\\slash", "sp ace", "ünï-🙂"]


def test_missing_extra_and_different_keys():
    source = {1: 10, 2: 20, 3: 30, AWKWARD[0]: 5}
    target = {2: 20, 3: 31, 4: 40, AWKWARD[1]: 6}
    found = classify(source, target)
    assert found.missing == {1, AWKWARD[0]}
    assert found.extra == {4, AWKWARD[1]}
    assert found.different == {3}
    assert found.keys == {1, 3, 4, *AWKWARD[:2]}
    assert not classify(source, dict(source))


def test_a_difference_is_settled_only_when_both_reads_saw_the_same_rows():
    first = RangeRead({1: 10, 2: 20, 3: 30}, {2: 21, 3: 30, 9: 90})
    # key 2: the target caught up (lag); key 1: still missing, unchanged (settled);
    # key 9: still extra, unchanged (settled); key 3: the source changed since (moving)
    second = RangeRead({1: 10, 2: 22, 3: 33}, {2: 22, 3: 30, 9: 90})
    found, moving = settled(first, second)
    assert found == Divergence(missing=frozenset({1}), extra=frozenset({9}))
    assert moving == {3}


def test_a_key_that_starts_differing_on_the_second_read_is_not_settled():
    first = RangeRead({1: 10, 5: 50}, {1: 10, 5: 50, 6: 60})
    second = RangeRead({1: 11, 5: 50}, {1: 10, 5: 50, 6: 60})
    found, moving = settled(first, second)
    assert found == Divergence(extra=frozenset({6}))
    assert moving == {1}


def test_samples_are_capped_and_lowest_first():
    result = KindResult().plus(frozenset(range(150, 0, -1)))
    assert result.count == 150
    assert result.keys == list(range(1, SAMPLE_KEYS + 1))
    again = result.plus(frozenset({0}))
    assert again.count == 151 and again.keys[0] == 0 and len(again.keys) == SAMPLE_KEYS
    assert sample(["b", "a"], 1) == ["a"]


def test_the_job_record_survives_the_metastore_with_awkward_keys():
    result = CollectionResult("default.c", "default.c", ranges_total=3, ranges_done=2)
    result = result.add(
        Divergence(
            missing=frozenset(AWKWARD[:2]),
            extra=frozenset(AWKWARD[2:]),
            different=frozenset({"plain"}),
        )
    )
    job = VerifyJob.new(["*"], repair=True).with_collection(result)
    job = job.with_(state="done", notes=["c was not loaded on the target; the verify loaded it"])
    again = VerifyJob.from_bytes(job.to_bytes())
    assert again == job
    view = again.view()
    assert view["divergent_rows"] == 5
    assert view["ranges_done"] == 2 and view["ranges_total"] == 3
    (collection,) = view["collections"]
    assert collection["missing"] == {"count": 2, "keys": sorted(AWKWARD[:2])}
    assert collection["extra"]["keys"] == sorted(AWKWARD[2:])
    assert view["repaired"] == 0
    assert VerifyJob.new(["c"], repair=False).view()["repaired"] is None


def test_the_cli_shows_progress_and_the_keys_of_each_kind():
    result = CollectionResult("default.c", "other.c", ranges_total=4, ranges_done=4)
    result = result.add(Divergence(missing=frozenset(AWKWARD), different=frozenset({7})))
    job = VerifyJob.new(["*"], repair=True).with_collection(result)
    job = job.with_(state="done", notes=["c was not loaded on the target; the verify loaded it"])
    view = job.view()
    line = verify_line(view)
    assert "4/4 ranges" in line and "5 divergent" in line and "0 repaired" in line, line
    assert line.endswith("done"), line
    lines = verify_result(view)
    assert lines[0] == "default.c -> other.c: 4 missing, 0 extra, 1 different", lines
    assert lines[1] == "  missing: " + ", ".join(repr(k) for k in sorted(AWKWARD)), lines
    assert lines[2] == "  different: 7", lines
    assert lines[-1].startswith("note: c was not loaded"), lines
