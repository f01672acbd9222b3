"""The source's metadata as Milvus keeps it in etcd (``<root>/<meta>/root-coord/...``), for
2.3-2.5 sources and for 2.6 (streaming) sources: the layout is the same; 2.6 writes more of it.

Databases, collections (with their full schemas), partitions and aliases. pymilvus does not ship
these record types; they are read field by field with the numbers of Milvus's
``pkg/proto/etcd_meta.proto`` (``internal/proto`` before 2.5):

    DatabaseInfo    1 tenant_id, 2 name, 3 id, 4 state, 5 created_time, 6 properties
    CollectionInfo  1 ID, 2 schema (name and flags; fields are separate keys), 3 create_time,
                    4 partitionIDs, 5 partitionNames, 9 partition_created_timestamps (all three
                    deprecated: partitions of collections made before 2.1), 7
                    virtual_channel_names, 8 physical_channel_names, 10 shards_num,
                    11 start_positions (common.KeyDataPair: 1 key = pchannel, 2 data = msg id),
                    12 consistency_level, 13 state (0 created, 1 creating, 2 dropping,
                    3 dropped), 14 properties (common.KeyValuePair: 1 key, 2 value), 15 db_id,
                    16 UpdateTimestamp
    FieldSchema     ``fields/<collID>/<fieldID>``: schema.FieldSchema as is
    PartitionInfo   1 partitionID, 2 partitionName, 3 created ts, 4 collection_id, 5 state
    AliasInfo       1 alias_name, 2 collection_id, 3 created_time, 4 state, 5 db_id

Keys (``internal/metastore/kv/rootcoord/rootcoord_constant.go`` and ``kv_catalog.go``, the
``Build*Key`` functions), all under ``<root>/<meta>/``:

    root-coord/database/db-info/<dbID>                        DatabaseInfo (the default
                                                              database, id 1, may have none)
    root-coord/database/collection-info/<dbID>/<collID>       CollectionInfo
    root-coord/collection/<collID>                            CollectionInfo of a collection
                                                              made before databases (db 1)
    root-coord/fields/<collID>/<fieldID>                      schema.FieldSchema
    root-coord/struct-array-fields/<collID>/<fieldID>         schema.StructArrayFieldSchema (2.6)
    root-coord/functions/<collID>/<functionID>                schema.FunctionSchema (2.6; BM25
                                                              and embedding functions)
    root-coord/partitions/<collID>/<partID>                   PartitionInfo
    root-coord/database/aliases/<dbID>/<alias>                AliasInfo

What 2.6 changes (``internal/rootcoord/ddl_callbacks_create_collection.go``,
``ddl_callbacks_drop_collection.go``; the 2.6 branch, ``pkg/v2`` imports):

- DDL is a broadcast in the WAL first; the root coordinator writes etcd in the broadcast's ack
  callback. ``kv_catalog.go CreateCollection`` still writes fields, struct-array fields,
  functions and partitions as keys of their own (``MarshalCollectionModel`` leaves them out of
  the CollectionInfo), the collection key last ("the commit point"); a collection key without
  fields is therefore never seen, but field keys without a collection key can be (skipped).
- The collection is written in state 0 (created) directly. ``create_time`` and
  ``UpdateTimestamp`` are the ``_tt`` of the CreateCollection copy on the control channel
  (``<pchannel>_vcchan``); the partitions' created ts too.
- ``consistency_level`` travels in the CreateCollection message as a schema property
  (``pkg/common/common.go``: ``ConsistencyLevel = "consistency_level"``; the root coordinator
  writes the enum number as text); ``mustConsumeConsistencyLevel``
  moves it to field 12 and leaves it out of field 14, so in etcd it is *not* a property.
  Every other collection property (``timezone`` is one, ``TimezoneKey`` in common.go; also
  ``collection.ttl.seconds``, ``mmap.enabled``, ...) is kept as given in field 14.
- ``start_positions``: per pchannel, ``adaptor.MustGetMQWrapperIDFromMessage(MessageID)
  .Serialize()`` of the CreateCollection copy appended on that vchannel (the code says it uses
  that id rather than the last-confirmed one because a woodpecker zero id serializes to nil).
  The serialization is the message queue's msgstream id, as on 2.3: Kafka's and RocksMQ's
  8-byte little-endian int64 of the offset / id (``common.Endian`` is ``binary.LittleEndian``),
  Pulsar's serialized ``MessageIdData``; so our sources' ``offset_of`` reads it unchanged.
  The record at that id is the CreateCollection copy itself; every record of the collection on
  that pchannel comes after it.
- A drop is a broadcast too; its ack callback calls ``meta_table.go DropCollection``, which
  rewrites the collection key with state 2 (dropping) and ``UpdateTimestamp`` = the drop's
  control-channel tick; ``RemoveCollection`` removes the keys later (``kv_catalog.go
  DropCollection``: aliases, partitions, fields, struct-array fields, functions, then the
  collection key).
- Milvus before 2.6 kept history under ``<root>/<meta>/snapshots/...`` and left a tombstone
  value (the bytes of U+26FC) at a removed key; later code only removes keys and skips legacy
  tombstones (``IsTombstone``). Keys holding a tombstone are skipped here either way.
- The streaming services keep their own meta beside it: ``streamingcoord-meta/pchannel/<name>``
  (where each pchannel's WAL runs; present on every 2.6 cluster, which is how
  :func:`is_streaming_source` tells a 2.6 source), ``streamingcoord-meta/broadcast-task/...``,
  and per pchannel ``streamingnode-meta/wal/<pchannel>/consume-checkpoint`` (a
  ``streamingpb.WALCheckpoint``: 1 message_id, 2 time_tick, 3 recovery_magic; the streaming
  node's own recovery point, not a start for a replica: data before it is in sealed segments).

Where a new task starts on a 2.6 WAL is therefore defined as on 2.3: a collection's start on a
pchannel is its start position there (the id of its CreateCollection copy); a task starts at the
earliest one of its selected collections when the queue still holds it, else at the end.
A start position names a record of the WAL the collection was created on: after an AlterWAL to
another backend it no longer names a record of the new one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from replicator.codec.wire import int64s, iter_fields, to_signed64
from replicator.meta.imports import SourceImport, read_imports
from replicator.meta.segments import SegmentRecord, read_segments

log = logging.getLogger(__name__)

DEFAULT_DB = "default"
DEFAULT_DB_ID = 1
COLLECTION_CREATED = 0
COLLECTION_CREATING = 1
COLLECTION_DROPPED_STATES = (2, 3)  # dropping, dropped
ALIAS_CREATED = 0
TOMBSTONE = b"\xe2\x9b\xbc"
STREAMING_COORD_META = "streamingcoord-meta/"


@dataclass(frozen=True)
class AliasMeta:
    name: str
    db_id: int
    collection_id: int


@dataclass(frozen=True)
class CollectionMeta:
    collection_id: int
    db_id: int
    db_name: str
    name: str
    schema: Any  # schema_pb2.CollectionSchema, with its fields
    vchannels: tuple[str, ...]
    pchannels: tuple[str, ...]
    shards: int
    consistency_level: int
    state: int
    create_time: int
    start_positions: dict[str, bytes] = field(default_factory=dict)
    partitions: dict[int, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)
    update_timestamp: int = 0

    @property
    def dropped(self) -> bool:
        return self.state in COLLECTION_DROPPED_STATES

    @property
    def creating(self) -> bool:
        """Written by the root coordinator before its CreateCollection went out (fields may be
        missing yet); the WAL's CreateCollection record, which follows, is what counts."""
        return self.state == COLLECTION_CREATING


def _text(value: int | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _int(value: int | bytes) -> int:
    return to_signed64(value) if isinstance(value, int) else 0


def _scalars(value: bytes) -> dict[int, int | bytes]:
    """A flat record's fields by number (the last occurrence wins, as in protobuf)."""
    return {number: v for number, _, v in iter_fields(value)}


def decode_database(value: bytes) -> tuple[int, str]:
    fields = _scalars(value)
    return _int(fields.get(3, 0)), _text(fields.get(2, b""))


def _pair(value: int | bytes) -> tuple[str, int | bytes]:
    """A KeyValuePair or KeyDataPair: (1 key, 2 value or data)."""
    fields = _scalars(value) if isinstance(value, bytes) else {}
    return _text(fields.get(1, b"")), fields.get(2, b"")


def decode_collection(value: bytes) -> dict[str, Any]:
    info: dict[str, Any] = {
        "vchannels": [],
        "pchannels": [],
        "start_positions": {},
        "properties": {},
        "legacy_partition_ids": [],
        "legacy_partition_names": [],
        "update_timestamp": 0,
        "shards": 1,
        "consistency_level": 0,
        "state": 0,
        "db_id": 0,
        "create_time": 0,
    }
    for number, _, v in iter_fields(value):
        if number == 1:
            info["id"] = _int(v)
        elif number == 2 and isinstance(v, bytes):
            info["schema"] = schema_pb2.CollectionSchema.FromString(v)
        elif number == 3:
            info["create_time"] = _int(v)
        elif number == 4:  # packed or not
            info["legacy_partition_ids"].extend(int64s(v))
        elif number == 5:
            info["legacy_partition_names"].append(_text(v))
        elif number == 7:
            info["vchannels"].append(_text(v))
        elif number == 8:
            info["pchannels"].append(_text(v))
        elif number == 10:
            info["shards"] = _int(v)
        elif number == 11:
            key, data = _pair(v)
            info["start_positions"][key] = data if isinstance(data, bytes) else b""
        elif number == 12:
            info["consistency_level"] = _int(v)
        elif number == 13:
            info["state"] = _int(v)
        elif number == 14:
            key, text = _pair(v)
            info["properties"][key] = _text(text)
        elif number == 15:
            info["db_id"] = _int(v)
        elif number == 16:
            info["update_timestamp"] = _int(v)
    return info


def decode_partition(value: bytes) -> tuple[int, str, int]:
    """(partition id, name, collection id)."""
    fields = _scalars(value)
    return _int(fields.get(1, 0)), _text(fields.get(2, b"")), _int(fields.get(4, 0))


def decode_alias(value: bytes) -> tuple[str, int, int, int]:
    """(alias name, collection id, state, db id)."""
    fields = _scalars(value)
    return (
        _text(fields.get(1, b"")),
        _int(fields.get(2, 0)),
        _int(fields.get(4, ALIAS_CREATED)),
        _int(fields.get(5, 0)),
    )


class SourceCatalog:
    """Reads the source's collections from its etcd; blocking, call from a thread."""

    def __init__(self, client: Any, root_path: str, meta_sub_path: str = "meta") -> None:
        self._client = client
        self._meta = f"{root_path.strip('/')}/{meta_sub_path.strip('/')}/"
        self._prefix = f"{self._meta}root-coord/"

    def _items(self, sub: str) -> list[tuple[str, bytes]]:
        prefix = self._prefix + sub
        return [
            (meta.key.decode()[len(prefix) :], bytes(value))
            for value, meta in self._client.get_prefix(prefix)
            if bytes(value) != TOMBSTONE
        ]

    def databases(self) -> dict[int, str]:
        names = {DEFAULT_DB_ID: DEFAULT_DB}
        for _, value in self._items("database/db-info/"):
            db_id, name = decode_database(value)
            names[db_id] = name
        return names

    def collections(self) -> dict[int, CollectionMeta]:
        return self._collections(None)

    def collection(self, collection_id: int) -> CollectionMeta | None:
        """One collection, reading only its own field and partition keys (what a CreateCollection
        record needs, without reading every schema of the source)."""
        return self._collections(collection_id).get(collection_id)

    def _children(self, sub: str, only: int | None, decode: Any) -> dict[int, list[Any]]:
        """Records kept under ``<sub>/<collID>/<id>``, by collection id."""
        scope = "" if only is None else f"{only}/"
        found: dict[int, list[Any]] = {}
        for key, value in self._items(f"{sub}/{scope}"):
            collection_id = only if only is not None else int(key.split("/", 1)[0])
            found.setdefault(collection_id, []).append(decode(value))
        return found

    def _collection_records(self, only: int | None) -> list[tuple[int, int, dict[str, Any]]]:
        """(db id, collection id, decoded CollectionInfo), ids from the record or else its key:
        the per-database keys, then the keys of collections made before databases existed (in
        the default database) unless the same collection also has a per-database key."""
        records = []
        for key, value in self._items("database/collection-info/"):
            db_key, _, id_key = key.partition("/")
            if only is None or id_key == str(only):
                info = decode_collection(value)
                records.append((int(db_key), info.get("id") or int(id_key), info))
        seen = {collection_id for _, collection_id, _ in records}
        for key, value in self._items("collection/"):
            if only is None or key == str(only):
                info = decode_collection(value)
                collection_id = info.get("id") or int(key)
                if collection_id not in seen:
                    records.append((DEFAULT_DB_ID, collection_id, info))
        return records

    def _collections(self, only: int | None) -> dict[int, CollectionMeta]:
        # The collection keys first, their fields, partitions and databases after (the reads
        # are not one snapshot): a collection key is written in state Created only once its
        # fields are (2.3-2.5: created in state Creating, then its fields, then Created; 2.6:
        # the key last), so a Created collection read here always finds its fields. Read the
        # other way round, a collection created between the two reads showed with none.
        records = self._collection_records(only)
        databases = self.databases()
        fields = self._children("fields", only, schema_pb2.FieldSchema.FromString)
        structs = self._children(
            "struct-array-fields", only, schema_pb2.StructArrayFieldSchema.FromString
        )
        functions = self._children("functions", only, schema_pb2.FunctionSchema.FromString)
        partitions: dict[int, dict[int, str]] = {}
        scope = "" if only is None else f"{only}/"
        for _, value in self._items(f"partitions/{scope}"):
            part_id, name, owner = decode_partition(value)
            partitions.setdefault(owner, {})[part_id] = name
        result = {}
        for key_db_id, collection_id, info in records:
            schema = info.get("schema") or schema_pb2.CollectionSchema()
            schema.fields.extend(sorted(fields.get(collection_id, []), key=lambda f: f.fieldID))
            schema.struct_array_fields.extend(
                sorted(structs.get(collection_id, []), key=lambda f: f.fieldID)
            )
            schema.functions.extend(sorted(functions.get(collection_id, []), key=lambda f: f.id))
            legacy = dict(
                zip(info["legacy_partition_ids"], info["legacy_partition_names"], strict=False)
            )
            db_id = info["db_id"] or key_db_id
            result[collection_id] = CollectionMeta(
                collection_id=collection_id,
                db_id=db_id,
                db_name=databases.get(db_id, DEFAULT_DB),
                name=schema.name,
                schema=schema,
                vchannels=tuple(info["vchannels"]),
                pchannels=tuple(info["pchannels"]),
                shards=info["shards"],
                consistency_level=info["consistency_level"],
                state=info["state"],
                create_time=info["create_time"],
                start_positions=info["start_positions"],
                partitions=partitions.get(collection_id, legacy),
                properties=info["properties"],
                update_timestamp=info["update_timestamp"],
            )
        return result

    def imports(self) -> list[SourceImport]:
        """The bulk imports the source still records (see :mod:`replicator.meta.imports`)."""
        return read_imports(self._client, self._meta, self.databases())

    def segments(self, collection_id: int) -> dict[int, SegmentRecord]:
        """One collection's segments (see :mod:`replicator.meta.segments`)."""
        return read_segments(self._client, self._meta, collection_id)

    def aliases(self) -> list[AliasMeta]:
        """The aliases in effect (being created or dropped ones are left out)."""
        result = []
        for key, value in self._items("database/aliases/"):
            name, collection_id, state, db_id = decode_alias(value)
            if state == ALIAS_CREATED and name and collection_id:
                result.append(AliasMeta(name, db_id or int(key.split("/", 1)[0]), collection_id))
        return result


def is_streaming_source(client: Any, root_path: str, meta_sub_path: str = "meta") -> bool:
    """Whether the Milvus that keeps its meta at ``root_path`` is 2.6 or later (streaming WAL):
    its streaming coordinator records where each pchannel's WAL runs under
    ``<root>/<meta>/streamingcoord-meta/pchannel/``. Blocking."""
    prefix = f"{root_path.strip('/')}/{meta_sub_path.strip('/')}/{STREAMING_COORD_META}"
    return any(True for _ in client.get_prefix(prefix, keys_only=True))
