"""Events decoded from Milvus 2.6+ streaming records.

Data and collection DDL reuse the event types of :mod:`replicator.events` (an Insert's
``request`` is still an ``msg_pb2.InsertRequest`` whose ``fields_data`` go to the target as they
are); the subclasses here add what only 2.6 records carry, in ``meta``: the vchannel, the
authoritative time tick ``_tt``, the transaction context and the broadcast header. ``ts`` of every
2.6 event is its ``_tt``, never a timestamp from the body.

Control messages without a 2.3 counterpart (transactions, manual flush, the WAL-switch
announcement, AlterWAL, partitions and the rest of the 2.6 DDL) get types of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicator.codec.streaming_headers import (
    MESSAGE_TYPES,
    BroadcastHeader,
    PartitionAssignment,
    TxnContext,
)
from replicator.events import (
    CollectionEvent,
    CreateCollection,
    Delete,
    DropCollection,
    DropPartition,
    Event,
    Insert,
    TimeTick,
)


@dataclass(frozen=True)
class StreamMeta:
    """What the properties of a 2.6 record say about it (everything but the body)."""

    pchannel: str
    msg_id: bytes  # the backend's id of this record, as the source reader reports it
    version: int  # _v
    msg_type: int  # _t
    time_tick: int  # _tt
    vchannel: str = ""  # _vc; "" on pchannel-wide messages (TimeTick)
    last_confirmed: str | None = None  # _lc as written (WAL-specific id); None with _lcs
    last_confirmed_is_self: bool = False  # _lcs: resume from this record itself
    barrier_time_tick: int = 0  # _btt
    wal_term: int = 0  # _wt
    txn: TxnContext | None = None  # _tx
    broadcast: BroadcastHeader | None = None  # _bh
    pchannel_level: bool = False  # _pcl
    replicated: bool = False  # _rh: copied from another cluster by Milvus's own replication

    @property
    def type_name(self) -> str:
        return MESSAGE_TYPES.get(self.msg_type, str(self.msg_type))


# --- data and collection DDL, as the 2.3 types plus meta ----------------------------------------


@dataclass(frozen=True, kw_only=True)
class StreamTimeTick(TimeTick):
    """Everything on ``meta.pchannel`` with ``_tt`` <= ``ts`` has been written."""

    meta: StreamMeta


@dataclass(frozen=True, kw_only=True)
class StreamInsert(Insert):
    meta: StreamMeta
    partitions: tuple[PartitionAssignment, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StreamDelete(Delete):
    meta: StreamMeta


@dataclass(frozen=True, kw_only=True)
class StreamCreateCollection(CreateCollection):
    """One copy of a broadcast CreateCollection (``meta.broadcast`` lists every copy)."""

    meta: StreamMeta
    db_id: int = 0
    partition_ids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StreamDropCollection(DropCollection):
    meta: StreamMeta
    db_id: int = 0


@dataclass(frozen=True, kw_only=True)
class StreamCreatePartition(CollectionEvent):
    meta: StreamMeta
    partition_name: str
    partition_id: int


@dataclass(frozen=True, kw_only=True)
class StreamDropPartition(DropPartition):
    meta: StreamMeta
    partition_id: int = 0


# --- transactions ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BeginTxn(Event):
    meta: StreamMeta
    txn_id: int
    keepalive_ms: int


@dataclass(frozen=True, kw_only=True)
class CommitTxn(Event):
    """The bodies of ``txn_id`` on ``meta.vchannel`` apply as one unit, at this ``ts``."""

    meta: StreamMeta
    txn_id: int


@dataclass(frozen=True, kw_only=True)
class RollbackTxn(Event):
    meta: StreamMeta
    txn_id: int


# --- flush and WAL switching -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ManualFlush(Event):
    """A flush of one collection's segments (a broadcast to its vchannels): the target flushes
    the collection once every vchannel has reached it."""

    meta: StreamMeta
    collection_id: int
    flush_ts: int
    segment_ids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FlushAll(Event):
    """A flush of every collection: a cluster-level broadcast, one ``_pcl`` copy per pchannel
    (the control channel's pchannel gets it on ``<pchannel>_vcchan``); its header and body are
    empty (messages.proto ``FlushAllMessageHeader``)."""

    meta: StreamMeta


@dataclass(frozen=True, kw_only=True)
class MqSwitchAnnounced(Event):
    """The WAL-switch announcement: a broadcast ManualFlush for "collection 0" carrying
    ``_mq_switch_*`` properties (seeds/mq-switch-api.zh.md). Never a flush."""

    meta: StreamMeta
    target_type: str  # "kafka", "pulsar", "rocksmq"
    config: tuple[tuple[str, str], ...] = ()  # _mq_switch_config_<key>=<value>, sorted


@dataclass(frozen=True, kw_only=True)
class AlterWAL(Event):
    """Released Milvus's WAL switch: after this record the pchannel continues on ``target_wal``
    from its earliest record; nothing more is appended to this backend."""

    meta: StreamMeta
    target_wal: str  # "kafka", "pulsar", "rocksmq", "woodpecker"
    target_wal_id: int  # common.WALName number
    config: tuple[tuple[str, str], ...] = ()  # AlterWALMessageHeader.config, sorted


# --- the rest of the 2.6 DDL -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StreamDdl(Event):
    """A DDL (database, alias, index, load configuration, alter/truncate collection, RBAC, ...)
    kept as its header and body bytes with the routing fields its header has (0 / "" where it
    has none). The pipeline decodes the body it applies; the codec only routes."""

    meta: StreamMeta
    type_name: str
    db_id: int = 0
    db_name: str = ""
    collection_id: int = 0
    collection_name: str = ""
    header: bytes = b""
    body: bytes = b""
