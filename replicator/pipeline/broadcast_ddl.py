"""A released 2.6 DDL or control record, applied once for its whole broadcast.

The worker hands over every 2.6 record that is not data, in tick order with the data. Here it
is decoded (a :class:`StreamDdl` into its typed operation), its broadcast's turn is taken (see
:mod:`barriers`), and it is applied: collections and partitions by :mod:`collection_ddl`, the
rest (databases, aliases, indexes, load, alter/rename, truncate, RBAC) by
:mod:`stream_ddl`. Nothing is acknowledged on the source.
"""

from __future__ import annotations

import logging
import threading

from replicator.codec.streaming_ddl import decode_ddl
from replicator.codec.streaming_ddl_ops import AlterCollection, CreateIndex, DdlOp, ImportJob
from replicator.codec.streaming_events import (
    FlushAll,
    ManualFlush,
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDdl,
    StreamDropCollection,
    StreamDropPartition,
)
from replicator.codec.wire import WireError
from replicator.errors import TaskFailedError
from replicator.events import Event
from replicator.pipeline.barriers import Barriers
from replicator.pipeline.collection_ddl import CollectionDdl
from replicator.pipeline.imports import TaskImports
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.sequencer import meta_of
from replicator.pipeline.status import ChannelState, ChannelStatus
from replicator.pipeline.stream_ddl import StreamDdlApplier
from replicator.pipeline.task_state import RunnerState

log = logging.getLogger(__name__)


class BroadcastDdl:
    def __init__(
        self,
        collections: CollectionDdl,
        barriers: Barriers,
        registry: CollectionRegistry,
        state: RunnerState,
        applier: StreamDdlApplier | None,
        stop: threading.Event,
        imports: TaskImports | None = None,
    ) -> None:
        self._collections = collections
        self._barriers = barriers
        self._registry = registry
        self._state = state
        self._applier = applier  # None: only collections and partitions are replicated
        self._stop = stop
        self._imports = imports

    def apply(self, event: Event, pchannel: str, status: ChannelStatus) -> None:
        meta = meta_of(event)
        assert meta is not None
        if self._applier is not None and isinstance(
            event, (StreamCreateCollection, StreamCreatePartition, StreamDropPartition)
        ):
            self._applier.names.observe(event)
        op = self._decode(event, pchannel) if isinstance(event, StreamDdl) else None
        # a drop, and a flush (which seals what every vchannel holds before it), apply at the
        # last copy
        barrier = isinstance(
            event, (StreamDropCollection, StreamDropPartition, ManualFlush, FlushAll)
        ) or (op is not None and op.barrier)
        with self._barriers.ddl_lock:
            turn = self._barriers.turn(meta, barrier)
            if turn:
                self._apply(event, op)
                self._barriers.applied(meta)
        if (
            not turn
            and isinstance(event, StreamCreateCollection)
            and not self._registry.settled(event.collection_id)
        ):
            # applied by another process's copy (a channel group's): this process learns the
            # collection from its own copy, or its channels' rows of it would find it unknown
            # (the target, asked again, answers that it exists and announces nothing)
            self._collections.create(event, self._collections.describe(event.collection_id))
        # After a truncate or a partition drop the collection or partition lives on: a channel
        # that reached its copy first waits for the barrier, or what it writes next would be
        # wiped when the last channel gets there
        holds = isinstance(event, StreamDropPartition) or (
            isinstance(event, StreamDdl) and event.type_name == "TruncateCollection"
        )
        if not turn and barrier and holds and meta.broadcast is not None:
            status.set_state(ChannelState.WAITING, f"for every vchannel to reach {meta.type_name}")
            self._barriers.wait_applied(meta, self._stop)
            status.set_state(ChannelState.RUNNING)

    def _decode(self, event: StreamDdl, pchannel: str) -> DdlOp:
        try:
            return decode_ddl(event)
        except WireError as exc:
            raise TaskFailedError(
                f"channel {pchannel}: undecodable 2.6 {event.type_name} at ts {event.ts}: {exc}"
            ) from exc

    def _apply(self, event: Event, op: DdlOp | None) -> None:
        """``op``: the decoded StreamDdl (None for the other records)."""
        if isinstance(event, StreamCreateCollection):
            # a 2.6 record names its database; the catalog adds the consistency level
            self._collections.create(event, self._collections.describe(event.collection_id))
        elif op is not None:
            self._apply_op(op)
        elif isinstance(event, StreamDropCollection):
            self._collections.drop(event.collection_id)
        elif isinstance(event, StreamDropPartition):
            self._collections.drop_partition(event.collection_id, event.partition_name)
        elif isinstance(event, StreamCreatePartition):
            self._collections.create_partition(event.collection_id, event.partition_name)
        elif isinstance(event, ManualFlush):
            self._collections.flush([event.collection_id])
        elif isinstance(event, FlushAll):
            self._collections.flush(None)
        else:
            log.warning("2.6 %s record not applied", type(event).__name__)

    def _apply_op(self, op: DdlOp) -> None:
        """A rename moves the task's collection too; an index the task made is remembered
        (the WAL names it only by id afterwards)."""
        collection = self._registry.resolve(op.collection_id) if op.collection_id else None
        if isinstance(op, ImportJob):
            if collection is not None and self._imports is not None:
                self._imports.add(op, f"{collection.db}.{collection.name}")
            return
        if self._applier is None:
            log.warning("2.6 %s is not replicated by this runner; skipped", op.type_name)
            return
        outcome = self._applier.apply(op)
        if isinstance(op, CreateIndex) and collection is not None:
            known = self._applier.names.index(op.collection_id, op.index.index_id)
            if known is not None:
                self._state.remember_index(op.collection_id, op.index.index_id, *known)
        if (
            isinstance(op, AlterCollection)
            and {"name", "db"} & op.changes
            and collection is not None
            and outcome.status in ("applied", "unchanged")
        ):
            new_db = self._applier.names.database(op.new_db_name) if op.new_db_name else None
            collection.db = new_db or collection.db
            collection.name = op.new_name or collection.name
