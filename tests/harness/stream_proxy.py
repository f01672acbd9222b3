"""A client's inserts, upserts and deletes of one collection as a Milvus 2.6 proxy appends them
to the WAL, for tests: the messages are written with :class:`harness.streaming_writer.
StreamingWriter`, their columns made by :mod:`harness.stream_columns`.

Derived from Milvus's Go code (milvus-io/milvus, ``internal/proxy`` unless named otherwise),
never from our decoder:

- row ids: an insert and an upsert allocate one id per row (``insertTask.PreExecute``,
  ``upsertTask.insertPreExecute``: ``common.AllocAutoID``), the Insert's ``RowIDs``;
- auto_id: the client sends no key; ``checkPrimaryFieldData`` (util.go) makes the key column
  from the row ids (``autoGenPrimaryFieldData``: the ids, or their decimal text for a VarChar
  key) and appends it after every other column (``$meta`` included: ``checkDynamicFieldData``
  runs before it); ``fillFieldPropertiesOnly`` then sets its field id. An upsert of an auto_id
  collection gives its rows new keys: ``checkUpsertPrimaryFieldData`` takes the client's key
  column out, appends one made of the new row ids, and the upsert's Delete removes the client's
  keys (``upsertTask.deletePreExecute``: ``PrimaryKeys = oldIDs``);
- shards: each row goes to the vchannel ``HashPK2Channels`` picks from its key
  (``assignChannelsByPK``): ``Hash32Int64`` (murmur3, seed 0, of the key's 8 little-endian
  bytes, top bit cleared) or ``HashString2Uint32`` (CRC-32 IEEE of the key's first 100 bytes),
  modulo the number of vchannels (``pkg/util/typeutil/hash.go``); a Delete's keys are split
  over the vchannels the same way (one Delete per vchannel);
- partition keys: a collection with an ``is_partition_key`` field has ``num_partitions``
  partitions ``_default_0`` .. ``_default_{n-1}`` (rootcoord ``createCollectionTask.
  assignPartitionIDs``, which puts their ids and names in the CreateCollection), and
  ``repackInsertDataWithPartitionKeyForStreamingService`` (task_insert_streaming.go) writes one
  Insert per (vchannel, partition): the partition ``HashKey2Partitions`` picks from the row's
  partition key (the same hashes, modulo the partitions in ``RearrangePartitionsForPartitionKey``
  order, by index). Its Deletes name no partition (``deleteRunner.Init``: ``partitionID =
  common.AllPartitionsID``, -1), nor do an upsert's (``upsertTask.deletePreExecute``); in a
  collection without a partition key an upsert's Delete names the partition it writes to
  (``_default``) and a plain delete none;
- transactions: the messages of one request go through ``streaming.WAL().AppendMessages``,
  which appends a vchannel's only message as it is and several as one transaction
  (``walAccesserImpl.appendToVChannel``, ``internal/distributed/streaming``): an upsert on each
  vchannel where it has an Insert and a Delete, and a partition-key insert whose rows on one
  vchannel fall into more than one partition.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymilvus.grpc_gen import schema_pb2 as S  # noqa: N812 - the protos, read as S.Int64

from harness.stream_columns import wal_columns
from harness.streaming_writer import StreamingWriter, Written

Key = int | str
Row = Mapping[str, Any]
ALL_PARTITIONS = -1  # common.AllPartitionsID
_M32 = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 (github.com/spaolacci/murmur3 ``New32``: seed 0)."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & _M32

    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & _M32
    body = len(data) // 4 * 4
    for i in range(0, body, 4):
        k = rotl(int.from_bytes(data[i : i + 4], "little") * c1 & _M32, 15) * c2 & _M32
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & _M32
    k = 0
    for i, byte in enumerate(data[body:]):
        k |= byte << (8 * i)
    if len(data) > body:
        h ^= rotl(k * c1 & _M32, 15) * c2 & _M32
    h ^= len(data)
    h = (h ^ (h >> 16)) * 0x85EBCA6B & _M32
    h = (h ^ (h >> 13)) * 0xC2B2AE35 & _M32
    return h ^ (h >> 16)


def key_hash(key: Key) -> int:
    """``typeutil.Hash32Int64`` of an Int64 key, ``typeutil.HashString2Uint32`` of a string."""
    if isinstance(key, str):
        return zlib.crc32(key.encode()[:100])
    return murmur3_32(struct.pack("<q", key)) & 0x7FFFFFFF


@dataclass
class ProxyCollection:
    """One collection of a 2.6 source: made with :meth:`create`, then written as a client
    writes it (``rows`` are dicts as a client inserts them, see :func:`wal_columns`)."""

    writer: StreamingWriter
    collection_id: int
    name: str
    schema: S.CollectionSchema
    vchannels: list[str]
    num_partitions: int = 0  # a partition-key collection's partitions
    # the proxy's id allocator (ids of a running cluster: large)
    row_ids: itertools.count = field(default_factory=lambda: itertools.count(448_000_000_000_001))
    partitions: list[tuple[int, str]] = field(init=False)  # (id, name), in index order

    def __post_init__(self) -> None:
        if self.partition_key is None:
            names = ["_default"]
        else:
            names = [f"_default_{i}" for i in range(self.num_partitions)]
        self.partitions = [(self.collection_id * 100 + i + 1, n) for i, n in enumerate(names)]

    @property
    def pk(self) -> S.FieldSchema:
        return next(f for f in self.schema.fields if f.is_primary_key)

    @property
    def partition_key(self) -> S.FieldSchema | None:
        return next((f for f in self.schema.fields if f.is_partition_key), None)

    def create(self, *extra_channels: str) -> list[Written]:
        """The CreateCollection broadcast (``extra_channels``: the control channel)."""
        return self.writer.create_collection(
            self.collection_id,
            self.name,
            [*self.vchannels, *extra_channels],
            partition_ids=[pid for pid, _ in self.partitions],
            partition_names=[name for _, name in self.partitions],
            schema=self.schema,
        )

    # --- the proxy's layout ------------------------------------------------------------------

    def _columns(self, rows: Sequence[Row], keys: Sequence[Key]) -> list[S.FieldData]:
        columns = wal_columns(self.schema, rows)
        if self.pk.autoID:  # the key column the proxy made, last
            column = S.FieldData(field_name=self.pk.name, field_id=self.pk.fieldID)
            column.type = self.pk.data_type
            if self.pk.data_type == S.VarChar:
                column.scalars.string_data.data.extend(str(k) for k in keys)
            else:
                column.scalars.long_data.data.extend(int(k) for k in keys)
            columns.append(column)
        return columns

    def vchannel_of(self, key: Key) -> str:
        return self.vchannels[key_hash(key) % len(self.vchannels)]

    def partition_of(self, row: Row) -> tuple[int, str]:
        if self.partition_key is None:
            return self.partitions[0]
        return self.partitions[key_hash(row[self.partition_key.name]) % len(self.partitions)]

    def _inserts(self, rows: Sequence[Row], keys: Sequence[Key], ids: Sequence[int]) -> dict:
        """Per vchannel, per partition: (rows, keys, row ids), in the rows' order."""
        grouped: dict[str, dict[tuple[int, str], list[tuple[Row, Key, int]]]] = {}
        for row, key, row_id in zip(rows, keys, ids, strict=True):
            by_partition = grouped.setdefault(self.vchannel_of(key), {})
            by_partition.setdefault(self.partition_of(row), []).append((row, key, row_id))
        return grouped

    def _write(
        self,
        rows: Sequence[Row],
        keys: Sequence[Key],
        deleted: Sequence[Key],
        delete_partition: tuple[int, str],
    ) -> list[Key]:
        """Write one request's messages; the keys of its rows."""
        ids = [next(self.row_ids) for _ in rows]
        if self.pk.autoID:
            keys = [str(i) if self.pk.data_type == S.VarChar else i for i in ids]
        inserts = self._inserts(rows, keys, ids)
        deletes: dict[str, list[Key]] = {}
        for key in deleted:
            deletes.setdefault(self.vchannel_of(key), []).append(key)
        for vchannel in sorted(set(inserts) | set(deletes)):
            parts = inserts.get(vchannel, {})
            txn = None
            if len(parts) + (vchannel in deletes) > 1:
                txn = self.writer.begin_txn(vchannel)
            for (partition_id, partition_name), group in sorted(parts.items()):
                batch = [row for row, _, _ in group]
                self.writer.insert(
                    vchannel,
                    self.collection_id,
                    [key for _, key, _ in group],
                    collection_name=self.name,
                    partition_id=partition_id,
                    partition_name=partition_name,
                    row_ids=[row_id for _, _, row_id in group],
                    columns=self._columns(batch, [key for _, key, _ in group]),
                    txn=txn,
                )
            if vchannel in deletes:
                self.writer.delete(
                    vchannel,
                    self.collection_id,
                    deletes[vchannel],
                    collection_name=self.name,
                    partition_id=delete_partition[0],
                    partition_name=delete_partition[1],
                    txn=txn,
                )
            if txn is not None:
                self.writer.end_txn(txn)
        return list(keys)

    # --- what a client does ------------------------------------------------------------------

    def insert(self, rows: Sequence[Row]) -> list[Key]:
        """Insert ``rows``; their keys (an auto_id collection's are the row ids)."""
        keys = [row.get(self.pk.name) for row in rows]
        return self._write(rows, keys, [], (ALL_PARTITIONS, ""))

    def upsert(self, rows: Sequence[Row]) -> list[Key]:
        """Upsert ``rows`` (each with its key); the keys the rows have now (new ones in an
        auto_id collection, whose old keys are deleted)."""
        keys = [row[self.pk.name] for row in rows]
        if self.partition_key is not None:
            delete_partition = (ALL_PARTITIONS, "")
        else:
            delete_partition = self.partitions[0]
        return self._write(rows, keys, keys, delete_partition)

    def delete(self, keys: Sequence[Key]) -> None:
        self._write([], [], keys, (ALL_PARTITIONS, ""))
