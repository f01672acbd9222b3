"""The Pulsar reader against a real broker named by CDC_TEST_PULSAR_URL (for instance
``pulsar://localhost:6650`` of ``bin/pulsar standalone``). Each test writes to a topic of its own
in ``public/default`` (override with CDC_TEST_PULSAR_TENANT / CDC_TEST_PULSAR_NAMESPACE); the
namespace must allow topic auto-creation, as Milvus's does."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from metastore import Position
from replicator.events import RawRecord
from replicator.sources.pulsar import BACKEND, PulsarChannelReader, PulsarSource
from replicator.sources.pulsar_ids import LATEST, MessageIdParts, msg_id_before

URL = os.environ.get("CDC_TEST_PULSAR_URL", "")
TENANT = os.environ.get("CDC_TEST_PULSAR_TENANT", "public")
NAMESPACE = os.environ.get("CDC_TEST_PULSAR_NAMESPACE", "default")

pytestmark = [
    pytest.mark.pulsar,
    pytest.mark.skipif(
        not URL,
        reason="no Pulsar broker: set CDC_TEST_PULSAR_URL (e.g. pulsar://localhost:6650)",
    ),
]

READ_DEADLINE = 30.0


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    producer_client = pulsar.Client(URL, operation_timeout_seconds=30)
    yield producer_client
    producer_client.close()


@pytest.fixture
def pchannel() -> str:
    return f"cdc-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def source() -> PulsarSource:
    return PulsarSource(URL, TENANT, NAMESPACE, operation_timeout_seconds=30)


def topic_of(pchannel: str) -> str:
    return f"persistent://{TENANT}/{NAMESPACE}/{pchannel}"


def props(i: int) -> dict[str, str]:
    return {"msg_type": "Insert", "traceparent": f"00-{i:032x}-{i:016x}-01", "seq": str(i)}


def payload(i: int) -> bytes:
    return bytes([i % 256, 0, 255]) + f"payload-{i}".encode()


def produce(client: Any, pchannel: str, count: int, start: int = 0) -> list[MessageIdParts]:
    """``count`` non-batched messages, one entry each; their ids as the broker gave them."""
    producer = client.create_producer(topic_of(pchannel), batching_enabled=False)
    try:
        return [
            MessageIdParts.of(producer.send(payload(i), properties=props(i)))
            for i in range(start, start + count)
        ]
    finally:
        producer.close()


def produce_batch(client: Any, pchannel: str, count: int) -> list[MessageIdParts]:
    """``count`` messages sent asynchronously into batches (usually one entry)."""
    producer = client.create_producer(
        topic_of(pchannel),
        batching_enabled=True,
        batching_max_messages=count,
        batching_max_publish_delay_ms=200,
    )
    ids: dict[int, MessageIdParts] = {}
    done = threading.Event()

    def sent(i: int) -> Any:
        def callback(result: Any, message_id: Any) -> None:
            ids[i] = MessageIdParts.of(message_id)
            if len(ids) == count:
                done.set()

        return callback

    try:
        for i in range(count):
            producer.send_async(payload(i), sent(i), properties=props(i))
        producer.flush()
        assert done.wait(READ_DEADLINE), "the broker did not acknowledge the batch"
    finally:
        producer.close()
    return [ids[i] for i in range(count)]


def read(
    reader: PulsarChannelReader, count: int, deadline: float = READ_DEADLINE
) -> list[RawRecord]:
    """Read until ``count`` records arrived (and a little longer, to catch extra ones)."""
    records: list[RawRecord] = []
    end = time.monotonic() + deadline
    while len(records) < count and time.monotonic() < end:
        records += reader.read_batch(100, 0.5)
    records += reader.read_batch(100, 1.0)  # anything beyond ``count`` would be a repeat
    return records


def position(record: RawRecord) -> Position:
    return Position(BACKEND, record.pchannel, record.msg_id, ts=0)


def parts(records: list[RawRecord]) -> list[MessageIdParts]:
    return [MessageIdParts.deserialize(r.msg_id) for r in records]


def test_reads_everything_in_order_with_properties(
    client: Any, source: PulsarSource, pchannel: str
) -> None:
    produced = produce(client, pchannel, 20)
    reader = source.open_channel(pchannel, None)
    try:
        records = read(reader, 20)
    finally:
        reader.close()
    assert [r.payload for r in records] == [payload(i) for i in range(20)]
    for i, record in enumerate(records):
        assert record.pchannel == pchannel
        assert {k: record.properties[k] for k in props(i)} == props(i)
    assert parts(records) == produced
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == 20
    assert offsets == [p.offset for p in produced]
    assert all(p.batch_index == -1 for p in parts(records))


def test_resume_after_a_position_repeats_nothing(
    client: Any, source: PulsarSource, pchannel: str
) -> None:
    produce(client, pchannel, 10)
    first = source.open_channel(pchannel, None)
    try:
        records = read(first, 10)
    finally:
        first.close()
    assert len(records) == 10

    resumed = source.open_channel(pchannel, position(records[3]))
    try:
        again = read(resumed, 6)
    finally:
        resumed.close()
    assert [r.payload for r in again] == [payload(i) for i in range(4, 10)]
    assert [r.msg_id for r in again] == [r.msg_id for r in records[4:]]

    at_end = source.open_channel(pchannel, position(records[-1]))
    try:
        assert at_end.read_batch(100, 2.0) == []
        produce(client, pchannel, 3, start=10)
        new = read(at_end, 3)
    finally:
        at_end.close()
    assert [r.payload for r in new] == [payload(i) for i in range(10, 13)]


def test_resume_inside_a_batch(client: Any, source: PulsarSource, pchannel: str) -> None:
    produced = produce_batch(client, pchannel, 10)
    assert all(p.batch_index >= 0 for p in produced), "the producer did not batch"
    reader = source.open_channel(pchannel, None)
    try:
        records = read(reader, 10)
    finally:
        reader.close()
    assert [r.payload for r in records] == [payload(i) for i in range(10)]
    assert parts(records) == produced
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == 10

    for k in (0, 3, 9):
        resumed = source.open_channel(pchannel, position(records[k]))
        try:
            rest = read(resumed, 9 - k, deadline=5.0)
        finally:
            resumed.close()
        assert [r.payload for r in rest] == [payload(i) for i in range(k + 1, 10)]


def test_start_at_a_message_and_seek_to_the_beginning(
    client: Any, source: PulsarSource, pchannel: str
) -> None:
    produce(client, pchannel, 4)
    produce_batch(client, pchannel, 4)
    reader = source.open_channel(pchannel, None)
    try:
        records = read(reader, 8)
        assert [r.payload for r in records] == [payload(i) for i in [0, 1, 2, 3, 0, 1, 2, 3]]
        for k in (0, 2, 4, 5):  # plain, plain, first of the batch, inside the batch
            before = Position(BACKEND, pchannel, msg_id_before(records[k].msg_id), ts=0)
            reader.seek(before)
            assert [r.msg_id for r in read(reader, 8 - k)] == [r.msg_id for r in records[k:]]
        reader.seek(None)
        assert [r.msg_id for r in read(reader, 8)] == [r.msg_id for r in records]
    finally:
        reader.close()


def test_latest_reads_only_what_comes_next(
    client: Any, source: PulsarSource, pchannel: str
) -> None:
    produce(client, pchannel, 3)
    reader = source.open_channel(pchannel, Position(BACKEND, pchannel, LATEST.serialize(), 0))
    try:
        assert reader.read_batch(100, 2.0) == []
        produce(client, pchannel, 2, start=3)
        assert [r.payload for r in read(reader, 2)] == [payload(3), payload(4)]
    finally:
        reader.close()


def test_watermarks(client: Any, source: PulsarSource, pchannel: str) -> None:
    assert source.watermarks(pchannel) == (0, 0)  # missing (or just auto-created) and empty
    produced = produce(client, pchannel, 5)
    low, high = source.watermarks(pchannel)
    assert low == produced[0].offset
    assert high == produced[-1].offset + 1
    batch = produce_batch(client, pchannel, 5)
    assert source.watermarks(pchannel) == (produced[0].offset, batch[-1].offset + 1)
