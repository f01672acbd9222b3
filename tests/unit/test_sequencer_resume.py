"""The sequencer on 2.3-2.5 records (issue 48): a resume skips what the saved tick proves
applied (fault 6), and a 2.3 DDL takes only the waiting DML it concerns, never an upsert's
Insert of another collection or partition whose Delete may still come (fault 3)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pymilvus.grpc_gen import common_pb2, msg_pb2

from replicator.events import Delete, Insert
from replicator.pipeline.sequencer import ChannelSequencer, DroppedPartitions, Pending

P0 = "by-dev-rootcoord-dml_0"


def dml(kind: type[Insert] | type[Delete], ts: int, collection: int, partition: str) -> Any:
    return kind(
        ts=ts,
        collection_id=collection,
        db_name="default",
        collection_name=f"c{collection}",
        partition_name=partition,
        num_rows=1,
        request=None,  # the sequencer reads ts and names only
    )


def insert(ts: int, collection: int = 1, partition: str = "_default") -> Insert:
    return dml(Insert, ts, collection, partition)  # type: ignore[no-any-return]


def delete(ts: int, collection: int = 1, partition: str = "_default") -> Delete:
    return dml(Delete, ts, collection, partition)  # type: ignore[no-any-return]


def feed(seq: ChannelSequencer, *events: Insert | Delete, first: int = 1) -> None:
    for offset, event in enumerate(events, first):
        seq.add(Pending(offset, event, (offset - 1).to_bytes(8, "little")))


def test_a_resume_skips_the_out_of_order_records_its_saved_tick_covers() -> None:
    """Insert A@100 waits, Insert B@90 after it is released by tick 95 and committed with the
    position before A and tick 95. Read again from there, B is applied already."""
    seq = ChannelSequencer(P0)
    feed(seq, insert(100), insert(90))
    released = seq.release(95)
    assert [p.event.ts for p in released] == [90]
    resume = seq.resume_point()
    assert resume is not None and resume.offset == 1  # the position stays before A

    again = ChannelSequencer(P0, 95)  # as the worker builds it from the saved position
    feed(again, insert(100), insert(90))
    assert [p.event.ts for p in again.release(110)] == [100]
    assert again.stats.repeats == 1


def test_within_a_reading_a_record_below_the_released_tick_is_not_dropped() -> None:
    """Only the resume's tick proves anything applied: a record older than a tick of this
    reading (which Milvus should never write) is still applied, late, not lost."""
    seq = ChannelSequencer(P0, 50)
    feed(seq, insert(60))
    assert [p.event.ts for p in seq.release(70)] == [60]
    feed(seq, insert(65), first=3)
    assert [p.event.ts for p in seq.release(80)] == [65]


def test_a_ddl_takes_only_the_waiting_dml_of_what_it_drops() -> None:
    seq = ChannelSequencer(P0)
    # an upsert of collection 1 (Insert K@10, its Delete not read yet), then collection 2's
    # rows, partition p1's and the default partition's of collection 3
    feed(seq, insert(10), insert(11, 2), insert(12, 3, "p1"), insert(13, 3), delete(14, 3, ""))
    assert seq.take_older(20, 4) == []  # another collection's DDL: nothing
    assert [p.event.ts for p in seq.take_older(20, 3, "p1")] == [12]  # its partition's rows
    assert [p.event.ts for p in seq.take_older(20, 2)] == [11]  # the dropped collection's
    assert seq.take_older(12, 3) == []  # only what is older than the DDL
    feed(seq, delete(10), first=6)  # the upsert's Delete, after the DDL records
    released = seq.release(20)
    assert [(type(p.event).__name__, p.event.ts) for p in released] == [
        ("Insert", 10),
        ("Delete", 10),
        ("Insert", 13),
        ("Delete", 14),
    ]


def upsert_insert(ts: int, collection: int = 1, partition: str = "_default") -> Insert:
    """An upsert's Insert: its MsgBase has no timestamp (2.3), its rows have the upsert's."""
    request = msg_pb2.InsertRequest(base=common_pb2.MsgBase(timestamp=0))
    return replace(insert(ts, collection, partition), request=request)


def test_a_partitions_drop_takes_its_rows_but_an_upserts_lone_insert_and_later_records() -> None:
    """A DropPartition of p1 at 20 read between an upsert's halves (its Insert into p1 at 10
    waits, its Delete follows the drop), with an older Insert into p1 after it too: the drop
    erases the upsert's rows and the late Insert's; none of them is written."""
    seq = ChannelSequencer(P0)
    plain = replace(
        insert(12, 3, "p1"), request=msg_pb2.InsertRequest(base=common_pb2.MsgBase(timestamp=12))
    )
    feed(seq, upsert_insert(10, 3, "p1"), plain, upsert_insert(11, 3, "p1"), delete(11, 3, "p1"))
    # the plain Insert and the upsert whose both halves were read go first; the lone one not
    taken = seq.take_dropped(20, 3, "p1")
    assert [(type(p.event).__name__, p.event.ts) for p in taken] == [
        ("Insert", 12),
        ("Insert", 11),
        ("Delete", 11),
    ]
    assert not seq.waiting()
    stored: list[list[tuple[int, str, int]]] = []
    dropped = DroppedPartitions((), stored.append)
    dropped.dropped(3, "p1", 20)
    assert stored == [[(3, "p1", 20)]]  # kept across a restart
    assert DroppedPartitions(stored[-1]).erased(delete(10, 3, "p1"))
    assert dropped.erased(delete(10, 3, "p1")) and dropped.erased(insert(15, 3, "p1"))
    assert not dropped.erased(insert(21, 3, "p1"))  # made again after the drop
    assert not dropped.erased(delete(10, 3, "p2")) and not dropped.erased(delete(10, 4, "p1"))
    dropped.passed(19)
    assert len(stored) == 1  # nothing passed: nothing stored
    dropped.passed(20)  # a tick at the drop: nothing older follows
    assert not dropped.erased(delete(10, 3, "p1")) and stored[-1] == []


def test_a_collections_drop_takes_its_rows_but_an_upserts_lone_insert() -> None:
    seq = ChannelSequencer(P0)
    feed(seq, upsert_insert(10, 3, "p1"), upsert_insert(11, 3), upsert_insert(12, 4))
    assert seq.take_dropped(20, 3) == []  # collection 3's lone upsert Inserts: dropped
    assert [p.event.collection_id for p in seq.release(20)] == [4]  # another's: kept
