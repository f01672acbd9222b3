"""What the channel workers of one task share: the task's collections, its target connection,
its state in the metastore, the barriers between channels, and the DDL appliers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from metastore import MetaStore
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.barriers import Barriers
from replicator.pipeline.broadcast_ddl import BroadcastDdl
from replicator.pipeline.collection_ddl import CollectionDdl
from replicator.pipeline.imports import TaskImports
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.stream_ddl import StreamDdlApplier
from replicator.pipeline.task_state import RunnerState
from replicator.pipeline.timings import TaskTimings
from replicator.pipeline.wal_backend import OpenWal
from replicator.sinks.milvus import MilvusTarget


@dataclass
class TaskContext:
    task_id: str
    store: MetaStore
    state: RunnerState
    registry: CollectionRegistry
    target: MilvusTarget
    stop: threading.Event  # set to stop every worker of the task
    barriers: Barriers
    collections: CollectionDdl
    broadcasts: BroadcastDdl
    # the source's WAL on another backend after it switched; None: switches are not followed
    open_wal: OpenWal | None = None
    # the task's creation as a hybrid timestamp: a record older than it about a collection
    # nobody knows is history (of a collection dropped before the task)
    task_ts: int = 0
    read_ahead: int = 2  # read batches a channel reads ahead of the target
    # where the lag goes (the runner's, kept across reconnects; shown on /metrics)
    timings: TaskTimings = field(default_factory=TaskTimings)

    @classmethod
    def build(
        cls,
        task_id: str,
        store: MetaStore,
        registry: CollectionRegistry,
        target: MilvusTarget,
        stop: threading.Event,
        *,
        describe: Callable[[int], CollectionMeta | None] = lambda _collection_id: None,
        ddl: StreamDdlApplier | None = None,
        open_wal: OpenWal | None = None,
        task_ts: int = 0,
        read_ahead: int = 2,
        imports: TaskImports | None = None,
        timings: TaskTimings | None = None,
        ddl_lock: AbstractContextManager[Any] | None = None,
    ) -> TaskContext:
        """``describe``: one collection of the source catalog (for what a CreateCollection
        record lacks); ``ddl``: the applier of the 2.6 DDL beyond collections and partitions
        (None: skipped); ``ddl_lock``: the DDL lock shared by a task's channel groups."""
        state = RunnerState(store, task_id)
        barriers = Barriers(state, registry, ddl_lock)
        collections = CollectionDdl(registry, target, state, barriers, describe, stop)
        broadcasts = BroadcastDdl(collections, barriers, registry, state, ddl, stop, imports)
        return cls(
            task_id,
            store,
            state,
            registry,
            target,
            stop,
            barriers,
            collections,
            broadcasts,
            open_wal,
            task_ts,
            read_ahead,
            timings if timings is not None else TaskTimings(),
        )
