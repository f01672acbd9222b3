"""The workers of one connection of a task's runner (:mod:`runner`): a channel worker per DML
pchannel, reading from its start on the WAL the source had there (:func:`source_at`), and a
replicate worker for the replicate channel when the task reads one. Each runs in a fiber of
its own."""

from __future__ import annotations

from metastore import Position
from replicator.pipeline.bootstrap import source_at
from replicator.pipeline.checkpoint import ChannelCheckpoint
from replicator.pipeline.context import TaskContext
from replicator.pipeline.replicate_worker import ReplicateWorker
from replicator.pipeline.selection import TaskSelection
from replicator.pipeline.status import ChannelStatus
from replicator.pipeline.task_state import RunnerState
from replicator.pipeline.wal_backend import OpenWal
from replicator.pipeline.worker import ChannelWorker
from replicator.sources.base import WalSource

Worker = ChannelWorker | ReplicateWorker


def task_workers(
    task: TaskContext,
    source: WalSource,
    state: RunnerState,
    statuses: dict[str, ChannelStatus],
    dml: dict[str, Position],
    replicate: tuple[str, Position] | None,
    *,
    open_wal: OpenWal | None,
    selection: TaskSelection,
) -> list[Worker]:
    """A worker per DML pchannel of ``dml`` (its start) and, with ``replicate`` (the replicate
    channel and its start), one for the replicate channel."""
    workers: list[Worker] = [
        ChannelWorker(
            task,
            source_at(source, state, open_wal, pchannel, start),
            pchannel,
            start,
            statuses[pchannel],
        )
        for pchannel, start in dml.items()
    ]
    if replicate is not None:
        rpc_channel, start = replicate
        checkpoint = ChannelCheckpoint(
            task.store,
            state,
            task.task_id,
            rpc_channel,
            source.backend,
            start,
            None,  # the replicate channel carries calls, no data
            source.offset_of,
        )
        workers.append(
            ReplicateWorker(
                task,
                checkpoint,
                statuses[rpc_channel],
                source.open_channel,
                selection=selection,
            )
        )
    return workers
