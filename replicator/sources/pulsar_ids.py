"""Pulsar message ids: their parts, their serialized form and their order-preserving offsets.

Positions and offsets
---------------------
A Pulsar message id is ``(ledger_id, entry_id, batch_index)`` (+ partition, always -1 for
Milvus's non-partitioned topics). Within a topic, ids increase in the order of the messages:
ledgers of one topic get increasing ids, entries increase within a ledger, and the messages of
a batched entry have batch indexes 0, 1, ... while a non-batched message has batch index -1.
The C++ client (under pulsar-client) orders ids the same way, lexicographically, -1 first.

``offset`` is an exact, order-preserving encoding of that triple as one non-negative int::

    offset = (ledger_id + 1) << 96 | (entry_id + 1) << 32 | (batch_index + 1)

(64, 64 and 32 bits; the +1 maps the "-1 = none" values to 0, so ``MessageId.earliest`` =
(-1, -1, -1) is offset 0). It is a pure function of the id: equal across restarts and across
readers, and decodable (``MessageIdParts.from_offset``). It is *not* dense (the next record's
offset is not "this + 1") and it does not fit in 64 bits: keep it as a Python int or a decimal
string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replicator.codec.wire import WireError, encode_varint, iter_fields, to_signed64

_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_ENTRY_SHIFT = 32
_LEDGER_SHIFT = 96
_ENTRY_MASK = (1 << 64) - 1
_BATCH_MASK = (1 << 32) - 1


@dataclass(frozen=True, order=True)
class MessageIdParts:
    """The fields of a Pulsar ``MessageIdData`` that place a message in its topic.

    Instances order like the C++ client's ``MessageId`` (ledger, entry, batch index); partition
    and batch size do not take part in comparisons.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = field(default=-1, compare=False)
    batch_size: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        for name, value, high in (
            ("ledger_id", self.ledger_id, _INT64_MAX),
            ("entry_id", self.entry_id, _INT64_MAX),
            ("batch_index", self.batch_index, _INT32_MAX),
            ("partition", self.partition, _INT32_MAX),
        ):
            if not -1 <= value <= high:
                raise ValueError(f"Pulsar message id: {name} {value} out of range [-1, {high}]")
        if not 0 <= self.batch_size <= _INT32_MAX:
            raise ValueError(f"Pulsar message id: batch_size {self.batch_size} out of range")

    # -- offset ------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        """Order-preserving integer of (ledger, entry, batch index); see the module doc."""
        return (
            (self.ledger_id + 1) << _LEDGER_SHIFT
            | (self.entry_id + 1) << _ENTRY_SHIFT
            | (self.batch_index + 1)
        )

    @classmethod
    def from_offset(cls, offset: int) -> MessageIdParts:
        if offset < 0 or offset >> _LEDGER_SHIFT > _INT64_MAX + 1:
            raise ValueError(f"not a Pulsar offset: {offset}")
        return cls(
            ledger_id=(offset >> _LEDGER_SHIFT) - 1,
            entry_id=((offset >> _ENTRY_SHIFT) & _ENTRY_MASK) - 1,
            batch_index=(offset & _BATCH_MASK) - 1,
        )

    # -- bytes -------------------------------------------------------------------------------
    def serialize(self) -> bytes:
        """``MessageIdData`` bytes, field for field what the C++ client's
        ``MessageId.serialize()`` writes (defaults -1 / 0 are left out)."""
        out = bytearray()
        _put_varint_field(out, 1, self.ledger_id)
        _put_varint_field(out, 2, self.entry_id)
        if self.partition != -1:
            _put_varint_field(out, 3, self.partition)
        if self.batch_index != -1:
            _put_varint_field(out, 4, self.batch_index)
        if self.batch_size != 0:
            _put_varint_field(out, 6, self.batch_size)
        return bytes(out)

    @classmethod
    def deserialize(cls, data: bytes) -> MessageIdParts:
        """Parse ``MessageIdData`` bytes as written by any Pulsar client (the Go client used by
        Milvus writes partition, batch index and batch size explicitly; the C++ client leaves
        defaults out). Chunk and ack-set fields are skipped. ``ValueError`` when the bytes are
        not a message id (for instance an 8-byte Kafka offset)."""
        values: dict[int, int] = {}
        try:
            for number, wire_type, value in iter_fields(bytes(data)):
                if number in (1, 2, 3, 4, 6):
                    if wire_type != 0 or not isinstance(value, int):
                        raise WireError(f"field {number} has wire type {wire_type}")
                    values[number] = to_signed64(value)
        except WireError as exc:
            raise ValueError(f"not a Pulsar message id ({len(data)} bytes): {exc}") from exc
        if 1 not in values or 2 not in values:
            raise ValueError(
                f"not a Pulsar message id ({len(data)} bytes): ledgerId and entryId are required"
            )
        return cls(
            ledger_id=values[1],
            entry_id=values[2],
            partition=values.get(3, -1),
            batch_index=values.get(4, -1),
            batch_size=values.get(6, 0),
        )

    @classmethod
    def of(cls, message_id: Any) -> MessageIdParts:
        """The parts of a pulsar-client ``MessageId`` (``pulsar.MessageId`` or
        ``_pulsar.MessageId``, as returned by ``Message.message_id()``)."""
        return cls(
            ledger_id=int(message_id.ledger_id()),
            entry_id=int(message_id.entry_id()),
            batch_index=int(message_id.batch_index()),
            partition=int(message_id.partition()),
        )

    def __str__(self) -> str:
        return f"({self.ledger_id}:{self.entry_id}:{self.batch_index})"


EARLIEST = MessageIdParts(-1, -1, -1)
LATEST = MessageIdParts(_INT64_MAX, _INT64_MAX, -1)


def _put_varint_field(out: bytearray, number: int, value: int) -> None:
    out.extend(encode_varint(number << 3))
    # negative int32/int64: 10-byte two's complement
    out.extend(encode_varint(value & ((1 << 64) - 1)))


def offset_of_msg_id(msg_id: bytes) -> int:
    """The offset (see the module doc) of a serialized message id, e.g. a ``Position.msg_id``
    or a collection's start position from Milvus's etcd."""
    return MessageIdParts.deserialize(msg_id).offset


def is_after(candidate: MessageIdParts, start: MessageIdParts | None) -> bool:
    """Whether a record with id ``candidate`` belongs to a read that starts after ``start``
    (None: from the beginning). ``LATEST`` as a start means "what is published from now on"."""
    if start is None or start in (EARLIEST, LATEST):
        return True
    return candidate > start


def msg_id_before(msg_id: bytes) -> bytes:
    """A message id X such that reading "strictly after X" starts *at* ``msg_id``.

    For a Milvus start position (the id of the CreateCollection message) this gives the position
    that makes the reader return that message itself. (L, E, b>0) gives (L, E, b-1); the first or
    only message of an entry gives (L, E-1, 2**31-1), which both the broker (it sends entry E-1
    again) and the client (it drops every message of entry E-1) treat as "after all of E-1".
    """
    parts = MessageIdParts.deserialize(msg_id)
    if parts.ledger_id < 0 or parts.entry_id < 0 or parts == LATEST:
        raise ValueError(f"no message precedes {parts}: not the id of a message")
    if parts.batch_index > 0:
        before = MessageIdParts(parts.ledger_id, parts.entry_id, parts.batch_index - 1)
    else:
        before = MessageIdParts(parts.ledger_id, parts.entry_id - 1, _INT32_MAX)
    return before.serialize()


__all__ = [
    "EARLIEST",
    "LATEST",
    "MessageIdParts",
    "is_after",
    "msg_id_before",
    "offset_of_msg_id",
]
