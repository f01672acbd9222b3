"""Kafka WAL reader (confluent-kafka). Milvus writes each pchannel to partition 0 of the topic of
the same name; a record's id is its offset, 8 bytes little-endian, as Milvus's own positions."""

from __future__ import annotations

import struct
import threading
import uuid
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from metastore import Position
from replicator.events import RawRecord
from replicator.sources.base import READ_BYTES, SourceUnavailableError, WalTruncatedError
from replicator.sources.kafka_logs import TIMING, LibrdkafkaLog

BACKEND = "kafka"
_PARTITION = 0
# seconds a watermark read waits for the broker unless told otherwise
WATERMARK_TIMEOUT = 10.0
# the longest a fetch of a caught-up reader waits at the broker for a record (librdkafka's
# fetch.wait.max.ms, default 500; sourceConfig.kafka.fetchWaitMs). A Kafka broker answers a
# waiting fetch as soon as a record arrives, so this costs a quiet channel one empty fetch per
# wait and adds no lag; librdkafka's mock cluster (the tests' broker) holds every empty fetch
# for the whole wait, however soon a record arrives, which at 500 ms adds 0-500 ms to every
# record read (bench/results/lag.md): benchmarks on the mock set a short wait
FETCH_WAIT_MS = 500


# librdkafka's errors that say the brokers answer but turn this client away
_REFUSALS = (KafkaError._AUTHENTICATION, KafkaError._SSL)


class BrokerRefusals(LibrdkafkaLog):
    """The ``error_cb`` and ``logger`` of a client: keeps the last refusal (SASL authentication
    failed, a certificate not verified, a TLS client at a plaintext listener), which librdkafka
    reports only there or only in its log; its calls then fail with "all broker connections are
    down" alone. Its log lines go to the "librdkafka" logger (kafka_logs.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.refusal = ""

    def __call__(self, error: KafkaError) -> None:
        if error.code() in _REFUSALS:
            with self._lock:
                self.refusal = TIMING.sub("", error.str())

    @property
    def last(self) -> str:
        """The refusal: librdkafka's error, else its log's."""
        return self.refusal or self.failure

    @last.setter
    def last(self, value: str) -> None:
        self.refusal = self.failure = value

    def explain(self, failure: object) -> str:
        """The refusal behind ``failure`` when there is one (it says more), else ``failure``."""
        return self.last or str(failure)


def encode_offset(offset: int) -> bytes:
    return struct.pack("<q", offset)


def decode_offset(msg_id: bytes) -> int:
    if len(msg_id) != 8:
        raise ValueError(f"a Kafka message id is 8 bytes, got {len(msg_id)}")
    return int(struct.unpack("<q", msg_id)[0])


class KafkaChannelReader:
    def __init__(self, config: dict[str, Any], pchannel: str, start: Position | None) -> None:
        self.pchannel = pchannel
        self._refusals = BrokerRefusals()
        self._full = False  # the last read took as many records as asked: likely more
        self._consumer = Consumer(
            {
                "fetch.wait.max.ms": FETCH_WAIT_MS,  # the source's setting, if any, wins
                # a broker answers a waiting fetch once it has this much: a record at once
                "fetch.min.bytes": 1,
                **config,
                # a group id is required by the client; nothing is ever committed under it
                "group.id": f"milvus-cdc-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # a position the broker no longer holds (retention) is an error, never a
                # silent jump to whatever is oldest: that would lose the records in between
                "auto.offset.reset": "error",
                "enable.partition.eof": False,
                # prefetch at most this much per channel (librdkafka's default is 64 MB)
                "queued.max.messages.kbytes": READ_BYTES // 1024,
                "error_cb": self._refusals,
                "logger": self._refusals,
            }
        )
        self.seek(start)

    def seek(self, position: Position | None) -> None:
        offset = OFFSET_BEGINNING if position is None else decode_offset(position.msg_id) + 1
        self._consumer.assign([TopicPartition(self.pchannel, _PARTITION, offset)])
        self._full = False

    def read_batch(self, max_records: int, timeout: float) -> list[RawRecord]:
        """What is fetched already, at once; else the first record to arrive within ``timeout``
        with whatever came with it. (``consume(n, timeout)`` alone waits out the whole timeout
        unless n records are there: 200 ms of lag added to every quiet read.)"""
        try:
            messages = self._consumer.consume(num_messages=max_records, timeout=0)
            if not messages:
                first = self._consumer.poll(timeout)
                if first is not None:
                    rest = self._consumer.consume(num_messages=max_records - 1, timeout=0)
                    messages = [first, *rest]
        except KafkaException as exc:
            raise SourceUnavailableError(f"kafka: {self._refusals.explain(exc)}") from exc
        self._full = len(messages) >= max_records
        if self._refusals.last and not messages:
            refusal, self._refusals.last = self._refusals.last, ""
            raise SourceUnavailableError(f"kafka {self.pchannel}: {refusal}")
        records = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue  # the channel has no records yet
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise WalTruncatedError(
                        f"kafka {self.pchannel}: the saved position is no longer in the topic "
                        f"(retention removed it): {error.str()}"
                    )
                raise SourceUnavailableError(f"kafka {self.pchannel}: {error.str()}")
            offset = int(message.offset() or 0)
            headers: dict[str, str] = {}
            for header in message.headers() or []:
                key, value = header[0], header[1]
                headers[str(key)] = (
                    value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
                )
            kind, millis = message.timestamp()
            records.append(
                RawRecord(
                    pchannel=self.pchannel,
                    msg_id=encode_offset(offset),
                    payload=message.value() or b"",
                    properties=headers,
                    offset=offset,
                    appended_at=millis / 1000 if kind != TIMESTAMP_NOT_AVAILABLE else 0.0,
                )
            )
        return records

    def more_buffered(self) -> bool:
        """Did the last read take as many records as it asked for (the consumer has likely
        fetched more already)?"""
        return self._full

    def close(self) -> None:
        self._consumer.close()


class KafkaSource:
    backend = BACKEND

    def __init__(self, bootstrap_servers: str, extra: dict[str, Any] | None = None) -> None:
        self._config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **(extra or {})}

    def open_channel(self, pchannel: str, start: Position | None) -> KafkaChannelReader:
        return KafkaChannelReader(self._config, pchannel, start)

    @staticmethod
    def offset_of(msg_id: bytes) -> int:
        return decode_offset(msg_id)

    @staticmethod
    def position_before(offset: int) -> bytes | None:
        return encode_offset(offset - 1) if offset > 0 else None

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        wait = WATERMARK_TIMEOUT if timeout is None else max(0.1, timeout)
        refusals = BrokerRefusals()
        config = {
            **self._config,
            "group.id": f"milvus-cdc-{uuid.uuid4().hex}",
            "error_cb": refusals,
            "logger": refusals,
        }
        if timeout is not None:  # a broker that accepts and never answers: given up as soon
            config["socket.timeout.ms"] = max(10, int(wait * 1000))
            config["socket.connection.setup.timeout.ms"] = max(1000, int(wait * 1000))
        consumer = Consumer(config)
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(pchannel, _PARTITION), timeout=wait
            )
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._UNKNOWN_PARTITION:
                return 0, 0  # no topic yet: Milvus has written nothing to this channel
            consumer.poll(0)  # serves error_cb: the refusal behind "all brokers down", if any
            raise SourceUnavailableError(f"kafka: {refusals.explain(exc)}") from exc
        finally:
            consumer.close()
