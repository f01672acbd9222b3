"""Pulsar WAL reader (pulsar-client): one non-durable reader per pchannel's topic.

Milvus writes each pchannel to the non-partitioned topic
``persistent://<tenant>/<namespace>/<pchannel>``; a record's id is the serialized Pulsar
``MessageIdData`` (what Milvus stores in its own positions).

Reading never leaves anything on the broker: a ``pulsar.Reader`` is a consumer on a
*non-durable* subscription with a random name (``reader-<random>``). The client acknowledges on
that subscription internally, but the broker drops it, cursor included, when the reader closes.
Nothing is subscribed durably, nothing is committed.

Message ids, their order and the offsets made of them: :mod:`replicator.sources.pulsar_ids`;
authentication: :mod:`replicator.sources.pulsar_auth`.

Start semantics
---------------
``open_channel(pchannel, start)`` reads the records strictly after ``start``, from the earliest
retained record when ``start`` is None. pulsar-client's ``create_reader(topic,
start_message_id, start_message_id_inclusive=False)`` (the default) is exclusive already; the
reader also drops every record whose id is not greater than the start id, and any record that
does not come after the previous one, so the guarantee holds whatever the client does.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import pulsar

from metastore import Position
from replicator.events import RawRecord
from replicator.sources.base import READ_BYTES, SourceUnavailableError
from replicator.sources.pulsar_auth import (
    PulsarTls,
    auth_config,
    build_authentication,
    tls_client_args,
)
from replicator.sources.pulsar_ids import (
    EARLIEST,
    LATEST,
    MessageIdParts,
    is_after,
    msg_id_before,
    offset_of_msg_id,
)

log = logging.getLogger(__name__)

BACKEND = "pulsar"

# Memory the reader's receive queue may hold per channel, at Milvus's maximum message size.
_QUEUE_BUDGET_BYTES = 64 * 1024 * 1024
_MIN_QUEUE = 16
_MAX_QUEUE = 1000


# --- names --------------------------------------------------------------------------------------
def topic_name(tenant: str, namespace: str, pchannel: str) -> str:
    """``persistent://<tenant>/<namespace>/<pchannel>``, the topic Milvus writes a pchannel to."""
    for what, value in (("tenant", tenant), ("namespace", namespace), ("pchannel", pchannel)):
        if not value or "/" in value or value != value.strip():
            raise ValueError(f"Pulsar {what} {value!r} is not a single non-empty name")
    return f"persistent://{tenant}/{namespace}/{pchannel}"


def service_url(address: str) -> str:
    """The broker URL: Milvus configurations sometimes give ``host:port`` without the scheme."""
    address = address.strip()
    if not address:
        raise ValueError("Pulsar address is empty")
    return address if "://" in address else f"pulsar://{address}"


def receiver_queue_size(max_message_size: int) -> int:
    """Receive-queue length per reader: at most about 64 MiB of messages of the largest size
    Milvus writes (``pulsar.maxMessageSize``), between 16 and 1000 messages."""
    if max_message_size <= 0:
        raise ValueError("max_message_size must be positive")
    return max(_MIN_QUEUE, min(_MAX_QUEUE, _QUEUE_BUDGET_BYTES // max_message_size))


# --- errors -------------------------------------------------------------------------------------
class PulsarConfigError(SourceUnavailableError):
    """The broker refuses the configuration (URL, topic name, credentials, permissions):
    retrying with the same settings cannot help, so the task fails with this reason."""

    retriable = False


_NOT_RETRIABLE: tuple[type[BaseException], ...] = tuple(
    getattr(pulsar, name)
    for name in (
        "InvalidConfiguration",
        "InvalidUrl",
        "InvalidTopicName",
        "AuthenticationError",
        "AuthorizationError",
        "NotAllowedError",
        "OperationNotSupported",
        "UnsupportedVersionError",
    )
    if hasattr(pulsar, name)
)


def source_error(exc: BaseException, what: str) -> SourceUnavailableError:
    """A pulsar-client error as the reader contract's exception (retriable unless the broker
    refused the configuration)."""
    kind = PulsarConfigError if isinstance(exc, _NOT_RETRIABLE) else SourceUnavailableError
    return kind(f"pulsar {what}: {type(exc).__name__}: {exc}")


# --- reader -------------------------------------------------------------------------------------
def _start_of(position: Position | None) -> tuple[Any, MessageIdParts | None]:
    """(pulsar-client start message id, filter bound) for "strictly after ``position``"."""
    if position is None:
        return pulsar.MessageId.earliest, None
    if position.backend != BACKEND:
        raise ValueError(
            f"position of channel {position.pchannel} is a {position.backend!r} position, "
            f"not a Pulsar one"
        )
    parts = MessageIdParts.deserialize(position.msg_id)
    if parts == LATEST:
        return pulsar.MessageId.latest, None
    if parts == EARLIEST:
        return pulsar.MessageId.earliest, None
    return pulsar.MessageId.deserialize(bytes(position.msg_id)), parts


class PulsarChannelReader:
    """Reads one pchannel through a ``pulsar.Reader`` (non-durable, never acknowledged on a
    durable subscription). Records come strictly after the start position, in topic order, each
    with an offset strictly greater than the previous one."""

    def __init__(self, source: PulsarSource, pchannel: str, start: Position | None) -> None:
        self.pchannel = pchannel
        self._source = source
        self._topic = source.topic(pchannel)
        self._reader: Any = None
        self._start_id: Any = pulsar.MessageId.earliest
        self._after: MessageIdParts | None = None
        self._disconnected_since: float | None = None
        self._closed = False
        self._client = source._acquire_client()
        try:
            self.seek(start)
        except BaseException:
            self.close()
            raise

    def seek(self, position: Position | None) -> None:
        start_id, after = _start_of(position)
        self._close_reader()
        self._start_id, self._after = start_id, after
        self._disconnected_since = None
        self._open()

    def _open(self) -> bool:
        """Create the pulsar reader at the current start; False while the topic does not exist
        (the broker refuses to create it: Milvus has written nothing to the channel yet)."""
        try:
            self._reader = self._client.create_reader(
                self._topic,
                self._start_id,
                receiver_queue_size=self._source.receiver_queue_size,
                is_read_compacted=False,
                start_message_id_inclusive=False,
            )
        except pulsar.TopicNotFound:
            log.debug("pulsar topic %s does not exist yet", self._topic)
            return False
        except pulsar.PulsarException as exc:
            raise source_error(exc, f"{self._topic}: creating a reader") from exc
        return True

    def read_batch(self, max_records: int, timeout: float) -> list[RawRecord]:
        if self._closed:
            raise SourceUnavailableError(f"pulsar {self._topic}: the reader is closed")
        if max_records <= 0:
            return []
        deadline = time.monotonic() + max(0.0, timeout)
        if self._reader is None and not self._open():
            time.sleep(max(0.0, timeout))
            return []
        records: list[RawRecord] = []
        size = 0
        while len(records) < max_records and size < READ_BYTES:
            wait_ms = 0 if records else max(0, int((deadline - time.monotonic()) * 1000))
            try:
                message = self._reader.read_next(wait_ms)
            except pulsar.Timeout:
                break
            except pulsar.PulsarException as exc:
                raise source_error(exc, f"{self._topic}: reading") from exc
            record = self._record(message)
            if record is not None:
                records.append(record)
                size += len(record.payload)
        self._check_connected(bool(records))
        return records

    def _record(self, message: Any) -> RawRecord | None:
        message_id = message.message_id()
        parts = MessageIdParts.of(message_id)
        if parts.partition >= 0:
            raise PulsarConfigError(
                f"pulsar {self._topic} is a partitioned topic; Milvus channels are not"
            )
        if not is_after(parts, self._after):
            log.warning(
                "pulsar %s: dropped message %s, not after %s (already read)",
                self._topic,
                parts,
                self._after,
            )
            return None
        self._after = parts
        properties = message.properties() or {}
        return RawRecord(
            pchannel=self.pchannel,
            msg_id=bytes(message_id.serialize()),
            payload=bytes(message.data() or b""),
            properties={str(key): str(value) for key, value in properties.items()},
            offset=parts.offset,
        )

    def _check_connected(self, got_records: bool) -> None:
        """The client reconnects by itself; report an outage only when it lasts."""
        if got_records or self._reader is None or self._reader.is_connected():
            self._disconnected_since = None
            return
        now = time.monotonic()
        if self._disconnected_since is None:
            self._disconnected_since = now
        elif now - self._disconnected_since >= self._source.disconnect_grace_seconds:
            raise SourceUnavailableError(
                f"pulsar {self._topic}: not connected to the broker for "
                f"{now - self._disconnected_since:.0f} s"
            )

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                reader.close()
            except pulsar.PulsarException as exc:
                log.debug("pulsar %s: closing the reader: %s", self._topic, exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reader()
        self._source._release_client()


class PulsarSource:
    """Milvus's Pulsar message queue as a WAL source.

    One pulsar-client ``Client`` (its connection pool and IO thread) is shared by the readers of
    this source; it is created with the first reader and closed with the last one.
    ``max_message_size`` (Milvus's ``pulsar.maxMessageSize``) bounds the receive queue of each
    reader, see ``receiver_queue_size``.
    """

    backend = BACKEND

    def __init__(
        self,
        address: str,
        tenant: str = "public",
        namespace: str = "default",
        auth_plugin: str = "",
        auth_params: str = "",
        max_message_size: int = 5242880,
        *,
        tls: Mapping[str, Any] | None = None,
        operation_timeout_seconds: int = 30,
        connection_timeout_ms: int = 10_000,
        disconnect_grace_seconds: float = 30.0,
        watermark_timeout_seconds: float = 5.0,
    ) -> None:
        self.address = service_url(address)
        topic_name(tenant, namespace, "x")  # validates tenant and namespace
        self.tenant = tenant
        self.namespace = namespace
        self._auth = auth_config(auth_plugin, auth_params)
        self.tls = PulsarTls(**(tls or {}))  # PulsarTls's fields, as PulsarSettings names them
        self.max_message_size = max_message_size
        self.receiver_queue_size = receiver_queue_size(max_message_size)
        self.operation_timeout_seconds = operation_timeout_seconds
        self.connection_timeout_ms = connection_timeout_ms
        self.disconnect_grace_seconds = disconnect_grace_seconds
        self.watermark_timeout_seconds = watermark_timeout_seconds
        self._lock = threading.Lock()
        self._client: Any = None
        self._users = 0

    def __repr__(self) -> str:
        return (
            f"PulsarSource(address={self.address!r}, tenant={self.tenant!r}, "
            f"namespace={self.namespace!r}, auth={self._auth!r})"
        )

    def topic(self, pchannel: str) -> str:
        return topic_name(self.tenant, self.namespace, pchannel)

    @staticmethod
    def offset_of(msg_id: bytes) -> int:
        """The offset a record with this message id gets (see the module doc)."""
        return offset_of_msg_id(msg_id)

    @staticmethod
    def position_before(offset: int) -> bytes | None:
        """Resume so that the message at ``offset`` is read next."""
        if offset <= 0:
            return None
        return msg_id_before(MessageIdParts.from_offset(offset).serialize())

    # -- client --------------------------------------------------------------------------------
    def new_client(self, timeout: float | None = None) -> Any:
        """A client; ``timeout``: one whose every call (connection, lookup, reader) gives up
        within about that many seconds."""
        operation, connection = self.operation_timeout_seconds, self.connection_timeout_ms
        if timeout is not None:
            operation = max(1, min(operation, math.ceil(timeout)))
            connection = max(100, min(connection, int(timeout * 1000)))
        try:
            return pulsar.Client(
                self.address,
                authentication=build_authentication(self._auth),
                **tls_client_args(self.address, self.tls),
                operation_timeout_seconds=operation,
                connection_timeout_ms=connection,
                logger=logging.getLogger("pulsar"),
            )
        except ValueError as exc:  # bad URL scheme, bad parameter types
            raise PulsarConfigError(f"pulsar {self.address}: {exc}") from exc
        except pulsar.PulsarException as exc:
            raise source_error(exc, f"{self.address}: creating the client") from exc

    def _acquire_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self.new_client()
            self._users += 1
            return self._client

    def _release_client(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or self._client is None:
                return
            client, self._client = self._client, None
        try:
            client.close()
        except pulsar.PulsarException as exc:
            log.debug("pulsar %s: closing the client: %s", self.address, exc)

    # -- the WalSource contract ------------------------------------------------------------------
    def open_channel(self, pchannel: str, start: Position | None) -> PulsarChannelReader:
        return PulsarChannelReader(self, pchannel, start)

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        """(offset of the earliest retained message, offset of the last message + 1), in the
        offsets the records get; (0, 0) when the topic is missing or empty. With a ``timeout``
        shorter than the client's operation timeout, the read has a client of its own that
        gives up within it (the shared one would wait the operation timeout).

        Pulsar has no numeric offsets and no "high watermark" a plain reader can ask for, so this
        is best effort, with two short-lived non-durable readers: one from ``MessageId.earliest``
        reads the first message; one from ``MessageId.latest`` with an inclusive start (the client
        then seeks to the broker's last message id) reads the last one. Unlike Kafka, the second
        value is a lower bound, not the exact offset the next record will get: any later record
        has an offset at least this large. A message published while this runs may or may not be
        counted.
        """
        topic = self.topic(pchannel)
        wait = self.watermark_timeout_seconds
        own = timeout is not None and timeout < self.operation_timeout_seconds
        if timeout is not None:
            wait = min(wait, timeout)
        timeout_ms = max(1, int(wait * 1000))
        client = self.new_client(timeout) if own else self._acquire_client()
        try:
            first = self._peek(client, topic, pulsar.MessageId.earliest, False, timeout_ms)
            if first is None:
                return 0, 0
            last = self._peek(client, topic, pulsar.MessageId.latest, True, timeout_ms)
            last = first if last is None or last < first else last
            return first.offset, last.offset + 1
        except pulsar.TopicNotFound:
            return 0, 0
        except pulsar.PulsarException as exc:
            raise source_error(exc, f"{topic}: watermarks") from exc
        finally:
            if own:
                with contextlib.suppress(pulsar.PulsarException):
                    client.close()
            else:
                self._release_client()

    def _peek(
        self, client: Any, topic: str, start: Any, inclusive: bool, timeout_ms: int
    ) -> MessageIdParts | None:
        """The id of the first message a reader from ``start`` gets, or for an inclusive
        ``latest`` start the last message of the topic (draining the rest of its batch)."""
        reader = client.create_reader(
            topic, start, receiver_queue_size=1000, start_message_id_inclusive=inclusive
        )
        try:
            if not reader.has_message_available():
                return None
            try:
                found = MessageIdParts.of(reader.read_next(timeout_ms).message_id())
            except pulsar.Timeout:
                return None
            if inclusive:  # a batched last entry: its remaining messages are already queued
                for _ in range(_MAX_QUEUE):
                    try:
                        found = MessageIdParts.of(reader.read_next(0).message_id())
                    except pulsar.Timeout:
                        break
            return found
        finally:
            with contextlib.suppress(pulsar.PulsarException):
                reader.close()
