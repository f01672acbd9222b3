"""What a task's channel worker asks of a reader that can read idly (a shared subscription)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from replicator.events import RawRecord
from replicator.sources.base import Wakes


@runtime_checkable
class IdleReader(Protocol):
    """A channel reader that can read idly (see the module doc): what a task's channel worker
    asks of a :class:`Subscription`."""

    took_all: bool

    def take_passed_over(self) -> int: ...

    def read_batch_idle(
        self, max_records: int, timeout: float, wakes: Wakes
    ) -> list[RawRecord]: ...

    def wake(self) -> None: ...


__all__ = ["IdleReader"]
