"""Shared channel readers against the Kafka mock: every subscriber reads exactly the records after
its own position, in order, whether it reads from the shared buffer or on its own; the channel is
read once for subscribers that keep up; a slow one falls behind without holding the others, reads
on its own and rejoins; a failing shared reader leaves each subscriber to meet the error on its
own; the buffer stays within its window and goes when the last subscriber leaves."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from metastore import Position
from replicator.errors import SourceUnavailableError
from replicator.events import RawRecord
from replicator.sources import shared as shared_module
from replicator.sources.kafka import KafkaSource, encode_offset
from replicator.sources.prefetch import PrefetchingReader
from replicator.sources.shared_records import RECORD_OVERHEAD
from replicator.sources.shared_source import SharedSource

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for value in values:
        producer.produce(topic, value=value, partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0


def values(first: int, count: int, size: int = 100) -> list[bytes]:
    return [f"{i:08d}".encode().ljust(size, b".") for i in range(first, first + count)]


def read_until(reader, count: int, timeout: float = 30, pause: float = 0.0) -> list[RawRecord]:
    records: list[RawRecord] = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += reader.read_batch(min(50, count - len(records)), 0.2)
        if pause:
            time.sleep(pause)
    return records


def at(topic: str, offset: int) -> Position:
    return Position("kafka", topic, encode_offset(offset), 0)


def payload_kind(record: RawRecord) -> int | None:
    """The kind of the test records: "tick..." a tick, "c<id>." data of collection <id>,
    anything else -1."""
    payload = record.payload
    if payload.startswith(b"tick"):
        return None
    return int(payload[1:].split(b".")[0]) if payload.startswith(b"c") else -1


@pytest.fixture
def topic(kafka_mock) -> str:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    produce(kafka_mock.bootstrap, name, values(0, 300))
    return name


def test_subscribers_read_exactly_after_their_own_positions_and_the_channel_once(kafka_mock, topic):
    shared = SharedSource(KafkaSource(kafka_mock.bootstrap))
    first = shared.open_channel(topic, None)
    second = shared.open_channel(topic, at(topic, 99))  # inside what the first one reads
    try:
        a = read_until(first, 300)
        b = read_until(second, 200)
        assert [r.payload for r in a] == values(0, 300)
        assert [r.offset for r in b] == list(range(100, 300))
        produce(kafka_mock.bootstrap, topic, values(300, 50))
        assert [r.offset for r in read_until(first, 50)] == list(range(300, 350))
        assert [r.offset for r in read_until(second, 50)] == list(range(300, 350))
        channel = shared.channel(topic)
        assert first.shared and second.shared
        # one reader for both: every record read once
        assert channel.stats.records_read == 350, channel.stats
    finally:
        first.close()
        second.close()


def test_a_slow_subscriber_reads_on_its_own_without_holding_the_fast_one_then_rejoins(
    kafka_mock,
):
    topic = f"shared-{uuid.uuid4().hex[:8]}"
    produce(kafka_mock.bootstrap, topic, values(0, 2000, size=1000))
    window = 40 * (1000 + RECORD_OVERHEAD)  # 40 records
    shared = SharedSource(KafkaSource(kafka_mock.bootstrap), window=window, depth=1)
    fast = shared.open_channel(topic, None)
    slow = shared.open_channel(topic, None)
    channel = shared.channel(topic)
    held: list[int] = []
    slow_read: list[RawRecord] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            held.append(channel.held_bytes())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        slow_read += read_until(slow, 20)
        fast_read = read_until(fast, 2000)  # the slow one reads nothing meanwhile
        assert [r.payload for r in fast_read] == values(0, 2000, size=1000)
        assert not slow.shared, "the slow subscriber should be reading on its own"
        slow_read += read_until(slow, 1980)
        assert [r.offset for r in slow_read] == list(range(2000))
        produce(kafka_mock.bootstrap, topic, values(2000, 10, size=1000))
        assert [r.offset for r in read_until(fast, 10)] == list(range(2000, 2010))
        assert [r.offset for r in read_until(slow, 10)] == list(range(2000, 2010))
        assert slow.shared, "caught up, the slow subscriber should read the shared buffer again"
    finally:
        stop.set()
        watcher.join()
        fast.close()
        slow.close()
    assert channel.stats.detached >= 1 and channel.stats.rejoined >= 1, channel.stats
    # the window, plus at most one read of the shared reader (50 records of 1 KB here)
    assert max(held) <= window + 1000 * (1000 + RECORD_OVERHEAD), max(held)
    assert channel.held_bytes() == 0  # the last subscriber gone, the buffer went with it


def test_a_take_is_one_read_of_bytes_whatever_the_window_holds(kafka_mock, monkeypatch):
    """A subscriber behind a full window takes about READ_BYTES at a time, as a reader of its
    own would, not the whole window (which it would then hold twice: raw and decoded). Scaled
    down: reads of 20 records' bytes, a window of 200."""
    record = 1000 + RECORD_OVERHEAD
    monkeypatch.setattr(shared_module, "READ_BYTES", 20 * record)
    topic = f"shared-{uuid.uuid4().hex[:8]}"
    produce(kafka_mock.bootstrap, topic, values(0, 150, size=1000))
    shared = SharedSource(KafkaSource(kafka_mock.bootstrap), window=200 * record)
    reader = shared.open_channel(topic, None)
    channel = shared.channel(topic)
    try:
        deadline = time.monotonic() + 30
        while channel.stats.records_read < 150 and time.monotonic() < deadline:
            time.sleep(0.05)  # the window holds all 150 records, unread
        assert channel.stats.records_read == 150, channel.stats
        takes = []
        while sum(takes) < 150:
            takes.append(len(reader.read_batch(1000, 1.0)))
        assert takes == [20] * 7 + [10], takes
    finally:
        reader.close()


def test_a_subscriber_ahead_of_the_shared_reader_reads_on_its_own_until_it_meets_it(
    kafka_mock, topic
):
    shared = SharedSource(KafkaSource(kafka_mock.bootstrap))
    behind = shared.open_channel(topic, None)
    try:
        assert len(read_until(behind, 10)) == 10
        ahead = shared.open_channel(topic, at(topic, 289))
        try:
            assert [r.offset for r in read_until(ahead, 10)] == list(range(290, 300))
            assert [r.offset for r in read_until(behind, 290)] == list(range(10, 300))
            produce(kafka_mock.bootstrap, topic, values(300, 5))
            assert [r.offset for r in read_until(ahead, 5)] == list(range(300, 305))
            assert [r.offset for r in read_until(behind, 5)] == list(range(300, 305))
            assert ahead.shared
        finally:
            ahead.close()
    finally:
        behind.close()


class FailingOnce:
    """The Kafka source whose readers opened by the shared channel fail on their third read."""

    def __init__(self, inner: KafkaSource) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.failed = 0

    def open_channel(self, pchannel: str, start: Position | None):
        reader = self.inner.open_channel(pchannel, start)
        if threading.current_thread().name.startswith("shared-read") and not self.failed:
            outer, reads = self, [0]
            read_batch = reader.read_batch

            def failing(max_records: int, timeout: float) -> list[RawRecord]:
                reads[0] += 1
                if reads[0] == 3:
                    outer.failed += 1
                    raise SourceUnavailableError("kafka: broker went away (injected)")
                return read_batch(max_records, timeout)

            reader.read_batch = failing  # type: ignore[method-assign]
        return reader

    def offset_of(self, msg_id: bytes) -> int:
        return self.inner.offset_of(msg_id)


def test_a_failing_shared_reader_leaves_each_subscriber_to_read_on_its_own(kafka_mock, topic):
    source = FailingOnce(KafkaSource(kafka_mock.bootstrap))
    shared = SharedSource(source, window=20 * (100 + RECORD_OVERHEAD))  # type: ignore[arg-type]
    first = shared.open_channel(topic, None)
    second = shared.open_channel(topic, at(topic, 4))
    try:
        a = read_until(first, 300)
        b = read_until(second, 295)
    finally:
        first.close()
        second.close()
    assert source.failed == 1
    assert [r.offset for r in a] == list(range(300))
    assert [r.offset for r in b] == list(range(5, 300))
    assert shared.channel(topic).stats.errors == 1


def test_an_idle_subscriber_sleeps_through_what_it_does_not_want(kafka_mock, topic):
    """An idle read (the task has nothing waiting for a tick) is not woken by ticks nor by the
    data of collections it does not want: they wait in the buffer and come, in order, with the
    next record it wants, or when the wait ends."""

    def wants(collection_id: int) -> bool:
        return collection_id == 7

    shared = SharedSource(KafkaSource(kafka_mock.bootstrap), kind=payload_kind)
    reader = shared.open_channel(topic, at(topic, 299))  # at the end of what is written
    channel = shared.channel(topic)
    got: list[RawRecord] = []
    # the first idle read looks at what is buffered after it (nothing): it then waits
    assert reader.read_batch_idle(100, 0.1, wants) == []
    idle = threading.Thread(target=lambda: got.extend(reader.read_batch_idle(100, 60, wants)))
    try:
        idle.start()
        unwanted = [b"tick0", b"c3.", b"tick1", b"c4.", b"tick2"]
        produce(kafka_mock.bootstrap, topic, unwanted)
        deadline = time.monotonic() + 30
        while channel.stats.records_read < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert channel.stats.records_read == 5, channel.stats  # they are in the buffer
        time.sleep(0.3)
        assert idle.is_alive() and not got, "a record it does not want woke the idle subscriber"
        produce(kafka_mock.bootstrap, topic, [b"c7."])
        idle.join(30)
        assert not idle.is_alive()
        # everything buffered after its cursor at once, as an idle task needs it: the data it
        # does not want passed over (and counted), the ticks then one after the other, so
        # only the last; then what woke it
        assert [(r.offset, r.payload) for r in got] == [(304, b"tick2"), (305, b"c7.")]
        assert reader.take_passed_over() == 2 and reader.take_passed_over() == 0
        # anything else than ticks and data wakes it
        woke: list[RawRecord] = []
        other = threading.Thread(target=lambda: woke.extend(reader.read_batch_idle(100, 60, wants)))
        other.start()
        produce(kafka_mock.bootstrap, topic, [b"tick3", b"ddl"])
        other.join(30)
        assert not other.is_alive() and [r.payload for r in woke] == [b"tick3", b"ddl"]
        # when the wait ends, what there is is returned
        produce(kafka_mock.bootstrap, topic, [b"tick4", b"c5."])
        assert [r.payload for r in read_idle_until(reader, 2, wants)] == [b"tick4", b"c5."]
        # a plain read is woken by anything, as before
        produce(kafka_mock.bootstrap, topic, [b"tick5"])
        assert [r.payload for r in read_until(reader, 1)] == [b"tick5"]
    finally:
        idle.join(1)
        reader.close()


def read_idle_until(reader, count: int, wants, timeout: float = 30) -> list[RawRecord]:
    records: list[RawRecord] = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += reader.read_batch_idle(count - len(records), 0.5, wants)
    return records


def test_a_record_the_channel_cannot_tell_apart_wakes_the_idle_subscriber(kafka_mock, topic):
    """``kind`` or a subscriber's ``wakes`` failing on a record neither stops the shared
    reader (every subscriber would wait forever) nor hides the record: it wakes the subscriber,
    which reads it."""

    def kind(record: RawRecord) -> int | None:
        if record.payload == b"boom":
            raise ValueError("cannot tell")
        return None if record.payload.startswith(b"tick") else 9

    def wants(collection_id: int) -> bool:
        raise KeyError(collection_id)

    shared = SharedSource(KafkaSource(kafka_mock.bootstrap), kind=kind)
    reader = shared.open_channel(topic, at(topic, 299))
    try:
        assert reader.read_batch_idle(100, 0.1, wants) == []

        def read_into(got: list[RawRecord]) -> None:
            got.extend(reader.read_batch_idle(100, 60, wants))

        for batch in ([b"tick0", b"boom"], [b"tick1", b"data"]):
            got: list[RawRecord] = []
            idle = threading.Thread(target=read_into, args=(got,))
            idle.start()
            produce(kafka_mock.bootstrap, topic, batch)
            idle.join(30)
            assert not idle.is_alive(), "the idle subscriber was never woken"
            assert [r.payload for r in got] == batch
        assert shared.channel(topic).stats.errors == 0
    finally:
        reader.close()


def test_an_idle_read_leaves_out_a_tick_another_tick_follows_and_ends_when_woken(kafka_mock, topic):
    """An idle read hands over only the last of consecutive time ticks (the later one releases
    all the earlier would), never the records it wants between them; its cursor is the last
    record, handed over even when it is data it does not want; ``wake()`` (the task stops)
    ends a long idle wait at once."""

    def kind(record: RawRecord) -> int | None:
        return None if record.payload.startswith(b"tick") else 3

    def wants_3(collection_id: int) -> bool:
        return collection_id == 3

    shared = SharedSource(KafkaSource(kafka_mock.bootstrap), kind=kind)
    reader = shared.open_channel(topic, at(topic, 299))
    channel = shared.channel(topic)
    try:
        assert reader.read_batch_idle(100, 0.1, wants_3) == []
        assert reader.took_all
        written = [b"tick0", b"tick1", b"tick2", b"c3", b"tick3", b"tick4", b"c3", b"tick5"]
        produce(kafka_mock.bootstrap, topic, written)
        deadline = time.monotonic() + 30
        while channel.stats.records_read < len(written) and time.monotonic() < deadline:
            time.sleep(0.05)
        got = reader.read_batch_idle(100, 0.1, wants_3)
        assert [(r.offset, r.payload) for r in got] == [
            (302, b"tick2"),
            (303, b"c3"),
            (305, b"tick4"),
            (306, b"c3"),
            (307, b"tick5"),
        ]
        assert reader.took_all and reader.cursor.offset == 307
        # a plain read hands over every tick
        produce(kafka_mock.bootstrap, topic, [b"tick6", b"tick7"])
        assert [r.payload for r in read_until(reader, 2)] == [b"tick6", b"tick7"]
        # unwanted data last in the buffer is handed over: it is the cursor
        produce(kafka_mock.bootstrap, topic, [b"tick8", b"c3"])
        got = read_idle_until(reader, 2, lambda _c: False)
        assert [(r.offset, r.payload) for r in got] == [(310, b"tick8"), (311, b"c3")]
        assert reader.take_passed_over() == 0

        ended: list[float] = []

        def long_idle_read() -> None:
            reader.read_batch_idle(100, 60, lambda _c: False)
            ended.append(time.monotonic())

        idle = threading.Thread(target=long_idle_read)
        idle.start()
        time.sleep(0.3)
        assert idle.is_alive() and not ended
        woken_at = time.monotonic()
        reader.wake()
        idle.join(10)
        assert ended and ended[0] - woken_at < 5, "wake() did not end the idle wait"
    finally:
        reader.close()


def test_a_polled_subscriber_is_told_when_to_read_and_never_waits(kafka_mock, topic):
    """A fiber's reads (``listen`` and ``poll``): a poll answers at once, None while a read
    would still wait; the listener is called for what would end that wait (for an idle read,
    only a record it wants; for a plain read, any record), and not for the rest; a reader of
    its own (read-ahead) calls it for every batch it has read."""

    def wants_7(collection_id: int) -> bool:
        return collection_id == 7

    shared = SharedSource(KafkaSource(kafka_mock.bootstrap), kind=payload_kind)
    reader = shared.open_channel(topic, at(topic, 299))
    channel = shared.channel(topic)
    told = threading.Event()
    reader.listen(told.set)
    try:
        assert reader.poll(100, wants_7, False) == []  # attached: it looks at what is buffered
        assert reader.poll(100, wants_7, False) is None  # then it would wait
        told.clear()
        produce(kafka_mock.bootstrap, topic, [b"tick0", b"c3."])
        deadline = time.monotonic() + 30
        while channel.stats.records_read < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert channel.stats.records_read == 2
        time.sleep(0.2)
        assert not told.is_set(), "a tick or unwanted data told the idle reader"
        assert reader.poll(100, wants_7, False) is None
        produce(kafka_mock.bootstrap, topic, [b"c7."])
        assert told.wait(30)
        assert [r.payload for r in reader.poll(100, wants_7, False) or []] == [b"tick0", b"c7."]
        assert reader.take_passed_over() == 1
        # the wait is over (``last``): what there is, even nothing
        assert reader.poll(100, wants_7, True) == []
        # a plain read is told of any record, a tick too
        assert reader.poll(100, None, False) is None
        told.clear()
        produce(kafka_mock.bootstrap, topic, [b"tick1"])
        assert told.wait(30)
        assert [r.payload for r in reader.poll(100, None, False) or []] == [b"tick1"]
        # wake() (the task stops, or hurries) tells an idle reader and ends its wait
        told.clear()
        reader.wake()
        assert told.is_set()
        assert reader.poll(100, wants_7, False) == []
    finally:
        reader.close()
    own = PrefetchingReader(KafkaSource(kafka_mock.bootstrap).open_channel(topic, None), 100)
    told.clear()
    own.listen(told.set)
    try:
        assert told.wait(30)
        records: list[RawRecord] = []
        deadline = time.monotonic() + 30
        while len(records) < 304 and time.monotonic() < deadline:
            batch = own.poll(100, None, False)
            if batch is None:
                told.clear()
                if own.poll(100, None, False) is None:  # nothing came in between
                    told.wait(1)
                continue
            records += batch
        assert [r.offset for r in records] == list(range(304))
        assert own.poll(100, None, False) is None
        assert own.poll(100, None, True) == []
    finally:
        own.close()
