"""The source's segment records decoded (real bytes a Milvus 2.3.5 wrote) and followed through
compaction: are the rows of an import's segments served on the source yet
(tests/unit/test_source_imports.py: a task's import waits for them before a copy).

The two records below are what a real Milvus 2.3.5 wrote under
``by-dev/meta/datacoord-meta/s/<collection>/<partition>/<segment>`` after three flushed segments
of 20 rows were compacted (``MilvusClient.compact``): the result (60 rows, state 4 flushed,
``compactionFrom`` naming the three) and one of the inputs (state 6 dropped).
tests/e2e/test_bulk_import.py checks the whole path against a live source.
"""

from __future__ import annotations

from replicator.meta.segments import SegmentRecord, decode_segment, unserved

COMPACTED = (
    b"\x08\xf9\x9c\xec\xf4\xe8\xd0\x8c\xc4\x06\x10\x84\xbc\xf8\xf4\xe8\xd0\x8c\xc4\x06\x18\x85\xbc"
    b'\xf8\xf4\xe8\xd0\x8c\xc4\x06"+by-dev-rootcoord-dml_2_470681714559950340v0(<0\x048'
    b"\xcc\x99\xb3\x06@\x85\x80\x80\x8a\x92\xd2\x8c\xc4\x06J~\n+by-dev-rootcoord-dml_2"
    b"_470681714559950340v0\x12\x08w\x04\x88\x8e\x862\x88\x06\x1a;datanod"
    b"e-1-by-dev-rootcoord-dml_2_470681714559950340v0-true \x81\x80\xe0\xcd\x8a\xd2\x8c\xc4\x06R~"
    b"\n+by-dev-rootcoord-dml_2_470681714559950340v0\x12\x08\x9e\x04\x88\x8e\x862\x88\x06\x1a"
    b";datanode-1-by-dev-rootcoord-dml_2_470681714559950340v0-true \x81\x80\x90\x80\x8d\xd2"
    b"\x8c\xc4\x06p\x01z\x1b\xa2\xbc\xf8\xf4\xe8\xd0\x8c\xc4\x06\xb1\xbc\xf8\xf4\xe8\xd0"
    b"\x8c\xc4\x06\xc4\xbc\xf8\xf4\xe8\xd0\x8c\xc4\x06"
)
COMPACTED_INPUT = (
    b"\x08\xa2\xbc\xf8\xf4\xe8\xd0\x8c\xc4\x06\x10\x84\xbc\xf8\xf4\xe8\xd0\x8c\xc4\x06\x18\x85\xbc"
    b'\xf8\xf4\xe8\xd0\x8c\xc4\x06"+by-dev-rootcoord-dml_2_470681714559950340v0(\x140\x068'
    b"\xcc\x99\xb3\x06@\x89\x80\xb0\xd4\x8c\xd2\x8c\xc4\x06J~\n+by-dev-rootcoord-dml_2"
    b"_470681714559950340v0\x12\x08w\x04\x88\x8e\x862\x88\x06\x1a;datanod"
    b"e-1-by-dev-rootcoord-dml_2_470681714559950340v0-true \x81\x80\xe0\xcd\x8a\xd2\x8c\xc4\x06R~"
    b"\n+by-dev-rootcoord-dml_2_470681714559950340v0\x12\x08\x9e\x04\x88\x8e\x862\x88\x06\x1a"
    b";datanode-1-by-dev-rootcoord-dml_2_470681714559950340v0-true \x81\x80\x90\x80\x8d\xd2"
    b"\x8c\xc4\x06\x80\x01\xd6\xda\xe4\xab\xf5\xac\xbb\xf5\x18\x98\x01\x01"
)
INPUTS = (470681714559950370, 470681714559950385, 470681714559950404)
RESULT = 470681714559749753


def test_segment_records_a_real_compaction_wrote():
    assert decode_segment(COMPACTED) == SegmentRecord(RESULT, 4, 60, INPUTS)
    assert decode_segment(COMPACTED_INPUT) == SegmentRecord(INPUTS[0], 6, 20)


def records(*items: SegmentRecord) -> dict[int, SegmentRecord]:
    return {r.segment_id: r for r in items}


FLUSHED, DROPPED = 4, 6


def test_a_segment_is_served_when_the_source_serves_it_or_what_it_was_compacted_into():
    lineage = records(
        SegmentRecord(1, DROPPED, 10),
        SegmentRecord(2, DROPPED, 10),
        SegmentRecord(3, DROPPED, 20, (1, 2)),  # compacted again into 4
        SegmentRecord(4, FLUSHED, 20, (3,)),
        SegmentRecord(5, FLUSHED, 10),
    )
    assert unserved([1, 2, 5], {4, 5}, lineage) == []
    assert unserved([1, 2, 5], {5}, lineage) == [1, 2]  # 4 is not loaded yet
    assert unserved([5], set(), lineage) == [5]


def test_a_dropped_segment_with_no_successor_holds_nothing_to_wait_for():
    lineage = records(SegmentRecord(1, DROPPED, 10), SegmentRecord(2, FLUSHED, 10))
    assert unserved([1, 2], {2}, lineage) == []
    assert unserved([9], {2}, lineage) == [9]  # not recorded at all: not taken as gone


def test_a_compaction_result_dropped_with_rows_is_not_where_the_rows_went():
    """A result dropped with rows and nothing after it (a compaction undone) does not stand for
    its input; one dropped with no rows (every row deleted) does."""
    undone = records(SegmentRecord(1, FLUSHED, 10), SegmentRecord(2, DROPPED, 10, (1,)))
    assert unserved([1], set(), undone) == [1]
    assert unserved([1], {1}, undone) == []
    emptied = records(SegmentRecord(1, DROPPED, 10), SegmentRecord(2, DROPPED, 0, (1,)))
    assert unserved([1], set(), emptied) == []


def test_records_that_loop_are_never_taken_as_served():
    looping = records(SegmentRecord(1, DROPPED, 5, (2,)), SegmentRecord(2, DROPPED, 5, (1,)))
    assert unserved([1], set(), looping) == [1]
