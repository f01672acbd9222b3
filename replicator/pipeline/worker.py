"""One source pchannel of a task: read, decode, sequence, and hand what a tick releases to the
target, the DDL appliers or the WAL switch.

Ordering (see :mod:`sequencer`): at a TimeTick ``t`` every event with ``ts <= t`` is final (no
later record can be older) and is applied in (ts, delete-first) order; younger events wait for
a later tick. An upsert's Insert and Delete share one timestamp but a tick can fall between
them, so a batch cut at the tick alone would apply the Insert, then the Delete, and lose the
row. Events released by the ticks of one read are written together when the read is done: a
worker behind its channel writes few large requests, not one per tick. The saved position
never passes a waiting event or an open transaction; the commit itself is :mod:`checkpoint`'s.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from metastore import Position
from replicator.codec.streaming import decode_any
from replicator.codec.streaming_events import AlterWAL, MqSwitchAnnounced, StreamCreateCollection
from replicator.errors import TaskFailedError
from replicator.events import (
    CreateCollection,
    Delete,
    DropCollection,
    DropPartition,
    FailedRecord,
    Insert,
    RawRecord,
    Skipped,
    TimeTick,
)
from replicator.fibers import Steps
from replicator.hybrid_time import to_seconds
from replicator.meta.catalog import DEFAULT_DB
from replicator.pipeline.channel_reads import READ_TIMEOUT, next_batch, read_with_retries
from replicator.pipeline.checkpoint import GROUP_EVENTS, ChannelCheckpoint
from replicator.pipeline.context import TaskContext
from replicator.pipeline.event_writer import channel_writer
from replicator.pipeline.save_budget import IDLE_SAVE_SECONDS, IDLE_SAVES
from replicator.pipeline.sequencer import (
    ChannelSequencer,
    DroppedPartitions,
    Pending,
    SequencerStats,
    meta_of,
)
from replicator.pipeline.status import ChannelStatus
from replicator.pipeline.stop_signal import StopSignal
from replicator.pipeline.timings import Releases
from replicator.pipeline.wal_switch import SwitchFollower
from replicator.sources.base import ChannelReader, WalSource, more_buffered
from replicator.sources.idle_reader import IdleReader
from replicator.sources.prefetch import reading_ahead

log = logging.getLogger(__name__)

READ_BATCH = 1000
# how long a channel with nothing waiting for a tick lets ticks (and other collections' data)
# gather on a shared reader: its applied time moves once per wait; anything else it must see
# ends the wait at once, and so does the task's stop. The wait starts at the first figure and
# doubles with each idle read in a row up to the second (a channel that has just applied
# something shows its applied time sooner; one that stays quiet costs less).
IDLE_READ_SECONDS = 1.0
IDLE_READ_SECONDS_MAX = 5.0


@dataclass
class _Read:
    """What one read of the channel produced."""

    ready: list[Pending] = field(default_factory=list)  # released data, written at its end
    commit_at: bytes | None = None  # the position once ``ready`` is on the target
    applied_to: int = 0  # the source time applied once ``ready`` is written
    changed: bool = False  # DDL or control applied: save the position
    releases: Releases = field(default_factory=Releases)  # for the daemon's own lag part


def rows_of(batch: list[Pending]) -> int:
    return sum(p.event.num_rows for p in batch if isinstance(p.event, (Insert, Delete)))


def commit_action(
    read: _Read, grouped: bool, backlog: bool, idle_due: bool
) -> tuple[list[Pending], bytes | None] | None:
    """What a channel commits after a read, as ``_write``'s batch and position; None: nothing
    yet. Released data, applied DDL or control, or an open group of a backlog (``grouped``) go
    with the read's position; an idle channel saves it now and then, as the daemon's budget
    allows (save_budget). An open group whose backlog ended in a read that released nothing
    (time ticks only) is committed as it is: its events must not wait for the next write."""
    if read.commit_at is not None and (
        read.ready or read.changed or grouped or (idle_due and IDLE_SAVES.take())
    ):
        return read.ready, read.commit_at
    if grouped and not backlog:
        return [], None
    return None


class ChannelWorker:
    sequencer: ChannelSequencer  # one per reading (from the saved position's tick)

    def __init__(
        self,
        context: TaskContext,
        source: WalSource,
        pchannel: str,
        saved: Position | None,
        status: ChannelStatus,
    ) -> None:
        self.context = context
        self.source = source
        self.pchannel = pchannel
        self.status = status
        self.applier, durable = channel_writer(context.target, context.registry.resolve, pchannel)
        self.checkpoint = ChannelCheckpoint(
            context.store,
            context.state,
            context.task_id,
            pchannel,
            saved.backend if saved is not None else source.backend,
            saved,
            self.applier,
            lambda msg_id: self.source.offset_of(msg_id),
            durable,
        )
        self.switches = SwitchFollower(pchannel, context.state, context.barriers, context.open_wal)
        self.sequenced = SequencerStats()  # across the sequencers of restarts and switches
        self.skipped: Counter[str] = Counter()  # records skipped on purpose, by cause
        self._last: RawRecord | None = None  # the last record read
        # the furthest offset read on the current WAL: after a retry rewinds, the channel is
        # not caught up until it has read past it again (a reader's first empty read, while
        # the target is still down, is no catching up)
        self._furthest = -1
        # 2.6 collections whose CreateCollection was read here but is not applied yet
        self._announced: set[int] = set()
        # 2.3 partitions whose drop was read here, until a tick passes it (kept across restarts)
        self._dropped = DroppedPartitions(
            context.state.dropped_partitions(pchannel),
            lambda drops: context.state.save_dropped_partitions(pchannel, drops),
        )

    def steps(self, wake: Callable[[], None]) -> Steps:
        """The worker as a fiber (:mod:`replicator.fibers`) woken by ``wake``."""
        yield from read_with_retries(
            self.checkpoint,
            self.status,
            self.context,
            wake,
            lambda start: reading_ahead(
                self.source.open_channel(self.pchannel, start), READ_BATCH, self.context.read_ahead
            ),
            self._consume,
        )

    def _consume(self, reader: ChannelReader) -> Generator[float, None, bool]:
        """Read until the task stops; True when the source switched its WAL and this channel
        now reads it from the new backend."""
        saved = self.checkpoint.saved
        seq = self.sequencer = ChannelSequencer(
            self.pchannel, saved.ts if saved else 0, stats=self.sequenced
        )
        self._last = None
        idle_reader = reader if isinstance(reader, IdleReader) else None
        unwake = (
            self.context.stop.when_set(idle_reader.wake)
            if idle_reader is not None and isinstance(self.context.stop, StopSignal)
            else None
        )
        try:
            return (yield from self._read_until_stopped(reader, idle_reader, seq))
        finally:
            if unwake is not None:
                unwake()

    def _read_until_stopped(
        self, reader: ChannelReader, idle_reader: IdleReader | None, seq: ChannelSequencer
    ) -> Generator[float, None, bool]:
        """The reading loop of :meth:`_consume` (``idle_reader``: ``reader`` when it can read
        idly)."""
        last_save = time.monotonic()
        idle_wait = IDLE_READ_SECONDS
        while not self.context.stop.is_set():
            read = _Read()
            read_started = time.time()
            # nothing waits for a tick: ticks need not wake it
            idle = idle_reader if idle_reader is not None and not seq.waiting() else None
            stop = self.context.stop
            if idle is not None:
                records = yield from next_batch(idle, stop, READ_BATCH, idle_wait, self._wakes)
                idle_wait = min(idle_wait * 2, IDLE_READ_SECONDS_MAX)
                if passed_over := idle.take_passed_over():  # other collections' data
                    self.skipped["not_selected"] += passed_over
            else:
                records = yield from next_batch(reader, stop, READ_BATCH, READ_TIMEOUT)
                idle_wait = IDLE_READ_SECONDS
            self.status.reader = "shared" if getattr(reader, "shared", False) else "own"
            for record in records:
                if self._dispatch(record, read):
                    return True
            # read to the end with nothing waiting (an idle read returns all it has)
            drained = not records or (idle is not None and idle.took_all)
            last = self._last
            caught_up = (
                drained
                and not seq.waiting()
                and (self._furthest < 0 or (last is not None and last.offset >= self._furthest))
            )
            # a backlog (more read already): a durable target may group it with the next reads
            backlog = bool(records) and more_buffered(reader)
            due = time.monotonic() - last_save > IDLE_SAVE_SECONDS
            committed = True
            action = commit_action(read, self.checkpoint.deferred is not None, backlog, due)
            if action is not None:
                committed = self._write(*action, more=backlog)
                last_save = time.monotonic()
                if action[0] and committed:
                    written_at = self.checkpoint.written_at
                    read.releases.written(
                        self.context.timings,
                        written_at - self.checkpoint.write_seconds,
                        written_at,
                        time.time(),
                    )
            if caught_up:  # once what it read is on the target
                self.status.mark_caught_up(seq.tick, read_started)
            else:
                self.status.caught_up = False
            if read.applied_to and committed:
                self.status.applied(read.applied_to)
            self.status.read_ts = max(self.status.read_ts, seq.tick)
            self.status.skipped = {**self.sequenced.counts(), **self.skipped}
        # stopping: events still waiting for their tick are re-read after a restart
        last = self._last
        if last is not None and not seq.waiting() and last.offset > self.checkpoint.saved_offset():
            self._write([], last.msg_id)
        elif self.checkpoint.deferred is not None:  # a grouped commit still open
            self._write([], None)
        self.checkpoint.settle()  # what was submitted is committed, and saved
        self.status.position = self.checkpoint.saved
        return False

    def _dispatch(self, record: RawRecord, read: _Read) -> bool:
        """Decode one record and sequence it; True when it switched the channel's WAL."""
        seq = self.sequencer
        before = self._last.msg_id if self._last is not None else self._saved_msg_id()
        read_at = time.time()
        self._last = record
        self._furthest = max(self._furthest, record.offset)
        decode_started = time.perf_counter()
        event = decode_any(record, self.checkpoint.backend, self._wanted)
        decoded = time.perf_counter() - decode_started
        if isinstance(event, FailedRecord):
            raise TaskFailedError(
                f"channel {self.pchannel} at offset {record.offset}: {event.reason}"
            )
        switching = isinstance(event, (MqSwitchAnnounced, AlterWAL))
        if switching:
            # Nothing older follows a switch copy on the old WAL (the switch holds the
            # cluster's exclusive lock, and AlterWAL is the backend's last record): the copy
            # releases like a tick
            seq.add(Pending(record.offset, event, before))
        if isinstance(event, TimeTick) or switching:
            return self._release(event.ts, record, read, read_at)
        if isinstance(event, (Insert, Delete)):
            self.context.timings.read_delay.observe(read_at - to_seconds(event.ts))
            self.context.timings.decode.observe(decoded)
        if meta_of(event) is None:  # 2.3-2.5
            if isinstance(event, (Insert, Delete)):
                if self._dropped.erased(event):  # of a partition whose drop was read
                    self.skipped["dropped_partition"] += 1
                else:
                    seq.add(Pending(record.offset, event, before, read_at=read_at))
            elif isinstance(event, (CreateCollection, DropCollection, DropPartition)):
                if self.context.collections.settled(event):
                    return False  # nothing to apply: no commit first (a Kafka target's waits)
                # the DML older than a drop, of what it drops, goes first (its barrier needs it
                # applied), but an upsert's lone Insert (the drop erases both its halves, the
                # Delete is skipped once read); nothing else waiting is taken: an upsert's
                # Delete may still follow its Insert (a DDL record can come between them), and
                # only a tick says that both halves were read. A created collection has no
                # older DML. A dropped partition's records read later are skipped.
                if isinstance(event, DropPartition):
                    if self.context.registry.wanted(event.collection_id):
                        self._dropped.dropped(event.collection_id, event.partition_name, event.ts)
                    taken = seq.take_dropped(event.ts, event.collection_id, event.partition_name)
                elif isinstance(event, DropCollection):
                    taken = seq.take_dropped(event.ts, event.collection_id)
                else:
                    taken = []
                older = read.ready + taken
                if self.checkpoint.durable is not None:  # committed before the DDL's events
                    ddl = Pending(record.offset, event, before)
                    self._write(older, *self._durable_point([ddl]))
                else:
                    self._write(older, read.commit_at)
                read.ready, read.commit_at = [], None
                read.releases.clear()
                self.context.collections.apply_record(event, self.pchannel)
            elif isinstance(event, Skipped):
                self._skip(event, record)
        elif isinstance(event, Skipped):
            self._skip(event, record)
        else:
            if isinstance(event, StreamCreateCollection):
                self._announce(event)
            seq.add(Pending(record.offset, event, before, read_at=read_at))
        return False

    def _release(self, tick: int, record: RawRecord, read: _Read, read_at: float) -> bool:
        """What a tick (or a switch copy) read at ``read_at`` makes final: data joins the
        read's batch, 2.6 DDL and control apply in tick order with it. True when the channel
        switched its WAL."""
        seq = self.sequencer
        released = seq.release(tick)
        self._dropped.passed(seq.tick)
        tick_wait = self.context.timings.tick_wait
        data = 0  # data events released by this tick, still in read.ready
        for i, item in enumerate(released):
            if isinstance(item.event, (Insert, Delete)):
                read.ready.append(item)
                data += 1
                if item.read_at:
                    tick_wait.observe(read_at - item.read_at)
                continue
            self._write(read.ready, *self._durable_point(released[i:]))
            read.ready, read.changed = [], True
            read.releases.clear()
            data = 0
            event = item.event
            if isinstance(event, (MqSwitchAnnounced, AlterWAL)):
                switch = self.switches.switch_point(event, self.checkpoint.backend)
                if switch is not None:
                    left_behind = i + 1 < len(released) or seq.waiting()
                    self.source = self.switches.follow(switch, self.checkpoint, left_behind)
                    self._furthest = -1  # offsets of the new WAL start over
                    self.status.position = self.checkpoint.saved
                    return True
                continue
            self.context.broadcasts.apply(event, self.pchannel, self.status)
            if isinstance(event, StreamCreateCollection):
                self._announced.discard(event.collection_id)
        read.releases.add(read_at, record.appended_at, data, self.context.timings)
        oldest = seq.resume_point()
        read.commit_at = oldest.before if oldest is not None else record.msg_id
        # everything up to the oldest waiting event is on the target once written
        read.applied_to = seq.applied_to()
        if self.checkpoint.durable is not None and data and rows_of(read.ready) >= GROUP_EVENTS:
            # a durable target builds a commit's events whole (their JSON is several times
            # the WAL's bytes): one read of megabytes of WAL is committed a tick at a time
            self._write(read.ready, read.commit_at, more=True)
            read.ready = []
            read.releases.clear()
        return False

    def _durable_point(self, rest: list[Pending]) -> tuple[bytes | None, int]:
        """Where the position may move before the first of ``rest`` (a DDL, then what was
        released after it) is applied: None, the position moves with the next read, unless
        the target commits its events with the position (Kafka). Its events are then
        committed now, with the position before the oldest record not applied yet (``rest``
        and what still waits) and the tick below ``rest``, so the DDL's events follow them."""
        tick = self.sequencer.tick
        if self.checkpoint.durable is None:
            return None, tick
        candidates = list(rest)
        oldest = self.sequencer.resume_point()
        if oldest is not None:
            candidates.append(oldest)
        first = min(candidates, key=lambda p: p.resume_offset)
        saved = self.checkpoint.saved
        if not first.before:
            return None, tick
        # everything at or below it is applied: what is released is below ``rest`` (a 2.6
        # DDL), and a 2.3 DDL read before its tick says nothing of the records older than it
        # that are still to come (a resume skips what the saved tick covers)
        below = min(min(p.event.ts for p in rest) - 1, tick)
        return first.before, max(below, saved.ts if saved is not None else 0)

    def _write(
        self, batch: list[Pending], at: bytes | None, ts: int | None = None, *, more: bool = False
    ) -> bool:
        """Commit ``batch`` and the position ``at`` (see ``ChannelCheckpoint.commit``); False
        when a durable target's commit waits for more of a backlog."""
        stats = self.applier.stats
        before = stats.rows_inserted + stats.rows_deleted
        tick = self.sequencer.tick if ts is None else ts
        committed = self.checkpoint.commit(batch, at, tick, more=more)
        if batch:
            timings, written = self.context.timings, self.checkpoint.written_at
            timings.target_write.observe(self.checkpoint.write_seconds)
            for item in batch:
                if isinstance(item.event, (Insert, Delete)):
                    timings.apply_delay.observe(written - to_seconds(item.event.ts))
        self.status.rows += stats.rows_inserted + stats.rows_deleted - before
        self.status.bytes = stats.bytes
        self.status.collection_rows = dict(stats.collection_rows)
        self.status.bytes_by_type = dict(stats.bytes_by_type)
        self.status.position = self.checkpoint.saved
        return committed

    def _wanted(self, collection_id: int) -> bool:
        """Decode this collection's data? Selected and known, or announced by a 2.6
        CreateCollection read on this channel and not yet applied (its data follows it in the
        channel but the creation waits for a tick). A collection nobody knows is looked up in
        the source catalog first."""
        registry = self.context.registry
        if registry.wanted(collection_id) or collection_id in self._announced:
            return True
        if not registry.known(collection_id):
            self.context.collections.learn(collection_id)
        return registry.wanted(collection_id)

    def _wakes(self, collection_id: int) -> bool:
        """Does a record of this collection's data wake this channel from an idle read?
        Selected, announced, or not known yet (a collection nobody knows is looked up or stops
        the task, at once). Asked by the shared reader's thread: it only looks."""
        registry = self.context.registry
        return (
            registry.wanted(collection_id)
            or collection_id in self._announced
            or not registry.known(collection_id)
        )

    def _skip(self, event: Skipped, record: RawRecord) -> None:
        """Count a record skipped on purpose; a record of a collection nobody knows, newer than
        the task, that a ``*`` task should replicate stops the task instead: its rows are
        never dropped in silence."""
        cause = event.cause
        if cause == "not_selected" and not self.context.registry.known(event.collection_id):
            if event.ts < self.context.task_ts:
                cause = "unknown_before_task"  # a collection dropped before the task
            elif self.context.registry.may_select_unknown():
                raise TaskFailedError(
                    f"channel {self.pchannel} at offset {record.offset} (ts {event.ts}): "
                    f"collection {event.collection_id} is neither in the source catalog nor "
                    "created in the WAL the task has read, so its rows cannot be placed; "
                    "they are not dropped: the task stops here"
                )
            else:
                cause = "unknown_collection"
        self.skipped[cause] += 1

    def _announce(self, event: StreamCreateCollection) -> None:
        """A 2.6 CreateCollection read here: its data, which follows it on this channel, is
        decoded (a selected collection) or known not to be wanted (another) before the creation
        is applied at its tick."""
        registry = self.context.registry
        if registry.selects(event.db_name or DEFAULT_DB, event.collection_name):
            self._announced.add(event.collection_id)
        elif not registry.known(event.collection_id):
            registry.add(
                event.collection_id,
                event.db_name,
                event.collection_name,
                event.schema,
                event.pchannels,
            )

    def _saved_msg_id(self) -> bytes | None:
        saved = self.checkpoint.saved
        return None if saved is None else saved.msg_id
