"""Decoding Milvus 2.6 streaming records built by the test writer (headers encoded by the
protobuf runtime from descriptors in code, read back by our field-by-field decoder), and
old-format records going through the same entry point."""

from __future__ import annotations

import base64

import pytest
from harness.streaming_writer import StreamingWriter
from pymilvus.grpc_gen import common_pb2, msg_pb2

from replicator.codec import streaming_headers as sh
from replicator.codec.streaming import decode_any, read_meta, record_kind, vchannel_pchannel
from replicator.codec.streaming_events import (
    AlterWAL,
    BeginTxn,
    CommitTxn,
    ManualFlush,
    MqSwitchAnnounced,
    RollbackTxn,
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDdl,
    StreamDelete,
    StreamDropCollection,
    StreamDropPartition,
    StreamInsert,
    StreamTimeTick,
)
from replicator.events import (
    CreateCollection,
    FailedRecord,
    Insert,
    RawRecord,
    Skipped,
    TimeTick,
)
from replicator.sources.kafka import encode_offset

P0, P1 = "by-dev-rootcoord-dml_0", "by-dev-rootcoord-dml_1"
COLL = 461
V0, V1 = f"{P0}_{COLL}v0", f"{P1}_{COLL}v1"
CONTROL = f"{P0}_vcchan"


def everything(collection_id: int) -> bool:
    return True


def decode(written):
    return decode_any(written.raw_record(), "kafka", everything)


@pytest.fixture
def writer() -> StreamingWriter:
    return StreamingWriter(None, start_ms=1_750_000_000_000)


def test_base36_properties_round_trip():
    for value in (0, 1, 35, 36, 2**63 - 1, 2**64 - 1, (1_750_000_000_000 << 18) + 7):
        assert sh.parse_base36("_tt", sh.format_base36(value)) == value
    assert sh.format_base36(-37) == "-11"
    assert sh.parse_base36("_lc", "zz") == 35 * 36 + 35
    with pytest.raises(sh.PropertyError, match=r"property _tt: 'x!' is not a base-36 number"):
        sh.parse_base36("_tt", "x!")


def test_meta_reads_every_property(writer):
    txn = writer.begin_txn(V0, keepalive_ms=2500)
    body = writer.insert(V0, COLL, [1, 2], txn=txn)
    meta = read_meta(body.raw_record())
    assert meta.version == 1
    assert meta.msg_type == 2 and meta.type_name == "Insert"
    assert meta.time_tick == body.time_tick == writer.tso._last
    assert meta.time_tick >> 18 == 1_750_000_000_000  # hybrid TSO, physical ms
    assert meta.vchannel == V0 and meta.pchannel == P0
    assert meta.wal_term == 1
    assert meta.txn == sh.TxnContext(txn_id=txn.txn_id, keepalive_ms=2500)
    # a body inside a transaction resumes from its BeginTxn, whose Kafka offset is _lc in base 36
    assert meta.last_confirmed == sh.format_base36(txn.begin_offset)
    assert not meta.last_confirmed_is_self
    assert meta.broadcast is None and not meta.pchannel_level and not meta.replicated


def test_time_tick(writer):
    tick = writer.time_tick(P1)
    event = decode(tick)
    assert isinstance(event, StreamTimeTick) and isinstance(event, TimeTick)
    assert event.ts == tick.time_tick
    assert event.meta.vchannel == ""  # a TimeTick is pchannel-wide
    assert event.meta.last_confirmed_is_self
    assert tick.properties[sh.HEADER] == ""  # the empty TimeTickMessageHeader


def test_insert_keeps_the_column_data_and_takes_ts_from_tt(writer):
    written = writer.insert(V0, COLL, [10, 11, 12], collection_name="books", partition_id=5)
    event = decode(written)
    assert isinstance(event, StreamInsert) and isinstance(event, Insert)
    assert event.ts == written.time_tick
    assert (event.collection_id, event.collection_name, event.num_rows) == (COLL, "books", 3)
    assert isinstance(event.request, msg_pb2.InsertRequest)
    columns = {f.field_name: f for f in event.request.fields_data}
    assert list(columns["id"].scalars.long_data.data) == [10, 11, 12]
    assert list(columns["vector"].vectors.float_vector.data) == [10, 10, 11, 11, 12, 12]
    assert list(columns["tag"].scalars.string_data.data) == ["row-10", "row-11", "row-12"]
    [partition] = event.partitions
    assert (partition.partition_id, partition.rows, partition.segment_id) == (5, 3, 1)
    assert partition.binary_size == len(written.payload)


def test_insert_of_an_unselected_collection_is_skipped_without_its_body(writer):
    written = writer.insert(V0, COLL, [1])
    # a body that is not protobuf: only the header may be read for an unselected collection
    record = RawRecord(P0, encode_offset(0), b"\xff\xff", written.properties)
    event = decode_any(record, "kafka", lambda cid: cid != COLL)
    assert isinstance(event, Skipped)
    assert event.reason == f"collection {COLL} not selected"
    assert event.ts == written.time_tick


def test_delete(writer):
    written = writer.delete(V1, COLL, [7, 8], collection_name="books")
    event = decode(written)
    assert isinstance(event, StreamDelete)
    assert (event.collection_id, event.num_rows, event.ts) == (COLL, 2, written.time_tick)
    assert list(event.request.primary_keys.int_id.data) == [7, 8]
    assert event.meta.vchannel == V1 and event.meta.pchannel == P1


def test_broadcast_create_collection_copies_share_one_broadcast_id(writer):
    copies = writer.create_collection(
        COLL, "books", [V0, V1, CONTROL], partition_ids=[4, 5], partition_names=["_default", "p"]
    )
    events = [decode(c) for c in copies]
    assert all(isinstance(e, StreamCreateCollection) for e in events)
    assert all(isinstance(e, CreateCollection) for e in events)
    assert [e.meta.vchannel for e in events] == [V0, V1, CONTROL]
    assert [e.meta.pchannel for e in events] == [P0, P1, P0]
    ticks = [e.ts for e in events]
    assert ticks == sorted(set(ticks))  # each copy has its own tick
    headers = {e.meta.broadcast for e in events}
    assert len(headers) == 1
    [broadcast] = headers
    assert broadcast.broadcast_id == 7001
    assert broadcast.vchannels == (V0, V1, CONTROL)
    assert broadcast.resource_keys == (sh.ResourceKey(domain=2, key="default:books", shared=False),)
    first = events[0]
    assert (first.collection_id, first.collection_name, first.db_id) == (COLL, "books", 1)
    assert first.partition_ids == (4, 5)  # packed repeated int64
    assert first.partition_names == ("_default", "p")
    assert first.vchannels == (V0, V1)
    assert first.pchannels == (P0, P1)
    assert [f.name for f in first.schema.fields] == ["id", "vector", "tag"]


def test_drop_collection_and_partitions(writer):
    [drop] = writer.drop_collection(COLL, "books", [V0])
    event = decode(drop)
    assert isinstance(event, StreamDropCollection)
    assert (event.collection_id, event.collection_name, event.db_id) == (COLL, "books", 1)
    assert event.meta.broadcast is not None

    [create] = writer.partition_ddl("CreatePartition", COLL, "books", 77, "p77", [V0])
    created = decode(create)
    assert isinstance(created, StreamCreatePartition)
    assert (created.partition_id, created.partition_name, created.collection_name) == (
        77,
        "p77",
        "books",
    )
    [dropped_copy] = writer.partition_ddl("DropPartition", COLL, "books", 77, "p77", [V0])
    dropped = decode(dropped_copy)
    assert isinstance(dropped, StreamDropPartition)
    assert (dropped.partition_id, dropped.partition_name, dropped.collection_id) == (
        77,
        "p77",
        COLL,
    )


def test_transaction_commit_and_rollback(writer):
    txn = writer.upsert(V0, COLL, [3, 4])
    begin, insert, delete, commit = (decode(r) for r in txn.records)
    assert isinstance(begin, BeginTxn)
    assert (begin.txn_id, begin.keepalive_ms) == (txn.txn_id, 10_000)
    assert isinstance(insert, StreamInsert) and isinstance(delete, StreamDelete)
    assert insert.meta.txn == delete.meta.txn == commit.meta.txn
    assert isinstance(commit, CommitTxn) and commit.txn_id == txn.txn_id
    assert begin.ts < insert.ts < delete.ts < commit.ts

    rolled = writer.begin_txn(V1, keepalive_ms=50)
    writer.insert(V1, COLL, [9], txn=rolled)
    writer.end_txn(rolled, commit=False)
    events = [decode(r) for r in rolled.records]
    assert isinstance(events[-1], RollbackTxn) and events[-1].txn_id == rolled.txn_id
    assert events[0].keepalive_ms == 50


def test_manual_flush_and_the_wal_switch_announcement_are_different_events(writer):
    [flush] = writer.manual_flush(COLL, [V0], segment_ids=[11, 12])
    event = decode(flush)
    assert isinstance(event, ManualFlush)
    assert (event.collection_id, event.segment_ids) == (COLL, (11, 12))
    assert event.flush_ts > 0

    copies = writer.announce_mq_switch(
        [V0, V1], "kafka", {"broker_address": "k2:9092", "topic_prefix": "milvus-"}
    )
    events = [decode(c) for c in copies]
    assert all(isinstance(e, MqSwitchAnnounced) for e in events)
    assert not any(isinstance(e, ManualFlush) for e in events)  # never a flush of collection 0
    assert events[0].target_type == "kafka"
    assert events[0].config == (("broker_address", "k2:9092"), ("topic_prefix", "milvus-"))
    assert {e.meta.broadcast.broadcast_id for e in events} == {
        events[0].meta.broadcast.broadcast_id
    }


def test_alter_wal_is_one_pchannel_level_copy_per_pchannel(writer):
    copies = writer.alter_wal([P0, P1], P0, "rocksmq", {"rocksmq.path": "/var/lib/milvus/rdb"})
    events = [decode(c) for c in copies]
    assert all(isinstance(e, AlterWAL) for e in events)
    assert [e.meta.vchannel for e in events] == [CONTROL, P1]
    assert [e.meta.pchannel for e in events] == [P0, P1]
    assert all(e.meta.pchannel_level for e in events)
    assert (events[0].target_wal, events[0].target_wal_id) == ("rocksmq", 1)
    assert events[0].config == (("rocksmq.path", "/var/lib/milvus/rdb"),)


def test_control_channel_ddl_is_routed_by_its_header(writer):
    [db] = writer.create_database("sales", 3, CONTROL)
    event = decode(db)
    assert isinstance(event, StreamDdl)
    assert (event.type_name, event.db_name, event.db_id) == ("CreateDatabase", "sales", 3)
    [truncate] = writer.truncate_collection(COLL, [V0], [1, 2])
    truncated = decode(truncate)
    assert isinstance(truncated, StreamDdl)
    assert (truncated.type_name, truncated.collection_id, truncated.db_id) == (
        "TruncateCollection",
        COLL,
        1,
    )


def test_encrypted_record_fails_with_a_reason(writer):
    written = writer.insert(V0, COLL, [1, 2], cipher=(42, b"secret"))
    event = decode(written)
    assert isinstance(event, FailedRecord)
    assert event.reason.startswith(f"encrypted Insert record on {V0} (cipher header _ch: ")
    assert "encryption zone 42, collection 461" in event.reason
    assert event.position.pchannel == P0
    assert event.position.msg_id == encode_offset(written.offset)
    assert event.position.ts == written.time_tick


def test_old_format_records_go_through_decode_any(writer):
    request = msg_pb2.InsertRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.Insert),
        collection_name="old",
        collectionID=COLL,
        timestamps=[99],
        num_rows=1,
    )
    old = writer.old_format(P0, request)
    event = decode(old)
    assert type(event) is Insert  # the msgstream decoder's event, not a streaming one
    assert (event.collection_name, event.ts) == ("old", 99)
    # "_v": "0" is what Milvus's WithOldVersion writes: still the old format
    zero = RawRecord(P0, encode_offset(1), request.SerializeToString(), {"_v": "0"})
    assert type(decode_any(zero, "kafka", everything)) is Insert


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("_h", "not base64!", "property _h: not valid base64"),
        ("_h", base64.b64encode(b"\x08").decode(), "property _h: malformed protobuf"),
        ("_tt", "-", "property _tt: '-' is not a base-36 number"),
        ("_t", "two", "property _t: 'two' is not a decimal number"),
        ("_v", "9", "property _v: unsupported message version 9"),
        ("_tx", base64.b64encode(b"\x10\x05").decode(), "property _tx: transaction context"),
        ("_bh", "", "property _bh: broadcast header without vchannels"),
    ],
)
def test_malformed_property_names_the_property(writer, key, value, reason):
    written = writer.insert(V0, COLL, [1])
    properties = {**written.properties, key: value}
    record = RawRecord(P0, encode_offset(written.offset), written.payload, properties)
    event = decode_any(record, "kafka", everything)
    assert isinstance(event, FailedRecord)
    assert reason in event.reason
    assert event.position.msg_id == encode_offset(written.offset)


def test_missing_and_unknown_properties(writer):
    written = writer.insert(V0, COLL, [1])
    no_tick = {k: v for k, v in written.properties.items() if k != "_tt"}
    event = decode_any(RawRecord(P0, b"", written.payload, no_tick), "kafka", everything)
    assert isinstance(event, FailedRecord) and "property _tt: missing" in event.reason
    no_header = {k: v for k, v in written.properties.items() if k != "_h"}
    event = decode_any(RawRecord(P0, b"", written.payload, no_header), "kafka", everything)
    assert isinstance(event, FailedRecord)
    assert event.reason == "undecodable 2.6 Insert record: property _h: missing"
    unknown = {**written.properties, "_t": "47"}
    event = decode_any(RawRecord(P0, b"", written.payload, unknown), "kafka", everything)
    assert isinstance(event, FailedRecord) and "unknown message type 47" in event.reason


def test_vchannel_pchannel():
    assert vchannel_pchannel(V0) == P0
    assert vchannel_pchannel(CONTROL) == P0
    assert vchannel_pchannel(P1) == P1  # a pchannel-level copy names the pchannel itself
    assert vchannel_pchannel("by-dev-rootcoord-dml_3_448v12") == "by-dev-rootcoord-dml_3"


def test_what_a_record_is_to_an_idle_task_is_known_without_its_body(writer):
    """Ticks, and the data of a 2.3-2.5 collection by its id, may wait for an idle task;
    everything else wakes it."""
    assert record_kind(writer.time_tick(P1).raw_record()) is None
    assert record_kind(writer.insert(V0, COLL, [1]).raw_record()) == -1  # 2.6 data: no routing
    assert record_kind(writer.manual_flush(COLL, [V0], [7])[0].raw_record()) == -1
    old_tick = msg_pb2.TimeTickMsg(
        base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=99, sourceID=1)
    )
    assert record_kind(writer.old_format(P0, old_tick).raw_record()) is None
    old_insert = msg_pb2.InsertRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.Insert), collectionID=COLL, num_rows=1
    )
    assert record_kind(writer.old_format(P0, old_insert).raw_record()) == COLL
    old_delete = msg_pb2.DeleteRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.Delete), collectionID=COLL + 1, num_rows=1
    )
    assert record_kind(writer.old_format(P0, old_delete).raw_record()) == COLL + 1
    old_drop = msg_pb2.DropCollectionRequest(
        base=common_pb2.MsgBase(msg_type=common_pb2.DropCollection), collectionID=COLL
    )
    assert record_kind(writer.old_format(P0, old_drop).raw_record()) == -1  # DDL wakes all
    # what cannot be read wakes it: its reader decodes it and meets the problem
    assert record_kind(RawRecord(P0, encode_offset(1), b"\xff\xff")) == -1
    assert record_kind(RawRecord(P0, encode_offset(2), b"", {"_v": "1", "_t": "one"})) == -1
