"""The event model every codec decodes into and the pipeline consumes.

Data events keep the source's protobuf request: column data is never turned into Python rows on
the way to the target.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pymilvus.grpc_gen import msg_pb2, schema_pb2

from metastore import Position


@dataclass(frozen=True)
class RawRecord:
    """One record as read from a WAL channel, before decoding."""

    pchannel: str
    msg_id: bytes
    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)
    # The backend's own order of the record on its channel (Kafka offset, RocksMQ id).
    offset: int = 0
    # When the WAL took the record (Kafka's message timestamp), seconds since the epoch; 0.0
    # when the backend does not say. Only measured against (the daemon's part of the lag).
    appended_at: float = 0.0


@dataclass(frozen=True)
class Event:
    ts: int  # hybrid timestamp of the message


@dataclass(frozen=True)
class TimeTick(Event):
    """Everything on the channel with a smaller timestamp has been seen."""


@dataclass(frozen=True)
class CollectionEvent(Event):
    collection_id: int
    db_name: str
    collection_name: str


@dataclass(frozen=True)
class CreateCollection(CollectionEvent):
    schema: schema_pb2.CollectionSchema
    vchannels: tuple[str, ...]
    pchannels: tuple[str, ...]
    partition_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class DropCollection(CollectionEvent):
    pass


@dataclass(frozen=True)
class DropPartition(CollectionEvent):
    partition_name: str = ""


@dataclass(frozen=True)
class Insert(CollectionEvent):
    partition_name: str
    num_rows: int
    request: msg_pb2.InsertRequest  # its fields_data go to the target as they are
    size: int = 0  # the request's bytes as read (0: not known; see apply.body_size)


@dataclass(frozen=True)
class Delete(CollectionEvent):
    partition_name: str
    num_rows: int
    request: msg_pb2.DeleteRequest  # primary_keys (int_id or str_id)
    size: int = 0  # the request's bytes as read (0: not known; see apply.body_size)


@dataclass(frozen=True)
class Skipped(Event):
    """A record this task does not need (another collection, a message type it ignores);
    ``cause`` counts it in the task's progress (``not_selected``, ``message_type``,
    ``wal_internal``); ``collection_id`` is the collection's when the record names one."""

    reason: str = ""
    cause: str = "message_type"
    collection_id: int = 0


@dataclass(frozen=True)
class FailedRecord:
    """A record that cannot be decoded: a value, not an exception; the task fails with it."""

    position: Position
    reason: str
