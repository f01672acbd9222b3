"""The daemon's source wrapped so that its tasks share one reader per pchannel."""

from __future__ import annotations

import threading

from metastore import Position
from replicator.sources.base import READ_BYTES, ChannelReader, WalSource
from replicator.sources.shared import SharedChannel
from replicator.sources.shared_records import Kind, every_record_wakes


class SharedSource:
    """A source whose channel readers are shared by every task of the daemon (see the module
    doc); the rest of the :class:`WalSource` contract is the wrapped source's."""

    def __init__(
        self,
        source: WalSource,
        window: int = 2 * READ_BYTES,
        depth: int = 2,
        kind: Kind = every_record_wakes,
    ) -> None:
        self.inner = source
        self.backend = source.backend
        self.window = window
        self.depth = depth
        self.kind = kind
        self._lock = threading.Lock()
        self._channels: dict[str, SharedChannel] = {}

    def channel(self, pchannel: str) -> SharedChannel:
        with self._lock:
            shared = self._channels.get(pchannel)
            if shared is None:
                shared = SharedChannel(
                    self.inner, self.backend, pchannel, self.window, self.depth, self.kind
                )
                self._channels[pchannel] = shared
            return shared

    def open_channel(self, pchannel: str, start: Position | None) -> ChannelReader:
        return self.channel(pchannel).subscribe(start)

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        return self.inner.watermarks(pchannel, timeout)

    def offset_of(self, msg_id: bytes) -> int:
        return self.inner.offset_of(msg_id)

    def position_before(self, offset: int) -> bytes | None:
        return self.inner.position_before(offset)


def unshared(source: WalSource) -> WalSource:
    """The source itself, not the daemon's shared readers of it: for a short read somewhere
    else than where the tasks read (the backfill's hand-over looks just before a start)."""
    return source.inner if isinstance(source, SharedSource) else source


__all__ = ["SharedSource", "unshared"]
