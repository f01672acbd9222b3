"""The WAL reader contract: one reader per source pchannel, built from its resume position.

``open_channel(pchannel, start)`` returns a reader positioned at the first record *after*
``start`` (the beginning of the channel when ``start`` is None). Readers never commit offsets to
the broker: the metastore is the only truth about progress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from metastore import Position
from replicator.errors import SourceUnavailableError, WalTruncatedError
from replicator.events import RawRecord

# What one read_batch returns at most, in payload bytes (always at least one record): a backlog
# of multi-MB Insert records is read a slice at a time, so memory stays bounded.
READ_BYTES = 8 * 1024 * 1024


class ChannelReader(Protocol):
    pchannel: str

    def read_batch(self, max_records: int, timeout: float) -> list[RawRecord]:
        """Up to ``max_records`` records (and about ``READ_BYTES`` of payload) in channel
        order; an empty list after ``timeout``."""

    def seek(self, position: Position | None) -> None:
        """Continue after ``position`` (from the beginning when None)."""

    def close(self) -> None: ...


# which collections' data ends an idle read (see replicator.sources.shared)
Wakes = Callable[[int], bool]


def more_buffered(reader: object) -> bool:
    """Did the last read of ``reader`` leave records waiting, to be taken at once (a
    backlog)? False for a reader that cannot tell."""
    buffered = getattr(reader, "more_buffered", None)
    return bool(buffered()) if buffered is not None else False


@runtime_checkable
class PolledReader(Protocol):
    """A reader whose reads need not wait in the caller's thread (a fiber's, see
    :mod:`replicator.fibers`): it calls its listener when records may have come, and ``poll``
    answers at once."""

    pchannel: str

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (from any thread, cheaply) whenever a read may find something
        new: the records a waiting ``read_batch`` would return for, or an idle read's wake-up
        (None: nobody listens)."""

    def poll(self, max_records: int, wakes: Wakes | None, last: bool) -> list[RawRecord] | None:
        """What ``read_batch`` (``wakes`` None) or an idle read (see the shared readers) would
        return now, or None when it would still wait; ``last``: its wait is over, answer."""

    def more_buffered(self) -> bool:
        """Were records left waiting, to be taken at once, by the last read (a backlog)? A
        reader over another (read ahead, shared) says so too while the one under it is
        behind its channel's end: a backlog has not ended because the records read ahead so
        far were all taken."""


class WalSource(Protocol):
    backend: str

    def open_channel(self, pchannel: str, start: Position | None) -> ChannelReader: ...

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        """(earliest offset still held, offset the next record will get). ``timeout``: how
        long to wait for the source at most, in seconds (None: the source's own default); a
        source that does not answer within it raises ``SourceUnavailableError``."""

    def offset_of(self, msg_id: bytes) -> int:
        """The order of a record on its channel, from its message id (Milvus's own positions
        use the same ids, so a collection's start position converts too)."""

    def position_before(self, offset: int) -> bytes | None:
        """A message id to resume after so that reading starts at ``offset`` (None: from the
        beginning of the channel)."""


__all__ = [
    "READ_BYTES",
    "ChannelReader",
    "PolledReader",
    "SourceUnavailableError",
    "Wakes",
    "WalSource",
    "WalTruncatedError",
    "more_buffered",
]
