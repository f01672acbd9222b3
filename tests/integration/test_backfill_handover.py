"""The hand-over start after a backfill never splits the records of one timestamp (a 2.3-2.5
upsert's Insert and Delete) nor a 2.6 transaction, read from a real Kafka protocol (the mock
cluster)."""

from __future__ import annotations

import uuid

import pytest
from harness.streaming_writer import StreamingWriter
from pymilvus.grpc_gen import common_pb2, msg_pb2
from test_kafka_source import produce

from metastore import Position
from replicator.backfill.handover import group_start
from replicator.sources.kafka import KafkaSource, encode_offset

pytestmark = pytest.mark.integration


def message(msg_type: int, ts: int, *, upsert: bool = False) -> bytes:
    """As Milvus 2.3.5 writes them: DML with per-row timestamps; an upsert's Insert with
    ``MsgBase.timestamp`` 0 (seen on the real source, ``tests/e2e/test_handover_upsert.py``)."""
    base = common_pb2.MsgBase(msg_type=msg_type, timestamp=0 if upsert else ts)
    if msg_type == common_pb2.TimeTick:
        return msg_pb2.TimeTickMsg(base=base).SerializeToString()
    if msg_type == common_pb2.Insert:
        request = msg_pb2.InsertRequest(base=base, collectionID=7, timestamps=[ts], num_rows=1)
        return request.SerializeToString()
    request = msg_pb2.DeleteRequest(base=base, collectionID=7, timestamps=[ts], num_rows=1)
    return request.SerializeToString()


def channel(kafka_mock) -> tuple[KafkaSource, str]:
    topic = f"dml-{uuid.uuid4().hex[:8]}"
    values = [
        message(common_pb2.Insert, 100),  # 0
        message(common_pb2.TimeTick, 100),  # 1
        message(common_pb2.Insert, 200, upsert=True),  # 2: an upsert's Insert ...
        message(common_pb2.TimeTick, 200),  # 3: ... a time tick between its halves ...
        message(common_pb2.Delete, 200),  # 4: ... and its Delete
        message(common_pb2.Insert, 300),  # 5
        message(common_pb2.TimeTick, 300),  # 6
    ]
    produce(kafka_mock.bootstrap, topic, values)
    return KafkaSource(kafka_mock.bootstrap), topic


def test_a_start_between_an_upserts_halves_moves_before_its_insert(kafka_mock):
    source, topic = channel(kafka_mock)
    start = Position("kafka", topic, encode_offset(3), 55)  # reading would begin at 4
    moved = group_start(source, start)
    assert moved == Position("kafka", topic, encode_offset(1), 55)  # reading begins at 2


def test_a_start_at_a_boundary_stays(kafka_mock):
    source, topic = channel(kafka_mock)
    for offset in (1, 4, 6):  # reading begins at 2, 5, or at the end
        start = Position("kafka", topic, encode_offset(offset), 9)
        assert group_start(source, start) == start


def test_a_start_inside_a_2_6_transaction_moves_before_its_begin(kafka_mock):
    """Milvus 2.6 writes an upsert as a transaction (BeginTxn, Insert, Delete, CommitTxn): a
    stream started inside it would read its end without its BeginTxn and drop it."""
    tag = uuid.uuid4().hex[:8]
    pchannel = f"dml26-{tag}"
    vchannel = f"{pchannel}_44v0"
    writer = StreamingWriter(kafka_mock.bootstrap)
    try:
        writer.insert(vchannel, 44, [1, 2])  # 0
        writer.time_tick(pchannel)  # 1
        done = writer.upsert(vchannel, 44, [1])  # 2-5: a transaction ended before the start
        writer.time_tick(pchannel)  # 6
        txn = writer.begin_txn(vchannel)  # 7
        writer.insert(vchannel, 44, [2], txn=txn)  # 8
        writer.delete(vchannel, 44, [2], txn=txn)  # 9
        writer.end_txn(txn)  # 10
        writer.time_tick(pchannel)  # 11
    finally:
        writer.close()
    assert [r.offset for r in done.records] == [2, 3, 4, 5] and txn.begin_offset == 7
    # the harness writes with the product's property names: the types and keys checked here
    # are Milvus's own (messages.proto: BeginTxn 900, CommitTxn 901; ``_t``, ``_tx``)
    assert [r.properties["_t"] for r in txn.records] == ["900", "2", "3", "901"]
    assert all("_tx" in r.properties for r in txn.records)
    source = KafkaSource(kafka_mock.bootstrap)
    for inside in (7, 8, 9):  # reading would begin at the Insert, the Delete, the Commit
        start = Position("kafka", pchannel, encode_offset(inside), 0)
        assert group_start(source, start) == Position("kafka", pchannel, encode_offset(6), 0)
    for outside in (1, 5, 6, 10, 11):  # before, between and after the transactions
        start = Position("kafka", pchannel, encode_offset(outside), 0)
        assert group_start(source, start) == start


def test_a_start_that_splits_the_channels_first_records_moves_to_its_beginning(kafka_mock):
    topic = f"dml-{uuid.uuid4().hex[:8]}"
    produce(
        kafka_mock.bootstrap,
        topic,
        [
            message(common_pb2.Insert, 200, upsert=True),  # 0: the channel's first record
            message(common_pb2.Delete, 200),  # 1
            message(common_pb2.TimeTick, 200),  # 2
        ],
    )
    start = Position("kafka", topic, encode_offset(0), 8)  # reading would begin at the Delete
    # no message id: read from the channel's first record
    assert group_start(KafkaSource(kafka_mock.bootstrap), start) == Position("kafka", topic, b"", 8)
