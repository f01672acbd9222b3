"""A Milvus 2.6 root coordinator's catalog, written into a real etcd for tests, since no 2.6
server runs here: a 2.6 source "with collections that exist before the task".

What it writes and in which order follows Milvus's code, not our reader
(replicator/meta/catalog.py): the record types and field numbers are declared again below from
``pkg/proto/etcd_meta.proto`` and milvus-proto ``common.proto``, and encoded with the protobuf
runtime, so a wrong number on either side fails the round trip instead of agreeing with itself.

- keys (``internal/metastore/kv/rootcoord/rootcoord_constant.go``, ``kv_catalog.go``) under
  ``<root>/meta/``: ``root-coord/database/db-info/<dbID>``,
  ``root-coord/database/collection-info/<dbID>/<collID>``, ``root-coord/fields/<collID>/<fieldID>``,
  ``root-coord/struct-array-fields/<collID>/<fieldID>``, ``root-coord/functions/<collID>/<fnID>``,
  ``root-coord/partitions/<collID>/<partID>``, ``root-coord/database/aliases/<dbID>/<alias>``;
- ``kv_catalog.go CreateCollection``: fields (system fields 0 RowID and 1 Timestamp included, as
  ``createCollectionTask.Prepare`` adds them), struct-array fields, functions and partitions
  first, the collection key last; the CollectionInfo's schema holds only name, description,
  autoID and enable_dynamic_field (``MarshalCollectionModel``);
- ``ddl_callbacks_create_collection.go``: the collection is written after its CreateCollection
  broadcast, in state created; create_time and UpdateTimestamp are the control channel copy's
  tick; start_positions hold, per pchannel, the msgstream id of the copy on that vchannel
  (Kafka: the offset as 8-byte little-endian int64, ``SerializeKafkaID``); the consistency level
  comes out of the schema properties (``consistency_level``) into its own field and the other
  properties are kept;
- drop: the ack callback marks the collection dropping (state 2); the keys go later
  (``kv_catalog.go DropCollection``: aliases, partitions, fields, struct-array fields,
  functions, then the collection). Before 2.6 a removed key could keep a tombstone value
  (the bytes of U+26FC); ``tombstones=True`` writes those instead of deleting.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2
from pymilvus.grpc_gen import schema_pb2

from harness.streaming_protos import build_classes
from harness.streaming_writer import StreamingWriter, Tso, Written, collection_schema

_F = descriptor_pb2.FieldDescriptorProto
_INT32, _INT64, _UINT64, _STRING, _BYTES, _MESSAGE, _BOOL = (
    _F.TYPE_INT32,  # enums (states, consistency level) have the same varint encoding
    _F.TYPE_INT64,
    _F.TYPE_UINT64,
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_MESSAGE,
    _F.TYPE_BOOL,
)

# pkg/proto/etcd_meta.proto (embedded schema.CollectionSchema as bytes: same wire bytes) and
# milvus-proto common.proto KeyValuePair / KeyDataPair
_META = build_classes(
    "cdc_test.etcd_meta",
    {
        "KeyValuePair": [("key", 1, _STRING, False, ""), ("value", 2, _STRING, False, "")],
        "KeyDataPair": [("key", 1, _STRING, False, ""), ("data", 2, _BYTES, False, "")],
        "DatabaseInfo": [
            ("tenant_id", 1, _STRING, False, ""),
            ("name", 2, _STRING, False, ""),
            ("id", 3, _INT64, False, ""),
            ("state", 4, _INT32, False, ""),
            ("created_time", 5, _UINT64, False, ""),
            ("properties", 6, _MESSAGE, True, "KeyValuePair"),
        ],
        "CollectionInfo": [
            ("ID", 1, _INT64, False, ""),
            ("schema", 2, _BYTES, False, ""),
            ("create_time", 3, _UINT64, False, ""),
            ("virtual_channel_names", 7, _STRING, True, ""),
            ("physical_channel_names", 8, _STRING, True, ""),
            ("shards_num", 10, _INT32, False, ""),
            ("start_positions", 11, _MESSAGE, True, "KeyDataPair"),
            ("consistency_level", 12, _INT32, False, ""),
            ("state", 13, _INT32, False, ""),
            ("properties", 14, _MESSAGE, True, "KeyValuePair"),
            ("db_id", 15, _INT64, False, ""),
            ("UpdateTimestamp", 16, _UINT64, False, ""),
        ],
        "PartitionInfo": [
            ("partitionID", 1, _INT64, False, ""),
            ("partitionName", 2, _STRING, False, ""),
            ("partition_created_timestamp", 3, _UINT64, False, ""),
            ("collection_id", 4, _INT64, False, ""),
            ("state", 5, _INT32, False, ""),
        ],
        "AliasInfo": [
            ("alias_name", 1, _STRING, False, ""),
            ("collection_id", 2, _INT64, False, ""),
            ("created_time", 3, _UINT64, False, ""),
            ("state", 4, _INT32, False, ""),
            ("db_id", 5, _INT64, False, ""),
        ],
        # pkg/proto/internal.proto ImportFile and data_coord.proto ImportJob (the data
        # coordinator's import meta; state is internal.ImportJobState)
        "ImportFile": [("id", 1, _INT64, False, ""), ("paths", 2, _STRING, True, "")],
        "ImportJob": [
            ("jobID", 1, _INT64, False, ""),
            ("dbID", 2, _INT64, False, ""),
            ("collectionID", 3, _INT64, False, ""),
            ("collection_name", 4, _STRING, False, ""),
            ("partitionIDs", 5, _INT64, True, ""),
            ("vchannels", 6, _STRING, True, ""),
            ("state", 11, _INT32, False, ""),
            ("reason", 12, _STRING, False, ""),
            ("complete_time", 13, _STRING, False, ""),
            ("files", 14, _MESSAGE, True, "ImportFile"),
            ("create_time", 16, _STRING, False, ""),
        ],
        # data_coord.proto ImportTaskV2 (state: ImportTaskStateV2) and SegmentInfo (state:
        # common.SegmentState), the fields the daemon reads and a few beside them
        "ImportTaskV2": [
            ("jobID", 1, _INT64, False, ""),
            ("taskID", 2, _INT64, False, ""),
            ("collectionID", 3, _INT64, False, ""),
            ("segmentIDs", 4, _INT64, True, ""),
            ("nodeID", 5, _INT64, False, ""),
            ("state", 6, _INT32, False, ""),
            ("sorted_segmentIDs", 10, _INT64, True, ""),
        ],
        "SegmentInfo": [
            ("ID", 1, _INT64, False, ""),
            ("collectionID", 2, _INT64, False, ""),
            ("partitionID", 3, _INT64, False, ""),
            ("insert_channel", 4, _STRING, False, ""),
            ("num_of_rows", 5, _INT64, False, ""),
            ("state", 6, _INT32, False, ""),
            ("createdByCompaction", 14, _BOOL, False, ""),
            ("compactionFrom", 15, _INT64, True, ""),
        ],
    },
    {},
)

DEFAULT_DB_ID = 1
DATABASE_CREATED = 1  # etcd_meta.proto DatabaseState
COLLECTION_DROPPING = 2  # CollectionState: 0 created, 1 creating, 2 dropping, 3 dropped
CONSISTENCY_PROPERTY = "consistency_level"  # pkg/common common.ConsistencyLevel
TOMBSTONE = "\u26fc".encode()  # SuffixSnapshotTombstone
IMPORT_COMPLETED, IMPORT_FAILED, IMPORT_IMPORTING = 5, 4, 3  # internal.ImportJobState


def kafka_msg_id(offset: int) -> bytes:
    """pkg/mq/msgstream/mqwrapper/kafka ``SerializeKafkaID``: the offset, little-endian int64."""
    return struct.pack("<q", offset)


def system_fields() -> list[schema_pb2.FieldSchema]:
    """RowID (0) and Timestamp (1), Int64, as the root coordinator adds them."""
    return [
        schema_pb2.FieldSchema(fieldID=0, name="RowID", data_type=schema_pb2.Int64),
        schema_pb2.FieldSchema(fieldID=1, name="Timestamp", data_type=schema_pb2.Int64),
    ]


@dataclass
class CreatedCollection:
    """What :meth:`Catalog26Writer.create_collection` wrote (and broadcast, if it did)."""

    collection_id: int
    db_id: int
    name: str
    schema: schema_pb2.CollectionSchema  # with system fields, as the field keys hold it
    vchannels: list[str]
    pchannels: list[str]
    partitions: dict[int, str]
    consistency_level: int
    properties: dict[str, str]
    create_time: int
    start_positions: dict[str, bytes]
    written: list[Written] = field(default_factory=list)


class Catalog26Writer:
    """Writes a 2.6 source's catalog keys under ``<root_path>/meta`` of a real etcd."""

    def __init__(
        self, client: Any, root_path: str, *, tso: Tso | None = None, meta_sub_path: str = "meta"
    ) -> None:
        self._client = client
        self._prefix = f"{root_path.strip('/')}/{meta_sub_path.strip('/')}/"
        self.tso = tso or Tso()
        self._infos: dict[int, Any] = {}  # collection id -> its CollectionInfo as last written
        self._aliases: dict[int, list[tuple[int, str]]] = {}  # collection id -> (db id, alias)

    def _put(self, key: str, message: Any) -> None:
        self._client.put(self._prefix + key, message.SerializeToString())

    def _remove(self, key: str, tombstones: bool) -> None:
        if tombstones:
            self._client.put(self._prefix + key, TOMBSTONE)
        else:
            self._client.delete(self._prefix + key)

    # --- the streaming coordinator's marker -----------------------------------------------------

    def register_pchannels(self, pchannels: Sequence[str]) -> None:
        """``streamingcoord-meta/pchannel/<name>``: where each pchannel's WAL runs (every 2.6
        cluster has them; the value, a ``streamingpb.PChannelMeta``, is left empty here)."""
        for pchannel in pchannels:
            self._client.put(f"{self._prefix}streamingcoord-meta/pchannel/{pchannel}", b"")

    # --- databases ------------------------------------------------------------------------------

    def create_database(
        self, db_id: int, name: str, properties: Mapping[str, str] | None = None
    ) -> None:
        info = _META["DatabaseInfo"](
            name=name, id=db_id, state=DATABASE_CREATED, created_time=self.tso.next()
        )
        for key, value in (properties or {}).items():
            info.properties.add(key=key, value=value)
        self._put(f"root-coord/database/db-info/{db_id}", info)

    def drop_database(self, db_id: int, *, tombstones: bool = False) -> None:
        self._remove(f"root-coord/database/db-info/{db_id}", tombstones)

    # --- collections ----------------------------------------------------------------------------

    def create_collection(
        self,
        collection_id: int,
        name: str,
        pchannels: Sequence[str],
        *,
        db_id: int = DEFAULT_DB_ID,
        db_name: str = "default",
        schema: schema_pb2.CollectionSchema | None = None,
        partitions: Mapping[int, str] | None = None,
        consistency_level: int = 2,
        properties: Mapping[str, str] | None = None,
        wal: StreamingWriter | None = None,
    ) -> CreatedCollection:
        """A collection with one shard per pchannel (vchannel ``<pchannel>_<id>v<i>``).

        With ``wal``, its CreateCollection is broadcast first (to the vchannels and the control
        channel of the first pchannel, the schema carrying ``consistency_level`` among its
        properties as the proxy sends it) and the catalog is written from the copies, as the
        ack callback does. Without, ticks come from :attr:`tso` and there are no start
        positions.
        """
        vchannels = [f"{p}_{collection_id}v{i}" for i, p in enumerate(pchannels)]
        parts = dict(partitions or {collection_id + 1: "_default"})
        user_schema = collection_schema(name) if schema is None else schema
        sent = schema_pb2.CollectionSchema()
        sent.CopyFrom(user_schema)
        del sent.fields[:]
        sent.fields.extend(system_fields())
        sent.fields.extend(f for f in user_schema.fields if f.fieldID >= 100)
        sent.properties.add(key=CONSISTENCY_PROPERTY, value=str(consistency_level))
        for key, value in (properties or {}).items():
            sent.properties.add(key=key, value=value)

        written: list[Written] = []
        start_positions: dict[str, bytes] = {}
        if wal is not None:
            bare = schema_pb2.CollectionSchema()
            bare.CopyFrom(sent)
            del bare.properties[:]  # the writer adds them as the proxy does
            written = wal.create_collection(
                collection_id,
                name,
                [*vchannels, f"{pchannels[0]}_vcchan"],
                partition_ids=list(parts),
                partition_names=list(parts.values()),
                db_id=db_id,
                db_name=db_name,
                schema=bare,
                consistency_level=consistency_level,
                properties=list((properties or {}).items()),
            )
            *copies, control = written  # in the order of the vchannels given
            created = control.time_tick
            for copy in copies:
                start_positions[copy.pchannel] = kafka_msg_id(copy.offset)
        else:
            created = self.tso.next()

        # consistency level out of the properties (mustConsumeConsistencyLevel), the rest kept
        kept = {p.key: p.value for p in sent.properties if p.key != CONSISTENCY_PROPERTY}
        for field_schema in sent.fields:
            self._put(f"root-coord/fields/{collection_id}/{field_schema.fieldID}", field_schema)
        for struct_field in sent.struct_array_fields:
            key = f"root-coord/struct-array-fields/{collection_id}/{struct_field.fieldID}"
            self._put(key, struct_field)
        for function in sent.functions:
            self._put(f"root-coord/functions/{collection_id}/{function.id}", function)
        for part_id, part_name in parts.items():
            self._put_partition(collection_id, part_id, part_name, created)
        info = _META["CollectionInfo"](
            ID=collection_id,
            schema=schema_pb2.CollectionSchema(
                name=name,
                description=sent.description,
                autoID=sent.autoID,
                enable_dynamic_field=sent.enable_dynamic_field,
            ).SerializeToString(),
            create_time=created,
            virtual_channel_names=vchannels,
            physical_channel_names=list(pchannels),
            shards_num=len(vchannels),
            consistency_level=consistency_level,
            state=0,
            db_id=db_id,
            UpdateTimestamp=created,
        )
        for pchannel, msg_id in start_positions.items():
            info.start_positions.add(key=pchannel, data=msg_id)
        for key, value in kept.items():
            info.properties.add(key=key, value=value)
        self._put(f"root-coord/database/collection-info/{db_id}/{collection_id}", info)
        self._infos[collection_id] = info
        return CreatedCollection(
            collection_id=collection_id,
            db_id=db_id,
            name=name,
            schema=sent,
            vchannels=vchannels,
            pchannels=list(pchannels),
            partitions=parts,
            consistency_level=consistency_level,
            properties=kept,
            create_time=created,
            start_positions=start_positions,
            written=written,
        )

    def drop_collection(
        self, collection_id: int, *, remove: bool = False, tombstones: bool = False
    ) -> None:
        """Mark it dropping (state 2, what the drop's ack callback leaves); with ``remove``,
        then remove its keys as the garbage collector does, the collection key last."""
        info = self._infos[collection_id]
        info.state = COLLECTION_DROPPING
        info.UpdateTimestamp = self.tso.next()
        self._put(f"root-coord/database/collection-info/{info.db_id}/{collection_id}", info)
        if not remove:
            return
        for db_id, alias in self._aliases.pop(collection_id, []):
            self._remove(f"root-coord/database/aliases/{db_id}/{alias}", tombstones)
        children = ("partitions", "fields", "struct-array-fields", "functions")
        for sub in children:
            prefix = f"{self._prefix}root-coord/{sub}/{collection_id}/"
            for _, meta in list(self._client.get_prefix(prefix)):
                self._remove(meta.key.decode()[len(self._prefix) :], tombstones)
        self._remove(
            f"root-coord/database/collection-info/{info.db_id}/{collection_id}", tombstones
        )
        del self._infos[collection_id]

    # --- partitions and aliases -----------------------------------------------------------------

    def _put_partition(self, collection_id: int, partition_id: int, name: str, ts: int) -> None:
        part = _META["PartitionInfo"](
            partitionID=partition_id,
            partitionName=name,
            partition_created_timestamp=ts,
            collection_id=collection_id,
            state=0,
        )
        self._put(f"root-coord/partitions/{collection_id}/{partition_id}", part)

    def create_partition(self, collection_id: int, partition_id: int, name: str) -> None:
        self._put_partition(collection_id, partition_id, name, self.tso.next())

    def drop_partition(
        self, collection_id: int, partition_id: int, *, tombstones: bool = False
    ) -> None:
        self._remove(f"root-coord/partitions/{collection_id}/{partition_id}", tombstones)

    def create_alias(self, db_id: int, alias: str, collection_id: int) -> None:
        """Also what AlterAlias writes (``kv_catalog.go AlterAlias`` calls CreateAlias)."""
        info = _META["AliasInfo"](
            alias_name=alias,
            collection_id=collection_id,
            created_time=self.tso.next(),
            state=0,
            db_id=db_id,
        )
        self._put(f"root-coord/database/aliases/{db_id}/{alias}", info)
        for targets in self._aliases.values():
            if (db_id, alias) in targets:
                targets.remove((db_id, alias))
        self._aliases.setdefault(collection_id, []).append((db_id, alias))

    # --- the data coordinator's import jobs -----------------------------------------------------

    def import_job(
        self,
        job_id: int,
        collection_id: int,
        name: str,
        files: Sequence[Sequence[str]],
        state: int,
        *,
        db_id: int = DEFAULT_DB_ID,
        vchannels: Sequence[str] = (),
        reason: str = "",
    ) -> None:
        """``datacoord-meta/import-job/<jobID>`` (``internal/metastore/kv/datacoord``
        ``buildImportJobKey``), rewritten at every state change of the job."""
        job = _META["ImportJob"](
            jobID=job_id,
            dbID=db_id,
            collectionID=collection_id,
            collection_name=name,
            partitionIDs=[collection_id + 1],
            vchannels=list(vchannels),
            state=state,
            reason=reason,
            files=[_META["ImportFile"](id=n, paths=list(p)) for n, p in enumerate(files)],
            create_time="2026-11-23T09:00:00Z",
        )
        self._put(f"datacoord-meta/import-job/{job_id}", job)

    def import_task(
        self, task_id: int, job_id: int, collection_id: int, segments: Sequence[int]
    ) -> None:
        """``datacoord-meta/import-task/<taskID>`` (``buildImportTaskKey``): one task of a job
        and the segments it wrote (state 4: ImportTaskStateV2 Completed)."""
        task = _META["ImportTaskV2"](
            jobID=job_id,
            taskID=task_id,
            collectionID=collection_id,
            segmentIDs=list(segments),
            nodeID=3,
            state=4,
        )
        self._put(f"datacoord-meta/import-task/{task_id}", task)

    def segment(
        self,
        collection_id: int,
        segment_id: int,
        state: int,
        rows: int,
        compaction_from: Sequence[int] = (),
    ) -> None:
        """``datacoord-meta/s/<collectionID>/<partitionID>/<segmentID>``
        (``buildSegmentPath``)."""
        partition_id = collection_id + 1
        info = _META["SegmentInfo"](
            ID=segment_id,
            collectionID=collection_id,
            partitionID=partition_id,
            insert_channel=f"by-dev-rootcoord-dml_0_{collection_id}v0",
            num_of_rows=rows,
            state=state,
            createdByCompaction=bool(compaction_from),
            compactionFrom=list(compaction_from),
        )
        self._put(f"datacoord-meta/s/{collection_id}/{partition_id}/{segment_id}", info)

    def drop_alias(self, db_id: int, alias: str, *, tombstones: bool = False) -> None:
        self._remove(f"root-coord/database/aliases/{db_id}/{alias}", tombstones)
        for targets in self._aliases.values():
            if (db_id, alias) in targets:
                targets.remove((db_id, alias))
