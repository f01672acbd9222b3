"""Shared channel readers: the tasks of one daemon that read one source share one reader per
pchannel.

:class:`SharedSource` wraps the daemon's source. Its ``open_channel`` gives a task a
:class:`Subscription` to the pchannel's :class:`SharedChannel`, after the task's own position;
everything else (watermarks, offsets) is the wrapped source's.

A shared channel reads the pchannel once, in a thread of its own, into a buffer that holds
*every* record after its ``base`` without a gap. It reads ahead of its fastest subscriber (the
leader) by at most ``window`` bytes, and keeps older records, which slower subscribers may still
need, while the buffer stays within the window. So a channel's memory is at most the window plus
one read batch (about ``READ_BYTES``), whatever the number of tasks and the backlog.

A slow task never stalls a fast one: when the buffer must drop a record that a subscriber has not
read yet, that subscriber is *detached* and continues on a reader of its own, from its own
cursor (with the usual read-ahead of ``depth`` batches). After each of its reads it asks to
rejoin; it does when its cursor is inside the buffer again (the buffer holds the record after
it), or when the shared channel has nobody attached and restarts at its cursor.

What a subscriber returns is exactly the records after its cursor, in channel order, whichever
reader they come from: it switches readers only between two records, at its cursor. Positions,
barriers, commit order: nothing of the task changes, it only reads from somewhere else.

A subscriber whose task has nothing waiting for a time tick reads *idly*
(:meth:`Subscription.read_batch_idle`): time ticks, and the data of collections it says it
does not want, do not wake it; another record does, or the end of its wait, and it then takes
everything buffered since, in order, less the ticks another tick follows and the data of
collections it does not want (counted, so the task shows them as not selected). Neither
changes anything on the target, so an idle task's thread runs once per wait (1 to 5 s, see the
worker) per channel instead of once per record of any collection of the source. The channel
tells records apart with ``kind`` (see :data:`Kind`), once per record for every subscriber.

Errors of the shared reader are not handed to anyone as they are: the subscribers attached at
that moment are detached, and each opens its own reader, which meets the error (or not) at its own
position, as an unshared task would, with the task's own retries and reasons.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from metastore import Position
from replicator.events import RawRecord
from replicator.sources.base import READ_BYTES, ChannelReader, Wakes, more_buffered
from replicator.sources.prefetch import PrefetchingReader
from replicator.sources.shared_records import (
    BEGINNING,
    Cursor,
    Kind,
    every_record_wakes,
    kind_of,
    record_bytes,
    wants_any,
)

log = logging.getLogger(__name__)

# what the shared reader asks of the wrapped reader per read
READ_RECORDS = 1000
READ_TIMEOUT = 0.2
# the longest a subscriber reading on its own waits for a record
READ_TIMEOUT_OWN = 1.0
# how long the reading thread sleeps when nobody needs more (it is woken as soon as one does)
_IDLE_WAIT = 0.5


class _Channels(Protocol):
    def open_channel(self, pchannel: str, start: Position | None) -> ChannelReader: ...

    def offset_of(self, msg_id: bytes) -> int: ...


@dataclass
class SharedStats:
    """What a shared channel did, for the bench and the tests."""

    records_read: int = 0  # by the shared reader
    bytes_read: int = 0
    detached: int = 0  # subscribers moved to a reader of their own
    rejoined: int = 0
    restarts: int = 0  # the shared reader reopened (at a rejoining cursor, after an error)
    errors: int = 0


class SharedChannel:
    """One pchannel read once for every subscriber; see the module doc."""

    def __init__(
        self,
        source: _Channels,
        backend: str,
        pchannel: str,
        window: int,
        depth: int,
        kind: Kind = every_record_wakes,
    ) -> None:
        self.pchannel = pchannel
        self.window = window
        self.stats = SharedStats()
        self._source = source
        self._backend = backend
        self._depth = depth
        self._kind = kind
        self._lock = threading.Lock()
        # subscribers wait for records on ``_data`` (idle ones on a condition of their own,
        # woken only by a record they want); the reading thread waits for room on ``_space``
        # (one lock: a take never wakes the other subscribers)
        self._data = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        # the buffer: records in channel order, with their offsets and the running total of
        # their bytes (cum[i]: bytes of every record buffered so far up to and with i, dropped
        # ones included)
        self._records: list[RawRecord] = []
        self._offsets: list[int] = []
        self._cum: list[int] = []
        self._kinds: list[int | None] = []  # what each record is (see Kind)
        self._dropped_bytes = 0  # cum of the last record dropped
        self._base = Cursor(BEGINNING, None)  # every record after it is in the buffer
        self._attached: set[Subscription] = set()
        self._subscribers = 0
        self._generation = 0  # bumped when the buffer restarts elsewhere: reopen the reader
        self._thread: threading.Thread | None = None
        # the reader's last read stopped before the channel's end: more is there at once
        self._reader_behind = False

    # -- subscribers -----------------------------------------------------------------------
    def subscribe(self, start: Position | None) -> Subscription:
        with self._lock:
            self._subscribers += 1
        return Subscription(self, self.cursor_of(start), threading.Condition(self._lock))

    def cursor_of(self, start: Position | None) -> Cursor:
        if start is None or not start.msg_id:
            return Cursor(BEGINNING, None)
        return Cursor(self._source.offset_of(start.msg_id), start.msg_id)

    def _unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            self._attached.discard(subscription)
            self._subscribers -= 1
            if self._subscribers == 0:
                # nobody reads this channel: the thread closes its reader and ends, the
                # buffer's memory goes with it
                self._thread = None
                self._restart_at(Cursor(BEGINNING, None))
            self._space.notify()
            self._wake_all()

    def open_private(self, cursor: Cursor) -> PrefetchingReader:
        """A reader of a subscriber's own, after its cursor, reading ahead as an unshared
        task's would."""
        return PrefetchingReader(self._open(cursor), READ_RECORDS, depth=self._depth)

    def try_attach(self, subscription: Subscription) -> bool:
        """Attach a subscriber reading on its own: when the buffer holds the record after its
        cursor (or will: the cursor is the buffer's newest), or when nobody is attached (the
        shared reader then restarts at this cursor)."""
        cursor = subscription.cursor
        with self._lock:
            if not self._base.offset <= cursor.offset <= self._newest_offset():
                if self._attached:
                    return False
                self._restart_at(cursor)
                self.stats.restarts += 1
            self._attached.add(subscription)
            subscription.wake_pending = True  # whatever is buffered after it: look at it
            self._ensure_thread()
            self._space.notify()
            return True

    def take(
        self,
        subscription: Subscription,
        max_records: int,
        timeout: float,
        wakes: Wakes | None = None,
    ) -> list[RawRecord]:
        """Up to ``max_records`` buffered records after the subscriber's cursor, waiting up to
        ``timeout`` for the first; idle (``wakes`` given), for the first record it wants, and
        then returning all before it too (or what there is when the wait ends), less what an
        idle subscriber needs not see (:meth:`_idle_view`); [] and the subscriber detached
        when the buffer no longer holds what it needs."""
        with self._lock:
            subscription.wakes = wakes
            if self._would_wait(subscription, wakes):
                if wakes is not None:
                    subscription.woken.wait(timeout)
                else:
                    self._data.wait(timeout)
            return self._take_after_cursor(subscription, max_records, wakes)

    def poll(
        self, subscription: Subscription, max_records: int, wakes: Wakes | None, last: bool
    ) -> list[RawRecord] | None:
        """What :meth:`take` would return now, or None when it would still wait (``last``:
        the wait is over, answer); the subscriber's listener says when to ask again."""
        with self._lock:
            subscription.wakes = wakes
            if not last and self._would_wait(subscription, wakes):
                return None
            return self._take_after_cursor(subscription, max_records, wakes)

    def _would_wait(self, subscription: Subscription, wakes: Wakes | None) -> bool:
        """Under the lock: would a read wait (attached, and nothing it wants buffered)?"""
        if subscription not in self._attached:
            return False
        if wakes is not None:
            return not subscription.wake_pending
        first, end = self._after(subscription, 1)
        return first == end

    def _take_after_cursor(
        self, subscription: Subscription, max_records: int, wakes: Wakes | None
    ) -> list[RawRecord]:
        first, end = self._after(subscription, max_records)
        if wakes is not None:
            records = self._idle_view(subscription, first, end, wakes)
        else:
            records = self._records[first:end]
        if records:
            subscription.cursor = Cursor.of(records[-1])
            self._space.notify()  # the reader may read ahead again
        subscription.took_all = subscription.cursor.offset >= self._newest_offset()
        if subscription.took_all:
            subscription.wake_pending = False
        return records

    def wake(self, subscription: Subscription) -> None:
        """End a subscriber's idle wait now (its task stops)."""
        with self._lock:
            subscription.wake_pending = True
            subscription.woken.notify()
            subscription.call_listener()

    def release(self, subscription: Subscription) -> None:
        """Let a subscriber go from the buffer (it goes on reading on its own or elsewhere)."""
        with self._lock:
            self._attached.discard(subscription)
            self._space.notify()

    def reader_behind(self) -> bool:
        """Did the channel's reader stop its last read before the channel's end (a backlog
        read no faster than its subscribers take it)?"""
        with self._lock:
            return self._reader_behind

    def is_attached(self, subscription: Subscription) -> bool:
        with self._lock:
            return subscription in self._attached

    def _after(self, subscription: Subscription, max_records: int) -> tuple[int, int]:
        """Where the records after the subscriber's cursor are in the buffer, up to
        ``max_records`` of them and about ``READ_BYTES`` (at least one record), as one read of
        a reader of its own would give (an empty span when it is not attached). A take of the
        whole window would hold it twice over in the task: raw, and decoded for the target."""
        if subscription not in self._attached:
            return 0, 0
        first = bisect.bisect_right(self._offsets, subscription.cursor.offset)
        end = min(first + max_records, len(self._records))
        if first < end:
            limit = self._bytes_before(first) + READ_BYTES
            within = bisect.bisect_right(self._cum, limit, lo=first, hi=end)
            end = max(first + 1, within)
        return first, end

    def _idle_view(
        self, subscription: Subscription, first: int, end: int, wakes: Wakes
    ) -> list[RawRecord]:
        """``records[first:end]`` as an idle subscriber needs them: without the ticks another
        tick follows (the later one releases all the earlier would) and without the data of
        collections it does not want, which it would only count as not selected (counted into
        its ``passed_over`` instead). The last record is always kept: it is the new cursor."""
        records, kinds = self._records, self._kinds
        wanted: dict[int, bool] = {}
        view: list[RawRecord] = []
        after_tick = False
        for i in range(first, end):
            kind = kinds[i]
            if kind is None:
                if after_tick:
                    view[-1] = records[i]
                else:
                    view.append(records[i])
                after_tick = True
                continue
            if kind >= 0 and i + 1 < end:
                if kind not in wanted:
                    wanted[kind] = wants_any(wakes, {kind})
                if not wanted[kind]:
                    subscription.passed_over += 1
                    continue
            view.append(records[i])
            after_tick = False
        return view

    # -- the buffer ------------------------------------------------------------------------
    def _bytes_before(self, index: int) -> int:
        """The running total of bytes before the record at ``index`` of the buffer."""
        return self._cum[index - 1] if index > 0 else self._dropped_bytes

    def _newest_offset(self) -> int:
        return self._offsets[-1] if self._records else self._base.offset

    def _leader_offset(self) -> int:
        return max(s.cursor.offset for s in self._attached)

    def _unread_by_leader(self) -> int:
        if not self._records:
            return 0
        first = bisect.bisect_right(self._offsets, self._leader_offset())
        return self._cum[-1] - self._bytes_before(first)

    def held_bytes(self) -> int:
        """The bytes of every record the buffer holds."""
        with self._lock:
            return self._cum[-1] - self._bytes_before(0) if self._records else 0

    def _restart_at(self, cursor: Cursor) -> None:
        self._records, self._offsets, self._cum, self._kinds = [], [], [], []
        self._dropped_bytes = 0
        self._base = cursor
        self._generation += 1
        self._reader_behind = False

    def _append(self, batch: list[RawRecord], record_kinds: list[int | None]) -> None:
        """Buffer ``batch``, and wake the idle subscribers that want a record of it
        (``record_kinds``: what each record is)."""
        total = self._cum[-1] if self._cum else self._dropped_bytes
        for record, kind in zip(batch, record_kinds, strict=True):
            total += record_bytes(record)
            self._records.append(record)
            self._offsets.append(record.offset)
            self._cum.append(total)
            self._kinds.append(kind)
        kinds = {kind for kind in record_kinds if kind is not None}
        self.stats.records_read += len(batch)
        self.stats.bytes_read += sum(len(r.payload) for r in batch)
        self._evict()
        self._data.notify_all()
        everyone = bool(kinds) and min(kinds) < 0
        for subscription in self._attached:
            wakes = subscription.wakes
            woken = wakes is None  # a plain read: any record ends its wait
            if (
                kinds
                and not subscription.wake_pending
                and (everyone or wakes is None or wants_any(wakes, kinds))
            ):
                subscription.wake_pending = True
                subscription.woken.notify()
                woken = True
            if woken:
                subscription.call_listener()

    def _evict(self) -> None:
        """Drop the oldest records while the buffer is over the window, never one the leader
        has not read; detach the subscribers that needed a dropped record."""
        leader = self._leader_offset() if self._attached else self._newest_offset()
        dropped = 0
        while (
            dropped < len(self._records)
            and self._cum[-1] - self._dropped_bytes > self.window
            and self._offsets[dropped] <= leader
        ):
            self._dropped_bytes = self._cum[dropped]
            self._base = Cursor.of(self._records[dropped])
            dropped += 1
        for subscription in [s for s in self._attached if s.cursor.offset < self._base.offset]:
            self._detach(subscription, "fell behind the shared reader's window")
        # dropped records go at once: a backlog's records are megabytes each (moving the
        # lists' pointers down costs microseconds)
        del self._records[:dropped], self._offsets[:dropped]
        del self._cum[:dropped], self._kinds[:dropped]

    def _wake_all(self) -> None:
        self._data.notify_all()
        for subscription in self._attached:
            subscription.woken.notify()
            subscription.call_listener()

    def _detach(self, subscription: Subscription, why: str) -> None:
        self._attached.discard(subscription)
        subscription.woken.notify()  # an idle subscriber waiting for records learns at once
        subscription.call_listener()
        self.stats.detached += 1
        log.info(
            "%s: a task's reader continues on its own after offset %d: %s",
            self.pchannel,
            subscription.cursor.offset,
            why,
        )

    # -- the reading thread ----------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            thread = threading.Thread(
                target=self._run, name=f"shared-read-{self.pchannel}", daemon=True
            )
            self._thread = thread
            thread.start()

    def _wants_read(self, generation: int) -> bool:
        if not self._attached:
            return False
        return generation != self._generation or self._unread_by_leader() < self.window

    def _run(self) -> None:
        me = threading.current_thread()
        reader: ChannelReader | None = None
        generation, base = -1, self._base
        try:
            while True:
                stale: ChannelReader | None = None
                with self._lock:
                    while self._thread is me and not self._wants_read(generation):
                        self._space.wait(_IDLE_WAIT)
                    if self._thread is not me:
                        return
                    if generation != self._generation:
                        stale, reader = reader, None
                        generation, base = self._generation, self._base
                if stale is not None:
                    stale.close()
                try:
                    if reader is None:
                        reader = self._open(base)
                    batch = reader.read_batch(READ_RECORDS, READ_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - each subscriber meets it on its own
                    if reader is not None:
                        reader.close()
                        reader = None
                    self._failed(exc)
                    continue
                # told apart outside the lock: the subscribers take meanwhile
                kinds = [kind_of(self._kind, record) for record in batch]
                behind = more_buffered(reader)
                with self._lock:
                    if generation == self._generation:
                        self._reader_behind = behind
                        if batch:
                            self._append(batch, kinds)
        finally:
            if reader is not None:
                reader.close()

    def _open(self, cursor: Cursor) -> ChannelReader:
        """The wrapped source's reader of this channel, after ``cursor``."""
        start = (
            None
            if cursor.msg_id is None
            else Position(self._backend, self.pchannel, cursor.msg_id, 0)
        )
        return self._source.open_channel(self.pchannel, start)

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.stats.errors += 1
            for subscription in list(self._attached):
                self._detach(subscription, f"the shared reader failed: {exc}")
            self._restart_at(self._base)
            self._wake_all()
        log.warning("%s: the shared reader failed, tasks read on their own: %s", self.pchannel, exc)


class Subscription:
    """A task's reader of a shared channel (a :class:`ChannelReader`): from the shared buffer
    while attached, else from a reader of its own."""

    reads_ahead = True  # it is buffered already: no prefetching wrapper around it

    def __init__(self, channel: SharedChannel, cursor: Cursor, woken: threading.Condition) -> None:
        self.pchannel = channel.pchannel
        self.cursor = cursor
        # idle reads (the channel's lock guards these): what wakes it, the condition it waits
        # on, and whether a record it wants came since it last took everything
        self.wakes: Wakes | None = None
        self.woken = woken
        self.wake_pending = True
        # its last take reached the newest record buffered
        self.took_all = False
        # data records of collections it does not want that idle reads left out (see
        # SharedChannel._idle_view), not yet counted by its task
        self.passed_over = 0
        # what a fiber reading it is woken by (see listen)
        self.listener: Callable[[], None] | None = None
        self._channel = channel
        self._own: PrefetchingReader | None = None
        self._closed = False
        if not channel.try_attach(self):
            self._open_own()

    @property
    def shared(self) -> bool:
        """Reading the shared buffer now (False once it was detached, even before its next
        read opens a reader of its own)."""
        # read without the channel's lock (asked after every read by every task): a set's
        # membership is read atomically, and a moment's staleness only delays the status
        return self._own is None and self in self._channel._attached

    def read_batch(self, max_records: int, timeout: float) -> list[RawRecord]:
        return self._read(max_records, timeout, None)

    def read_batch_idle(self, max_records: int, timeout: float, wakes: Wakes) -> list[RawRecord]:
        """A read for a task with nothing waiting for a tick: up to ``timeout`` for a record
        that is no time tick and, for data, of a collection ``wakes`` selects (see the module
        doc). On a reader of its own, a plain read."""
        return self._read(max_records, timeout, wakes)

    def wake(self) -> None:
        """End an idle read now, from another thread (its task stops)."""
        self._channel.wake(self)

    def take_passed_over(self) -> int:
        """The data records of unwanted collections idle reads left out since the last call
        (the task counts them as not selected)."""
        count, self.passed_over = self.passed_over, 0
        return count

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` when a read would stop waiting (see :class:`PolledReader`):
        called by the shared reader under the channel's lock, it must only signal."""
        with self._channel._lock:
            self.listener = listener
        own = self._own
        if own is not None:
            own.listen(listener)

    def call_listener(self) -> None:
        listener = self.listener
        if listener is not None:
            listener()

    def poll(self, max_records: int, wakes: Wakes | None, last: bool) -> list[RawRecord] | None:
        """What a read (``wakes`` None) or an idle read would return now; None when it would
        still wait and ``last`` is False."""
        if self._own is None:
            records = self._channel.poll(self, max_records, wakes, last)
            if records is None or records or self._channel.is_attached(self):
                return records
            self._open_own()
        records = self._read_own(max_records, 0)
        return records if records or last else None

    def more_buffered(self) -> bool:
        own = self._own
        if own is not None:
            return own.more_buffered()
        return not self.took_all or self._channel.reader_behind()

    def _read(self, max_records: int, timeout: float, wakes: Wakes | None) -> list[RawRecord]:
        if self._own is None:
            records = self._channel.take(self, max_records, timeout, wakes)
            if records or self._channel.is_attached(self):
                return records
            self._open_own()
        # on its own every record wakes it, and a wake() does not reach it: short waits
        return self._read_own(max_records, min(timeout, READ_TIMEOUT_OWN))

    def _open_own(self) -> None:
        """Detached: read on its own, after the cursor."""
        own = self._channel.open_private(self.cursor)
        own.listen(self.listener)
        self._own = own

    def _read_own(self, max_records: int, timeout: float) -> list[RawRecord]:
        own = self._own
        assert own is not None
        records = own.read_batch(max_records, timeout)
        self.took_all = len(records) < max_records
        if records:
            self.cursor = Cursor.of(records[-1])
        if self._channel.try_attach(self):
            self._own = None
            own.close()
            self._channel.stats.rejoined += 1
        return records

    def seek(self, position: Position | None) -> None:
        self._channel.release(self)
        own, self._own = self._own, None
        if own is not None:
            own.close()
        self.cursor = self._channel.cursor_of(position)
        if not self._channel.try_attach(self):
            self._open_own()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        own, self._own = self._own, None
        if own is not None:
            own.close()
        self._channel._unsubscribe(self)
