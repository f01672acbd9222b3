"""A Kafka topic read whole, as a consumer of the daemon's events reads it: committed records
only, every partition from its first record still kept to its end.

From the first record *kept*, not offset 0: the positions topic is shared by every test of a
session, and the Kafka mock keeps about 5 MB (or 100,000 records) a partition, dropping the
oldest beyond. A consumer assigned offset 0 of a trimmed partition is reset to its end (the
default ``auto.offset.reset``), so it read nothing: a test waited 90 s for rows already there.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: Any  # the record's JSON


def read_topic(bootstrap: str, topic: str, timeout: float = READ_TIMEOUT_S) -> list[TopicRecord]:
    """Every committed record of ``topic`` (none if it does not exist), in each partition's
    order, partitions in turn. TimeoutError naming the partitions not read to their end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
        open_partitions = set(metadata.partitions)
        records = []
        deadline = time.monotonic() + timeout
        while open_partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"topic {topic}: partitions {sorted(open_partitions)} not read to their end "
                    f"in {timeout:g} s ({len(records)} records read)"
                )
            for message in consumer.consume(1000, 0.5):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition())
                    continue
                records.append(
                    TopicRecord(
                        message.partition(),
                        message.offset(),
                        message.key(),
                        json.loads(message.value()),
                    )
                )
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()
