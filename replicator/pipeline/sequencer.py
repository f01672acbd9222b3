"""Per-pchannel ordering of decoded events: what a TimeTick makes final, in what order, and where
a restart has to begin reading again.

Both source generations go through one sequencer, so a topic that crosses the upgrade from 2.5
to 2.6 is read without a gap:

- **2.3-2.5 (msgstream)** events wait for the next TimeTick and are released in channel order
  (their timestamps mostly grow with the offset; concurrent proxy tasks append some out of
  order). A reading that resumes from a saved position drops the records at or below the saved
  tick (``resumed_at``): the saved tick proves them applied (a record older than a waiting one
  lies after the position, released and written before it). Records after the position and
  above its tick are released again; a Milvus target writes them as upserts (see the runner's
  in-flight bound), a Kafka target never committed them.
- **2.6 (streaming)** events are ordered by ``_tt``, which does not grow with the offset within
  a pchannel: at a TimeTick ``T`` every event with ``_tt <= T`` is released, sorted by ``_tt``.
  ``(pchannel, _tt)`` names one message, so a second record with a ``_tt`` already waiting, or one
  at or below the released tick, is a repeat (a retried append, or a re-read after a restart)
  and is dropped.
- **Transactions** (2.6): BeginTxn, bodies carrying ``_tx``, then CommitTxn or RollbackTxn, on one
  vchannel. The bodies wait in the transaction and become events at the CommitTxn's ``_tt``, as
  one unit; a rollback drops them, and so does expiry: a transaction whose newest record is older
  than the released tick by more than its keepalive can no longer commit. The own ``_tt`` of a
  body says nothing about whether it was applied: only its commit's does.

The resume point is the record before the oldest one not yet applied, counting the BeginTxn of
every open transaction, so a restart re-reads whole transactions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from replicator.codec.streaming_events import BeginTxn, CommitTxn, RollbackTxn, StreamMeta
from replicator.events import Delete, Event, Insert
from replicator.hybrid_time import from_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pending:
    """A decoded event waiting for the tick that makes it final."""

    offset: int
    event: Event
    before: bytes | None  # msg id of the record before it: where to resume to re-read it
    # the offset of the record ``before`` precedes, when not this one's (a committed
    # transaction's bodies are re-read from its BeginTxn)
    anchor: int = -1
    read_at: float = 0.0  # when the worker read it (time.time()), for its tick wait

    @property
    def resume_offset(self) -> int:
        return self.anchor if self.anchor >= 0 else self.offset


def meta_of(event: Event) -> StreamMeta | None:
    """The 2.6 properties of an event; None for a 2.3-2.5 one."""
    meta = getattr(event, "meta", None)
    return meta if isinstance(meta, StreamMeta) else None


@dataclass
class _OpenTxn:
    begin: Pending
    keepalive: int  # in hybrid-timestamp units; 0: never expires
    newest: int  # the newest _tt among its records
    bodies: list[Pending] = field(default_factory=list)
    ticks: set[int] = field(default_factory=set)

    def expired(self, tick: int) -> bool:
        return self.keepalive > 0 and self.newest + self.keepalive < tick


@dataclass
class SequencerStats:
    repeats: int = 0  # records dropped as repeats of one already seen or applied
    committed: int = 0
    rolled_back: int = 0
    expired: int = 0
    orphans: int = 0  # transaction records without their BeginTxn

    def counts(self) -> dict[str, int]:
        """What was dropped on purpose, by cause."""
        return {
            "repeated_records": self.repeats,
            "rolled_back_transactions": self.rolled_back,
            "expired_transactions": self.expired,
            "orphan_records": self.orphans,
        }


class ChannelSequencer:
    def __init__(
        self, pchannel: str, released_tick: int = 0, stats: SequencerStats | None = None
    ) -> None:
        self.pchannel = pchannel
        self.tick = released_tick  # everything at or below it is applied
        # the saved tick this reading resumed from: 2.3-2.5 records at or below it are applied
        self.resumed_at = released_tick
        self.stats = stats if stats is not None else SequencerStats()
        self._pending: list[Pending] = []
        self._ticks: set[int] = set()  # _tt of the waiting 2.6 events
        self._txns: dict[tuple[str, int], _OpenTxn] = {}

    # --- in ---------------------------------------------------------------------------------
    def add(self, item: Pending) -> None:
        meta = meta_of(item.event)
        if meta is None:
            if item.event.ts <= self.resumed_at:
                self.stats.repeats += 1  # read again after a resume: applied before it
                return
            self._pending.append(item)
        elif meta.txn is not None:
            self._add_to_txn(item, meta)
        elif item.event.ts <= self.tick or item.event.ts in self._ticks:
            self.stats.repeats += 1
        else:
            self._ticks.add(item.event.ts)
            self._pending.append(item)

    def _add_to_txn(self, item: Pending, meta: StreamMeta) -> None:
        assert meta.txn is not None
        key = (meta.vchannel, meta.txn.txn_id)
        event = item.event
        txn = self._txns.get(key)
        if isinstance(event, BeginTxn):
            if txn is not None:
                self.stats.repeats += 1
                return
            keepalive = from_ms(max(0, event.keepalive_ms))
            self._txns[key] = _OpenTxn(item, keepalive, event.ts)
            return
        if txn is None:
            # the transaction ended already (a repeat of its end), or began before where this
            # reader started, which the resume point rules out
            self.stats.orphans += 1
            log.debug("record of transaction %d on %s without its BeginTxn", *key[::-1])
            return
        txn.newest = max(txn.newest, event.ts)
        if isinstance(event, RollbackTxn):
            del self._txns[key]
            self.stats.rolled_back += 1
            log.info(
                "transaction %d on %s rolled back: %d records dropped",
                key[1],
                key[0],
                len(txn.bodies),
            )
            return
        if isinstance(event, CommitTxn):
            del self._txns[key]
            if event.ts <= self.tick or event.ts in self._ticks:
                self.stats.repeats += 1  # committed and applied before a restart
                return
            self.stats.committed += 1
            self._ticks.add(event.ts)
            # the bodies apply at the commit's tick; re-reading them needs the BeginTxn
            self._pending += [
                replace(
                    body,
                    event=replace(body.event, ts=event.ts),
                    before=txn.begin.before,
                    anchor=txn.begin.offset,
                )
                for body in txn.bodies
            ]
            return
        if event.ts in txn.ticks:
            self.stats.repeats += 1
            return
        txn.ticks.add(event.ts)
        txn.bodies.append(item)

    def take_older(
        self, ts: int, collection_id: int, partition: str | None = None
    ) -> list[Pending]:
        """Remove and return the waiting events of one collection (of one of its partitions,
        ``partition``) with ``ts`` at or below ``ts``, without moving the released tick: a 2.3
        DDL record is applied when read, after the DML older than it that it concerns. The
        other waiting events stay: an upsert's Insert and Delete share a timestamp, a DDL
        record can come between them (its tick is younger), and only a tick says that both
        halves were read."""

        def taken(p: Pending) -> bool:
            event = p.event
            return (
                isinstance(event, (Insert, Delete))
                and event.ts <= ts
                and event.collection_id == collection_id
                and (partition is None or event.partition_name == partition)
            )

        ready = [p for p in self._pending if taken(p)]
        if ready:
            self._pending = [p for p in self._pending if not taken(p)]
        return ready

    # --- out --------------------------------------------------------------------------------
    def take_dropped(
        self, ts: int, collection_id: int, partition: str | None = None
    ) -> list[Pending]:
        """:meth:`take_older` for a 2.3 DropCollection (DropPartition of ``partition``) at
        ``ts``, without the lone Insert of an upsert into what it drops: its Delete, still to
        come, is of the same collection and partition (skipped once read: the collection is
        no longer replicated, :class:`DroppedPartitions`), and the drop erases both halves'
        rows; written alone it would be an ``insert`` of a key the target holds (a Kafka
        consumer got the key twice), then the Delete re-made a dropped partition."""
        taken = self.take_older(ts, collection_id, partition)
        deletes = {p.event.ts for p in taken if isinstance(p.event, Delete)}
        return [p for p in taken if not _lone_upsert_insert(p.event, deletes)]

    def release(self, tick: int) -> list[Pending]:
        """The events a TimeTick at ``tick`` makes final, in ``_tt`` order (stable: a
        transaction's bodies stay in their order)."""
        self.tick = max(self.tick, tick)
        ready, self._pending = _split(self._pending, self.tick)
        self._ticks = {p.event.ts for p in self._pending if meta_of(p.event) is not None}
        for key, txn in list(self._txns.items()):
            if txn.expired(self.tick):
                del self._txns[key]
                self.stats.expired += 1
                log.warning(
                    "transaction %d on %s expired without a commit: %d records dropped",
                    key[1],
                    key[0],
                    len(txn.bodies),
                )
        return sorted(ready, key=lambda p: p.event.ts)

    def waiting(self) -> bool:
        return bool(self._pending or self._txns)

    def resume_point(self) -> Pending | None:
        """The oldest record not yet applied (its ``before`` is where a restart reads from);
        None when nothing waits."""
        candidates = [*self._pending, *(txn.begin for txn in self._txns.values())]
        return min(candidates, key=lambda p: p.resume_offset) if candidates else None

    def applied_to(self) -> int:
        """The source time up to which everything on the channel is applied once the released
        events are written."""
        waiting = [p.event.ts for p in self._pending]
        waiting += [txn.begin.event.ts for txn in self._txns.values()]
        return min(self.tick, min(waiting) - 1) if waiting else self.tick


def _split(pending: list[Pending], ts: int) -> tuple[list[Pending], list[Pending]]:
    """(events with ts <= ``ts``, the rest), each in channel order."""
    return [p for p in pending if p.event.ts <= ts], [p for p in pending if p.event.ts > ts]


def _lone_upsert_insert(event: Event, deletes: set[int]) -> bool:
    """An upsert's Insert (2.3: its ``MsgBase`` has no timestamp, its rows have the upsert's)
    without its Delete (same timestamp) among ``deletes``."""
    return (
        isinstance(event, Insert) and event.request.base.timestamp == 0 and event.ts not in deletes
    )


class DroppedPartitions:
    """The 2.3 partitions a channel read the drop of, with the drop's timestamp, until a tick
    passes it: a record of such a partition at or below its drop, read after the drop
    (concurrent proxy tasks append to a pchannel side by side; an upsert's Delete after a
    DropPartition between its halves), changes rows the drop erased. Applied, it made the
    partition again on the target with them (a Milvus target held rows the source dropped; a
    Kafka consumer got the partition made again). ``saved``: the drops kept across restarts
    (a saved position may lie past a drop while its tick is below it), ``save`` stores them
    whenever they change (a drop read, a drop passed: rare)."""

    def __init__(
        self,
        saved: Sequence[tuple[int, str, int]] = (),
        save: Callable[[list[tuple[int, str, int]]], None] = lambda _drops: None,
    ) -> None:
        self._at: dict[tuple[int, str], int] = {(c, p): at for c, p, at in saved}
        self._save = save

    def dropped(self, collection_id: int, partition: str, ts: int) -> None:
        key = (collection_id, partition)
        if self._at.get(key, 0) < ts:
            self._at[key] = ts
            self._stored()

    def erased(self, event: Insert | Delete) -> bool:
        """Whether ``event`` changes rows a drop read before it erased."""
        at = self._at.get((event.collection_id, event.partition_name))
        return at is not None and event.ts <= at

    def passed(self, tick: int) -> None:
        """A tick at ``tick``: no record at or below it follows, the drops below it are done."""
        if any(at <= tick for at in self._at.values()):
            self._at = {key: at for key, at in self._at.items() if at > tick}
            self._stored()

    def _stored(self) -> None:
        self._save(sorted((c, p, at) for (c, p), at in self._at.items()))
