"""A realistic Milvus 2.6 stream written into the Kafka mock by the test writer and read back
through the Kafka source reader and decode_any: every event, its order, ticks and properties,
on a topic that starts in the 2.5 format and crosses the upgrade."""

from __future__ import annotations

import time
import uuid

import pytest
from harness.streaming_writer import StreamingWriter
from pymilvus.grpc_gen import common_pb2, msg_pb2

from replicator.codec import streaming_headers as sh
from replicator.codec.streaming import decode_any
from replicator.codec.streaming_events import (
    AlterWAL,
    BeginTxn,
    CommitTxn,
    ManualFlush,
    MqSwitchAnnounced,
    RollbackTxn,
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDelete,
    StreamDropCollection,
    StreamInsert,
    StreamTimeTick,
)
from replicator.events import FailedRecord, Insert, TimeTick
from replicator.sources.kafka import KafkaSource, decode_offset

pytestmark = pytest.mark.integration

COLL = 4242


def read_all(source: KafkaSource, topic: str, expected: int, timeout: float = 30) -> list:
    reader = source.open_channel(topic, None)
    records: list = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < expected and time.monotonic() < deadline:
            records += reader.read_batch(100, 0.5)
    finally:
        reader.close()
    return records


def test_a_2_6_stream_reads_back_event_by_event(kafka_mock):
    prefix = f"s{uuid.uuid4().hex[:6]}-rootcoord-dml"
    p0, p1 = f"{prefix}_0", f"{prefix}_1"
    v0, v1, control = f"{p0}_{COLL}v0", f"{p1}_{COLL}v1", f"{p0}_vcchan"
    writer = StreamingWriter(kafka_mock.bootstrap)

    # before the upgrade: 2.5 msgstream records on p0 (no _v)
    old_ts = writer.tso.next()
    old_insert = msg_pb2.InsertRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.Insert),
        collection_name="legacy",
        collectionID=COLL,
        timestamps=[old_ts],
        num_rows=1,
    )
    writer.old_format(p0, old_insert)
    old_tick = writer.tso.next()
    writer.old_format(
        p0,
        msg_pb2.TimeTickMsg(
            base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=old_tick)
        ),
    )

    # after it: 2.6 records
    create = writer.create_collection(COLL, "books", [v0, v1, control], partition_ids=[1])
    writer.time_tick(p0)
    writer.time_tick(p1)
    # two concurrent inserts on p0: ticks taken in one order, appended in the other
    early, late = writer.tso.next(), writer.tso.next()
    writer.insert(v0, COLL, [1, 2, 3], collection_name="books", tt=late)
    writer.insert(v0, COLL, [4, 5], collection_name="books", tt=early)
    writer.insert(v1, COLL, [6], collection_name="books")
    release_p0 = writer.time_tick(p0)
    upsert = writer.upsert(v1, COLL, [6], collection_name="books")
    rolled = writer.begin_txn(v0, keepalive_ms=100)
    writer.delete(v0, COLL, [1], collection_name="books", txn=rolled)
    writer.end_txn(rolled, commit=False)
    writer.partition_ddl("CreatePartition", COLL, "books", 9, "recent", [v0, v1])
    writer.manual_flush(COLL, [v0, v1], segment_ids=[1])
    writer.time_tick(p0)
    writer.time_tick(p1)
    writer.announce_mq_switch([v0, v1], "rocksmq", {"path": "/var/lib/milvus/rdb"})
    alter = writer.alter_wal([p0, p1], p0, "rocksmq", {"rocksmq.path": "/var/lib/milvus/rdb"})
    writer.drop_collection(COLL, "books", [v0, v1, control])
    writer.time_tick(p0)
    writer.time_tick(p1)
    writer.close()

    source = KafkaSource(kafka_mock.bootstrap)
    expected = {p: [w for w in writer.written if w.pchannel == p] for p in (p0, p1)}
    events = {}
    for pchannel, written in expected.items():
        records = read_all(source, pchannel, len(written))
        # the bytes and properties arrive as written, in offset order
        assert [decode_offset(r.msg_id) for r in records] == [w.offset for w in written]
        assert [r.payload for r in records] == [w.payload for w in written]
        assert [r.properties for r in records] == [w.properties for w in written]
        events[pchannel] = [decode_any(r, "kafka", lambda cid: cid == COLL) for r in records]
        assert not [e for e in events[pchannel] if isinstance(e, FailedRecord)]

    kinds = {p: [type(e).__name__ for e in evs] for p, evs in events.items()}
    assert kinds[p0] == [
        "Insert",  # 2.5 format: the msgstream decoder's own event
        "TimeTick",
        "StreamCreateCollection",  # copy for v0
        "StreamCreateCollection",  # copy for the control channel
        "StreamTimeTick",
        "StreamInsert",
        "StreamInsert",
        "StreamTimeTick",
        "BeginTxn",
        "StreamDelete",
        "RollbackTxn",
        "StreamCreatePartition",
        "ManualFlush",
        "StreamTimeTick",
        "MqSwitchAnnounced",
        "AlterWAL",
        "StreamDropCollection",
        "StreamDropCollection",
        "StreamTimeTick",
    ]
    assert kinds[p1] == [
        "StreamCreateCollection",
        "StreamTimeTick",
        "StreamInsert",
        "BeginTxn",
        "StreamInsert",
        "StreamDelete",
        "CommitTxn",
        "StreamCreatePartition",
        "ManualFlush",
        "StreamTimeTick",
        "MqSwitchAnnounced",
        "AlterWAL",
        "StreamDropCollection",
        "StreamTimeTick",
    ]

    # the upgrade is crossed without a gap: old records keep their body timestamps
    legacy, legacy_tick = events[p0][:2]
    assert type(legacy) is Insert and legacy.ts == old_ts
    assert type(legacy_tick) is TimeTick and legacy_tick.ts == old_tick

    # every 2.6 event's ts is its _tt, and that is the tick the writer gave it
    for pchannel, evs in events.items():
        streamed = [e for e in evs if hasattr(e, "meta")]
        written = [w for w in expected[pchannel] if sh.VERSION in w.properties]
        assert [e.ts for e in streamed] == [w.time_tick for w in written]
        assert all(e.meta.pchannel == pchannel for e in streamed)

    # _tt is not monotonic in offset order on p0; the TimeTick after them covers both
    p0_inserts = [e for e in events[p0] if isinstance(e, StreamInsert)]
    assert [e.ts for e in p0_inserts] == [late, early]
    assert [e.num_rows for e in p0_inserts] == [3, 2]
    release = next(e for e in events[p0] if e.ts == release_p0.time_tick)
    assert isinstance(release, StreamTimeTick)
    assert all(e.ts <= release.ts for e in p0_inserts)
    assert sorted(e.ts for e in p0_inserts) == [early, late]

    # broadcast: copies of one DDL share a broadcast id across pchannels, one per vchannel
    creates = [e for evs in events.values() for e in evs if isinstance(e, StreamCreateCollection)]
    assert len({e.meta.broadcast.broadcast_id for e in creates}) == 1
    assert creates[0].meta.broadcast.broadcast_id > 0
    assert [c.properties[sh.BROADCAST_HEADER] for c in create] == [
        create[0].properties[sh.BROADCAST_HEADER]
    ] * 3
    assert sorted(e.meta.vchannel for e in creates) == sorted([v0, v1, control])
    assert creates[0].meta.broadcast.vchannels == (v0, v1, control)
    assert len({e.ts for e in creates}) == 3
    drops = [e for evs in events.values() for e in evs if isinstance(e, StreamDropCollection)]
    assert len(drops) == 3 and len({e.meta.broadcast.broadcast_id for e in drops}) == 1
    assert drops[0].meta.broadcast.broadcast_id != creates[0].meta.broadcast.broadcast_id

    # transactions: the committed upsert on v1, the rolled-back delete on v0
    begin, body_insert, body_delete, commit = events[p1][3:7]
    assert isinstance(begin, BeginTxn) and begin.txn_id == upsert.txn_id
    assert isinstance(body_insert, StreamInsert) and isinstance(body_delete, StreamDelete)
    assert body_insert.meta.txn.txn_id == body_delete.meta.txn.txn_id == upsert.txn_id
    assert body_insert.meta.last_confirmed == sh.format_base36(upsert.begin_offset)
    assert isinstance(commit, CommitTxn) and commit.meta.vchannel == v1
    rollback = next(e for e in events[p0] if isinstance(e, RollbackTxn))
    assert rollback.txn_id == rolled.txn_id != upsert.txn_id

    partitions = [e for e in events[p0] if isinstance(e, StreamCreatePartition)]
    assert [(e.partition_id, e.partition_name) for e in partitions] == [(9, "recent")]

    # flush vs. the WAL-switch announcement vs. AlterWAL
    flush = next(e for e in events[p1] if isinstance(e, ManualFlush))
    assert (flush.collection_id, flush.segment_ids) == (COLL, (1,))
    switch = [e for evs in events.values() for e in evs if isinstance(e, MqSwitchAnnounced)]
    assert [(e.target_type, e.config) for e in switch] == [
        ("rocksmq", (("path", "/var/lib/milvus/rdb"),))
    ] * 2
    alters = {e.meta.vchannel: e for evs in events.values() for e in evs if isinstance(e, AlterWAL)}
    assert set(alters) == {control, p1}
    assert all(e.meta.pchannel_level and e.target_wal == "rocksmq" for e in alters.values())
    assert alters[control].ts == alter[0].time_tick
    assert alters[control].config == (("rocksmq.path", "/var/lib/milvus/rdb"),)
