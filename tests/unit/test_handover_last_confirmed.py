"""The hand-over reads a 2.6 record's last-confirmed id (``_lc``) on every WAL it reads, and on
Pulsar, whose offsets are no record counts, finds a transaction's BeginTxn however far back it
is. No broker: the ids are made the way Milvus's WAL implementations marshal them."""

from __future__ import annotations

import base64
import string

import pulsar
import pytest
from harness.streaming_writer import StreamingWriter

from metastore import Position
from replicator.backfill.handover import WINDOW, group_start, wal_msg_id
from replicator.codec.wire import WireError
from replicator.events import RawRecord
from replicator.sources.kafka import KafkaSource
from replicator.sources.pulsar import PulsarSource
from replicator.sources.pulsar_ids import MessageIdParts, msg_id_before
from replicator.sources.rocksmq import RocksmqSource

LEDGER = 7


def go_format_int36(value: int) -> str:
    """Go's ``strconv.FormatInt(value, 36)`` (lower-case digits), which Milvus's
    ``message.EncodeInt64`` uses for Kafka and RocksMQ ids (``pkg/streaming/util/message/
    encoder.go``, ``walimpls/impls/{kafka,rmq}/message_id.go`` ``Marshal``)."""
    digits = string.digits + string.ascii_lowercase
    out = ""
    while True:
        value, rest = divmod(value, 36)
        out = digits[rest] + out
        if value == 0:
            return out


def pulsar_lc(entry: int, batch_index: int = -1) -> str:
    """A Pulsar id as Milvus marshals it (``walimpls/impls/pulsar/message_id.go``: base64,
    standard alphabet, of the client's serialized ``MessageIdData``); serialized here by the
    Pulsar client library, not by our code."""
    serialized = pulsar.MessageId(-1, LEDGER, entry, batch_index).serialize()
    return base64.b64encode(serialized).decode("ascii")


def test_a_last_confirmed_id_names_the_record_on_every_wal():
    assert go_format_int36(100) == "2s"
    assert KafkaSource.offset_of(wal_msg_id("kafka", "2s")) == 100
    rmq_id = (1_760_000_000_000 << 18) + 5  # RocksMQ ids are hybrid-TSO numbers
    assert RocksmqSource.offset_of(wal_msg_id("rocksmq", go_format_int36(rmq_id))) == rmq_id
    for entry, batch in ((100, -1), (0, -1), (41, 3)):
        offset = PulsarSource.offset_of(wal_msg_id("pulsar", pulsar_lc(entry, batch)))
        assert offset == MessageIdParts(LEDGER, entry, batch).offset
    assert wal_msg_id("woodpecker", "2s") is None  # a WAL this daemon does not read
    for backend, junk in (("kafka", "x!"), ("rocksmq", "-zzzzzzzzzzzzzz"), ("pulsar", "@@")):
        with pytest.raises(WireError, match="property _lc"):
            wal_msg_id(backend, junk)


class PulsarLike:
    """A Pulsar channel in memory: record ``i`` of the writer's dry run is entry ``i`` of one
    ledger; offsets, positions and start semantics are the Pulsar reader's."""

    backend = "pulsar"
    offset_of = staticmethod(PulsarSource.offset_of)
    position_before = staticmethod(PulsarSource.position_before)

    def __init__(self, records: list[RawRecord]) -> None:
        self.records = records
        self.reads_from: list[int] = []

    def watermarks(self, pchannel, timeout=None):
        return self.records[0].offset, self.records[-1].offset + 1

    def open_channel(self, pchannel, start):
        after = -1 if start is None else PulsarSource.offset_of(start.msg_id)
        left = [r for r in self.records if r.offset > after]
        self.reads_from.append(left[0].offset if left else -1)
        records = self

        class Reader:
            def read_batch(self, max_records, timeout):
                batch = left[:max_records]
                del left[:max_records]
                return batch

            def close(self):
                records.reads_from.append(-2)

        return Reader()


def as_pulsar(pchannel: str, writer: StreamingWriter) -> list[RawRecord]:
    """The writer's records with Pulsar ids: ``_lc`` as Milvus's Pulsar WAL writes it."""
    records = []
    for written in writer.written:
        props = dict(written.properties)
        if "_lc" in props:  # the dry run wrote the entry number in base 36
            props["_lc"] = pulsar_lc(int(props["_lc"], 36))
        parts = MessageIdParts(LEDGER, written.offset)
        records.append(
            RawRecord(pchannel, parts.serialize(), written.payload, props, offset=parts.offset)
        )
    return records


def test_on_pulsar_the_start_moves_before_a_begin_far_back():
    """Pulsar offsets pack (ledger, entry, batch index): "the start minus WINDOW" names no
    message, so the read starts at the start's record and the _lc it carries leads back to the
    BeginTxn of the transaction still open there."""
    pchannel = "by-dev-rootcoord-dml_2"
    vchannel = f"{pchannel}_44v0"
    writer = StreamingWriter(None, start_ms=1_760_000_000_000)
    writer.insert(vchannel, 44, [1])  # entry 0
    txn = writer.begin_txn(vchannel)  # entry 1
    writer.insert(vchannel, 44, [2], txn=txn)  # entry 2
    for key in range(WINDOW + 500):
        writer.insert(f"{pchannel}_45v0", 45, [key])
    end = writer.written[-1].offset
    source = PulsarLike(as_pulsar(pchannel, writer))
    before_begin = msg_id_before(MessageIdParts(LEDGER, 1).serialize())
    for at in (end, end - 100):  # the channel's end, and a start with records after it
        start = Position("pulsar", pchannel, MessageIdParts(LEDGER, at).serialize(), 3)
        assert group_start(source, start) == Position("pulsar", pchannel, before_begin, 3)
        assert source.reads_from[-2] == MessageIdParts(LEDGER, 1).offset  # BeginTxn read
    writer.delete(vchannel, 44, [2], txn=txn)
    writer.end_txn(txn)
    source = PulsarLike(as_pulsar(pchannel, writer))
    after = Position("pulsar", pchannel, MessageIdParts(LEDGER, end + 2).serialize(), 3)
    assert group_start(source, after) == after
