"""Encoding a Kafka target's row events on more than one core: worker processes turn an
insert's columns into its rows' events (``kafka_columns.insert_events``, the same code and so
the same bytes), while the task's own process keeps everything that decides order and
positions (reading, the sequencer, the commit and its position).

One pool per daemon (``encodeProcesses``; 0, the default, encodes in the task's process as
before). A channel's writer submits every insert of a batch before it logs the first, then
takes the results in the batch's order; while it waits for them it holds no interpreter lock,
so the task's other channels run meanwhile. What crosses to a process is the insert's request
as protobuf bytes and the names its events carry; what comes back is each row's key and
event body. An insert whose rows may pair with a delete of the same batch (an upsert) is
encoded in the task's process, where the pairing is.

A worker process is started with ``spawn`` (the daemon's threads and gRPC channels are not
copied into it); it imports only the codec and the Kafka event format. A failure in a worker
(a column of the wrong length, a process killed) is raised in the writer as it would have been
raised encoding in place: the batch is not written, the channel retries from its position.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from pymilvus.grpc_gen import msg_pb2

from replicator.sinks.kafka_columns import Entry, EventLog, Rows, insert_events

log = logging.getLogger(__name__)

# an insert's rows as encoded by a worker: their keys and event bodies, in row order
Encoded = tuple[list[bytes], list[bytes]]
# an insert of fewer rows is encoded in place: sending it costs about what encoding it does
MIN_ROWS = 256


@dataclass
class _Rows:
    """An event log of one insert (``kafka_columns.EventLog``), in a worker process."""

    events: list[Entry] = field(default_factory=list)

    def add_rows(self, rows: Rows) -> None:
        self.events.append(rows)


def encode_insert(
    request: bytes, db: str, collection: str, partition: str, pk_name: str, num_rows: int, ts: int
) -> Encoded:
    """In a worker: the insert's row events as ``insert_events`` makes them (no pairing)."""
    rows = _Rows()
    fields_data = msg_pb2.InsertRequest.FromString(request).fields_data
    insert_events(rows, "", db, collection, partition, pk_name, fields_data, num_rows, ts, {})
    keys: list[bytes] = []
    bodies: list[bytes] = []
    for entry in rows.events:  # without a delete to pair with, all of them are Rows
        assert isinstance(entry, Rows)
        keys += entry.keys
        bodies += entry.bodies
    return keys, bodies


class EncodePool:
    """The worker processes (see the module doc)."""

    def __init__(self, processes: int, min_rows: int = MIN_ROWS) -> None:
        self.processes = processes
        self.min_rows = min_rows
        self._futures: weakref.WeakSet[Future[Encoded]] = weakref.WeakSet()
        self._executor = ProcessPoolExecutor(
            max_workers=processes, mp_context=multiprocessing.get_context("spawn")
        )

    def submit(
        self,
        request: msg_pb2.InsertRequest,
        db: str,
        collection: str,
        partition: str,
        pk_name: str,
        num_rows: int,
        ts: int,
    ) -> Future[Encoded]:
        future: Future[Encoded]
        try:
            future = self._executor.submit(
                encode_insert,
                request.SerializeToString(),
                db,
                collection,
                partition,
                pk_name,
                num_rows,
                ts,
            )
        except BrokenProcessPool as exc:  # a worker died since: answered like its futures
            future = Future()
            future.set_exception(exc)
        self._futures.add(future)
        return future

    def warm_up(self) -> None:
        """Start every worker (an empty insert each; nothing waits for them)."""
        for _ in range(self.processes):
            self._executor.submit(encode_insert, b"", "", "", "", "", 0, 0)

    def worker_pids(self) -> list[int]:
        """The worker processes now (the executor keeps no public list of them)."""
        return list(getattr(self._executor, "_processes", None) or {})

    def owns(self, future: Future[Encoded]) -> bool:
        return future in self._futures

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def log_encoded(log: EventLog, topic: str, encoded: Encoded) -> int:
    """Log a worker's rows in a channel's ``log`` under ``topic``; the number of rows."""
    keys, bodies = encoded
    if keys:
        log.add_rows(Rows(topic, keys, bodies))
    return len(keys)


def encoded_rows(future: Future[Encoded]) -> Encoded | None:
    """A worker's rows; None when the pool broke (a worker process died): the insert is then
    encoded in place, and the next batch starts a new pool. Any other failure is raised."""
    try:
        return future.result()
    except BrokenProcessPool as exc:
        log.warning("an encoding process ended (%s); encoding in the task's process", exc)
        _broken(future)
        return None


def unpaired(events: Sequence[Any], delete_type: type) -> int:
    """How many of a batch's events come before its first delete (their inserts cannot pair
    with a delete of the batch: they may be encoded by the pool)."""
    for n, event in enumerate(events):
        if isinstance(event, delete_type):
            return n
    return len(events)


_lock = threading.Lock()
_pool: EncodePool | None = None
_processes = 0


def configure(processes: int) -> None:
    """The daemon's setting (``encodeProcesses``), at its start: the processes start now, in
    the background (each imports the codec, about a second of CPU, before the first batch
    needs it); 0 closes them."""
    global _processes
    with _lock:
        _processes = processes
    if processes <= 0:
        _close()
        return
    pool = shared_pool()
    if pool is not None:
        pool.warm_up()


def _close() -> None:
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None


def _broken(future: Future[Encoded]) -> None:
    """Drop the broken pool (its futures all fail alike): the next caller starts another."""
    global _pool
    with _lock:
        if _pool is not None and _pool.owns(future):
            _pool.close()
            _pool = None


def shared_pool() -> EncodePool | None:
    """The daemon's pool, started now if needed; None when encoding stays in the process."""
    global _pool
    with _lock:
        if _processes <= 0:
            return None
        if _pool is None:
            _pool = EncodePool(_processes)
            log.info("encoding Kafka events in %d worker processes", _processes)
        return _pool


__all__ = [
    "EncodePool",
    "configure",
    "encode_insert",
    "encoded_rows",
    "log_encoded",
    "shared_pool",
    "unpaired",
]
