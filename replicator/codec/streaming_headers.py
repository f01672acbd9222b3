"""Milvus 2.6+ streaming records: property keys, message types and the small protobuf headers
carried in properties, read field by field with :mod:`replicator.codec.wire`.

A 2.6 WAL record is a payload plus string properties (Kafka headers, Pulsar properties, the
RocksMQ layout's map). The keys, their encodings and the header field numbers below are our own
wire-compatible definitions; what they were checked against in Milvus's public code
(milvus-io/milvus at the commits the notes name):

- ``pkg/streaming/util/message/properties.go``: the reserved keys ``_v _t _tt _btt _wt _lc _lcs
  _vc _bh _h _tx _ch _np _pcl _rh`` (and ``_ur _tc _puc _ik``, which we carry but do not read).
- ``pkg/streaming/util/message/encoder.go``: ticks and ids are ``strconv.FormatUint/FormatInt(v,
  36)``; headers are ``base64.StdEncoding`` of the marshalled protobuf.
- ``pkg/streaming/util/message/message_type.go``: ``_t`` is the decimal MessageType number.
- ``pkg/streaming/util/message/version.go`` and ``message_impl.go``: ``_v`` absent or "0" is the
  old msgstream format (``WithOldVersion`` writes "0"); builders write "1" (bodies from
  milvus-proto's ``msg.proto``) or "2" (bodies from ``pkg/proto/messages.proto``).
- ``pkg/streaming/util/message/builder.go``: ``_h`` is always set, to the base64 of the header
  (empty string for an empty header); ``_bh`` carries ``BroadcastHeader`` and, after the split
  into one copy per vchannel, every copy keeps the whole header and gets its own ``_vc``.
- ``pkg/proto/messages.proto``: ``MessageType`` numbers; ``TxnContext{txn_id=1,
  keepalive_milliseconds=2}``; ``BroadcastHeader{broadcast_id=1 (uint64), vchannels=2,
  Resource_keys=3 (ResourceKey{domain=1, key=2, shared=3}), ack_sync_up=4}``;
  ``InsertMessageHeader{collection_id=1, partitions=2 (PartitionSegmentAssignment{partition_id=1,
  rows=2, binary_size=3, segment_assignment=4 {segment_id=1}})}``; ``DeleteMessageHeader
  {collection_id=1, rows=2}``; ``CreateCollectionMessageHeader{collection_id=1, partition_ids=2,
  db_id=3}``; ``DropCollectionMessageHeader{collection_id=1, db_id=2}``; ``Create/
  DropPartitionMessageHeader{collection_id=1, partition_id=2}``; ``ManualFlushMessageHeader
  {collection_id=1, flush_ts=2, segment_ids=3}``; ``BeginTxnMessageHeader
  {keepalive_milliseconds=1}``; ``AlterWALMessageHeader{target_wal_name=1 (common.WALName),
  config=2 (map<string,string>)}``; ``CipherHeader{ez_id=1, collection_id=2, safe_key=3,
  payload_bytes=4}``; and the DDL headers whose db/collection fields :data:`DDL_ROUTING` lists.
- milvus-proto ``proto/common.proto``: ``WALName{Unknown=0, RocksMQ=1, Pulsar=2, Kafka=3,
  WoodPecker=4, Test=999}``.
- ``pkg/streaming/walimpls/impls/kafka/message_id.go``: a Kafka message id (``_lc``) is the offset
  in base 36; ``.../kafka/wal.go``: every property is one Kafka header, value = the raw string.

proto3 packs repeated scalars, but a parser must accept both packed and unpacked encodings; the
readers below do.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from replicator.codec.wire import WireError, iter_fields, packed_varints, to_signed64

# --- property keys ---------------------------------------------------------------------------
VERSION = "_v"
TYPE = "_t"
TIME_TICK = "_tt"
BARRIER_TIME_TICK = "_btt"
WAL_TERM = "_wt"
LAST_CONFIRMED = "_lc"
LAST_CONFIRMED_IS_SELF = "_lcs"
VCHANNEL = "_vc"
HEADER = "_h"
BROADCAST_HEADER = "_bh"
TXN_CONTEXT = "_tx"
REPLICATE_HEADER = "_rh"
CIPHER_HEADER = "_ch"
NOT_PERSISTED = "_np"
PCHANNEL_LEVEL = "_pcl"

# The WAL-switch announcement (seeds/mq-switch-api.zh.md): a broadcast ManualFlush with these.
MQ_SWITCH_OPERATION = "_mq_switch_operation"
MQ_SWITCH_TARGET_TYPE = "_mq_switch_target_type"
MQ_SWITCH_CONFIG_PREFIX = "_mq_switch_config_"

# --- message types (messages.proto MessageType) -------------------------------------------------
MESSAGE_TYPES: dict[int, str] = {
    1: "TimeTick",
    2: "Insert",
    3: "Delete",
    4: "Flush",
    5: "CreateCollection",
    6: "DropCollection",
    7: "CreatePartition",
    8: "DropPartition",
    9: "ManualFlush",
    10: "CreateSegment",
    11: "Import",
    12: "SchemaChange",
    13: "AlterCollection",
    14: "AlterLoadConfig",
    15: "DropLoadConfig",
    16: "CreateDatabase",
    17: "AlterDatabase",
    18: "DropDatabase",
    19: "AlterAlias",
    20: "DropAlias",
    21: "RestoreRBAC",
    22: "AlterUser",
    23: "DropUser",
    24: "AlterRole",
    25: "DropRole",
    26: "AlterUserRole",
    27: "DropUserRole",
    28: "AlterPrivilege",
    29: "DropPrivilege",
    30: "AlterPrivilegeGroup",
    31: "DropPrivilegeGroup",
    32: "AlterResourceGroup",
    33: "DropResourceGroup",
    34: "CreateIndex",
    35: "AlterIndex",
    36: "DropIndex",
    37: "FlushAll",
    38: "TruncateCollection",
    700: "AlterWAL",
    800: "AlterReplicateConfig",
    900: "BeginTxn",
    901: "CommitTxn",
    902: "RollbackTxn",
    999: "Txn",
}
TYPE_NUMBERS: dict[str, int] = {name: number for number, name in MESSAGE_TYPES.items()}

# common.proto WALName, as the lower-case backend names our sources use
WAL_NAMES: dict[int, str] = {
    0: "unknown",
    1: "rocksmq",
    2: "pulsar",
    3: "kafka",
    4: "woodpecker",
    999: "test",
}

# Where the DDL headers keep their database and collection (messages.proto), for routing a
# broadcast DDL without decoding its body: type -> (db_id, db_name, collection_id,
# collection_name) field numbers, 0 where the header has no such field.
DDL_ROUTING: dict[int, tuple[int, int, int, int]] = {
    13: (1, 0, 2, 0),  # AlterCollection{db_id=1, collection_id=2, update_mask=3, ...}
    14: (1, 0, 2, 0),  # AlterLoadConfig{db_id=1, collection_id=2, partition_ids=3, ...}
    15: (1, 0, 2, 0),  # DropLoadConfig{db_id=1, collection_id=2}
    16: (2, 1, 0, 0),  # CreateDatabase{db_name=1, db_id=2}
    17: (2, 1, 0, 0),  # AlterDatabase{db_name=1, db_id=2}
    18: (2, 1, 0, 0),  # DropDatabase{db_name=1, db_id=2}
    19: (1, 2, 3, 4),  # AlterAlias{db_id=1, db_name=2, collection_id=3, collection_name=4, alias=5}
    20: (1, 2, 0, 0),  # DropAlias{db_id=1, db_name=2, alias=3}
    34: (1, 0, 2, 0),  # CreateIndex{db_id=1, collection_id=2, field_id=3, index_id=4, ...}
    35: (0, 0, 1, 0),  # AlterIndex{collection_id=1, index_ids=2}
    36: (0, 0, 1, 0),  # DropIndex{collection_id=1, index_ids=2}
    38: (1, 0, 2, 0),  # TruncateCollection{db_id=1, collection_id=2, segment_ids=3}
}


class PropertyError(WireError):
    """A property of a 2.6 record that cannot be read; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"property {key}: {problem}")
        self.key = key


# --- property values -------------------------------------------------------------------------


def parse_base36(key: str, value: str) -> int:
    """A tick, term or Kafka/RocksMQ id: Go's ``strconv.FormatUint/FormatInt(v, 36)``."""
    try:
        return int(value, 36)
    except ValueError:
        raise PropertyError(key, f"{value!r} is not a base-36 number") from None


def format_base36(value: int) -> str:
    """The inverse of :func:`parse_base36` (lower-case digits, a leading '-' when negative)."""
    if value < 0:
        return "-" + format_base36(-value)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        value, rest = divmod(value, 36)
        out = digits[rest] + out
        if value == 0:
            return out


def header_bytes(key: str, value: str) -> bytes:
    """The protobuf bytes of a header property (standard base64 with padding)."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PropertyError(key, "not valid base64") from None


def _fields(key: str, buf: bytes) -> list[tuple[int, int, int | bytes]]:
    try:
        return list(iter_fields(buf))
    except WireError as exc:
        raise PropertyError(key, f"malformed protobuf ({exc})") from None


def _varints(wire_type: int, value: int | bytes) -> list[int]:
    """A repeated varint field's values, packed (wire type 2) or not (wire type 0)."""
    if isinstance(value, bytes):
        return packed_varints(value)
    return [value] if wire_type == 0 else []


def _text(value: int | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else ""


def _int(value: int | bytes) -> int:
    return value if isinstance(value, int) else 0


# --- headers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TxnContext:
    """``_tx``: carried by BeginTxn, every body of the transaction and its Commit/Rollback."""

    txn_id: int
    keepalive_ms: int


@dataclass(frozen=True)
class ResourceKey:
    domain: int
    key: str
    shared: bool


@dataclass(frozen=True)
class BroadcastHeader:
    """``_bh``: the same on every copy of one broadcast; ``vchannels`` lists every copy."""

    broadcast_id: int
    vchannels: tuple[str, ...]
    resource_keys: tuple[ResourceKey, ...] = ()
    ack_sync_up: bool = False


@dataclass(frozen=True)
class CipherHeader:
    """``_ch``: the payload is encrypted with a key of the source's encryption zone."""

    ez_id: int
    collection_id: int
    payload_bytes: int


@dataclass(frozen=True)
class PartitionAssignment:
    partition_id: int
    rows: int
    binary_size: int
    segment_id: int


def parse_txn_context(key: str, value: str) -> TxnContext:
    txn_id = keepalive = 0
    for number, _wire, field in _fields(key, header_bytes(key, value)):
        if number == 1:
            txn_id = to_signed64(_int(field))
        elif number == 2:
            keepalive = to_signed64(_int(field))
    if txn_id == 0:
        raise PropertyError(key, "transaction context without a txn_id")
    return TxnContext(txn_id=txn_id, keepalive_ms=keepalive)


def _resource_key(key: str, buf: bytes) -> ResourceKey:
    domain, name, shared = 0, "", False
    for number, _wire, field in _fields(key, buf):
        if number == 1:
            domain = _int(field)
        elif number == 2:
            name = _text(field)
        elif number == 3:
            shared = bool(field)
    return ResourceKey(domain=domain, key=name, shared=shared)


def parse_broadcast_header(key: str, value: str) -> BroadcastHeader:
    broadcast_id = 0
    vchannels: list[str] = []
    keys: list[ResourceKey] = []
    ack_sync_up = False
    for number, _wire, field in _fields(key, header_bytes(key, value)):
        if number == 1:
            broadcast_id = _int(field)
        elif number == 2:
            vchannels.append(_text(field))
        elif number == 3 and isinstance(field, bytes):
            keys.append(_resource_key(key, field))
        elif number == 4:
            ack_sync_up = bool(field)
    if not vchannels:
        raise PropertyError(key, "broadcast header without vchannels")
    return BroadcastHeader(broadcast_id, tuple(vchannels), tuple(keys), ack_sync_up)


def parse_cipher_header(key: str, value: str) -> CipherHeader:
    ez_id = collection_id = payload_bytes = 0
    for number, _wire, field in _fields(key, header_bytes(key, value)):
        if number == 1:
            ez_id = to_signed64(_int(field))
        elif number == 2:
            collection_id = to_signed64(_int(field))
        elif number == 4:
            payload_bytes = to_signed64(_int(field))
    return CipherHeader(ez_id=ez_id, collection_id=collection_id, payload_bytes=payload_bytes)


class Header:
    """A type-specific header (``_h``), read on demand by field number."""

    def __init__(self, key: str, buf: bytes) -> None:
        self._key = key
        self._fields = _fields(key, buf)

    def uint64(self, number: int) -> int:
        """The last value of a varint field (protobuf's "last one wins"), unsigned."""
        found = 0
        for field_number, _wire, value in self._fields:
            if field_number == number and isinstance(value, int):
                found = value
        return found

    def int64(self, number: int) -> int:
        """An int64 (or enum) field: the varint read as two's complement."""
        return to_signed64(self.uint64(number))

    def text(self, number: int) -> str:
        found = ""
        for field_number, _wire, value in self._fields:
            if field_number == number and isinstance(value, bytes):
                found = self._decode_text(number, value)
        return found

    def int64_list(self, number: int) -> tuple[int, ...]:
        values: list[int] = []
        for field_number, wire, value in self._fields:
            if field_number == number:
                try:
                    values += _varints(wire, value)
                except WireError as exc:
                    raise PropertyError(self._key, f"field {number}: {exc}") from None
        return tuple(to_signed64(v) for v in values)

    def messages(self, number: int) -> list[Header]:
        return [
            Header(self._key, value)
            for field_number, _wire, value in self._fields
            if field_number == number and isinstance(value, bytes)
        ]

    def string_map(self, number: int) -> dict[str, str]:
        """A ``map<string, string>``: repeated entries {key=1, value=2}."""
        return {entry.text(1): entry.text(2) for entry in self.messages(number)}

    def _decode_text(self, number: int, value: bytes) -> str:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise PropertyError(self._key, f"field {number} is not UTF-8 text") from None


def parse_header(key: str, value: str) -> Header:
    return Header(key, header_bytes(key, value))


def insert_partitions(header: Header) -> tuple[PartitionAssignment, ...]:
    """InsertMessageHeader.partitions."""
    assignments = []
    for partition in header.messages(2):
        segments = partition.messages(4)
        assignments.append(
            PartitionAssignment(
                partition_id=partition.int64(1),
                rows=partition.uint64(2),
                binary_size=partition.uint64(3),
                segment_id=segments[-1].int64(1) if segments else 0,
            )
        )
    return tuple(assignments)
