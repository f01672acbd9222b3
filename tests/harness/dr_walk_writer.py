"""The walk's writers (:mod:`harness.dr_walk`): a thread per flow inserting rows into the
cluster it is pointed at, every acknowledged key kept with its cluster and time, and the read of
a collection's keys the invariants compare."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pymilvus import MilvusClient

from harness.dr_clusters import row

BATCH = 5  # rows per insert of a writer
WRITE_TIMEOUT = 5.0  # seconds a writer's insert waits for its answer
KEY_CHUNK = 16_000  # keys per query of primary_keys
FIRST_ROWS = 100  # keys 0..99, written before the tasks


@dataclass(frozen=True)
class Ack:
    cluster: str  # the cluster that acknowledged the write
    at: float  # when the insert returned, by this host's clock (the clusters' clock too)


class MovingWriter(threading.Thread):
    """Inserts ``BATCH`` rows at a time into one collection of the cluster it is pointed at,
    until stopped; ``acked`` holds every acknowledged key with its cluster and time."""

    def __init__(self, collection: str, uris: dict[str, str], at: str, first: int) -> None:
        super().__init__(daemon=True, name=f"writer-{collection}")
        self.collection = collection
        self.uris = uris
        self.at = at
        self.first = first
        self.next = first
        self.acked: dict[int, Ack] = {}
        self.refused: dict[str, int] = {}
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._clients: dict[str, MilvusClient] = {}

    def key_ranges(self) -> list[range]:
        """Every key written so far, or being written: the rows before the tasks, then the
        writer's (one batch past what it acknowledged)."""
        return [range(FIRST_ROWS), range(self.first, self.next + BATCH)]

    def move_to(self, label: str) -> None:
        self.at = label

    def snapshot(self) -> dict[int, Ack]:
        with self._lock:
            return dict(self.acked)

    def _client(self, label: str) -> MilvusClient:
        if label not in self._clients:
            self._clients[label] = MilvusClient(uri=self.uris[label], dedicated=True, timeout=5)
        return self._clients[label]

    def run(self) -> None:
        while not self.stop.is_set():
            label = self.at
            keys = list(range(self.next, self.next + BATCH))
            try:
                self._client(label).insert(
                    self.collection, [row(k) for k in keys], timeout=WRITE_TIMEOUT
                )
            except Exception:  # noqa: BLE001 - a fenced or lost cluster refuses in many ways
                self.refused[label] = self.refused.get(label, 0) + 1
                client = self._clients.pop(label, None)
                if client is not None:
                    client.close()
                time.sleep(0.3)
                continue
            acked = Ack(label, time.time())
            with self._lock:
                self.acked.update(dict.fromkeys(keys, acked))
            self.next += BATCH
            time.sleep(0.1)
        for client in self._clients.values():
            client.close()


def primary_keys(client: MilvusClient, collection: str, ranges: Sequence[range]) -> set[int]:
    """The primary keys of ``collection`` within ``ranges``, read with Strong consistency in
    key ranges of at most ``KEY_CHUNK`` (a query answers 16,384 rows at most; the query
    iterator's hints make 2.3.5 skip keys and read stale, replicator/backfill/transfer.py)."""
    keys: set[int] = set()
    for whole in ranges:
        for lo in range(whole.start, whole.stop, KEY_CHUNK):
            hi = min(lo + KEY_CHUNK, whole.stop)
            found = client.query(
                collection,
                filter=f"id >= {lo} and id < {hi}",
                output_fields=["id"],
                limit=hi - lo,
                consistency_level="Strong",
                timeout=30,
            )
            keys.update(int(r["id"]) for r in found)
    return keys


def sample_keys(keys: set[int]) -> list[int]:
    return sorted(keys)[:8]
