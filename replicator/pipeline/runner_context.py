"""What a task's runner needs from the daemon (:class:`RunnerContext`): the source, its catalog
and channels, how a target is opened, the WAL a source switches to, the backfill launcher, the
bulk imports and the pool of threads, built once per named source from the settings
(``server/tasks/engine.py``). Disaster recovery reads a source through it too, without a runner
(``server/dr``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from metastore import TaskRecord
from replicator.backfill.phase import DriverLauncher
from replicator.fibers import FiberPool, shared_pool
from replicator.meta.catalog import AliasMeta, CollectionMeta
from replicator.meta.imports import SourceImport
from replicator.pipeline.imports import TaskImports
from replicator.pipeline.wal_backend import OpenWal
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.targets import open_target
from replicator.sources.base import WalSource


@dataclass
class RunnerContext:
    """What a runner needs from the daemon, built once from its settings."""

    source: Callable[[], WalSource]
    catalog: Callable[[], dict[int, CollectionMeta]]
    channels: list[str]
    default_partition: str = "_default"
    target_factory: Callable[[TaskRecord], MilvusTarget] = open_target
    # the source's aliases (etcd only in 2.3-2.5); None: aliases are not mirrored
    aliases: Callable[[], list[AliasMeta]] | None = None
    # one collection (cheaper than the whole catalog); None: taken from the whole catalog
    collection: Callable[[int], CollectionMeta | None] | None = None
    # a WAL the source switched to: (kind, settings the switch message carried) -> source
    open_wal: OpenWal | None = None
    # how to launch a backfill job's driver; None: the daemon cannot backfill
    backfill: DriverLauncher | None = None
    # read batches a channel reads ahead of the target (sourceConfig.readChanLen)
    read_ahead: int = 2
    # the source's bulk imports (its etcd); None: not followed (2.6 Import messages still are)
    imports: Callable[[], list[SourceImport]] | None = None
    # why the daemon cannot backfill ("" when it can): imports then wait for an operator
    backfill_blocker: str = ""
    # asks the source whether it serves a completed import's segments (a copy waits for it);
    # None: the daemon cannot ask (no sourceConfig.milvus.uri) and imports wait for an operator
    import_serving: Callable[[TaskImports], None] | None = None
    # the threads every task's fibers run on (one pool per daemon)
    pool: FiberPool = field(default_factory=shared_pool)
    # a channel group's process (replicator.sinks.kafka_groups): its name ("": the task runs in
    # the daemon), whether it reads the replicate channel, and the task's DDL lock it shares
    group: str = ""
    replicate_channel: bool = True
    ddl_lock: AbstractContextManager[Any] | None = None
