"""The replication runner of one task: a worker thread per source pchannel.

A worker reads its channel, decodes, and collects DML until a TimeTick; then it applies the
batch to the target and saves the tick's position. Commit order, per channel:

    1. persist the in-flight bound (offset of the batch's last record)   put_state
    2. write the batch to the target; it acknowledges each request       MilvusTarget
    3. persist the position (the TimeTick after the batch)                save_position

A crash between 1 and 3 leaves a saved position before the batch and a bound at its end: after
a restart the worker re-reads the batch and writes its inserts as upserts, so rows the target
already has are replaced, never doubled (deletes and DDL are idempotent anyway). A crash before
1 re-reads records the target never saw and writes them as plain inserts.

Source and target outages are retried with backoff (the task stays Running, its lag grows); an
undecodable record or a write the target rejects fails the task with a reason naming the
channel, the position and the cause.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from metastore import (
    ConcurrentUpdateError,
    MetaStore,
    MetaStoreError,
    Position,
    PositionConflictError,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)
from replicator.backfill.handover import group_start
from replicator.backfill.phase import BackfillPhase, DriverLauncher
from replicator.backfill.state import BackfillJob, BackfillState, CollectionRef
from replicator.codec.replicate import RpcEvent, decode_replicate
from replicator.codec.streaming import decode_any
from replicator.codec.streaming_ddl import AlterCollection, CreateIndex, DdlOp, decode_ddl
from replicator.codec.streaming_events import (
    AlterWAL,
    ManualFlush,
    MqSwitchAnnounced,
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDdl,
    StreamDropCollection,
    StreamDropPartition,
    StreamMeta,
)
from replicator.codec.wire import WireError
from replicator.events import (
    CreateCollection,
    Delete,
    DropCollection,
    DropPartition,
    Event,
    FailedRecord,
    Insert,
    RawRecord,
    Skipped,
    TimeTick,
)
from replicator.log_context import log_context
from replicator.meta.catalog import COLLECTION_CREATED, DEFAULT_DB, AliasMeta, CollectionMeta
from replicator.pipeline.aliases import AliasMirror
from replicator.pipeline.apply import BatchApplier, TargetCollection
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.selection import WILDCARD, TaskSelection
from replicator.pipeline.sequencer import ChannelSequencer, Pending, meta_of
from replicator.pipeline.stream_ddl import StreamDdlApplier, TaskNames
from replicator.pipeline.wal_switch import (
    UnfollowableSwitchError,
    WalSwitch,
    describe_config,
    local_copies,
    parse_backend,
    record_switch,
    recorded_switch,
    requested_switch,
)
from replicator.sinks.base import SinkError, TargetRejectedError
from replicator.sinks.milvus import MilvusTarget, is_unimplemented
from replicator.sources.base import (
    ChannelReader,
    SourceUnavailableError,
    WalSource,
    WalTruncatedError,
)
from replicator.sources.factory import SourceConfigError
from replicator.sources.prefetch import PrefetchingReader
from replicator.task_runner import FailureCallback

log = logging.getLogger(__name__)

READ_BATCH = 1000
READ_TIMEOUT = 0.2
IDLE_SAVE_SECONDS = 5.0
MAX_BACKOFF = 30.0
WARNINGS_KEY = "warnings"


class TaskFailedError(Exception):
    """Stops the task: needs an operator."""


@dataclass
class ChannelStatus:
    pchannel: str
    rows: int = 0
    bytes: int = 0
    position: Position | None = None
    # the source time (hybrid ts) up to which everything on the channel is on the target
    applied_ts: int = 0
    state: str = "starting"
    # DML channels carry time ticks; the replicate channel does not, so the age of its last
    # record says nothing about lag and it is left out of it
    has_ticks: bool = True
    # read to the end with nothing waiting: a 2.6 pchannel with no writes has no ticks either,
    # and its last tick's age is no lag
    caught_up: bool = False

    @property
    def lag_seconds(self) -> float | None:
        """Source time not yet on the target; None until the channel's first time tick. It is
        computed when asked, so a stuck worker shows a growing lag."""
        if not self.applied_ts or not self.has_ticks:
            return None
        if self.caught_up:
            return 0.0
        return max(0.0, time.time() - (self.applied_ts >> 18) / 1000)

    def view(self) -> dict[str, Any]:
        return {
            "channel": self.pchannel,
            "state": self.state,
            "rows": self.rows,
            "bytes": self.bytes,
            "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
            "position": None if self.position is None else self.position.to_json(),
        }


@dataclass
class RunnerContext:
    """What a runner needs from the daemon, built once from its settings."""

    source: Callable[[], WalSource]
    catalog: Callable[[], dict[int, CollectionMeta]]
    channels: list[str]
    default_partition: str = "_default"
    target_factory: Callable[[dict[str, Any]], MilvusTarget] = MilvusTarget
    # the source's aliases (etcd only in 2.3-2.5); None: aliases are not mirrored
    aliases: Callable[[], list[AliasMeta]] | None = None
    # one collection (cheaper than the whole catalog); None: taken from the whole catalog
    collection: Callable[[int], CollectionMeta | None] | None = None
    # a WAL the source switched to: (kind, settings the switch message carried) -> source
    open_wal: Callable[[str, Mapping[str, str]], WalSource] | None = None
    # how to launch a backfill job's driver; None: the daemon cannot backfill
    backfill: DriverLauncher | None = None


@dataclass
class _Shared:
    task_id: str
    store: MetaStore
    registry: CollectionRegistry
    target: MilvusTarget
    stop: threading.Event
    ddl_lock: threading.Lock = field(default_factory=threading.Lock)
    # one collection of the source catalog, for what a CreateCollection record does not carry
    describe: Callable[[int], CollectionMeta | None] = lambda _collection_id: None
    # the source's WAL on another backend (kind, settings from the switch message), after the
    # source switched its message queue; None: switches are not followed
    open_wal: Callable[[str, Mapping[str, str]], WalSource] | None = None
    # the 2.6 DDL beyond collections and partitions (databases, aliases, indexes, load,
    # alter/truncate, RBAC); None: such records are skipped
    ddl: StreamDdlApplier | None = None
    # broadcasts applied, for channels waiting at a barrier (see _wait_for_broadcast)
    broadcasts: threading.Condition = field(default_factory=threading.Condition)
    done_broadcasts: set[int] = field(default_factory=set)


class ChannelWorker:
    def __init__(
        self,
        shared: _Shared,
        source: WalSource,
        backend: str,
        pchannel: str,
        start: Position | None,
        saved: Position | None,
        status: ChannelStatus,
    ) -> None:
        self.shared = shared
        self.source = source
        self.backend = backend
        self.pchannel = pchannel
        self.start = start  # where reading begins (after it)
        self.saved = saved  # what the metastore holds (for compare-and-set)
        self.status = status
        self.applier = BatchApplier(shared.target, shared.registry.resolve)
        store_value = shared.store.get_state(shared.task_id, self._inflight_key)
        self.replay_until = int(store_value) if store_value else -1
        self.inflight = self.replay_until
        self.sequencer = ChannelSequencer(pchannel)
        # 2.6 collections whose CreateCollection was read here but is not applied yet
        self._announced: set[int] = set()

    @property
    def _inflight_key(self) -> str:
        return f"inflight/{self.pchannel}"

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        backoff = 1.0
        while not self.shared.stop.is_set():
            reader: ChannelReader | None = None
            try:
                start = self.start if self.start is None or self.start.msg_id else None
                reader = PrefetchingReader(
                    self.source.open_channel(self.pchannel, start), READ_BATCH
                )
                self.status.state = "running"
                if self._consume(reader):
                    continue  # the source switched its WAL: go on there
                return
            except WalTruncatedError as exc:
                raise TaskFailedError(f"channel {self.pchannel}: {exc}") from exc
            except (SourceUnavailableError, SinkError, MetaStoreError) as exc:
                if isinstance(exc, (TaskNotFoundError, PositionConflictError)):
                    raise
                if not getattr(exc, "retriable", False):
                    raise TaskFailedError(
                        f"channel {self.pchannel}, reading {self._where()}: {exc}"
                    ) from exc
                self.status.state = f"retrying: {exc}"
                log.warning("retrying in %.0f s: %s", backoff, exc)
                self.start = self.saved  # re-read what was not committed
                self.shared.stop.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
            finally:
                if reader is not None:
                    reader.close()

    def _where(self) -> str:
        if self.saved is None:
            return "from the beginning"
        return f"after position {self.saved.msg_id.hex()} (ts {self.saved.ts})"

    def _consume(self, reader: ChannelReader) -> bool:
        """Release events by time tick (see :mod:`replicator.pipeline.sequencer`): at a tick
        ``t`` every event with ``ts <= t`` is final (no later record can be older) and is
        applied in (ts, delete-first) order; younger events wait for a later tick. An upsert's
        Insert and Delete share one timestamp but a tick can fall between them, so a batch cut
        at the tick alone would apply the Insert, then the Delete, and lose the row. The saved
        position never passes a waiting event or an open transaction. True when the source
        switched its WAL and this channel now reads it from the new backend."""
        seq = ChannelSequencer(self.pchannel, self.saved.ts if self.saved else 0)
        self.sequencer = seq
        last: RawRecord | None = None
        last_save = time.monotonic()
        while not self.shared.stop.is_set():
            # Events released by the ticks of one read are written together when the read is
            # done: a worker behind its channel then writes few large requests, not one per
            # tick (a read holds at most about READ_BYTES).
            ready: list[Pending] = []
            commit_at: bytes | None = None  # the position once ``ready`` is on the target
            applied_to = 0
            changed = False  # something was applied during this read: save the position
            records = reader.read_batch(READ_BATCH, READ_TIMEOUT)
            self.status.caught_up = not records and not seq.waiting()
            for record in records:
                before = last.msg_id if last is not None else self._saved_msg_id()
                last = record
                event = decode_any(record, self.backend, self._wanted)
                if isinstance(event, FailedRecord):
                    raise TaskFailedError(
                        f"channel {self.pchannel} at offset {record.offset}: {event.reason}"
                    )
                switching = isinstance(event, (MqSwitchAnnounced, AlterWAL))
                if switching:
                    # Nothing older follows a switch copy on the old WAL (the switch holds the
                    # cluster's exclusive lock, and AlterWAL is the backend's last record):
                    # the copy releases like a tick
                    seq.add(Pending(record.offset, event, before))
                if isinstance(event, TimeTick) or switching:
                    released = seq.release(event.ts)
                    for i, item in enumerate(released):
                        if isinstance(item.event, (Insert, Delete)):
                            ready.append(item)
                            continue
                        # 2.6 DDL and control, in tick order with the data
                        self._commit(ready, None, seq.tick)
                        ready = []
                        changed = True
                        if isinstance(item.event, (MqSwitchAnnounced, AlterWAL)):
                            switch = self._switch_point(item.event)
                            if switch is not None:
                                self._switch(switch, len(released) - i - 1)
                                return True
                            continue
                        self._apply_stream_control(item.event)
                    oldest = seq.resume_point()
                    commit_at = oldest.before if oldest is not None else record.msg_id
                    # everything up to the oldest waiting event is on the target once written
                    applied_to = seq.applied_to()
                elif meta_of(event) is None:
                    if isinstance(event, (Insert, Delete)):
                        seq.add(Pending(record.offset, event, before))
                    elif isinstance(event, (CreateCollection, DropCollection, DropPartition)):
                        # DML older than the DDL goes first; a drop's barrier needs it applied
                        self._commit(ready + seq.take_older(event.ts), commit_at, seq.tick)
                        ready, commit_at = [], None
                        self._apply_ddl(event)
                elif not isinstance(event, Skipped):
                    if isinstance(event, StreamCreateCollection):
                        self._announce(event)
                    seq.add(Pending(record.offset, event, before))
            if commit_at is not None and (
                ready or changed or time.monotonic() - last_save > IDLE_SAVE_SECONDS
            ):
                self._commit(ready, commit_at, seq.tick)
                last_save = time.monotonic()
            if applied_to:
                self.status.applied_ts = max(self.status.applied_ts, applied_to)
        # stopping: events still waiting for their tick are re-read after a restart
        if last is not None and not seq.waiting() and last.offset > self._saved_offset():
            self._commit([], last.msg_id, seq.tick)
        return False

    def _wanted(self, collection_id: int) -> bool:
        """Decode this collection's data? Selected and known, or announced by a 2.6
        CreateCollection read on this channel and not yet applied (its data follows it in the
        channel but the creation waits for a tick)."""
        return self.shared.registry.wanted(collection_id) or collection_id in self._announced

    def _announce(self, event: StreamCreateCollection) -> None:
        db = event.db_name or DEFAULT_DB
        if self.shared.registry.selects(db, event.collection_name):
            self._announced.add(event.collection_id)

    def _saved_msg_id(self) -> bytes | None:
        return None if self.saved is None else self.saved.msg_id

    def _saved_offset(self) -> int:
        if self.saved is None or not self.saved.msg_id:
            return -1  # nothing read yet (a switched channel starts before its first record)
        return int.from_bytes(self.saved.msg_id, "little", signed=True)

    # --- commit ------------------------------------------------------------------------------
    def _commit(self, ready: list[Pending], at: bytes | None, ts: int) -> None:
        """Apply ``ready`` (in-flight bound first), then save the position ``at``."""
        if ready:
            offsets = [p.offset for p in ready]
            first, last_offset = min(offsets), max(offsets)
            replay = first <= self.replay_until
            if last_offset > self.inflight:
                self.shared.store.put_state(
                    self.shared.task_id, self._inflight_key, str(last_offset).encode()
                )
                self.inflight = last_offset
            before = self.applier.stats.rows_inserted + self.applier.stats.rows_deleted
            log.debug(
                "applying %d events, offsets %d..%d%s",
                len(ready),
                first,
                last_offset,
                " as replay" if replay else "",
            )
            self.applier.apply(
                [p.event for p in ready if isinstance(p.event, (Insert, Delete))], replay=replay
            )
            after = self.applier.stats.rows_inserted + self.applier.stats.rows_deleted
            self.status.rows += after - before
            self.status.bytes = self.applier.stats.bytes
        moved = self.saved is None or at != self.saved.msg_id or ts > self.saved.ts
        if at is not None and moved:
            position = Position(self.backend, self.pchannel, at, ts)
            self.shared.store.save_position(self.shared.task_id, position, self.saved)
            log.debug("saved position %s ts %d", at.hex(), ts)
            self.saved = position
            self.start = position
            self.status.position = position

    # --- DDL ---------------------------------------------------------------------------------
    def _arrive(self, key: str, member: str) -> set[str]:
        """Add ``member`` to the set kept under ``key`` in the task's state (what has reached
        a barrier: kept so that a restart in between does not forget it); the set now."""
        shared = self.shared
        arrived = {*json.loads(shared.store.get_state(shared.task_id, key) or b"[]"), member}
        shared.store.put_state(shared.task_id, key, json.dumps(sorted(arrived)).encode())
        return arrived

    def _all_channels_reached(self, key: str, collection_id: int) -> bool:
        """A 2.3 drop waits until every channel of the collection has read up to it."""
        arrived = self._arrive(key, self.pchannel)
        return (self.shared.registry.pchannels(collection_id) or {self.pchannel}) <= arrived

    def _apply_ddl(self, event: CreateCollection | DropCollection | DropPartition) -> None:
        """A 2.3-2.5 DDL record, applied when read."""
        with self.shared.ddl_lock:
            if isinstance(event, CreateCollection):
                self._create_collection(event)
                return
            collection = self.shared.registry.resolve(event.collection_id)
            if collection is None:
                return
            if isinstance(event, DropPartition):
                key = f"drop-partition/{event.collection_id}/{event.partition_name}"
                if self._all_channels_reached(key, event.collection_id):
                    self._drop_partition(collection, event.partition_name)
                return
            if self._all_channels_reached(f"drop/{event.collection_id}", event.collection_id):
                self._drop_collection(event.collection_id, collection)

    def _create_collection(self, event: CreateCollection) -> None:
        shared = self.shared
        # Milvus 2.3 leaves the record's db_name empty outside the default database (it names
        # only the dbID), and the record has no consistency level: both come from the source
        # catalog when it has the collection
        meta = shared.describe(event.collection_id)
        db = meta.db_name if meta is not None else event.db_name
        collection = shared.registry.add(
            event.collection_id, db, event.collection_name, event.schema, event.pchannels
        )
        self._announced.discard(event.collection_id)
        if collection is None:
            return
        shards = len([v for v in event.vchannels if not v.endswith("_vcchan")]) or 1
        consistency = meta.consistency_level if meta is not None else 0
        remember_collection(shared, event, db or DEFAULT_DB, shards, consistency)
        created = shared.target.create_collection(
            collection.db, collection.name, event.schema, shards, consistency
        )
        if created:
            log.info("created collection %s.%s on the target", collection.db, collection.name)

    def _drop_collection(self, collection_id: int, collection: TargetCollection) -> None:
        shared = self.shared
        if shared.target.drop_collection(collection.db, collection.name):
            log.info("dropped collection %s.%s on the target", *_names(collection))
        shared.registry.remove(collection_id)
        forget_collection(shared, collection_id)

    def _drop_partition(self, collection: TargetCollection, partition: str) -> None:
        if self.shared.target.drop_partition(collection.db, collection.name, partition):
            log.info("dropped partition %s of %s.%s on the target", partition, *_names(collection))
        collection.known_partitions.discard(partition)

    # --- 2.6 DDL and control: broadcast copies, applied once -------------------------------
    def _apply_stream_control(self, event: Event) -> None:
        """A released 2.6 DDL or control record. A broadcast has one copy per vchannel: a
        create or alter applies at the first copy; a drop or truncate only once every vchannel
        of the broadcast has been read up to its copy, so data a slower channel still holds
        before the drop reaches the target first. Nothing is acknowledged on the source."""
        meta = meta_of(event)
        assert meta is not None
        if isinstance(event, ManualFlush):
            return  # the source's own segment flush; nothing for a replica to do
        if self.shared.ddl is not None and isinstance(
            event, (StreamCreateCollection, StreamCreatePartition, StreamDropPartition)
        ):
            self.shared.ddl.names.observe(event)
        op = self._ddl_op(event) if isinstance(event, StreamDdl) else None
        barrier = isinstance(event, (StreamDropCollection, StreamDropPartition)) or (
            op is not None and op.barrier
        )
        with self.shared.ddl_lock:
            turn = self._broadcast_turn(meta, barrier)
            if turn:
                self._apply_stream_ddl(event, op)
                self._broadcast_done(meta)
        # After a truncate or a partition drop the collection or partition lives on: a
        # channel that reached its copy first waits for the barrier, or what it writes next
        # would be wiped when the last channel gets there
        holds = isinstance(event, StreamDropPartition) or (
            isinstance(event, StreamDdl) and event.type_name == "TruncateCollection"
        )
        if not turn and barrier and holds and meta.broadcast is not None:
            self._wait_for_broadcast(meta)

    def _wait_for_broadcast(self, meta: StreamMeta) -> None:
        assert meta.broadcast is not None
        shared, broadcast_id = self.shared, meta.broadcast.broadcast_id
        key = f"broadcast/{broadcast_id}"
        self.status.state = f"waiting for every vchannel to reach {meta.type_name}"
        log.info("waiting at %s %d for the other vchannels", meta.type_name, broadcast_id)
        with shared.broadcasts:
            while not shared.stop.is_set():
                if broadcast_id in shared.done_broadcasts:
                    break
                state = json.loads(shared.store.get_state(shared.task_id, key) or b"{}")
                if state.get("done"):
                    break
                shared.broadcasts.wait(1.0)
        self.status.state = "running"

    def _apply_stream_ddl(self, event: Event, op: DdlOp | None) -> None:
        """``op``: the decoded StreamDdl (None for the other records)."""
        shared = self.shared
        if isinstance(event, StreamCreateCollection):
            self._create_collection(event)
            return
        if op is not None:
            self._apply_ddl_op(op)
            return
        collection_ddl = (StreamDropCollection, StreamCreatePartition, StreamDropPartition)
        if not isinstance(event, collection_ddl):
            log.warning("2.6 %s record not applied", type(event).__name__)
            return
        collection = shared.registry.resolve(event.collection_id)
        if collection is None:
            return
        if isinstance(event, StreamDropCollection):
            self._drop_collection(event.collection_id, collection)
        elif isinstance(event, StreamDropPartition):
            self._drop_partition(collection, event.partition_name)
        elif not collection.partition_key and event.partition_name not in (
            "",
            collection.default_partition,
        ):
            if not shared.target.has_partition(
                collection.db, collection.name, event.partition_name
            ):
                shared.target.create_partition(collection.db, collection.name, event.partition_name)
            collection.known_partitions.add(event.partition_name)

    def _ddl_op(self, event: StreamDdl) -> DdlOp:
        try:
            return decode_ddl(event)
        except WireError as exc:
            raise TaskFailedError(
                f"channel {self.pchannel}: undecodable 2.6 {event.type_name} at ts {event.ts}: "
                f"{exc}"
            ) from exc

    def _apply_ddl_op(self, op: DdlOp) -> None:
        """Databases, aliases, indexes, load, alter/truncate collection, RBAC (see
        :mod:`replicator.pipeline.stream_ddl`); a rename moves the task's collection too."""
        applier = self.shared.ddl
        if applier is None:
            log.warning("2.6 %s is not replicated by this runner; skipped", op.type_name)
            return
        collection = self.shared.registry.resolve(op.collection_id) if op.collection_id else None
        outcome = applier.apply(op)
        log.info("2.6 %s: %s %s", op.type_name, outcome.status, outcome.detail)
        if isinstance(op, CreateIndex) and collection is not None:
            # the WAL names indexes by id afterwards (DropIndex): kept for after a restart
            known = applier.names.index(op.collection_id, op.index.index_id)
            if known is not None:
                key = f"{_INDEX_KEY}{op.collection_id}/{op.index.index_id}"
                self.shared.store.put_state(self.shared.task_id, key, json.dumps(known).encode())
        if (
            isinstance(op, AlterCollection)
            and {"name", "db"} & op.changes
            and collection is not None
            and outcome.status in ("applied", "unchanged")
        ):
            new_db = applier.names.database(op.new_db_name) if op.new_db_name else None
            collection.db = new_db or collection.db
            collection.name = op.new_name or collection.name

    def _broadcast_turn(self, meta: StreamMeta, barrier: bool) -> bool:
        """Is this copy the one that applies its broadcast? (Under the DDL lock.) The copies
        seen so far and whether it was applied are kept in the task's state, so a copy
        re-read after a restart neither applies it twice nor is forgotten."""
        header = meta.broadcast
        if header is None:
            return True  # a message for one vchannel
        shared = self.shared
        key = f"broadcast/{header.broadcast_id}"
        state = json.loads(shared.store.get_state(shared.task_id, key) or b"{}")
        if state.get("done"):
            return False
        if not barrier:
            return True
        arrived = {*state.get("arrived", ()), meta.vchannel}
        if set(header.vchannels) <= arrived:
            return True
        log.info(
            "%s %d: %d of %d vchannels have reached it",
            meta.type_name,
            header.broadcast_id,
            len(arrived & set(header.vchannels)),
            len(header.vchannels),
        )
        shared.store.put_state(
            shared.task_id, key, json.dumps({"arrived": sorted(arrived)}).encode()
        )
        return False

    def _broadcast_done(self, meta: StreamMeta) -> None:
        if meta.broadcast is not None:
            key = f"broadcast/{meta.broadcast.broadcast_id}"
            self.shared.store.put_state(self.shared.task_id, key, b'{"done": true}')
            with self.shared.broadcasts:
                self.shared.done_broadcasts.add(meta.broadcast.broadcast_id)
                self.shared.broadcasts.notify_all()

    # --- WAL switch (see replicator.pipeline.wal_switch) -------------------------------------
    def _switch_point(self, event: MqSwitchAnnounced | AlterWAL) -> WalSwitch | None:
        """The switch, once this channel's last copy of its broadcast is released (the
        announcement has a copy per vchannel; the copies seen are kept in the task's state so
        a restart between them does not forget the first)."""
        try:
            kind, config = requested_switch(event, self.backend)
        except UnfollowableSwitchError as exc:
            raise TaskFailedError(f"channel {self.pchannel}: {exc}") from exc
        local = local_copies(event, self.pchannel)
        header = event.meta.broadcast
        if header is not None and len(local) > 1:
            key = f"switch/{header.broadcast_id}/{self.pchannel}"
            if not local <= self._arrive(key, event.meta.vchannel):
                return None
        generation = parse_backend(self.backend)[1] + 1
        return WalSwitch(kind, config, event.ts, generation)

    def _switch(self, switch: WalSwitch, dropped: int) -> None:
        """Everything up to the switch tick is applied: record the new WAL, then a position
        at its start, and read on there."""
        shared = self.shared
        if shared.open_wal is None:
            raise TaskFailedError(
                f"channel {self.pchannel}: the source switched its WAL to {switch.kind}; "
                "this runner was built without a way to open another WAL"
            )
        if dropped or self.sequencer.waiting():
            log.warning(
                "records younger than the WAL switch at ts %d were still on %s; they are "
                "expected on %s",
                switch.switch_ts,
                self.backend,
                switch.kind,
            )
        try:
            source = shared.open_wal(switch.kind, switch.config)
        except SourceConfigError as exc:
            raise TaskFailedError(
                f"channel {self.pchannel}: the source switched its WAL at ts "
                f"{switch.switch_ts}: {exc}"
            ) from exc
        record_switch(shared.store, shared.task_id, self.pchannel, switch)
        position = Position(switch.backend, self.pchannel, b"", switch.switch_ts)
        shared.store.save_position(shared.task_id, position, self.saved)
        # the in-flight bound counted offsets of the old backend
        shared.store.put_state(shared.task_id, self._inflight_key, b"-1")
        self.replay_until = self.inflight = -1
        log.info(
            "the source switched its WAL at ts %d: reading %s on %s (settings given: %s)",
            switch.switch_ts,
            self.pchannel,
            switch.backend,
            describe_config(switch.config),
        )
        self.source, self.backend = source, switch.backend
        self.saved = self.start = self.status.position = position


class ReplicateWorker(ChannelWorker):
    """The replicate channel: the source's index, load, flush and database calls, made on the
    target in order under the task's names; the position is saved after each record."""

    WAIT_FOR_COLLECTION = 60.0

    def __init__(self, *args: Any, selection: TaskSelection, task_ts: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.selection = selection
        self.task_ts = task_ts  # calls older than the task about unknown collections are history

    def _consume(self, reader: ChannelReader) -> bool:
        while not self.shared.stop.is_set():
            for record in reader.read_batch(100, READ_TIMEOUT):
                event = decode_replicate(record, self.backend)
                if isinstance(event, FailedRecord):
                    raise TaskFailedError(
                        f"channel {self.pchannel} at offset {record.offset}: {event.reason}"
                    )
                if isinstance(event, RpcEvent):
                    self._apply_rpc(event)
                ts = max(event.ts, self.saved.ts if self.saved else 0)
                self.status.applied_ts = max(self.status.applied_ts, ts)
                self._commit([], record.msg_id, ts)
        return False

    def _target_request(self, event: RpcEvent) -> Any:
        """The request under the target's names, or None when the task does not select it."""
        db = event.db_name
        request = type(event.request)()
        request.CopyFrom(event.request)
        request.ClearField("base")
        if event.kind == "database":
            if not any(d in (WILDCARD, db) for d, _ in self.selection.selection):
                return None
            request.db_name = self.selection.target_name(db, "")[0]
            return request
        names = [c for c in event.collections if self.selection.selects(db, c)]
        if not names:
            return None
        if not all(self._wait_known(db, c, event.ts) for c in names):
            return None
        mapped = [self.selection.target_name(db, c) for c in names]
        request.db_name = mapped[0][0]
        if event.kind == "collections":
            del request.collection_names[:]
            request.collection_names.extend(c for _, c in mapped)
        else:
            request.collection_name = mapped[0][1]
        return request

    def _wait_known(self, db: str, collection: str, ts: int) -> bool:
        """The DML channel creates collections; a call about one it has not seen yet waits
        for it, unless the call predates the task (history of a collection since dropped).
        A collection is registered before the target has made it, under the DDL lock: taking
        the lock once waits for the target's collection too."""
        if self._known(db, collection):
            return True
        if ts < self.task_ts:
            return False
        deadline = time.monotonic() + self.WAIT_FOR_COLLECTION
        while time.monotonic() < deadline and not self.shared.stop.is_set():
            if self._known(db, collection):
                return True
            self.shared.stop.wait(0.5)
        raise TaskFailedError(
            f"channel {self.pchannel}: {collection!r} in {db!r} is not on the target "
            f"{self.WAIT_FOR_COLLECTION:.0f} s after the source used it"
        )

    def _known(self, db: str, collection: str) -> bool:
        if not self.shared.registry.knows(db, collection):
            return False
        with self.shared.ddl_lock:  # its creation on the target has finished
            return True

    def _apply_rpc(self, event: RpcEvent) -> None:
        request = self._target_request(event)
        if request is None:
            return
        what = f"{event.method} {request.db_name}.{','.join(event.collections) or ''}"
        try:
            self.shared.target.call(event.method, request, what)
            log.info("applied %s", what)
        except TargetRejectedError as exc:
            if is_unimplemented(exc):
                # e.g. Milvus Lite has no partition load state; the data is unaffected
                log.warning("%s: the target does not offer this call; skipped", what)
                return
            text = str(exc).lower()
            absent = any(w in text for w in ("not exist", "not found", "doesn't exist"))
            creating = event.method.startswith(("Create", "Load"))
            if (creating and "exist" in text and not absent) or (not creating and absent):
                log.info("%s: already in that state on the target", what)
                return
            raise


def _names(collection: TargetCollection) -> tuple[str, str]:
    return collection.db, collection.name


# --- collections learnt from the WAL ------------------------------------------------------------
# A collection created after the task started is known from its CreateCollection record. It is
# kept in the task's state, so a restart knows it even when the source catalog does not (a 2.6
# source's catalog, or a collection the catalog has dropped while its data is still to be read).
_COLLECTION_KEY = "collection/"


def remember_collection(
    shared: _Shared, event: CreateCollection, db: str, shards: int, consistency: int
) -> None:
    record = {
        "db": db,
        "name": event.collection_name,
        "schema": base64.b64encode(event.schema.SerializeToString()).decode("ascii"),
        "pchannels": list(event.pchannels),
        "vchannels": list(event.vchannels),
        "shards": shards,
        "consistency": consistency,
    }
    key = f"{_COLLECTION_KEY}{event.collection_id}"
    shared.store.put_state(shared.task_id, key, json.dumps(record).encode())


def forget_collection(shared: _Shared, collection_id: int) -> None:
    shared.store.put_state(shared.task_id, f"{_COLLECTION_KEY}{collection_id}", b"")


_INDEX_KEY = "index/"


def remembered_indexes(
    store: MetaStore, task_id: str, collection_id: int
) -> dict[int, tuple[str, str]]:
    """index id -> (field, index name) of the 2.6 indexes this task made on a collection."""
    prefix = f"{_INDEX_KEY}{collection_id}/"
    found = {}
    for key, value in store.list_state(task_id, prefix).items():
        field_name, index_name = json.loads(value)
        found[int(key[len(prefix) :])] = (str(field_name), str(index_name))
    return found


def remembered_collections(store: MetaStore, task_id: str) -> list[CollectionMeta]:
    found = []
    for key, value in store.list_state(task_id, _COLLECTION_KEY).items():
        if not value:
            continue  # dropped
        record = json.loads(value)
        found.append(
            CollectionMeta(
                collection_id=int(key[len(_COLLECTION_KEY) :]),
                db_id=0,
                db_name=record["db"],
                name=record["name"],
                schema=schema_pb2.CollectionSchema.FromString(base64.b64decode(record["schema"])),
                pchannels=tuple(record["pchannels"]),
                vchannels=tuple(record["vchannels"]),
                shards=int(record["shards"]),
                consistency_level=int(record["consistency"]),
                state=COLLECTION_CREATED,
                create_time=0,
            )
        )
    return found


class ReplicationRunner:
    def __init__(
        self,
        task: TaskRecord,
        store: MetaStore,
        on_failure: FailureCallback,
        context: RunnerContext,
    ) -> None:
        self.task = task
        self.store = store
        self.on_failure = on_failure
        self.context = context
        self.selection = TaskSelection.from_spec(task.spec)
        self.rpc_channel = str(task.spec.get("rpc_channel_info", {}).get("name") or "")
        channels = [*context.channels, *([self.rpc_channel] if self.rpc_channel else [])]
        self.statuses = {ch: ChannelStatus(ch, has_ticks=ch != self.rpc_channel) for ch in channels}
        self._stop = threading.Event()  # set to stop the workers: by stop() or a worker error
        self._stop_requested = False  # stop() was called: a failure then is not reported
        self._thread: threading.Thread | None = None
        self._watermarks: dict[str, tuple[int, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warnings: list[str] = []
        self._backfill: BackfillPhase | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._main, name=f"task-{self.task.task_id[:8]}", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self._stop_requested = True
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def status(self) -> dict[str, Any]:
        """Progress for get/list and /metrics: totals and every channel that has seen data or
        time ticks (a task reads every DML channel of the source; idle ones are left out)."""
        channels = [s for s in self.statuses.values() if s.applied_ts or s.rows]
        lags = [lag for s in channels if (lag := s.lag_seconds) is not None]
        return {
            "rows": sum(s.rows for s in channels),
            "bytes": sum(s.bytes for s in channels),
            "lag_seconds": round(max(lags), 3) if lags else None,
            "channels": [s.view() for s in channels],
            "warnings": list(self._warnings),
            "backfill": None if self._backfill is None else self._backfill.view,
        }

    # --- the task's main thread --------------------------------------------------------------
    def _main(self) -> None:
        with log_context(task_id=self.task.task_id):
            try:
                self._run()
            except TaskNotFoundError:
                log.info("task deleted; runner stops")
            except (TaskFailedError, PositionConflictError, SinkError) as exc:
                log.error("task failed: %s", exc)
                self._report(str(exc))
            except Exception as exc:
                log.exception("task runner crashed")
                self._report(f"internal error: {type(exc).__name__}: {exc}")

    def _report(self, reason: str) -> None:
        if self._loop is not None and not self._stop_requested:
            asyncio.run_coroutine_threadsafe(self.on_failure(self.task.task_id, reason), self._loop)

    def _run(self) -> None:
        """Connect and run the workers; source, target and store outages are retried."""
        backoff = 1.0
        while not self._stop.is_set():
            try:
                source, target, catalog, saved = self._connect()
                try:
                    self._run_workers(source, target, catalog, saved)
                finally:
                    target.close()
                return
            except (SourceUnavailableError, SinkError, MetaStoreError, OSError) as exc:
                if isinstance(exc, (TaskNotFoundError, PositionConflictError)):
                    raise
                if not getattr(exc, "retriable", True):
                    raise
                log.warning("source or target unavailable, retrying in %.0f s: %s", backoff, exc)
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)

    def _connect(
        self,
    ) -> tuple[WalSource, MilvusTarget, dict[int, CollectionMeta], dict[str, Position]]:
        """The source, the target, the catalog, and the positions saved so far."""
        source = self.context.source()
        # The ends of the channels a new task has no position on are read BEFORE the catalog:
        # a collection created in between is then in the catalog or after the start in the WAL.
        saved = self.store.get_positions(self.task.task_id)
        self._watermarks = {
            ch: source.watermarks(ch) for ch in self.context.channels if ch not in saved
        }
        catalog = self.context.catalog()
        target = self.context.target_factory(dict(self.task.spec["milvus_connect_param"]))
        return source, target, catalog, saved

    def _run_workers(
        self,
        source: WalSource,
        target: MilvusTarget,
        catalog: dict[int, CollectionMeta],
        saved: dict[str, Position],
    ) -> None:
        registry = CollectionRegistry(self.selection, self.context.default_partition)
        context = self.context
        describe = context.collection or (lambda collection: context.catalog().get(collection))
        names = TaskNames.for_task(registry.resolve, self.selection)
        shared = _Shared(
            self.task.task_id,
            self.store,
            registry,
            target,
            self._stop,
            describe=describe,
            open_wal=context.open_wal,
            ddl=StreamDdlApplier(
                target,
                names,
                rbac=bool((self.task.spec.get("extra_info") or {}).get("enable_user_role")),
            ),
        )
        for meta in [*catalog.values(), *remembered_collections(self.store, self.task.task_id)]:
            if meta.dropped or registry.wanted(meta.collection_id):
                continue
            names.remember_schema(meta.collection_id, meta.schema)
            for index_id, (field_name, index_name) in remembered_indexes(
                self.store, self.task.task_id, meta.collection_id
            ).items():
                names.remember_index(meta.collection_id, index_id, field_name, index_name)
            for partition_id, partition in meta.partitions.items():
                names.remember_partition(meta.collection_id, partition_id, partition)
            collection = registry.add(
                meta.collection_id, meta.db_name, meta.name, meta.schema, meta.pchannels
            )
            if collection is not None:
                target.create_collection(
                    collection.db, collection.name, meta.schema, meta.shards, meta.consistency_level
                )
        # a pending backfill of every selected collection copies their history: a new task then
        # starts streaming at the end of each channel instead of at the collections' creation
        backfill = self._backfill_job()
        at_end = backfill is not None and backfill.active and backfill.covers_all
        starts: dict[str, Position | None] = {}
        history_lost = []
        for pchannel in self.context.channels:
            start = saved.get(pchannel)
            if start is None:
                start, lost = self._initial_position(source, pchannel, catalog, registry, at_end)
                if lost:
                    history_lost.append(pchannel)
                if start is not None:
                    self.store.save_position(self.task.task_id, start, None)
            starts[pchannel] = start
        self._load_warnings()
        if backfill is not None and not self._run_backfill(
            backfill, source, catalog, registry, starts
        ):
            return  # stopped during the backfill; it resumes at the next start
        workers: list[ChannelWorker] = [
            ChannelWorker(
                shared,
                self._source_at(source, pchannel, start),
                start.backend if start is not None else source.backend,
                pchannel,
                start,
                start,
                self.statuses[pchannel],
            )
            for pchannel, start in starts.items()
        ]
        if history_lost and not (backfill is not None and backfill.active):
            self._warn(
                f"the WAL no longer holds the creation of the selected collections on "
                f"{', '.join(history_lost)}: replication there starts at the end of the WAL, "
                f"and older rows are not copied (use a backfill)"
            )
        elif self._warnings:
            self._show_warnings()
        if self.rpc_channel:
            start = saved.get(self.rpc_channel)
            if start is None:
                # from the oldest call the WAL holds: earlier index and load calls of the
                # selected collections are made again (they are idempotent)
                earliest, _ = source.watermarks(self.rpc_channel)
                msg_id = source.position_before(earliest)
                if msg_id is not None:
                    start = Position(source.backend, self.rpc_channel, msg_id, 0)
                    self.store.save_position(self.task.task_id, start, None)
            workers.append(
                ReplicateWorker(
                    shared,
                    source,
                    source.backend,
                    self.rpc_channel,
                    start,
                    start,
                    self.statuses[self.rpc_channel],
                    selection=self.selection,
                    task_ts=int(self.task.created_at * 1000) << 18,
                )
            )
        errors: list[Exception] = []
        threads = []
        if self.context.aliases is not None:
            # its own target connection: gRPC calls of the workers are not held up by it
            alias_target = self.context.target_factory(dict(self.task.spec["milvus_connect_param"]))
            mirror = AliasMirror(self.context.aliases, registry, alias_target, self._stop)
            threads.append(threading.Thread(target=self._mirror, args=(mirror,), name="aliases"))

        def run(worker: ChannelWorker) -> None:
            with log_context(task_id=self.task.task_id, channel=worker.pchannel):
                try:
                    worker.run()
                except Exception as exc:  # noqa: BLE001 - any worker error stops the task
                    errors.append(exc)
                    self._stop.set()

        threads += [
            threading.Thread(target=run, args=(w,), name=f"{w.pchannel}", daemon=True)
            for w in workers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _source_at(self, source: WalSource, pchannel: str, start: Position | None) -> WalSource:
        """The WAL a saved position is on: the configured source, or one it switched to."""
        if start is None or parse_backend(start.backend)[1] == 0:
            return source
        try:
            switch = recorded_switch(self.store, self.task.task_id, pchannel, start.backend)
        except UnfollowableSwitchError as exc:
            raise TaskFailedError(str(exc)) from exc
        if self.context.open_wal is None:
            raise TaskFailedError(f"channel {pchannel}: cannot open {start.backend}")
        try:
            return self.context.open_wal(switch.kind, switch.config)
        except SourceConfigError as exc:
            raise TaskFailedError(f"channel {pchannel}: {exc}") from exc

    def _mirror(self, mirror: AliasMirror) -> None:
        with log_context(task_id=self.task.task_id):
            try:
                mirror.run()
            finally:
                mirror.close()

    def _initial_position(
        self,
        source: WalSource,
        pchannel: str,
        catalog: dict[int, CollectionMeta],
        registry: CollectionRegistry,
        at_end: bool = False,
    ) -> tuple[Position | None, bool]:
        """Where a new task starts on a channel: at the creation of the earliest selected
        collection on it when the WAL still has it; else at the end (what comes next) as it
        was before the catalog was read. The flag tells that selected history was lost.
        ``at_end``: at the end anyway (a backfill copies the history)."""
        earliest, latest = self._watermarks.get(pchannel) or source.watermarks(pchannel)
        if at_end:
            msg_id = source.position_before(latest)
            return (
                None if msg_id is None else Position(source.backend, pchannel, msg_id, 0)
            ), False
        starts = [
            source.offset_of(meta.start_positions[pchannel])
            for meta in catalog.values()
            if registry.wanted(meta.collection_id) and pchannel in meta.start_positions
        ]
        lost = bool(starts) and min(starts) < earliest
        offset = min(starts) if starts and not lost else latest
        msg_id = source.position_before(offset)
        return (None if msg_id is None else Position(source.backend, pchannel, msg_id, 0)), lost

    # --- backfill: before the workers start (replicator/backfill/phase.py) ---------------------
    def _backfill_job(self) -> BackfillJob | None:
        """The task's backfill job, if it has one; its progress is shown from now on."""
        if self.context.backfill is None:
            return None
        state = BackfillState(self.store, self.task.task_id)
        job = state.job()
        if job is None:
            return None
        self._backfill = BackfillPhase(self.task.task_id, state, self.context.backfill, self._stop)
        self._backfill.refresh(job)
        return job

    def _run_backfill(
        self,
        job: BackfillJob,
        source: WalSource,
        catalog: dict[int, CollectionMeta],
        registry: CollectionRegistry,
        starts: dict[str, Position | None],
    ) -> bool:
        """Run a pending or interrupted job; False when the runner was stopped meanwhile.
        ``starts`` (the workers' start positions) may be moved back by the hand-over."""
        if not job.active or self._backfill is None:
            return True
        with log_context(task_id=self.task.task_id, channel="backfill"):
            collections, missing = self._backfill_collections(job, catalog, registry)
            if missing:
                collections = []
            finished = self._backfill.run(job, collections, lambda: self._hand_over(source, starts))
            if finished is None:
                return False
            if missing:
                finished = finished.with_(
                    state="failed", reason=f"not selected collections of the source: {missing}"
                )
                self._backfill.state.save_job(finished)
                self._backfill.refresh(finished)
            if finished.state == "failed":
                self._warn(f"backfill {finished.job_id} failed: {finished.reason}")
        return True

    def _backfill_collections(
        self, job: BackfillJob, catalog: dict[int, CollectionMeta], registry: CollectionRegistry
    ) -> tuple[list[CollectionRef], list[str]]:
        """The selected source collections the job names (all for '*'), and names that match
        none."""
        refs = []
        matched: set[str] = set()
        for meta in sorted(catalog.values(), key=lambda m: (m.db_name, m.name)):
            target = registry.resolve(meta.collection_id)
            if meta.dropped or target is None:
                continue
            names = {meta.name, f"{meta.db_name}.{meta.name}"}
            if job.covers_all or names & set(job.requested):
                matched |= names
                refs.append(CollectionRef(meta.db_name, meta.name, target.db, target.name))
        missing = [] if job.covers_all else sorted(set(job.requested) - matched)
        return refs, missing

    def _hand_over(self, source: WalSource, starts: dict[str, Position | None]) -> None:
        """Raise every channel's in-flight bound to its end: the workers replay everything up
        to there as upserts (the records the backfill may have copied already); move a start
        that splits the records of one timestamp (an upsert's halves) back before them."""
        for pchannel, start in starts.items():
            wal = self._source_at(source, pchannel, start)  # the WAL the channel is on now
            if start is not None and start.msg_id:
                earlier = group_start(wal, start)
                if earlier != start:
                    self.store.save_position(self.task.task_id, earlier, start)
                    starts[pchannel] = earlier
            _, latest = wal.watermarks(pchannel)
            key = f"inflight/{pchannel}"
            raw = self.store.get_state(self.task.task_id, key)
            bound = max(latest, int(raw) if raw else -1)
            self.store.put_state(self.task.task_id, key, str(bound).encode())
        log.info("backfill finished; streaming starts from the recorded positions")

    # --- warnings: kept in the task's state, shown in progress and, while Running, as reason --
    def _load_warnings(self) -> None:
        raw = self.store.get_state(self.task.task_id, WARNINGS_KEY)
        self._warnings = json.loads(raw) if raw else []

    def _warn(self, text: str) -> None:
        log.warning("%s", text)
        if text not in self._warnings:
            self._warnings.append(text)
            payload = json.dumps(self._warnings).encode()
            self.store.put_state(self.task.task_id, WARNINGS_KEY, payload)
        self._show_warnings()

    def _show_warnings(self) -> None:
        """Put the warnings into the reason of the Running task (resume clears the reason)."""
        task = self.store.get_task(self.task.task_id)
        if task is None or task.state is not TaskState.RUNNING:
            return
        missing = [w for w in self._warnings if w not in task.reason]
        if not missing:
            return
        try:
            self.store.update_task(
                task.task_id,
                state=TaskState.RUNNING,
                reason="; ".join([task.reason, *missing] if task.reason else missing),
                expected_revision=task.revision,
            )
        except ConcurrentUpdateError:
            log.info("task changed while recording a warning; it stays in progress.warnings")
