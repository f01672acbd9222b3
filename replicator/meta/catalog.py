"""The source's metadata as Milvus 2.3-2.5 keeps it in etcd (``<root>/<meta>/root-coord/...``).

Databases, collections (with their full schemas), partitions and aliases. pymilvus does not ship
these record types; they are read field by field with the numbers of Milvus's etcd_meta.proto:

    DatabaseInfo    2 name, 3 id, 4 state
    CollectionInfo  1 ID, 2 schema (name and flags; fields are separate keys), 3 create_time,
                    7 virtual_channel_names, 8 physical_channel_names, 10 shards_num,
                    11 start_positions (KeyDataPair: 1 key = pchannel, 2 data = msgID),
                    12 consistency_level, 13 state, 15 db_id
    FieldSchema     ``fields/<collID>/<fieldID>``: schema.FieldSchema as is
    PartitionInfo   1 partitionID, 2 partitionName, 3 created ts, 4 collection_id
    AliasInfo       1 alias_name, 2 collection_id, 3 created_time, 4 state, 5 db_id

A key Milvus has removed may still hold its snapshot tombstone (the bytes of U+26FC); such keys
are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from replicator.codec.wire import iter_fields, to_signed64

log = logging.getLogger(__name__)

DEFAULT_DB = "default"
COLLECTION_CREATED = 0
COLLECTION_CREATING = 1
COLLECTION_DROPPED_STATES = (2, 3)  # dropping, dropped
ALIAS_CREATED = 0
TOMBSTONE = b"\xe2\x9b\xbc"


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


def decode_collection(value: bytes) -> dict[str, Any]:
    info: dict[str, Any] = {
        "vchannels": [],
        "pchannels": [],
        "start_positions": {},
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
        elif number == 7:
            info["vchannels"].append(_text(v))
        elif number == 8:
            info["pchannels"].append(_text(v))
        elif number == 10:
            info["shards"] = _int(v)
        elif number == 11 and isinstance(v, bytes):
            pair = {n: val for n, _, val in iter_fields(v)}
            info["start_positions"][_text(pair.get(1, b""))] = pair.get(2, b"")
        elif number == 12:
            info["consistency_level"] = _int(v)
        elif number == 13:
            info["state"] = _int(v)
        elif number == 15:
            info["db_id"] = _int(v)
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
        self._prefix = f"{root_path.strip('/')}/{meta_sub_path.strip('/')}/root-coord/"

    def _items(self, sub: str) -> list[tuple[str, bytes]]:
        prefix = self._prefix + sub
        return [
            (meta.key.decode()[len(prefix) :], bytes(value))
            for value, meta in self._client.get_prefix(prefix)
            if bytes(value) != TOMBSTONE
        ]

    def databases(self) -> dict[int, str]:
        names = {1: DEFAULT_DB}
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

    def _collections(self, only: int | None) -> dict[int, CollectionMeta]:
        databases = self.databases()
        scope = "" if only is None else f"{only}/"
        fields: dict[int, list[Any]] = {}
        for key, value in self._items(f"fields/{scope}"):
            collection_id = only if only is not None else int(key.split("/", 1)[0])
            fields.setdefault(collection_id, []).append(schema_pb2.FieldSchema.FromString(value))
        partitions: dict[int, dict[int, str]] = {}
        for _, value in self._items(f"partitions/{scope}"):
            part_id, name, collection_id = decode_partition(value)
            partitions.setdefault(collection_id, {})[part_id] = name
        result = {}
        for key, value in self._items("database/collection-info/"):
            if only is not None and not key.endswith(f"/{only}"):
                continue
            info = decode_collection(value)
            collection_id = info.get("id") or int(key.rsplit("/", 1)[-1])
            schema = info.get("schema") or schema_pb2.CollectionSchema()
            for field_schema in sorted(fields.get(collection_id, []), key=lambda f: f.fieldID):
                schema.fields.append(field_schema)
            db_id = info["db_id"] or int(key.split("/", 1)[0])
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
                partitions=partitions.get(collection_id, {}),
            )
        return result

    def aliases(self) -> list[AliasMeta]:
        """The aliases in effect (being created or dropped ones are left out)."""
        result = []
        for key, value in self._items("database/aliases/"):
            name, collection_id, state, db_id = decode_alias(value)
            if state == ALIAS_CREATED and name and collection_id:
                result.append(AliasMeta(name, db_id or int(key.split("/", 1)[0]), collection_id))
        return result
