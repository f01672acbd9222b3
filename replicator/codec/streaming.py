"""Decoding Milvus 2.6+ streaming records, and :func:`decode_any`, which picks the decoder per
record so a topic that crosses the upgrade from 2.5 is read without a gap.

A 2.6 record is a body plus properties (see :mod:`replicator.codec.streaming_headers` for the
keys and what in Milvus's code they were checked against). Decoding order, cheapest first:

1. the properties every record has: ``_v`` (decimal; absent or 0 is the old format, handed to
   :mod:`replicator.codec.msgstream`), ``_t`` (decimal type), ``_tt`` (base 36);
2. the optional ones: ``_vc``, ``_lc``/``_lcs``, ``_btt``, ``_wt`` (base 36), ``_tx`` and ``_bh``
   (base64 protobuf), ``_pcl``, ``_rh``;
3. ``_ch`` (cipher header): the body is encrypted; the record becomes a :class:`FailedRecord`
   that says so, because nothing downstream can be right without it;
4. the type-specific header ``_h`` (routing: an Insert's collection is in its header, so a body
   is parsed only when ``wanted`` selects the collection);
5. the body. Version-1 types (TimeTick, Insert, Delete, Create/DropCollection,
   Create/DropPartition, Import) have the milvus-proto ``msg.proto`` bodies pymilvus ships; the
   other types' bodies are ``pkg/proto/messages.proto`` messages we keep as bytes.

Facts relied on beyond those listed in ``streaming_headers``:

- ``pkg/streaming/util/message/builder.go``: ``NewInsertMessageBuilderV1`` etc. pair each V1 type
  with its ``msgpb`` body; ManualFlush, BeginTxn/CommitTxn/RollbackTxn and AlterWAL are V2 with
  empty bodies (``messages.proto`` ``*MessageBody {}``).
- milvus-proto ``proto/msg.proto``: ``CreateCollectionRequest.collection_schema = 13`` (a
  ``CollectionSchema`` message); the legacy ``schema = 8`` bytes are set only when it is not.
- seeds/mq-switch-api.zh.md: the WAL-switch announcement is a ManualFlush with header
  ``collection_id=0, flush_ts=0`` and ``_mq_switch_*`` properties.
- ``internal/coordinator/restful_mgr_routes.go`` (``broadcastAlterWALMessage``): AlterWAL is a
  cluster-level broadcast, one copy per pchannel (the control channel's pchannel gets its copy
  on ``<pchannel>_vcchan``), each marked ``_pcl``.
- Milvus's design note "TimeTick & Transaction" (milvus-io/milvus docs; the search index did not
  record its path): each transaction body has its own ``_tt`` and the committed transaction takes
  the CommitTxn's; a transaction expires at its last ``_tt`` + keepalive; an idle pchannel's
  ticks are not persisted (``_np``), so it writes none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import DecodeError
from pymilvus.grpc_gen import msg_pb2

from metastore import Position
from replicator.codec import msgstream
from replicator.codec import streaming_headers as sh
from replicator.codec.streaming_events import (
    AlterWAL,
    BeginTxn,
    CommitTxn,
    FlushAll,
    ManualFlush,
    MqSwitchAnnounced,
    RollbackTxn,
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDdl,
    StreamDelete,
    StreamDropCollection,
    StreamDropPartition,
    StreamInsert,
    StreamMeta,
    StreamTimeTick,
)
from replicator.codec.wire import WireError
from replicator.events import Event, FailedRecord, RawRecord, Skipped

Wanted = Callable[[int], bool]

SUPPORTED_VERSIONS = (1, 2)
_TIME_TICK = sh.TYPE_NUMBERS["TimeTick"]

# Written by the WAL for its own bookkeeping; nothing a replica applies.
_INTERNAL_TYPES = {
    sh.TYPE_NUMBERS["Flush"],
    sh.TYPE_NUMBERS["CreateSegment"],
}

# Kept whole (header and body bytes) for the pipeline, routed by DDL_ROUTING where possible.
_GENERIC_TYPES = (
    set(sh.DDL_ROUTING)
    | set(range(sh.TYPE_NUMBERS["RestoreRBAC"], sh.TYPE_NUMBERS["DropResourceGroup"] + 1))
    | {
        sh.TYPE_NUMBERS["SchemaChange"],
        sh.TYPE_NUMBERS["Import"],
        sh.TYPE_NUMBERS["AlterReplicateConfig"],
    }
)


def is_streaming(properties: Mapping[str, str]) -> bool:
    """True for a 2.6 record; ``_v`` absent, empty or "0" is the old msgstream format."""
    return properties.get(sh.VERSION, "") not in ("", "0")


def decode_any(record: RawRecord, backend: str, wanted: Wanted) -> Event | FailedRecord:
    """Decode one record of either format, chosen per record by its ``_v`` property."""
    if is_streaming(record.properties):
        return decode_streaming(record, backend, wanted)
    return msgstream.decode(record, backend, wanted)


def record_kind(record: RawRecord) -> int | None:
    """What a record is to a task with nothing waiting (a shared reader's ``Kind``): None for
    a time tick; the collection's id for an Insert or Delete of the 2.3-2.5 format (its body is
    not parsed); -1 for anything else, a 2.6 record's data too, and a record that cannot be
    read (whoever reads it decodes it and meets the problem)."""
    try:
        if is_streaming(record.properties):
            return None if _decimal(record.properties, sh.TYPE) == _TIME_TICK else -1
        msg_type, _ = msgstream.message_header(record.payload)
        if msg_type == msgstream.MSG_TIME_TICK:
            return None
        if msg_type in (msgstream.MSG_INSERT, msgstream.MSG_DELETE):
            return msgstream.collection_of(record.payload, msg_type)
    except WireError:
        pass
    return -1


def decode_streaming(record: RawRecord, backend: str, wanted: Wanted) -> Event | FailedRecord:
    """Decode one 2.6 record; DML bodies are parsed only for collections ``wanted`` selects."""
    try:
        meta = read_meta(record)
    except WireError as exc:
        return _failed(record, backend, 0, f"undecodable 2.6 record: {exc}")
    cipher = record.properties.get(sh.CIPHER_HEADER)
    if cipher is not None:
        return _encrypted(record, backend, meta, cipher)
    try:
        return _decode(meta, record.payload, record.properties, wanted)
    except (WireError, DecodeError, ValueError) as exc:
        reason = f"undecodable 2.6 {meta.type_name} record: {exc}"
        return _failed(record, backend, meta.time_tick, reason)


def read_meta(record: RawRecord) -> StreamMeta:
    """The properties of a 2.6 record; a :class:`PropertyError` names the key it cannot read."""
    props = record.properties
    version = _decimal(props, sh.VERSION)
    if version not in SUPPORTED_VERSIONS:
        raise sh.PropertyError(sh.VERSION, f"unsupported message version {version}")
    msg_type = _decimal(props, sh.TYPE)
    if sh.TIME_TICK not in props:
        raise sh.PropertyError(sh.TIME_TICK, "missing")
    txn = props.get(sh.TXN_CONTEXT)
    broadcast = props.get(sh.BROADCAST_HEADER)
    return StreamMeta(
        pchannel=record.pchannel,
        msg_id=record.msg_id,
        version=version,
        msg_type=msg_type,
        time_tick=sh.parse_base36(sh.TIME_TICK, props[sh.TIME_TICK]),
        vchannel=props.get(sh.VCHANNEL, ""),
        last_confirmed=props.get(sh.LAST_CONFIRMED),
        last_confirmed_is_self=sh.LAST_CONFIRMED_IS_SELF in props,
        barrier_time_tick=_base36_or_zero(props, sh.BARRIER_TIME_TICK),
        wal_term=_base36_or_zero(props, sh.WAL_TERM),
        txn=sh.parse_txn_context(sh.TXN_CONTEXT, txn) if txn is not None else None,
        broadcast=(
            sh.parse_broadcast_header(sh.BROADCAST_HEADER, broadcast)
            if broadcast is not None
            else None
        ),
        pchannel_level=sh.PCHANNEL_LEVEL in props,
        replicated=sh.REPLICATE_HEADER in props,
    )


def vchannel_pchannel(vchannel: str) -> str:
    """The pchannel a vchannel lives on: ``<pchannel>_<collectionID>v<shard>`` and the control
    channel ``<pchannel>_vcchan``; a pchannel-level copy's ``_vc`` is the pchannel itself."""
    if vchannel.endswith("_vcchan"):
        return vchannel[: -len("_vcchan")]
    head, sep, tail = vchannel.rpartition("_")
    collection, v, shard = tail.partition("v")
    if sep and v and collection.isdigit() and shard.isdigit():
        return head
    return vchannel


# --- per type ----------------------------------------------------------------------------------


def _decode(meta: StreamMeta, payload: bytes, props: Mapping[str, str], wanted: Wanted) -> Event:
    t = meta.msg_type
    ts = meta.time_tick
    name = sh.MESSAGE_TYPES.get(t)
    if name == "TimeTick":
        return StreamTimeTick(ts=ts, meta=meta)
    if name in ("Insert", "Delete"):
        header = _header(props)
        collection_id = header.int64(1)
        if not wanted(collection_id):
            return Skipped(
                ts=ts,
                reason=f"collection {collection_id} not selected",
                cause="not_selected",
                collection_id=collection_id,
            )
        if name == "Insert":
            insert = msg_pb2.InsertRequest.FromString(payload)
            return StreamInsert(
                ts=ts,
                collection_id=collection_id,
                meta=meta,
                partitions=sh.insert_partitions(header),
                **msgstream.dml_fields(insert, len(payload)),
            )
        delete = msg_pb2.DeleteRequest.FromString(payload)
        return StreamDelete(
            ts=ts,
            collection_id=collection_id,
            meta=meta,
            **msgstream.dml_fields(delete, len(payload)),
        )
    if name == "CreateCollection":
        return _create_collection(meta, _header(props), payload)
    if name == "DropCollection":
        header = _header(props)
        return StreamDropCollection(
            ts=ts,
            collection_id=header.int64(1),
            meta=meta,
            db_id=header.int64(2),
            **msgstream.drop_collection_fields(payload),
        )
    if name in _PARTITION_EVENTS:
        header = _header(props)
        body_type, event_type = _PARTITION_EVENTS[name]
        return event_type(
            ts=ts,
            collection_id=header.int64(1),
            meta=meta,
            partition_id=header.int64(2),
            **msgstream.partition_fields(body_type.FromString(payload)),
        )
    if name == "ManualFlush":
        return _manual_flush(meta, props)
    if name == "FlushAll":
        return FlushAll(ts=ts, meta=meta)
    if name == "AlterWAL":
        header = _header(props)
        wal_id = header.int64(1)
        return AlterWAL(
            ts=ts,
            meta=meta,
            target_wal=sh.WAL_NAMES.get(wal_id, str(wal_id)),
            target_wal_id=wal_id,
            config=tuple(sorted(header.string_map(2).items())),
        )
    if name in ("BeginTxn", "CommitTxn", "RollbackTxn"):
        return _txn_event(meta, props)
    if t in _INTERNAL_TYPES:
        return Skipped(ts=ts, reason=f"WAL-internal message {name}", cause="wal_internal")
    if t in _GENERIC_TYPES:
        return _generic(meta, props, payload)
    raise sh.PropertyError(sh.TYPE, f"unknown message type {t} (written by a newer Milvus?)")


_PARTITION_EVENTS: dict[str, tuple[Any, type[StreamCreatePartition | StreamDropPartition]]] = {
    "CreatePartition": (msg_pb2.CreatePartitionRequest, StreamCreatePartition),
    "DropPartition": (msg_pb2.DropPartitionRequest, StreamDropPartition),
}


def _create_collection(meta: StreamMeta, header: sh.Header, payload: bytes) -> Event:
    return StreamCreateCollection(
        ts=meta.time_tick,
        collection_id=header.int64(1),
        meta=meta,
        db_id=header.int64(3),
        partition_ids=header.int64_list(2),
        **msgstream.create_collection_fields(payload),
    )


def _manual_flush(meta: StreamMeta, props: Mapping[str, str]) -> Event:
    if props.get(sh.MQ_SWITCH_OPERATION) == "true":
        target = props.get(sh.MQ_SWITCH_TARGET_TYPE, "")
        if not target:
            raise sh.PropertyError(sh.MQ_SWITCH_TARGET_TYPE, "missing on a WAL-switch announcement")
        prefix = sh.MQ_SWITCH_CONFIG_PREFIX
        config = sorted((k[len(prefix) :], v) for k, v in props.items() if k.startswith(prefix))
        return MqSwitchAnnounced(
            ts=meta.time_tick, meta=meta, target_type=target.lower(), config=tuple(config)
        )
    header = _header(props)
    return ManualFlush(
        ts=meta.time_tick,
        meta=meta,
        collection_id=header.int64(1),
        flush_ts=header.uint64(2),
        segment_ids=header.int64_list(3),
    )


def _txn_event(meta: StreamMeta, props: Mapping[str, str]) -> Event:
    txn = meta.txn
    if txn is None:
        raise sh.PropertyError(sh.TXN_CONTEXT, f"missing on a {meta.type_name} record")
    if meta.type_name == "BeginTxn":
        # BeginTxnMessageHeader.keepalive_milliseconds = 1; the context carries it too
        keepalive = _header(props).int64(1) or txn.keepalive_ms
        return BeginTxn(ts=meta.time_tick, meta=meta, txn_id=txn.txn_id, keepalive_ms=keepalive)
    if meta.type_name == "CommitTxn":
        return CommitTxn(ts=meta.time_tick, meta=meta, txn_id=txn.txn_id)
    return RollbackTxn(ts=meta.time_tick, meta=meta, txn_id=txn.txn_id)


def _generic(meta: StreamMeta, props: Mapping[str, str], payload: bytes) -> Event:
    raw = sh.header_bytes(sh.HEADER, props.get(sh.HEADER, ""))
    header = sh.Header(sh.HEADER, raw)
    db_id_f, db_name_f, coll_id_f, coll_name_f = sh.DDL_ROUTING.get(meta.msg_type, (0, 0, 0, 0))
    if meta.type_name == "SchemaChange":
        coll_id_f = 1  # SchemaChangeMessageHeader{collection_id=1, flushed_segment_ids=2}
    return StreamDdl(
        ts=meta.time_tick,
        meta=meta,
        type_name=meta.type_name,
        db_id=header.int64(db_id_f) if db_id_f else 0,
        db_name=header.text(db_name_f) if db_name_f else "",
        collection_id=header.int64(coll_id_f) if coll_id_f else 0,
        collection_name=header.text(coll_name_f) if coll_name_f else "",
        header=raw,
        body=payload,
    )


# --- helpers -----------------------------------------------------------------------------------


def _header(props: Mapping[str, str]) -> sh.Header:
    value = props.get(sh.HEADER)
    if value is None:
        raise sh.PropertyError(sh.HEADER, "missing")
    return sh.parse_header(sh.HEADER, value)


def _decimal(props: Mapping[str, str], key: str) -> int:
    value = props.get(key)
    if value is None:
        raise sh.PropertyError(key, "missing")
    try:
        return int(value, 10)
    except ValueError:
        raise sh.PropertyError(key, f"{value!r} is not a decimal number") from None


def _base36_or_zero(props: Mapping[str, str], key: str) -> int:
    value = props.get(key)
    return 0 if value is None else sh.parse_base36(key, value)


def _failed(record: RawRecord, backend: str, ts: int, reason: str) -> FailedRecord:
    return FailedRecord(Position(backend, record.pchannel, record.msg_id, ts), reason)


def _encrypted(record: RawRecord, backend: str, meta: StreamMeta, value: str) -> FailedRecord:
    where = f"{meta.type_name} record on {meta.vchannel or record.pchannel}"
    try:
        cipher = sh.parse_cipher_header(sh.CIPHER_HEADER, value)
    except WireError as exc:
        return _failed(record, backend, meta.time_tick, f"encrypted {where}; {exc}")
    return _failed(
        record,
        backend,
        meta.time_tick,
        f"encrypted {where} (cipher header _ch: encryption zone {cipher.ez_id}, collection "
        f"{cipher.collection_id}): its payload can be read only with the source cluster's "
        "key, which this daemon does not have; replicate this collection another way or "
        "disable encryption for it",
    )
