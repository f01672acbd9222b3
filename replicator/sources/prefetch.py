"""Reading ahead: a channel reader that fetches the next batches in a thread of its own.

A channel worker spends most of a catch-up waiting for the target to acknowledge a write; with
the reader in front of it running ahead, the next batch is read (and its bytes are in memory)
by the time the write returns. At most ``depth`` batches wait, each at most about READ_BYTES,
so memory stays bounded. A fiber reads it without waiting (``listen`` and ``poll``): the
reading thread calls the listener after each batch it queues.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from metastore import Position
from replicator.events import RawRecord
from replicator.sources.base import ChannelReader, Wakes, more_buffered

_PUT_WAIT = 0.1


class PrefetchingReader:
    def __init__(
        self, inner: ChannelReader, max_records: int, depth: int = 2, timeout: float = 0.2
    ) -> None:
        self.pchannel = inner.pchannel
        self._inner = inner
        self._max_records = max_records
        self._timeout = timeout
        self._queue: queue.Queue[list[RawRecord] | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leftover: list[RawRecord] = []  # of a batch read ahead, not yet asked for
        self._inner_behind = False  # the inner reader's last read stopped before the end
        self._listener: Callable[[], None] | None = None
        self._start()

    def _start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"read-{self.pchannel}", daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        while not self._queue.empty():
            self._queue.get_nowait()
        self._leftover = []
        self._inner_behind = False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._inner.read_batch(self._max_records, self._timeout)
                self._inner_behind = more_buffered(self._inner)
                if batch:
                    self._put(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(exc)

    def _put(self, item: list[RawRecord] | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_PUT_WAIT)
            except queue.Full:
                continue
            listener = self._listener
            if listener is not None:
                listener()
            return

    def listen(self, listener: Callable[[], None] | None) -> None:
        self._listener = listener

    def poll(self, max_records: int, wakes: Wakes | None, last: bool) -> list[RawRecord] | None:
        """A read that does not wait (every record ends an idle read of a reader of its own:
        ``wakes`` changes nothing)."""
        records = self.read_batch(max_records, 0)
        return records if records or last else None

    def more_buffered(self) -> bool:
        return bool(self._leftover) or not self._queue.empty() or self._inner_behind

    def read_batch(self, max_records: int, timeout: float) -> list[RawRecord]:
        """Up to ``max_records`` of the records read ahead (the rest of a larger batch is
        kept for the next call); an error of the underlying reader is raised here, in the
        consumer."""
        if not self._leftover:
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                return []
            if isinstance(item, BaseException):
                self._halt()
                raise item
            self._leftover = item
        batch, self._leftover = self._leftover[:max_records], self._leftover[max_records:]
        return batch

    def seek(self, position: Position | None) -> None:
        self._halt()
        self._inner.seek(position)
        self._start()

    def close(self) -> None:
        self._halt()
        self._inner.close()


def reading_ahead(reader: ChannelReader, max_records: int, depth: int) -> ChannelReader:
    """``reader`` reading ahead: itself when it does already (a shared channel's
    subscription, :mod:`replicator.sources.shared`), else in a :class:`PrefetchingReader`."""
    if getattr(reader, "reads_ahead", False):
        return reader
    return PrefetchingReader(reader, max_records, depth=depth)
