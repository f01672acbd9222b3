"""The Kafka reader against the Kafka mock: order, resume after a position, and a position
lost to retention failing loudly instead of skipping records."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from metastore import Position
from replicator.sources.base import WalTruncatedError
from replicator.sources.kafka import KafkaSource, decode_offset, encode_offset

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value=value, partition=0, headers=[("traceparent", b"t")])
        producer.poll(0)
    assert producer.flush(30) == 0


def read_all(reader, expected: int, timeout: float = 20) -> list:
    records: list = []
    deadline = time.monotonic() + timeout
    while len(records) < expected and time.monotonic() < deadline:
        records += reader.read_batch(100, 0.5)
    return records


def test_reads_in_order_and_resumes_after_a_position(kafka_mock):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    produce(kafka_mock.bootstrap, topic, [f"m{i}".encode() for i in range(10)])
    source = KafkaSource(kafka_mock.bootstrap)
    reader = source.open_channel(topic, None)
    try:
        records = read_all(reader, 10)
    finally:
        reader.close()
    assert [r.payload for r in records] == [f"m{i}".encode() for i in range(10)]
    assert [decode_offset(r.msg_id) for r in records] == list(range(10))
    assert records[0].properties == {"traceparent": "t"}
    assert source.watermarks(topic) == (0, 10)
    assert source.watermarks(f"missing-{uuid.uuid4().hex}") == (0, 0)
    resumed = source.open_channel(topic, Position("kafka", topic, encode_offset(6), 0))
    try:
        rest = read_all(resumed, 3)
    finally:
        resumed.close()
    assert [r.offset for r in rest] == [7, 8, 9]  # strictly after the position


def test_a_position_lost_to_retention_is_an_error(kafka_mock):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    # the mock keeps a few MB per partition; write well past that
    produce(kafka_mock.bootstrap, topic, [bytes(200_000) for _ in range(60)])
    source = KafkaSource(kafka_mock.bootstrap)
    earliest, latest = source.watermarks(topic)
    assert latest == 60
    assert earliest > 1, "the mock kept everything; write more to test retention"
    reader = source.open_channel(topic, Position("kafka", topic, encode_offset(0), 0))
    try:
        with pytest.raises(WalTruncatedError, match="no longer in the topic"):
            read_all(reader, 1)
    finally:
        reader.close()


def test_reading_ahead_keeps_order_seeks_and_raises_in_the_consumer(kafka_mock):
    from replicator.sources.prefetch import PrefetchingReader

    topic = f"t-{uuid.uuid4().hex[:8]}"
    produce(kafka_mock.bootstrap, topic, [f"m{i}".encode() for i in range(250)])
    source = KafkaSource(kafka_mock.bootstrap)
    reader = PrefetchingReader(source.open_channel(topic, None), max_records=40, depth=2)
    try:
        records = read_all(reader, 250)
        assert [r.offset for r in records] == list(range(250))
        reader.seek(Position("kafka", topic, encode_offset(199), 0))
        assert [r.offset for r in read_all(reader, 50)] == list(range(200, 250))
    finally:
        reader.close()

    # an error of the reader behind (a position lost to retention) reaches the consumer
    lost = f"t-{uuid.uuid4().hex[:8]}"
    produce(kafka_mock.bootstrap, lost, [bytes(200_000) for _ in range(60)])
    reader = PrefetchingReader(
        source.open_channel(lost, Position("kafka", lost, encode_offset(0), 0)), max_records=10
    )
    try:
        with pytest.raises(WalTruncatedError):
            read_all(reader, 1)
    finally:
        reader.close()
