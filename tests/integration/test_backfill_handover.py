"""The hand-over start after a backfill never splits the records of one timestamp (a 2.3-2.5
upsert's Insert and Delete) nor a 2.6 transaction, however far back the transaction began, read
from a real Kafka protocol (the mock cluster)."""

from __future__ import annotations

import uuid

import pytest
from harness.streaming_writer import StreamingWriter
from pymilvus.grpc_gen import common_pb2, msg_pb2
from test_kafka_source import produce

from metastore import Position
from replicator.backfill.handover import WINDOW, group_start
from replicator.errors import TaskFailedError
from replicator.events import RawRecord
from replicator.sources.kafka import KafkaSource, decode_offset, encode_offset

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


FAR = 2600  # records between a transaction's BeginTxn and the start: more than WINDOW
START_MS = 1_760_000_000_000  # a fixed clock: the transaction never expires while it is written


def far_transaction(kafka_mock) -> tuple[str, str, StreamingWriter, object]:
    """A pchannel where transaction T (vchannel ``_44v0``) began at offset 1 and has an Insert
    at 2, followed by FAR single-row inserts of another collection (offsets 3 .. FAR + 2); T's
    Delete and CommitTxn are written by the caller. Returns (pchannel, vchannel, writer, T)."""
    pchannel = f"dml26far-{uuid.uuid4().hex[:8]}"
    vchannel, other = f"{pchannel}_44v0", f"{pchannel}_45v0"
    writer = StreamingWriter(kafka_mock.bootstrap, start_ms=START_MS)
    writer.insert(vchannel, 44, [1])  # 0
    txn = writer.begin_txn(vchannel)  # 1
    writer.insert(vchannel, 44, [2], txn=txn)  # 2
    for key in range(FAR):  # 3 .. FAR + 2: nothing of T among them
        writer.insert(other, 45, [key])
    return pchannel, vchannel, writer, txn


def test_a_transaction_begun_further_back_than_the_window_moves_the_start_to_its_begin(
    kafka_mock,
):
    """The window before the start is WINDOW records; a transaction open at the start whose
    BeginTxn lies further back is read back to however far it is, never skipped: while it is
    still open (its CommitTxn not written yet, none of its records after the start) and after
    it committed."""
    pchannel, vchannel, writer, txn = far_transaction(kafka_mock)
    end = FAR + 2
    assert txn.begin_offset == 1 and end - txn.begin_offset > WINDOW
    source = KafkaSource(kafka_mock.bootstrap)
    before_begin = Position("kafka", pchannel, encode_offset(0), 0)  # reading begins at 1
    try:
        # as Milvus writes it (pkg/streaming/util/message/properties.go: "_lc", the last
        # confirmed message id; encoder.go and walimpls/impls/kafka/message_id.go: a Kafka
        # offset in base 36), every record written while T is open names T's BeginTxn
        last = writer.written[-1]
        assert last.offset == end and int(last.properties["_lc"], 36) == txn.begin_offset
        for at in (end, end - 100):  # the channel's end, and a start with records after it
            start = Position("kafka", pchannel, encode_offset(at), 0)
            assert group_start(source, start) == before_begin
        writer.delete(vchannel, 44, [2], txn=txn)  # end + 1
        writer.end_txn(txn)  # end + 2
        writer.time_tick(pchannel)  # end + 3
    finally:
        writer.close()
    assert [r.properties["_t"] for r in txn.records] == ["900", "2", "3", "901"]
    assert [r.offset for r in txn.records] == [1, 2, end + 1, end + 2]
    for at in (end - 100, end, end + 1):  # the start before T's Delete, before its CommitTxn
        start = Position("kafka", pchannel, encode_offset(at), 0)
        assert group_start(source, start) == before_begin
    for at in (end + 2, end + 3):  # T ended before the start
        start = Position("kafka", pchannel, encode_offset(at), 0)
        assert group_start(source, start) == start


class WithoutLastConfirmed:
    """The source with the last-confirmed properties taken off every record it reads."""

    def __init__(self, inner: KafkaSource) -> None:
        self.inner = inner
        self.backend = inner.backend

    def open_channel(self, pchannel, start):
        reader = self.inner.open_channel(pchannel, start)
        read_batch = reader.read_batch

        def without(max_records: int, timeout: float) -> list[RawRecord]:
            records = read_batch(max_records, timeout)
            for record in records:
                record.properties.pop("_lc", None)
                record.properties.pop("_lcs", None)
            return records

        reader.read_batch = without
        return reader

    def watermarks(self, pchannel, timeout=None):
        return self.inner.watermarks(pchannel, timeout)

    def offset_of(self, msg_id):
        return self.inner.offset_of(msg_id)

    def position_before(self, offset):
        return self.inner.position_before(offset)


def test_without_last_confirmed_ids_the_records_of_an_open_transaction_lead_to_its_begin(
    kafka_mock,
):
    """Records that name no last-confirmed id (or a wrong one) lose nothing either: a record of
    a transaction open at the start whose BeginTxn was not read makes the read go further back
    until it is found."""
    pchannel, vchannel, writer, txn = far_transaction(kafka_mock)
    end = FAR + 2
    try:
        writer.delete(vchannel, 44, [2], txn=txn)  # end + 1
        writer.end_txn(txn)  # end + 2
    finally:
        writer.close()
    source = WithoutLastConfirmed(KafkaSource(kafka_mock.bootstrap))
    start = Position("kafka", pchannel, encode_offset(end), 7)
    assert group_start(source, start) == Position("kafka", pchannel, encode_offset(0), 7)


class Retained:
    """The source as the queue's retention leaves it: records before ``cut`` are gone. (The mock
    cluster refuses DeleteRecords, "Required feature not supported by broker", so the low
    watermark is raised here; a read that starts before it fails as Kafka's would.)"""

    def __init__(self, inner: KafkaSource, cut: int) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.cut = cut

    def open_channel(self, pchannel, start):
        begins_at = 0 if start is None else decode_offset(start.msg_id) + 1
        assert begins_at >= self.cut, f"read from {begins_at}, before the earliest {self.cut}"
        return self.inner.open_channel(pchannel, start)

    def watermarks(self, pchannel, timeout=None):
        low, high = self.inner.watermarks(pchannel, timeout)
        return max(low, self.cut), high

    def offset_of(self, msg_id):
        return self.inner.offset_of(msg_id)

    def position_before(self, offset):
        return self.inner.position_before(offset)


def test_a_transaction_whose_begin_is_no_longer_held_stops_the_task_naming_it(kafka_mock):
    """T's BeginTxn (offset 1) was taken by retention, its Insert (2) is still held: a start
    before T's end cannot be replayed, and the hand-over says so instead of skipping T's rows;
    a start after T's end is not affected."""
    pchannel, vchannel, writer, txn = far_transaction(kafka_mock)
    end = FAR + 2
    try:
        writer.delete(vchannel, 44, [2], txn=txn)  # end + 1
        writer.end_txn(txn)  # end + 2
        writer.time_tick(pchannel)  # end + 3
    finally:
        writer.close()
    source = Retained(KafkaSource(kafka_mock.bootstrap), cut=2)
    for at in (end, end + 1):
        start = Position("kafka", pchannel, encode_offset(at), 0)
        with pytest.raises(TaskFailedError) as failed:
            group_start(source, start)
        reason = str(failed.value)
        assert pchannel in reason and str(txn.txn_id) in reason and vchannel in reason
        assert "no longer held" in reason
    after = Position("kafka", pchannel, encode_offset(end + 2), 0)
    assert group_start(source, after) == after


def test_an_expired_transaction_whose_begin_is_gone_does_not_stop_the_task(kafka_mock):
    """A transaction abandoned without a commit (its keepalive ran out before the start) can
    never end after it (Milvus refuses appends to an expired one, the stream drops it): its lost
    BeginTxn is no reason to stop."""
    pchannel = f"dml26exp-{uuid.uuid4().hex[:8]}"
    vchannel = f"{pchannel}_44v0"
    writer = StreamingWriter(kafka_mock.bootstrap, start_ms=START_MS)
    try:
        abandoned = writer.begin_txn(vchannel, keepalive_ms=5)  # 0: taken by retention below
        body = writer.insert(vchannel, 44, [1], txn=abandoned)  # 1
        # 2: 10 ms later (hybrid time: milliseconds << 18) the transaction has expired
        writer.time_tick(pchannel, tt=body.time_tick + (10 << 18))
        writer.insert(vchannel, 44, [2])  # 3
    finally:
        writer.close()
    assert [r.properties["_t"] for r in writer.written] == ["900", "2", "1", "2"]
    source = Retained(KafkaSource(kafka_mock.bootstrap), cut=1)
    for at in (2, 3):
        start = Position("kafka", pchannel, encode_offset(at), 0)
        assert group_start(source, start) == start
