"""Decoding the 2.3-2.5 replicate channel (``<prefix>-replicate-msg``): index, load, flush and
database operations, written by the source as the public API's own request messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from pymilvus.grpc_gen import milvus_pb2

from metastore import Position
from replicator.codec.msgstream import message_header
from replicator.codec.wire import WireError
from replicator.events import Event, FailedRecord, RawRecord, Skipped

# msg_type -> (request class, MilvusService method, kind)
OPERATIONS: dict[int, tuple[Any, str, str]] = {
    300: (milvus_pb2.CreateIndexRequest, "CreateIndex", "collection"),
    302: (milvus_pb2.DropIndexRequest, "DropIndex", "collection"),
    304: (milvus_pb2.AlterIndexRequest, "AlterIndex", "collection"),
    106: (milvus_pb2.LoadCollectionRequest, "LoadCollection", "collection"),
    107: (milvus_pb2.ReleaseCollectionRequest, "ReleaseCollection", "collection"),
    205: (milvus_pb2.LoadPartitionsRequest, "LoadPartitions", "collection"),
    206: (milvus_pb2.ReleasePartitionsRequest, "ReleasePartitions", "collection"),
    402: (milvus_pb2.FlushRequest, "Flush", "collections"),
    1801: (milvus_pb2.CreateDatabaseRequest, "CreateDatabase", "database"),
    1802: (milvus_pb2.DropDatabaseRequest, "DropDatabase", "database"),
}


@dataclass(frozen=True)
class RpcEvent(Event):
    """One API call the source made, to be made on the target under the task's names."""

    method: str
    kind: str  # "collection", "collections" (Flush) or "database"
    request: Any

    @property
    def db_name(self) -> str:
        return str(self.request.db_name) or "default"

    @property
    def collections(self) -> tuple[str, ...]:
        if self.kind == "collection":
            return (self.request.collection_name,)
        if self.kind == "collections":
            return tuple(self.request.collection_names)
        return ()


def decode_replicate(record: RawRecord, backend: str) -> Event | FailedRecord:
    try:
        msg_type, ts = message_header(record.payload)
        operation = OPERATIONS.get(msg_type)
        if operation is None:
            return Skipped(ts=ts, reason=f"message type {msg_type} on the replicate channel")
        request_type, method, kind = operation
        return RpcEvent(
            ts=ts, method=method, kind=kind, request=request_type.FromString(record.payload)
        )
    except (WireError, DecodeError, ValueError) as exc:
        position = Position(backend, record.pchannel, record.msg_id, 0)
        return FailedRecord(position, f"undecodable record on the replicate channel: {exc}")
