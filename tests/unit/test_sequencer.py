"""The per-channel sequencer on 2.6 records as the test writer produces them (in memory, the same
bytes it writes to Kafka), decoded by decode_any: tick order, repeats, transactions, resume
points, and a topic that crosses the upgrade from 2.5."""

from __future__ import annotations

from harness.streaming_writer import StreamingWriter, Written
from pymilvus.grpc_gen import common_pb2, msg_pb2

from replicator.codec.streaming import decode_any
from replicator.events import Delete, Insert, TimeTick
from replicator.pipeline.sequencer import ChannelSequencer, Pending

COLL = 77
P0 = "by-dev-rootcoord-dml_0"
V0 = f"{P0}_{COLL}v0"


class Feed:
    """Decodes written records into a sequencer the way a channel worker does and collects
    what each tick releases."""

    def __init__(self, writer: StreamingWriter, released_tick: int = 0) -> None:
        self.writer = writer
        self.seq = ChannelSequencer(P0, released_tick)
        self.seen = 0
        self.last: bytes | None = None
        self.released: list[Pending] = []

    def feed(self, records: list[Written] | None = None) -> list[Pending]:
        """Feed the given records (default: everything written since the last feed)."""
        if records is None:
            records = self.writer.written[self.seen :]
            self.seen = len(self.writer.written)
        out: list[Pending] = []
        for written in records:
            record = written.raw_record()
            event = decode_any(record, "kafka", lambda _c: True)
            if isinstance(event, TimeTick):
                out += self.seq.release(event.ts)
            else:
                self.seq.add(Pending(record.offset, event, self.last))
            self.last = record.msg_id
        self.released += out
        return out


def keys(items: list[Pending]) -> list[tuple[str, list[int]]]:
    result = []
    for item in items:
        event = item.event
        if isinstance(event, Insert):
            result.append(("insert", list(event.request.rowIDs)))
        elif isinstance(event, Delete):
            result.append(("delete", list(event.request.primary_keys.int_id.data)))
    return result


def test_events_are_released_in_tick_order_not_offset_order():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    early, late = writer.tso.next(), writer.tso.next()
    writer.insert(V0, COLL, [2], tt=late)
    writer.insert(V0, COLL, [1], tt=early)
    after = writer.tso.next()
    writer.insert(V0, COLL, [3], tt=after + 10)  # younger than the tick below: waits
    writer.time_tick(P0, tt=after)
    assert keys(feed.feed()) == [("insert", [1]), ("insert", [2])]
    assert feed.seq.waiting()
    writer.time_tick(P0, tt=after + 20)
    assert keys(feed.feed()) == [("insert", [3])]
    assert not feed.seq.waiting()


def test_a_repeated_append_and_a_reread_after_restart_are_dropped():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    first = writer.insert(V0, COLL, [1])
    writer.insert(V0, COLL, [2])
    # the same message appended twice (same _tt), e.g. a retried append
    writer.repeat(first)
    tick = writer.time_tick(P0)
    assert keys(feed.feed()) == [("insert", [1]), ("insert", [2])]
    assert feed.seq.stats.repeats == 1

    # a restart at the saved tick re-reads the same records: all were applied
    restarted = Feed(writer, released_tick=tick.time_tick)
    assert restarted.feed(writer.written) == []
    assert restarted.seq.stats.repeats == 3


def test_a_transaction_applies_at_its_commit_as_one_unit():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    txn = writer.begin_txn(V0)
    writer.insert(V0, COLL, [5, 6], txn=txn)
    writer.delete(V0, COLL, [5, 6], txn=txn)
    # a tick past the bodies' own ticks releases nothing: the transaction is open
    writer.time_tick(P0)
    assert feed.feed() == []
    resume = feed.seq.resume_point()
    assert resume is not None and resume.offset == txn.begin_offset
    commit = writer.end_txn(txn)
    writer.insert(V0, COLL, [7])  # after the commit, outside the transaction
    writer.time_tick(P0)
    released = feed.feed()
    assert keys(released) == [("insert", [5, 6]), ("delete", [5, 6]), ("insert", [7])]
    assert {p.event.ts for p in released[:2]} == {commit.time_tick}
    assert feed.seq.stats.committed == 1


def test_rolled_back_and_expired_transactions_are_dropped():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    rolled = writer.begin_txn(V0)
    writer.insert(V0, COLL, [1], txn=rolled)
    writer.end_txn(rolled, commit=False)
    # a keepalive far beyond the test's own time (the writer's clock is the wall clock: a
    # 5 ms keepalive expired before the first tick on a loaded machine)
    expiring = writer.begin_txn(V0, keepalive_ms=60_000)
    writer.insert(V0, COLL, [2], txn=expiring)
    writer.insert(V0, COLL, [3])
    writer.time_tick(P0)
    assert keys(feed.feed()) == [("insert", [3])]
    assert feed.seq.waiting()  # the second one is still open: it may commit
    # 2 min later (in hybrid time) it has outlived its 1 min keepalive
    writer.time_tick(P0, tt=writer.tso.next() + (120_000 << 18))
    assert feed.feed() == []
    assert not feed.seq.waiting()
    assert (feed.seq.stats.rolled_back, feed.seq.stats.expired) == (1, 1)
    # a late commit of the expired transaction finds nothing to apply
    writer.end_txn(expiring)
    writer.time_tick(P0)
    assert feed.feed() == []
    assert feed.seq.stats.orphans == 1


def test_a_restart_inside_a_transaction_rereads_it_from_its_begin():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    writer.insert(V0, COLL, [1])
    txn = writer.begin_txn(V0)
    writer.insert(V0, COLL, [2], txn=txn)
    tick = writer.time_tick(P0)
    assert keys(feed.feed()) == [("insert", [1])]
    resume = feed.seq.resume_point()
    assert resume is not None and resume.offset == txn.begin_offset
    # the worker saves (resume.before, tick) and dies; the transaction commits meanwhile
    writer.end_txn(txn)
    writer.time_tick(P0)
    restarted = Feed(writer, released_tick=tick.time_tick)
    restarted.last = resume.before
    assert keys(restarted.feed(writer.written[txn.begin_offset :])) == [("insert", [2])]


def test_committed_bodies_waiting_for_their_tick_keep_the_begin_as_resume_point():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    txn = writer.begin_txn(V0)
    writer.insert(V0, COLL, [1], txn=txn)
    lone = writer.insert(V0, COLL, [2], tt=writer.tso.next() + 1000)
    writer.end_txn(txn)
    feed.feed()
    resume = feed.seq.resume_point()
    assert resume is not None and resume.resume_offset == txn.begin_offset
    assert lone.offset > txn.begin_offset


def test_a_topic_crossing_the_upgrade_releases_old_records_first():
    writer = StreamingWriter(None)
    feed = Feed(writer)
    old_ts = writer.tso.next()
    writer.old_format(
        P0,
        msg_pb2.InsertRequest(
            base=common_pb2.MsgBase(msg_type=common_pb2.Insert),
            collectionID=COLL,
            timestamps=[old_ts],
            rowIDs=[100],
            num_rows=1,
        ),
    )
    writer.old_format(
        P0,
        msg_pb2.TimeTickMsg(
            base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=writer.tso.next())
        ),
    )
    writer.insert(V0, COLL, [101])
    writer.time_tick(P0)
    assert keys(feed.feed()) == [("insert", [100]), ("insert", [101])]
