"""The harness's topic reader on a partition the Kafka mock has trimmed (it keeps about 5 MB a
partition): it reads from the first record kept, not nothing (a reader assigned offset 0 was
reset to the partition's end, and a test waited for rows already on the topic)."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.kafka_topics import read_topic

pytestmark = pytest.mark.integration

RECORDS = 7_000
PADDING = "x" * 1_000  # 7,000 records of 1 KB: past the mock's 5 MB a partition


def test_a_trimmed_partition_is_read_from_its_first_kept_record_to_its_end(kafka_mock):
    topic = f"trimmed-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka_mock.bootstrap, "linger.ms": 5})
    for n in range(RECORDS):
        producer.produce(topic, json.dumps({"n": n, "pad": PADDING}), b"k", partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0
    watcher = Consumer({"bootstrap.servers": kafka_mock.bootstrap, "group.id": "w"})
    try:
        low, high = watcher.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        watcher.close()
    assert high == RECORDS and low > 0, (low, high)  # the mock dropped the oldest

    records = [r for r in read_topic(kafka_mock.bootstrap, topic) if r.partition == 0]

    assert [r.offset for r in records] == list(range(low, high))
    assert [r.value["n"] for r in records] == list(range(low, RECORDS))
    assert {r.key for r in records} == {b"k"}
