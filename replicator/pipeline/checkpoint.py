"""One channel's commit protocol: what makes a ``kill -9`` lose nothing and double nothing.

Commit order, per channel, for a batch of released events read up to position ``P``:

    1. persist the in-flight bound: the offset of the batch's last record   (task state)
    2. write the batch to the target; it acknowledges each request          (BatchWriter)
    3. persist the position ``P``                                           (save_position)

The replay decision: a record at or below the bound found at start (or at a rewind) may be on
the target already, so its inserts are written as upserts; rows the target has are replaced,
never doubled. Deletes and DDL are idempotent anyway. Every failure branch then ends well:

- a crash or a failed write between 1 and 3: the saved position is before the batch and the
  bound at its end; the batch is read again and written as upserts;
- a crash before 1: the records were never written; they are read again as plain inserts;
- a failed position save after 2 (a metastore outage): the worker rewinds to the saved
  position; the batch is written again, as upserts;
- a WAL switch: the bound counted offsets of the old queue; it is reset with the position
  that names the new queue.

A target that writes in transactions (a Kafka target, ``durable``) needs no replay rule and no
in-flight bound: the batch's events and the position ``P`` are committed together before
step 3, so a crash leaves either both or neither; a rewind then starts after the newer of the
metastore's position and the target's (see :mod:`replicator.sinks.kafka`), and drops the
events not committed yet (they are read again). While a channel works through a backlog
(``more``), its commits are grouped: one transaction and one save for up to ``GROUP_EVENTS``
events or ``GROUP_SECONDS``, instead of one a read.

Tests: ``tests/unit/test_checkpoint.py``, one per branch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from metastore import MetaStore, Position
from replicator.events import Delete, Insert
from replicator.pipeline.sequencer import Pending
from replicator.pipeline.task_state import RunnerState

log = logging.getLogger(__name__)

# a transactional target's commits during a backlog: one for up to this many events (about
# 10 MB of JSON for small rows) or this long, whichever comes first
GROUP_EVENTS = 20_000
GROUP_SECONDS = 1.0


class BatchWriter(Protocol):
    def apply(self, events: Sequence[Insert | Delete], *, replay: bool = False) -> None:
        """Write to the target; return once it acknowledged every request."""


class DurableLog(Protocol):
    """A target's own record of a channel: events and position committed as one."""

    def commit(self, position: Position | None) -> None:
        """Commit the events written since the last commit, with ``position`` if given; return
        once they are committed, with every commit submitted before."""

    def submit(self, position: Position) -> None:
        """What ``commit`` does, returning before it is committed (``committed`` says when)."""

    def settle(self) -> None:
        """Wait until what was submitted is committed (raise what failed it)."""

    def committed(self) -> Position | None:
        """The channel's last position the target committed."""

    def pending(self) -> int:
        """The events written since the last commit."""

    def discard(self) -> None:
        """Drop the events written since the last commit (they are read again)."""


class ChannelCheckpoint:
    def __init__(
        self,
        store: MetaStore,
        state: RunnerState,
        task_id: str,
        pchannel: str,
        backend: str,
        saved: Position | None,
        writer: BatchWriter | None,
        offset_of: Callable[[bytes], int],
        durable: DurableLog | None = None,
    ) -> None:
        self._store = store
        self.durable = durable
        self._state = state
        self._task_id = task_id
        self.pchannel = pchannel
        self.backend = backend
        # the position reading resumes after, and its tick (everything at or below it is
        # applied): the metastore's, or a durable target's newer one after the metastore's
        # save that follows its commit failed (see ``rewind``)
        self.saved = saved
        self._stored = saved  # what the metastore holds (the compare-and-set expectation)
        self._writer = writer  # None: a channel without data (the replicate channel)
        self._offset_of = offset_of
        self.bound = state.inflight_bound(pchannel)
        # records at or below it may be on the target already: their inserts go as upserts
        self.replay_until = self.bound
        # the last batch: how long the target took to acknowledge it, and when it did
        self.write_seconds = 0.0
        self.written_at = 0.0
        # a durable target's position not committed yet (a commit grouped with the next
        # reads of a backlog), and since when
        self.deferred: Position | None = None
        self._deferred_at = 0.0
        self._stored_at = 0.0  # when the metastore last took a submitted commit's position

    def replaying(self, offset: int) -> bool:
        return offset <= self.replay_until

    def saved_offset(self) -> int:
        """The offset of the saved position's record; -1 before the channel's first record."""
        if self.saved is None or not self.saved.msg_id:
            return -1
        return self._offset_of(self.saved.msg_id)

    def rewind(self) -> Position | None:
        """After a failure: reading starts again after the saved position, and what the bound
        covers (possibly written by the failed attempt) is replayed as upserts. A durable
        target that committed a newer position (the metastore's save after it failed) is
        ahead: its position becomes the saved one (where reading resumes, with its tick), and
        the metastore's stays the expectation of the next save, which brings it up."""
        self.replay_until = max(self.replay_until, self.bound)
        if self.durable is not None:
            self.durable.settle()  # a failed commit stops the task: no rewind then
            self.durable.discard()
            self.deferred = None
            committed = self.durable.committed()
            if committed is not None and newer(committed, self.saved, self._offset_of):
                self.saved = committed
        return self.saved

    def commit(
        self, batch: Sequence[Pending], at: bytes | None, ts: int, *, more: bool = False
    ) -> bool:
        """Write ``batch`` (a Milvus target's in-flight bound first), then save the position
        ``at`` (with tick ``ts``);
        ``at`` None: the batch only (the position moves with a later commit). ``more``: the
        channel has more of a backlog to read; a durable target's commit may then wait for it
        (see ``GROUP_EVENTS``). False when the position waits so (``deferred``)."""
        if batch:
            assert self._writer is not None, "a channel without a writer has no data"
            offsets = [p.offset for p in batch]
            first, last = min(offsets), max(offsets)
            if last > self.bound and self.durable is None:
                self._state.set_inflight_bound(self.pchannel, last)
                self.bound = last
            replay = self.replaying(first)
            events = [p.event for p in batch if isinstance(p.event, (Insert, Delete))]
            log.debug(
                "applying %d events, offsets %d..%d%s",
                len(events),
                first,
                last,
                " as replay" if replay else "",
            )
            started = time.monotonic()
            self._writer.apply(events, replay=replay)
            self.write_seconds = time.monotonic() - started
            self.written_at = time.time()
        position = self.deferred
        if at is not None and (self.saved is None or at != self.saved.msg_id or ts > self.saved.ts):
            position = Position(self.backend, self.pchannel, at, ts)
        if position is None:
            return True
        if more and self._may_wait():
            if self.deferred is None:
                self._deferred_at = time.monotonic()
            self.deferred = position
            return False
        self._save(position, pipelined=more)
        return True

    def _may_wait(self) -> bool:
        """May a durable target's commit wait for the next read of a backlog?"""
        if self.durable is None:
            return False
        if self.deferred is not None and time.monotonic() - self._deferred_at >= GROUP_SECONDS:
            return False
        return self.durable.pending() < GROUP_EVENTS

    def _save(self, position: Position, *, pipelined: bool = False) -> None:
        """Commit ``position`` (a durable target's events with it), then save it in the
        metastore. ``pipelined`` (a durable target's commit in a backlog): the commit is
        submitted and the channel reads on; the metastore gets the newest position the target
        committed instead (the next commits and ``settle`` bring it up)."""
        if self.durable is not None and pipelined:
            self.durable.submit(position)
            self.deferred = None
            self.saved = position  # where reading goes on (a failed commit stops the task)
            if time.monotonic() - self._stored_at >= GROUP_SECONDS:  # a save a second at most
                self._store_committed()
            return
        if self.durable is not None:
            self.durable.commit(position)
        self.deferred = None
        self._store.save_position(self._task_id, position, self._stored)
        log.debug("saved position %s ts %d", position.msg_id.hex(), position.ts)
        self.saved = self._stored = position

    def settle(self) -> None:
        """A durable target: wait until the submitted commits are committed (raising what
        failed them), and save the newest in the metastore."""
        if self.durable is not None:
            self.durable.settle()
            self._store_committed()

    def _store_committed(self) -> None:
        """The metastore catches up with the durable target's newest committed position."""
        assert self.durable is not None
        committed = self.durable.committed()
        if committed is None or committed == self._stored:
            return
        if newer(committed, self._stored, self._offset_of):
            self._store.save_position(self._task_id, committed, self._stored)
            self._stored = committed
            self._stored_at = time.monotonic()

    def switch_to(self, backend: str, switch_ts: int) -> Position:
        """The source moved the channel to another WAL (recorded in the task state first):
        the position names the new queue's start, after tick ``switch_ts``; the bound, which
        counted the old queue's offsets, is reset."""
        position = Position(backend, self.pchannel, b"", switch_ts)
        self._save(position)
        self._state.set_inflight_bound(self.pchannel, -1)
        self.bound = self.replay_until = -1
        self.backend = backend
        return position


def newer(position: Position, than: Position | None, offset_of: Callable[[bytes], int]) -> bool:
    """Is ``position`` after ``than`` on the same channel? By tick, then (same queue) offset."""
    if than is None:
        return True
    if position.ts != than.ts or position.backend != than.backend:
        return position.ts > than.ts
    if position.msg_id == than.msg_id:
        return False
    if not than.msg_id:
        return bool(position.msg_id)
    if not position.msg_id:
        return False
    return offset_of(position.msg_id) > offset_of(than.msg_id)
