"""The reading loop of a task's channel, as a fiber (:mod:`replicator.fibers`): open a reader
after the saved position, consume it, retry what can be retried, and wait for records without
holding a thread.

A worker's loop is a generator: where a blocking read would wait, :func:`next_batch` yields
until the reader's listener says records may have come (or the wait is over), then answers with
exactly what the blocking read would have returned. A reader that cannot tell when records come
is read as before, blocking (only readers outside the daemon's own are such).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any, cast

from metastore import MetaStoreError, Position, PositionConflictError, TaskNotFoundError
from replicator.errors import (
    CdcError,
    SinkSessionLostError,
    TaskFailedError,
    WalTruncatedError,
    is_retriable,
)
from replicator.events import RawRecord
from replicator.fibers import pause
from replicator.pipeline.checkpoint import ChannelCheckpoint
from replicator.pipeline.context import TaskContext
from replicator.pipeline.status import ChannelState, ChannelStatus
from replicator.sources.base import ChannelReader, PolledReader, Wakes
from replicator.sources.idle_reader import IdleReader

log = logging.getLogger(__name__)

READ_TIMEOUT = 0.2
MAX_BACKOFF = 30.0

# a fiber's steps that end with a value
Steps = Generator[float, None, Any]


def next_batch(
    reader: ChannelReader | IdleReader,
    stop: Any,
    max_records: int,
    timeout: float,
    wakes: Wakes | None = None,
) -> Generator[float, None, list[RawRecord]]:
    """In a fiber: what ``reader.read_batch(max_records, timeout)`` returns (with ``wakes``, an
    idle read's ``read_batch_idle``), yielding while it would wait. ``stop`` (the task's stop
    event) ends the wait: the read then answers with what it has."""
    poll = getattr(reader, "poll", None)  # a PolledReader (an isinstance check costs more)
    if poll is None:
        if wakes is not None:
            return cast(IdleReader, reader).read_batch_idle(max_records, timeout, wakes)
        return cast(ChannelReader, reader).read_batch(max_records, timeout)
    until = time.monotonic() + timeout
    while True:
        last = stop.is_set() or time.monotonic() >= until
        records: list[RawRecord] | None = poll(max_records, wakes, last)
        if records is not None:
            return records
        yield until


def read_with_retries(
    checkpoint: ChannelCheckpoint,
    status: ChannelStatus,
    context: TaskContext,
    wake: Callable[[], None],
    open_reader: Callable[[Position | None], ChannelReader],
    consume: Callable[[ChannelReader], Generator[float, None, bool]],
) -> Generator[float, None, None]:
    """In a fiber woken by ``wake``: open a reader after the saved position and ``consume`` it
    until the task stops (True from ``consume``: go on from the saved position, on the WAL the
    source switched to). A retriable failure of the source, target or metastore rewinds to the
    saved position after a backoff; any other fails the task with a reason naming the
    channel."""
    pchannel, backoff = checkpoint.pchannel, 1.0
    start = checkpoint.saved
    while not context.stop.is_set():
        reader: ChannelReader | None = None
        try:
            reader = open_reader(start if start is not None and start.msg_id else None)
            if isinstance(reader, PolledReader):
                reader.listen(wake)
            status.set_state(ChannelState.RUNNING)
            if not (yield from consume(reader)):
                return
            start = checkpoint.saved
        except (TaskFailedError, TaskNotFoundError, PositionConflictError, SinkSessionLostError):
            raise
        except WalTruncatedError as exc:
            raise TaskFailedError(f"channel {pchannel}: {exc}") from exc
        except (CdcError, MetaStoreError) as exc:
            if not is_retriable(exc):
                raise TaskFailedError(
                    f"channel {pchannel}, reading {_after(checkpoint.saved)}: {exc}"
                ) from exc
            status.caught_up = False  # what it read is not on the target: its lag shows it
            status.set_state(ChannelState.RETRYING, str(exc))
            log.warning("retrying in %.0f s: %s", backoff, exc)
            start = checkpoint.rewind()  # re-read what was not committed
            yield from pause(context.stop, backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)
        finally:
            if reader is not None:
                if isinstance(reader, PolledReader):
                    reader.listen(None)
                reader.close()


def _after(saved: Position | None) -> str:
    if saved is None or not saved.msg_id:  # a channel empty when the task began
        return "from the beginning"
    return f"after position {saved.msg_id.hex()} (ts {saved.ts})"
