"""What a runner knows before its workers start: the task's collections, and where each channel
starts reading.

- **Collections** come from the source catalog (2.3-2.5: etcd) and from what the task learnt
  from the WAL and kept in its state (2.6 collections, or collections the catalog dropped while
  their data is still to be read). Each selected one is registered and made on the target.
- **Where a new task starts** on a channel: at the creation of the earliest selected collection
  on it when the queue still holds it (so rows written before the task are copied); when
  retention has removed it, at the end of the queue, as it was *before* the catalog was read
  (a collection created in between is then in the catalog or after the start), and the history
  is reported lost. With a backfill of every selected collection: at the end.
- **The replicate channel** starts at its oldest record: earlier index and load calls of the
  selected collections are made again (they are idempotent).
- **A switched channel** is read on the WAL its saved position names.
"""

from __future__ import annotations

from dataclasses import dataclass

from metastore import MetaStore, Position
from replicator.errors import SourceConfigError, TaskFailedError
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.collection_ddl import make_on_target
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.selection import TaskSelection
from replicator.pipeline.stream_ddl import TaskNames
from replicator.pipeline.task_state import RunnerState
from replicator.pipeline.wal_backend import OpenWal, parse_backend
from replicator.sinks.milvus import MilvusTarget
from replicator.sources.base import WalSource


def register_collections(
    registry: CollectionRegistry,
    names: TaskNames,
    target: MilvusTarget,
    catalog: dict[int, CollectionMeta],
    state: RunnerState,
) -> None:
    """Register the selected collections of the catalog and of the task's memory, and make
    them on the target (unless they exist)."""
    remembered = state.collections()
    known_ids = {meta.collection_id for meta in remembered}
    for meta in [*catalog.values(), *remembered]:
        if meta.dropped or meta.creating or registry.wanted(meta.collection_id):
            continue
        names.remember_schema(meta.collection_id, meta.schema)
        for index_id, (field_name, index_name) in state.indexes(meta.collection_id).items():
            names.remember_index(meta.collection_id, index_id, field_name, index_name)
        for partition_id, partition in meta.partitions.items():
            names.remember_partition(meta.collection_id, partition_id, partition)
        collection = registry.add(
            meta.collection_id, meta.db_name, meta.name, meta.schema, meta.pchannels
        )
        if collection is not None:
            if meta.collection_id not in known_ids:
                # kept: after a restart its data is placed even once the catalog dropped it
                state.remember_collection(meta)
            make_on_target(target, registry, collection, meta)


@dataclass
class ChannelStarts:
    positions: dict[str, Position]  # per DML channel
    history_lost: list[str]  # channels whose selected history the queue no longer holds


def channel_starts(
    store: MetaStore,
    task_id: str,
    source: WalSource,
    channels: list[str],
    saved: dict[str, Position],
    watermarks: dict[str, tuple[int, int]],
    catalog: dict[int, CollectionMeta],
    selection: TaskSelection,
    *,
    at_end: bool,
) -> ChannelStarts:
    """The saved positions, and for channels without one the initial position, saved now.
    ``watermarks``: the channels' ends read before the catalog; ``at_end``: a backfill copies
    the history."""
    starts = ChannelStarts({}, [])
    for pchannel in channels:
        start = saved.get(pchannel)
        if start is None:
            marks = watermarks.get(pchannel) or source.watermarks(pchannel)
            start, lost = initial_position(source, pchannel, marks, catalog, selection, at_end)
            if lost:
                starts.history_lost.append(pchannel)
            store.save_position(task_id, start, None)
        starts.positions[pchannel] = start
    return starts


def initial_position(
    source: WalSource,
    pchannel: str,
    watermarks: tuple[int, int],
    catalog: dict[int, CollectionMeta],
    selection: TaskSelection,
    at_end: bool = False,
) -> tuple[Position, bool]:
    """Where a new task starts on a channel (see the module docstring); the flag tells that
    selected history was lost."""
    earliest, latest = watermarks
    if not at_end:
        created = [
            source.offset_of(meta.start_positions[pchannel])
            for meta in catalog.values()
            if not meta.dropped
            and not meta.creating
            and selection.selects(meta.db_name, meta.name)
            and pchannel in meta.start_positions
        ]
        lost = bool(created) and min(created) < earliest
        if created and not lost:
            return position_before_offset(source, pchannel, min(created)), False
        return position_before_offset(source, pchannel, latest), lost
    return position_before_offset(source, pchannel, latest), False


def replicate_start(
    store: MetaStore,
    task_id: str,
    source: WalSource,
    pchannel: str,
    saved: Position | None,
    *,
    at_end: bool = False,
) -> Position:
    """The replicate channel's start: its saved position, else before its oldest record (or,
    ``at_end``, after its last one: a task started at the WAL's end)."""
    if saved is not None:
        return saved
    earliest, latest = source.watermarks(pchannel)
    start = position_before_offset(source, pchannel, latest if at_end else earliest)
    store.save_position(task_id, start, None)
    return start


def position_before_offset(source: WalSource, pchannel: str, offset: int) -> Position:
    """A position to resume after so that ``offset`` is read next; with an empty message id
    when that is the channel's first record (readers then start at the beginning)."""
    msg_id = source.position_before(offset)
    return Position(source.backend, pchannel, msg_id or b"", 0)


def source_at(
    source: WalSource,
    state: RunnerState,
    open_wal: OpenWal | None,
    pchannel: str,
    start: Position | None,
) -> WalSource:
    """The WAL a saved position is on: the configured source, or one it switched to."""
    if start is None or parse_backend(start.backend)[1] == 0:
        return source
    switch = state.recorded_switch(pchannel, start.backend)
    if open_wal is None:
        raise TaskFailedError(f"channel {pchannel}: cannot open {start.backend}")
    try:
        return open_wal(switch.kind, switch.config)
    except SourceConfigError as exc:
        raise TaskFailedError(f"channel {pchannel}: {exc}") from exc
