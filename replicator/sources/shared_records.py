"""What a shared channel knows of a record: its kind, its cost in the buffer, the cursor after it.

See :mod:`replicator.sources.shared`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from replicator.events import RawRecord
from replicator.sources.base import Wakes

# what a record costs in the buffer beyond its payload (object, properties, lists)
RECORD_OVERHEAD = 256
BEGINNING = -1  # the cursor of a reader that starts at the beginning of the channel


# What a record is to an idle subscriber: None for a time tick, a collection's id (>= 0) for a
# record of that collection's data, a negative number for anything else (every idle
# subscriber wakes for it)
Kind = Callable[[RawRecord], int | None]


def every_record_wakes(record: RawRecord) -> int | None:
    """The kind that knows nothing: every record wakes every idle subscriber."""
    return -1


def record_bytes(record: RawRecord) -> int:
    return len(record.payload) + RECORD_OVERHEAD


@dataclass(frozen=True)
class Cursor:
    """The last record a reader has: its order on the channel and its message id (None and
    ``BEGINNING``: nothing yet, read from the beginning)."""

    offset: int
    msg_id: bytes | None

    @classmethod
    def of(cls, record: RawRecord) -> Cursor:
        return cls(record.offset, record.msg_id)


def kind_of(kind: Kind, record: RawRecord) -> int | None:
    """``kind`` of a record; a record it cannot tell wakes everyone (whoever reads it decodes
    it): a failure here would stop the shared reader's thread, and every subscriber with it."""
    try:
        return kind(record)
    except Exception:  # noqa: BLE001 - see the docstring
        return -1


def wants_any(wakes: Wakes, kinds: set[int]) -> bool:
    """Does a subscriber want data of one of ``kinds``? One that cannot tell is woken."""
    try:
        return any(wakes(kind) for kind in kinds)
    except Exception:  # noqa: BLE001 - as in kind_of
        return True


__all__ = [
    "BEGINNING",
    "RECORD_OVERHEAD",
    "Cursor",
    "Kind",
    "every_record_wakes",
    "kind_of",
    "record_bytes",
    "wants_any",
]
