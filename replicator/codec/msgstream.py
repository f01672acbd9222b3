"""Decoding Milvus 2.3-2.5 msgstream records (the payload is the request protobuf; its field 1
is ``common.MsgBase`` with the message type and timestamp)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError
from pymilvus.grpc_gen import common_pb2, msg_pb2, schema_pb2

from metastore import Position
from replicator.codec.wire import (
    WireError,
    find_bytes_field,
    find_varint_field,
    packed_varints,
    to_signed64,
)
from replicator.events import (
    CreateCollection,
    Delete,
    DropCollection,
    DropPartition,
    Event,
    FailedRecord,
    Insert,
    RawRecord,
    Skipped,
    TimeTick,
)

MSG_CREATE_COLLECTION = 100
MSG_DROP_COLLECTION = 101
MSG_DROP_PARTITION = 201
MSG_INSERT = 400
MSG_DELETE = 401
MSG_TIME_TICK = 1200

# collectionID field number in each body (all requests of msg.proto)
_COLLECTION_FIELD = {
    MSG_INSERT: 7,
    MSG_DELETE: 7,
    MSG_CREATE_COLLECTION: 6,
    MSG_DROP_COLLECTION: 5,
    MSG_DROP_PARTITION: 6,
}

# the per-row ``timestamps`` field of InsertRequest and DeleteRequest (msg.proto)
_TIMESTAMPS_FIELD = 10

Wanted = Callable[[int], bool]


def message_header(payload: bytes) -> tuple[int, int]:
    """(msg_type, timestamp) from the MsgBase in field 1 (parsed by protobuf: it is small, and
    every record of every task passes here)."""
    base = find_bytes_field(payload, 1)
    if base is None:
        raise WireError("no MsgBase")
    try:
        header = common_pb2.MsgBase.FromString(base)
    except DecodeError as exc:
        raise WireError(f"malformed MsgBase: {exc}") from None
    return header.msg_type, header.timestamp


def record_time(payload: bytes) -> tuple[int, int]:
    """(msg_type, timestamp) of a record as Milvus orders it: DML by its rows' timestamps,
    because an upsert's Insert carries ``MsgBase.timestamp`` 0 (the Delete written after it has
    the upsert's timestamp, and so do the Insert's rows). Only the rows' first timestamp is
    read, from the wire: a record of a collection no task selects is not parsed."""
    msg_type, ts = message_header(payload)
    if ts == 0 and msg_type in (MSG_INSERT, MSG_DELETE):
        packed = find_bytes_field(payload, _TIMESTAMPS_FIELD)
        if packed:
            ts = packed_varints(packed)[0]
        else:  # a single row's timestamp may be written unpacked
            ts = find_varint_field(payload, _TIMESTAMPS_FIELD) or 0
    return msg_type, ts


def decode(record: RawRecord, backend: str, wanted: Wanted) -> Event | FailedRecord:
    """Decode one record; DML bodies are parsed only for collections ``wanted`` selects."""
    try:
        msg_type, ts = record_time(record.payload)
        if msg_type == MSG_TIME_TICK:
            return TimeTick(ts=ts)
        if msg_type not in _COLLECTION_FIELD:
            return Skipped(ts=ts, reason=f"message type {msg_type}")
        collection_id = collection_of(record.payload, msg_type)
        # DML bodies are parsed only for wanted collections; DDL is rare and always decoded
        # (a new collection's id is unknown until its CreateCollection has been read).
        if msg_type in (MSG_INSERT, MSG_DELETE) and not wanted(collection_id):
            return Skipped(
                ts=ts,
                reason=f"collection {collection_id} not selected",
                cause="not_selected",
                collection_id=collection_id,
            )
        return _decode_body(msg_type, ts, collection_id, record.payload)
    except (WireError, DecodeError, ValueError) as exc:
        position = Position(backend, record.pchannel, record.msg_id, 0)
        return FailedRecord(position, f"undecodable record: {exc}")


def collection_of(payload: bytes, msg_type: int) -> int:
    """The collection id of a message whose type names its collection's field."""
    return to_signed64(find_varint_field(payload, _COLLECTION_FIELD[msg_type]) or 0)


# --- what an event takes from a body: the bodies are the same msg.proto messages in the 2.3-2.5
# format and in 2.6 (replicator.codec.streaming builds its events from these too)
def dml_fields(request: Any, size: int) -> dict[str, Any]:
    """An Insert's or Delete's fields from its ``InsertRequest``/``DeleteRequest`` body of
    ``size`` bytes."""
    return {
        "db_name": request.db_name,
        "collection_name": request.collection_name,
        "partition_name": request.partition_name,
        "num_rows": request.num_rows,
        "request": request,
        "size": size,
    }


def create_collection_fields(payload: bytes) -> dict[str, Any]:
    """A CreateCollection's fields; the schema is ``collection_schema`` where a newer Milvus
    sets it, else the ``schema`` bytes."""
    create = msg_pb2.CreateCollectionRequest.FromString(payload)
    if create.HasField("collection_schema"):
        schema = create.collection_schema
    else:
        schema = schema_pb2.CollectionSchema.FromString(create.schema)
    return {
        "db_name": create.db_name,
        "collection_name": create.collectionName or schema.name,
        "schema": schema,
        "vchannels": tuple(create.virtualChannelNames),
        "pchannels": tuple(create.physicalChannelNames),
        "partition_names": tuple(create.partitionNames),
    }


def drop_collection_fields(payload: bytes) -> dict[str, Any]:
    drop = msg_pb2.DropCollectionRequest.FromString(payload)
    return {"db_name": drop.db_name, "collection_name": drop.collectionName}


def partition_fields(request: Any) -> dict[str, Any]:
    """A Create/DropPartition's fields from its body."""
    return {
        "db_name": request.db_name,
        "collection_name": request.collection_name,
        "partition_name": request.partition_name,
    }


def _row_ts(request: Any, ts: int) -> int:
    """DML carries per-row timestamps (an upsert's Insert has base.timestamp 0)."""
    return (request.timestamps[0] if request.timestamps else ts) or ts


def _decode_body(msg_type: int, ts: int, collection_id: int, payload: bytes) -> Event:
    if msg_type == MSG_INSERT:
        insert = msg_pb2.InsertRequest.FromString(payload)
        return Insert(
            ts=_row_ts(insert, ts), collection_id=collection_id, **dml_fields(insert, len(payload))
        )
    if msg_type == MSG_DELETE:
        delete = msg_pb2.DeleteRequest.FromString(payload)
        return Delete(
            ts=_row_ts(delete, ts), collection_id=collection_id, **dml_fields(delete, len(payload))
        )
    if msg_type == MSG_CREATE_COLLECTION:
        return CreateCollection(
            ts=ts, collection_id=collection_id, **create_collection_fields(payload)
        )
    if msg_type == MSG_DROP_COLLECTION:
        return DropCollection(ts=ts, collection_id=collection_id, **drop_collection_fields(payload))
    drop_partition = msg_pb2.DropPartitionRequest.FromString(payload)
    return DropPartition(ts=ts, collection_id=collection_id, **partition_fields(drop_partition))
