"""One Milvus 2.3 (msgstream) pchannel written record by record into the Kafka mock, in an order
the test chooses: the interleavings a real 2.3.5 produces only by chance (issue 48).

A 2.3.5 proxy appends the records of concurrent tasks to a pchannel as each task produces them,
so their timestamps are not in offset order, and an upsert's two records (an Insert whose
``MsgBase`` timestamp is 0, its rows at the upsert's time, then a Delete of the same keys at that
time; see tests/e2e/test_handover_upsert.py, which reads a real one) can have another record
between them, a DDL of rootcoord's included. A TimeTick ``T`` says every record at or below
``T`` is written.

The records are pymilvus's ``msg_pb2`` requests as Milvus 2.3 writes them (a CreateCollection
with its schema as ``schema`` bytes and no database name), with the column data of
:func:`harness.streaming_writer.row_columns`, produced by :meth:`StreamingWriter.old_format`
(no streaming properties). Times are hybrid timestamps of a clock started two minutes ago, so a
CreateCollection is not waited on for the source catalog (there is none: the daemon learns the
collection from the record)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from pymilvus.grpc_gen import common_pb2, msg_pb2

from harness.streaming_writer import (
    LOGICAL_BITS,
    StreamingWriter,
    Written,
    collection_schema,
    row_columns,
)


class MsgstreamChannel:
    """A 2.3 pchannel ``<prefix>-rootcoord-dml_0`` of collections with one shard each."""

    def __init__(self, writer: StreamingWriter, prefix: str) -> None:
        self.writer = writer
        self.pchannel = f"{prefix}-rootcoord-dml_0"
        self.base = int(time.time() * 1000 - 120_000) << LOGICAL_BITS

    def at(self, ms: int) -> int:
        """The hybrid time ``ms`` milliseconds after the channel's start."""
        return self.base + (ms << LOGICAL_BITS)

    def vchannel(self, collection_id: int) -> str:
        return f"{self.pchannel}_{collection_id}v0"

    def tick(self, ms: int) -> Written:
        return self.writer.old_format(
            self.pchannel,
            msg_pb2.TimeTickMsg(
                base=common_pb2.MsgBase(
                    msg_type=common_pb2.TimeTick, timestamp=self.at(ms), sourceID=1
                )
            ),
        )

    def create_collection(
        self, collection_id: int, name: str, ms: int, partitions: Sequence[str] = ("_default",)
    ) -> Written:
        return self.writer.old_format(
            self.pchannel,
            msg_pb2.CreateCollectionRequest(
                base=common_pb2.MsgBase(
                    msg_type=common_pb2.CreateCollection, timestamp=self.at(ms)
                ),
                collectionName=name,
                collectionID=collection_id,
                schema=collection_schema(name).SerializeToString(),
                virtualChannelNames=[self.vchannel(collection_id)],
                physicalChannelNames=[self.pchannel],
                partitionNames=list(partitions),
            ),
        )

    def drop_collection(self, collection_id: int, name: str, ms: int) -> Written:
        return self.writer.old_format(
            self.pchannel,
            msg_pb2.DropCollectionRequest(
                base=common_pb2.MsgBase(msg_type=common_pb2.DropCollection, timestamp=self.at(ms)),
                collectionName=name,
                collectionID=collection_id,
            ),
        )

    def drop_partition(self, collection_id: int, name: str, partition: str, ms: int) -> Written:
        return self.writer.old_format(
            self.pchannel,
            msg_pb2.DropPartitionRequest(
                base=common_pb2.MsgBase(msg_type=common_pb2.DropPartition, timestamp=self.at(ms)),
                collection_name=name,
                partition_name=partition,
                collectionID=collection_id,
            ),
        )

    def insert(
        self,
        collection_id: int,
        name: str,
        pks: Sequence[int],
        ms: int,
        *,
        tag: str = "row",
        partition: str = "_default",
        upsert: bool = False,
    ) -> Written:
        """An Insert of ``pks`` at ``ms``; ``upsert``: an upsert's, whose ``MsgBase`` has no
        timestamp (its rows have)."""
        ts = self.at(ms)
        return self.writer.old_format(
            self.pchannel,
            msg_pb2.InsertRequest(
                base=common_pb2.MsgBase(msg_type=common_pb2.Insert, timestamp=0 if upsert else ts),
                shardName=self.vchannel(collection_id),
                collection_name=name,
                partition_name=partition,
                collectionID=collection_id,
                rowIDs=list(pks),
                timestamps=[ts] * len(pks),
                num_rows=len(pks),
                version=msg_pb2.ColumnBased,
                fields_data=row_columns(pks, tag=tag),
            ),
        )

    def delete(
        self, collection_id: int, name: str, pks: Sequence[int], ms: int, partition: str = ""
    ) -> Written:
        ts = self.at(ms)
        request = msg_pb2.DeleteRequest(
            base=common_pb2.MsgBase(msg_type=common_pb2.Delete, timestamp=ts),
            shardName=self.vchannel(collection_id),
            collection_name=name,
            partition_name=partition,
            collectionID=collection_id,
            timestamps=[ts] * len(pks),
            num_rows=len(pks),
        )
        request.primary_keys.int_id.data.extend(pks)
        return self.writer.old_format(self.pchannel, request)
