"""The Milvus 2.6 stream every upgrade run writes (bench/store_dumps.py, bench/upgrade.py, the
dump tests): ``CHANNELS`` pchannels on the Kafka mock, a live collection and a paused one, and
what the target must hold of the live one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.streaming_writer import StreamingWriter

CHANNELS = 2
LIVE_ID, PAUSED_ID = 71001, 71002
# test secrets of the dumps' tasks (test data: they guard nothing)
PASSWORD = "dump-target-Pa55-sealed-at-rest"
TOKEN = "dump-target-token-sealed-at-rest"


@dataclass
class Stream:
    """The 2.6 source: ``CHANNELS`` pchannels under ``prefix`` and what the target must hold of
    the live task's collection (primary key -> tag)."""

    writer: StreamingWriter
    prefix: str
    expected: dict[int, str] = field(default_factory=dict)
    collection_id: int = LIVE_ID  # the collection ``expected`` is of

    def pchannel(self, i: int) -> str:
        return f"{self.prefix}-rootcoord-dml_{i}"

    def vchannels(self, collection_id: int) -> list[str]:
        return [f"{self.pchannel(i)}_{collection_id}v{i}" for i in range(CHANNELS)]

    def tick_all(self) -> None:
        for i in range(CHANNELS):
            self.writer.time_tick(self.pchannel(i))

    def source_config(self, etcd: str, kafka: str) -> dict[str, Any]:
        return {
            "etcd": {"address": [etcd]},
            "etcdRootPath": f"{self.prefix}-meta",
            "channelPrefix": self.prefix,
            "kafka": {"address": kafka},
            "dmlChannelNum": CHANNELS,
        }

    def by_shard(self, pks: Sequence[int]) -> list[tuple[str, list[int]]]:
        """``pks`` by the vchannel each lives on (key mod ``CHANNELS``): as in Milvus, every
        write of one key goes to one shard, so its insert and its delete stay in order."""
        v = self.vchannels(self.collection_id)
        shards = [(v[i], [pk for pk in pks if pk % CHANNELS == i]) for i in range(CHANNELS)]
        return [(vchannel, keys) for vchannel, keys in shards if keys]

    def insert(self, first: int, last: int, tag: str = "row") -> None:
        """Rows ``first`` .. ``last - 1`` of the collection, in batches of 20, each on its
        shard."""
        for start in range(first, last, 20):
            for vchannel, pks in self.by_shard(range(start, min(start + 20, last))):
                self.writer.insert(vchannel, self.collection_id, pks, tag=tag)
                self.expected.update({pk: f"{tag}-{pk}" for pk in pks})
        self.tick_all()

    def upsert(self, pks: range, tag: str) -> None:
        for vchannel, keys in self.by_shard(pks):
            self.writer.upsert(vchannel, self.collection_id, keys, tag=tag)
            self.expected.update({pk: f"{tag}-{pk}" for pk in keys})
        self.tick_all()

    def delete(self, pks: range) -> None:
        for vchannel, keys in self.by_shard(pks):
            self.writer.delete(vchannel, self.collection_id, keys)
            for pk in keys:
                self.expected.pop(pk, None)
        self.tick_all()
