"""A Milvus 2.6 WAL writer for tests: produces streaming records into Kafka (the session's mock
cluster) the way a 2.6 streaming node does, since no 2.6 server runs here.

What it writes, per shared/MILVUS-WIRE.md and Milvus's code (the module docstrings of
replicator/codec/streaming*.py name the files):

- one Kafka record per message: topic = pchannel, partition 0, value = body, every property a
  header whose value is the raw string (``pkg/streaming/walimpls/impls/kafka/wal.go``);
- properties ``_v`` (1 for msg.proto bodies, 2 for messages.proto ones), ``_t`` (decimal), ``_tt``
  and ``_wt`` (base 36), ``_h`` (base64 of the header, "" when empty), ``_vc`` (absent on
  TimeTick), ``_lc`` (the base-36 offset of the BeginTxn of the first transaction still open on
  the pchannel) or, with none open, ``_lcs`` (resume here): see :meth:`StreamingWriter.append`;
- bodies: pymilvus's ``msg_pb2`` requests for the version-1 types (InsertRequest with real column
  data, DeleteRequest, CreateCollectionRequest with ``collection_schema``, ...), empty bodies for
  the version-2 control messages; headers from tests/harness/streaming_protos.py;
- time ticks: every message takes a tick from :class:`Tso`; callers may take ticks first and
  write in another order, which is how concurrent appends leave ``_tt`` out of order within a
  pchannel; :meth:`StreamingWriter.time_tick` writes the TimeTick that releases them;
- broadcast: one copy per vchannel of ``_bh.vchannels``, each on its vchannel's pchannel with its
  own ``_vc``, ``_tt`` and offset, all with the same ``_bh`` (same ``broadcast_id``);
- transactions: BeginTxn, bodies and CommitTxn/RollbackTxn on one vchannel, all carrying ``_tx``;
  an upsert is a transaction of an Insert and a Delete of the same keys (2.6's proxy appends
  both for one vchannel through ``AppendMessages``, which makes them one transaction);
- the WAL-switch announcement (ManualFlush of collection 0 with ``_mq_switch_*``) and AlterWAL
  (a cluster-level broadcast, one ``_pcl`` copy per pchannel).
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import Producer
from pymilvus.grpc_gen import common_pb2, msg_pb2, schema_pb2

from harness.streaming_protos import WAL_NAME, header
from replicator.codec import streaming_headers as sh
from replicator.codec.streaming import vchannel_pchannel
from replicator.events import RawRecord
from replicator.sources.kafka import encode_offset

LOGICAL_BITS = 18
VECTOR_DIM = 2


class Tso:
    """Hybrid timestamps (physical milliseconds << 18 | logical), strictly increasing and,
    unless started at a given time, following the clock (ticks then say how old data is)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._follow_clock = start_ms is None
        physical = int(time.time() * 1000) if start_ms is None else start_ms
        self._last = physical << LOGICAL_BITS

    def next(self) -> int:
        now = int(time.time() * 1000) << LOGICAL_BITS if self._follow_clock else 0
        self._last = max(self._last + 1, now)
        return self._last


@dataclass(frozen=True)
class Written:
    """One record as produced: where it went and exactly what it carried."""

    pchannel: str
    offset: int
    payload: bytes
    properties: dict[str, str]

    @property
    def time_tick(self) -> int:
        return sh.parse_base36(sh.TIME_TICK, self.properties[sh.TIME_TICK])

    def raw_record(self) -> RawRecord:
        """The record as replicator/sources/kafka.py reports it."""
        return RawRecord(
            self.pchannel,
            encode_offset(self.offset),
            self.payload,
            dict(self.properties),
            offset=self.offset,
        )


@dataclass
class Txn:
    vchannel: str
    txn_id: int
    keepalive_ms: int
    begin_offset: int = -1
    records: list[Written] = field(default_factory=list)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def row_columns(
    pks: Sequence[int], dim: int = VECTOR_DIM, tag: str = "row"
) -> list[schema_pb2.FieldData]:
    """Columns for ``pks``: id (Int64, field 100), vector (FloatVector, 101) = pk repeated,
    tag (VarChar, 102) = "<tag>-<pk>"."""
    pk = schema_pb2.FieldData(field_name="id", field_id=100, type=schema_pb2.Int64)
    pk.scalars.long_data.data.extend(pks)
    vec = schema_pb2.FieldData(field_name="vector", field_id=101, type=schema_pb2.FloatVector)
    vec.vectors.dim = dim
    vec.vectors.float_vector.data.extend(float(p) for p in pks for _ in range(dim))
    column = schema_pb2.FieldData(field_name="tag", field_id=102, type=schema_pb2.VarChar)
    column.scalars.string_data.data.extend(f"{tag}-{p}" for p in pks)
    return [pk, vec, column]


def collection_schema(name: str, dim: int = VECTOR_DIM) -> schema_pb2.CollectionSchema:
    """id (Int64 key, field 100), vector (FloatVector, 101), tag (VarChar(64), 102)."""
    schema = schema_pb2.CollectionSchema(name=name)
    schema.fields.add(fieldID=100, name="id", data_type=schema_pb2.Int64, is_primary_key=True)
    vec = schema.fields.add(fieldID=101, name="vector", data_type=schema_pb2.FloatVector)
    vec.type_params.add(key="dim", value=str(dim))
    tag = schema.fields.add(fieldID=102, name="tag", data_type=schema_pb2.VarChar)
    tag.type_params.add(key="max_length", value="64")
    return schema


class Sink(Protocol):
    """Where records of a pchannel go: ``produce`` returns the record's offset or id."""

    def produce(self, topic: str, payload: bytes, properties: dict[str, str]) -> int: ...


class KafkaSink:
    """Another Kafka cluster (a source moved to Kafka B)."""

    def __init__(self, bootstrap: str) -> None:
        self._writer = StreamingWriter(bootstrap)

    def produce(self, topic: str, payload: bytes, properties: dict[str, str]) -> int:
        return self._writer._produce(topic, payload, properties)

    def close(self) -> None:
        self._writer.close()


class StreamingWriter:
    """Writes 2.6 records for one source cluster to a Kafka bootstrap address.

    With ``bootstrap=None`` nothing is produced: records get per-topic offsets from 0 and stay
    in :attr:`written` (the same bytes, for unit tests of the codec that need no broker).
    """

    def __init__(
        self,
        bootstrap: str | None,
        *,
        wal_term: int = 1,
        start_ms: int | None = None,
        client: dict[str, str] | None = None,
    ) -> None:
        """``client``: more librdkafka settings (a broker behind TLS or SASL)."""
        self._producer = (
            None
            if bootstrap is None
            else Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **(client or {})})
        )
        self._dry_offsets: dict[str, int] = {}
        # pchannels moved to another WAL (switch_to): where their records go now
        self._moved: dict[str, Sink] = {}
        self.tso = Tso(start_ms)
        self.wal_term = wal_term
        self._broadcast_ids = itertools.count(7001)
        self._txn_ids = itertools.count(9001)
        self._open_txns: dict[str, list[Txn]] = {}  # per pchannel: begun, not ended
        self.written: list[Written] = []

    # --- the record ----------------------------------------------------------------------------

    def append(
        self,
        pchannel: str,
        msg_type: str,
        *,
        header_bytes: bytes = b"",
        body: bytes = b"",
        version: int,
        vchannel: str = "",
        tt: int | None = None,
        txn: Txn | None = None,
        broadcast: bytes | None = None,
        extra: dict[str, str] | None = None,
    ) -> Written:
        """Produce one record and wait for its offset."""
        tick = self.tso.next() if tt is None else tt
        props = {
            sh.VERSION: str(version),
            sh.TYPE: str(sh.TYPE_NUMBERS[msg_type]),
            sh.TIME_TICK: sh.format_base36(tick),
            sh.WAL_TERM: sh.format_base36(self.wal_term),
            sh.HEADER: _b64(header_bytes),
        }
        if vchannel:
            props[sh.VCHANNEL] = vchannel
        if txn is not None:
            ctx = header("TxnContext", txn_id=txn.txn_id, keepalive_milliseconds=txn.keepalive_ms)
            props[sh.TXN_CONTEXT] = _b64(ctx)
        confirmed = self._last_confirmed(pchannel, tick)
        if confirmed is not None:
            props[sh.LAST_CONFIRMED] = sh.format_base36(confirmed)
        else:
            props[sh.LAST_CONFIRMED_IS_SELF] = ""
        if broadcast is not None:
            props[sh.BROADCAST_HEADER] = _b64(broadcast)
        props.update(extra or {})
        offset = self._produce(pchannel, body, props)
        record = Written(pchannel=pchannel, offset=offset, payload=body, properties=props)
        self.written.append(record)
        if txn is not None:
            txn.records.append(record)
        return record

    def _last_confirmed(self, pchannel: str, tick: int) -> int | None:
        """Where a reader resumes so that nothing after this record is lost, as Milvus keeps it:
        the time-tick interceptor stamps every message with its ack manager's last-confirmed id
        (``WithLastConfirmed(acker.LastConfirmedMessageID())``), which never passes a message of
        a transaction that is not committed, rolled back or expired
        (``interceptors/timetick/ack/last_confirmed.go``; ``txn/session.go``: expired once the
        tick reaches the last message's tick + keepalive). Milvus's own id lags a little more
        (in-flight appends); the BeginTxn itself, or this record (None) with none open, is the
        latest id that keeps that promise."""
        begins = [
            txn.begin_offset
            for txn in self._open_txns.get(pchannel, [])
            if txn.keepalive_ms <= 0  # kept alive for good
            or tick < txn.records[-1].time_tick + (txn.keepalive_ms << LOGICAL_BITS)
        ]
        return min(begins, default=None)

    def repeat(self, record: Written) -> Written:
        """The same message appended again (a retried append): same body and properties, so
        the same ``_tt``, at a new offset."""
        offset = self._produce(record.pchannel, record.payload, dict(record.properties))
        again = Written(record.pchannel, offset, record.payload, dict(record.properties))
        self.written.append(again)
        return again

    def switch_to(self, pchannels: Iterable[str], sink: Sink) -> None:
        """From now on, records of ``pchannels`` go to ``sink`` (the WAL the source switched
        to); the others stay where they are."""
        for pchannel in pchannels:
            self._moved[pchannel] = sink

    def _produce(self, topic: str, value: bytes, props: dict[str, str]) -> int:
        moved = self._moved.get(topic)
        if moved is not None:
            return moved.produce(topic, value, props)
        if self._producer is None:
            offset = self._dry_offsets.get(topic, 0)
            self._dry_offsets[topic] = offset + 1
            return offset
        delivered: dict[str, object] = {}

        def on_delivery(err: object, msg: object) -> None:
            delivered["err"] = err
            delivered["offset"] = msg.offset()  # type: ignore[attr-defined]

        self._producer.produce(
            topic,
            value=value,
            partition=0,
            headers=[(key, val.encode("utf-8")) for key, val in props.items()],
            on_delivery=on_delivery,
        )
        if self._producer.flush(30) != 0 or delivered.get("err") is not None:
            raise RuntimeError(f"produce to {topic} failed: {delivered.get('err')}")
        return int(delivered["offset"])  # type: ignore[call-overload]

    def broadcast(
        self,
        msg_type: str,
        vchannels: Sequence[str],
        *,
        header_bytes: bytes,
        body: bytes = b"",
        version: int,
        pchannel_level: bool = False,
        extra: dict[str, str] | None = None,
        resource_keys: Iterable[dict[str, object]] = (),
        broadcast_id: int | None = None,
        only: Iterable[str] | None = None,
    ) -> list[Written]:
        """One copy per vchannel, each with its own tick, all with the same broadcast header.
        ``only`` writes just the copies of those vchannels (the rest can be written later with
        the same ``broadcast_id``: copies reach slow channels late)."""
        bh = header(
            "BroadcastHeader",
            broadcast_id=next(self._broadcast_ids) if broadcast_id is None else broadcast_id,
            vchannels=list(vchannels),
            resource_keys=list(resource_keys),
        )
        chosen = set(vchannels if only is None else only)
        more = dict(extra or {})
        if pchannel_level:
            more[sh.PCHANNEL_LEVEL] = ""
        return [
            self.append(
                vchannel_pchannel(vchannel),
                msg_type,
                header_bytes=header_bytes,
                body=body,
                version=version,
                vchannel=vchannel,
                broadcast=bh,
                extra=more,
            )
            for vchannel in vchannels
            if vchannel in chosen
        ]

    # --- messages ------------------------------------------------------------------------------

    def time_tick(self, pchannel: str, tt: int | None = None) -> Written:
        """A persisted TimeTick: everything on ``pchannel`` with ``_tt`` <= its tick is written."""
        tick = self.tso.next() if tt is None else tt
        body = msg_pb2.TimeTickMsg(
            base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=tick, sourceID=1)
        )
        return self.append(pchannel, "TimeTick", body=body.SerializeToString(), version=1, tt=tick)

    def create_collection(
        self,
        collection_id: int,
        name: str,
        vchannels: Sequence[str],
        *,
        partition_ids: Sequence[int] = (),
        partition_names: Sequence[str] = ("_default",),
        db_id: int = 1,
        db_name: str = "default",
        consistency_level: int = common_pb2.ConsistencyLevel.Value("Bounded"),
        properties: Sequence[tuple[str, str]] = (),
        schema: schema_pb2.CollectionSchema | None = None,
    ) -> list[Written]:
        """The broadcast copies, one per vchannel (include the control channel
        ``<pchannel>_vcchan`` as Milvus does); ``schema`` defaults to :func:`collection_schema`.

        As 2.6 writes it: the proxy appends the consistency level to the request's properties
        as a decimal number (proxy/task.go ``appendConsistecyLevel``), and rootcoord's
        createCollectionTask sets the schema's properties to the request's
        (``t.body.CollectionSchema.Properties = t.Req.GetProperties()``): the message has no
        consistency field of its own."""
        data_channels = [v for v in vchannels if not v.endswith("_vcchan")]
        sent = schema_pb2.CollectionSchema()
        sent.CopyFrom(collection_schema(name) if schema is None else schema)
        for key, value in [*properties, ("consistency_level", str(consistency_level))]:
            sent.properties.add(key=key, value=value)
        body = msg_pb2.CreateCollectionRequest(
            base=common_pb2.MsgBase(msg_type=common_pb2.CreateCollection),
            db_name=db_name,
            collectionName=name,
            dbID=db_id,
            collectionID=collection_id,
            virtualChannelNames=data_channels,
            physicalChannelNames=[vchannel_pchannel(v) for v in data_channels],
            partitionIDs=list(partition_ids),
            partitionNames=list(partition_names),
            collection_schema=sent,
        )
        head = header(
            "CreateCollectionMessageHeader",
            collection_id=collection_id,
            partition_ids=list(partition_ids),
            db_id=db_id,
        )
        return self.broadcast(
            "CreateCollection",
            vchannels,
            header_bytes=head,
            body=body.SerializeToString(),
            version=1,
            resource_keys=[{"domain": 2, "key": f"{db_name}:{name}"}],
        )

    def drop_collection(
        self, collection_id: int, name: str, vchannels: Sequence[str], *, db_name: str = "default"
    ) -> list[Written]:
        body = msg_pb2.DropCollectionRequest(
            base=common_pb2.MsgBase(msg_type=common_pb2.DropCollection),
            db_name=db_name,
            collectionName=name,
            collectionID=collection_id,
        )
        head = header("DropCollectionMessageHeader", collection_id=collection_id, db_id=1)
        return self.broadcast(
            "DropCollection",
            vchannels,
            header_bytes=head,
            body=body.SerializeToString(),
            version=1,
        )

    def partition_ddl(
        self,
        msg_type: str,
        collection_id: int,
        collection_name: str,
        partition_id: int,
        partition_name: str,
        vchannels: Sequence[str],
    ) -> list[Written]:
        """CreatePartition or DropPartition, broadcast to the collection's vchannels."""
        request = (
            msg_pb2.CreatePartitionRequest
            if msg_type == "CreatePartition"
            else msg_pb2.DropPartitionRequest
        )
        body = request(
            base=common_pb2.MsgBase(msg_type=getattr(common_pb2, msg_type)),
            db_name="default",
            collection_name=collection_name,
            partition_name=partition_name,
            collectionID=collection_id,
            partitionID=partition_id,
        )
        head = header(
            "PartitionMessageHeader", collection_id=collection_id, partition_id=partition_id
        )
        return self.broadcast(
            msg_type, vchannels, header_bytes=head, body=body.SerializeToString(), version=1
        )

    def insert(
        self,
        vchannel: str,
        collection_id: int,
        pks: Sequence[int],
        *,
        collection_name: str = "",
        partition_id: int = 1,
        partition_name: str = "_default",
        segment_id: int = 1,
        tt: int | None = None,
        txn: Txn | None = None,
        cipher: tuple[int, bytes] | None = None,
        tag: str = "row",
        dim: int = VECTOR_DIM,
        columns: Sequence[schema_pb2.FieldData] | None = None,
        row_ids: Sequence[int] | None = None,
    ) -> Written:
        """An Insert of ``pks`` with real columns (:func:`row_columns`, or ``columns`` of
        another schema: harness/stream_columns.py); ``cipher=(ez_id, key)`` encrypts the body
        (XOR with the key, enough to make it unreadable) and adds ``_ch``. ``row_ids``: the
        proxy's row ids (default: the keys, which must then be integers)."""
        tick = self.tso.next() if tt is None else tt
        body = msg_pb2.InsertRequest(
            base=common_pb2.MsgBase(msg_type=common_pb2.Insert, timestamp=tick),
            shardName=vchannel,
            db_name="default",
            collection_name=collection_name,
            partition_name=partition_name,
            collectionID=collection_id,
            partitionID=partition_id,
            segmentID=segment_id,
            rowIDs=list(pks if row_ids is None else row_ids),
            timestamps=[tick] * len(pks),
            num_rows=len(pks),
            version=msg_pb2.ColumnBased,
            fields_data=row_columns(pks, dim=dim, tag=tag) if columns is None else columns,
        )
        payload = body.SerializeToString()
        head = header(
            "InsertMessageHeader",
            collection_id=collection_id,
            partitions=[
                {
                    "partition_id": partition_id,
                    "rows": len(pks),
                    "binary_size": len(payload),
                    "segment_assignment": {"segment_id": segment_id},
                }
            ],
        )
        extra: dict[str, str] = {}
        if cipher is not None:
            ez_id, key = cipher
            extra[sh.CIPHER_HEADER] = _b64(
                header(
                    "CipherHeader",
                    ez_id=ez_id,
                    collection_id=collection_id,
                    safe_key=b"wrapped-" + key,
                    payload_bytes=len(payload),
                )
            )
            payload = bytes(b ^ key[i % len(key)] for i, b in enumerate(payload))
        return self.append(
            vchannel_pchannel(vchannel),
            "Insert",
            header_bytes=head,
            body=payload,
            version=1,
            vchannel=vchannel,
            tt=tick,
            txn=txn,
            extra=extra,
        )

    def delete(
        self,
        vchannel: str,
        collection_id: int,
        pks: Sequence[int] | Sequence[str],
        *,
        collection_name: str = "",
        partition_id: int = -1,
        partition_name: str = "",
        tt: int | None = None,
        txn: Txn | None = None,
    ) -> Written:
        """A Delete of ``pks`` (integers or strings); ``partition_id`` -1: every partition."""
        tick = self.tso.next() if tt is None else tt
        body = msg_pb2.DeleteRequest(
            base=common_pb2.MsgBase(msg_type=common_pb2.Delete, timestamp=tick),
            shardName=vchannel,
            db_name="default",
            collection_name=collection_name,
            collectionID=collection_id,
            partitionID=partition_id,
            partition_name=partition_name,
            timestamps=[tick] * len(pks),
            num_rows=len(pks),
        )
        if pks and isinstance(pks[0], str):
            body.primary_keys.str_id.data.extend(pks)  # type: ignore[arg-type]
        else:
            body.primary_keys.int_id.data.extend(pks)  # type: ignore[arg-type]
        head = header("DeleteMessageHeader", collection_id=collection_id, rows=len(pks))
        return self.append(
            vchannel_pchannel(vchannel),
            "Delete",
            header_bytes=head,
            body=body.SerializeToString(),
            version=1,
            vchannel=vchannel,
            tt=tick,
            txn=txn,
        )

    def begin_txn(self, vchannel: str, keepalive_ms: int = 10_000) -> Txn:
        txn = Txn(vchannel=vchannel, txn_id=next(self._txn_ids), keepalive_ms=keepalive_ms)
        begin = self.append(
            vchannel_pchannel(vchannel),
            "BeginTxn",
            header_bytes=header("BeginTxnMessageHeader", keepalive_milliseconds=keepalive_ms),
            version=2,
            vchannel=vchannel,
            txn=txn,
        )
        txn.begin_offset = begin.offset
        self._open_txns.setdefault(begin.pchannel, []).append(txn)
        return txn

    def end_txn(self, txn: Txn, *, commit: bool = True) -> Written:
        """CommitTxn (the bodies apply, at its tick) or RollbackTxn (they are dropped)."""
        end = self.append(
            vchannel_pchannel(txn.vchannel),
            "CommitTxn" if commit else "RollbackTxn",
            version=2,
            vchannel=txn.vchannel,
            txn=txn,
        )
        opened = self._open_txns.get(end.pchannel, [])
        opened[:] = [other for other in opened if other is not txn]
        return end

    def upsert(
        self,
        vchannel: str,
        collection_id: int,
        pks: Sequence[int],
        *,
        collection_name: str = "",
        tag: str = "row",
        columns: Sequence[schema_pb2.FieldData] | None = None,
    ) -> Txn:
        """An upsert as 2.6 writes it: one transaction with the Insert and the Delete."""
        txn = self.begin_txn(vchannel)
        self.insert(
            vchannel,
            collection_id,
            pks,
            collection_name=collection_name,
            txn=txn,
            tag=tag,
            columns=columns,
        )
        self.delete(vchannel, collection_id, pks, collection_name=collection_name, txn=txn)
        self.end_txn(txn)
        return txn

    def manual_flush(
        self, collection_id: int, vchannels: Sequence[str], segment_ids: Sequence[int]
    ) -> list[Written]:
        flush_ts = self.tso.next()
        head = header(
            "ManualFlushMessageHeader",
            collection_id=collection_id,
            flush_ts=flush_ts,
            segment_ids=list(segment_ids),
        )
        return self.broadcast("ManualFlush", vchannels, header_bytes=head, version=2)

    def import_job(
        self,
        collection_id: int,
        name: str,
        vchannels: Sequence[str],
        job_id: int,
        files: Sequence[Sequence[str]],
        *,
        partition_ids: Sequence[int] = (),
    ) -> list[Written]:
        """A bulk import: ``Import`` (version 1, body msg.proto ``ImportMsg``, an empty
        ``ImportMessageHeader``) broadcast to the collection's vchannels, as 2.6's datacoord
        import service builds it (``message.NewImportMessageBuilderV1``); the imported rows
        themselves never enter the WAL."""
        body = msg_pb2.ImportMsg(
            base=common_pb2.MsgBase(msg_type=common_pb2.Import),
            db_name="default",
            collection_name=name,
            collectionID=collection_id,
            partitionIDs=list(partition_ids),
            jobID=job_id,
            files=[msg_pb2.ImportFile(id=i, paths=list(p)) for i, p in enumerate(files)],
        )
        return self.broadcast(
            "Import",
            vchannels,
            header_bytes=header("ImportMessageHeader"),
            body=body.SerializeToString(),
            version=1,
        )

    def flush_all(self, pchannels: Sequence[str], control_pchannel: str) -> list[Written]:
        """FlushAll: a cluster-level broadcast (message.WithClusterLevelBroadcast), one
        ``_pcl`` copy per pchannel, the control pchannel's on ``<pchannel>_vcchan``; empty
        header and body."""
        channels = [p + "_vcchan" if p == control_pchannel else p for p in pchannels]
        return self.broadcast(
            "FlushAll",
            channels,
            header_bytes=header("FlushAllMessageHeader"),
            version=2,
            pchannel_level=True,
            resource_keys=[{"domain": 127, "key": ""}],
        )

    def announce_mq_switch(
        self, vchannels: Sequence[str], target: str, config: dict[str, str]
    ) -> list[Written]:
        """The ``_mq_switch_*`` announcement: ManualFlush{collection_id=0, flush_ts=0}."""
        extra = {sh.MQ_SWITCH_OPERATION: "true", sh.MQ_SWITCH_TARGET_TYPE: target}
        extra.update({sh.MQ_SWITCH_CONFIG_PREFIX + k: v for k, v in config.items()})
        head = header("ManualFlushMessageHeader", collection_id=0, flush_ts=0)
        return self.broadcast(
            "ManualFlush",
            vchannels,
            header_bytes=head,
            version=2,
            extra=extra,
            resource_keys=[{"domain": 127, "key": ""}],
        )

    def alter_wal(
        self,
        pchannels: Sequence[str],
        control_pchannel: str,
        target: str,
        config: dict[str, str],
        *,
        only: Iterable[str] | None = None,
        broadcast_id: int | None = None,
    ) -> list[Written]:
        """AlterWAL to every pchannel; the control channel's pchannel gets its copy on
        ``<pchannel>_vcchan``. ``only`` (pchannels) writes just their copies."""
        channels = [p + "_vcchan" if p == control_pchannel else p for p in pchannels]
        chosen = None if only is None else [c for c in channels if vchannel_pchannel(c) in only]
        head = header("AlterWALMessageHeader", target_wal_name=WAL_NAME[target], config=config)
        return self.broadcast(
            "AlterWAL",
            channels,
            header_bytes=head,
            version=2,
            pchannel_level=True,
            resource_keys=[{"domain": 127, "key": ""}],
            broadcast_id=broadcast_id,
            only=chosen,
        )

    def create_database(self, db_name: str, db_id: int, control_channel: str) -> list[Written]:
        head = header("CreateDatabaseMessageHeader", db_name=db_name, db_id=db_id)
        return self.broadcast(
            "CreateDatabase",
            [control_channel],
            header_bytes=head,
            version=2,
            resource_keys=[{"domain": 3, "key": db_name}],
        )

    def truncate_collection(
        self, collection_id: int, vchannels: Sequence[str], segment_ids: Sequence[int]
    ) -> list[Written]:
        head = header(
            "TruncateCollectionMessageHeader",
            db_id=1,
            collection_id=collection_id,
            segment_ids=list(segment_ids),
        )
        return self.broadcast("TruncateCollection", vchannels, header_bytes=head, version=2)

    def old_format(self, pchannel: str, request: object) -> Written:
        """A 2.3-2.5 msgstream record (no ``_v``), as a source written before its upgrade."""
        payload = request.SerializeToString()  # type: ignore[attr-defined]
        props = {"traceparent": "00-0-0-01"}
        offset = self._produce(pchannel, payload, props)
        record = Written(pchannel=pchannel, offset=offset, payload=payload, properties=props)
        self.written.append(record)
        return record

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None  # its librdkafka threads go with it
