"""The replicate channel of a 2.3-2.5 source: its index, load, flush and database calls, made on
the target in order under the task's names; the position is saved after each record.

A call about a collection waits until the DML channels have created it on the target (they
carry the CreateCollection, in no order with this channel), unless the call predates the task:
then it is history of a collection since dropped, and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any

from metastore import Position
from replicator.codec.replicate import RpcEvent, decode_replicate
from replicator.errors import Rejection, TargetRejectedError, TaskFailedError
from replicator.events import FailedRecord
from replicator.fibers import Steps
from replicator.pipeline.channel_reads import READ_TIMEOUT, next_batch, read_with_retries
from replicator.pipeline.checkpoint import ChannelCheckpoint
from replicator.pipeline.context import TaskContext
from replicator.pipeline.selection import WILDCARD, TaskSelection
from replicator.pipeline.status import ChannelStatus
from replicator.sources.base import ChannelReader
from replicator.sources.prefetch import reading_ahead

log = logging.getLogger(__name__)

READ_BATCH = 100
WAIT_FOR_COLLECTION = 60.0


class ReplicateWorker:
    """``checkpoint`` holds the channel's saved position (it carries no data: no writer);
    ``open_channel`` opens a reader after a position."""

    def __init__(
        self,
        context: TaskContext,
        checkpoint: ChannelCheckpoint,
        status: ChannelStatus,
        open_channel: Callable[[str, Position | None], ChannelReader],
        *,
        selection: TaskSelection,
    ) -> None:
        self.context = context
        self.checkpoint = checkpoint
        self.pchannel = checkpoint.pchannel
        self.status = status
        self._open_channel = open_channel
        self.selection = selection

    def steps(self, wake: Callable[[], None]) -> Steps:
        """The worker as a fiber (:mod:`replicator.fibers`) woken by ``wake``."""
        yield from read_with_retries(
            self.checkpoint,
            self.status,
            self.context,
            wake,
            lambda start: reading_ahead(
                self._open_channel(self.pchannel, start), READ_BATCH, self.context.read_ahead
            ),
            self._consume,
        )

    def _consume(self, reader: ChannelReader) -> Generator[float, None, bool]:
        stop = self.context.stop
        while not stop.is_set():
            records = yield from next_batch(reader, stop, READ_BATCH, READ_TIMEOUT)
            for record in records:
                event = decode_replicate(record, self.checkpoint.backend)
                if isinstance(event, FailedRecord):
                    raise TaskFailedError(
                        f"channel {self.pchannel} at offset {record.offset}: {event.reason}"
                    )
                if isinstance(event, RpcEvent):
                    self._apply(event)
                saved = self.checkpoint.saved
                ts = max(event.ts, saved.ts if saved else 0)
                self.status.applied(ts)
                self.checkpoint.commit([], record.msg_id, ts)
                self.status.position = self.checkpoint.saved
        return False

    def _apply(self, event: RpcEvent) -> None:
        request = self._target_request(event)
        if request is None:
            return
        what = f"{event.method} {request.db_name}.{','.join(event.collections) or ''}"
        try:
            self.context.target.call(event.method, request, what)
            log.info("applied %s", what)
        except TargetRejectedError as exc:
            if exc.rejection is Rejection.UNIMPLEMENTED:
                # e.g. Milvus Lite has no partition load state; the data is unaffected
                log.warning("%s: the target does not offer this call; skipped", what)
                return
            creating = event.method.startswith(("Create", "Load"))
            done = Rejection.ALREADY_EXISTS if creating else Rejection.NOT_FOUND
            if exc.rejection is done:
                log.info("%s: already in that state on the target", what)
                return
            raise

    def _target_request(self, event: RpcEvent) -> Any:
        """The request under the target's names, or None when the task does not select it."""
        db = event.db_name
        request = type(event.request)()
        request.CopyFrom(event.request)
        request.ClearField("base")
        if event.kind == "database":
            if not any(d in (WILDCARD, db) for d, _ in self.selection.selection):
                return None
            request.db_name = self.selection.target_name(db, "")[0]
            return request
        names = [c for c in event.collections if self.selection.selects(db, c)]
        if not names:
            return None
        if self.context.registry.single_partition and "Partition" in event.method:
            log.info("%s skipped: the task writes every row to the default partition", event.method)
            return None
        if not all(self._created(db, c, event.ts) for c in names):
            return None
        mapped = [self.selection.target_name(db, c) for c in names]
        request.db_name = mapped[0][0]
        if event.kind == "collections":
            del request.collection_names[:]
            request.collection_names.extend(c for _, c in mapped)
        else:
            request.collection_name = mapped[0][1]
        return request

    def _created(self, db: str, collection: str, ts: int) -> bool:
        """Is the collection on the target (waiting for the DML channel that creates it)?"""
        registry, stop = self.context.registry, self.context.stop
        if registry.wait_created(db, collection, 0, stop):
            return True
        if ts < self.context.task_ts:  # history of a collection since dropped
            return False
        if registry.wait_created(db, collection, WAIT_FOR_COLLECTION, stop):
            return True
        if stop.is_set():  # not a failure; the call is read again at the next start
            raise TaskFailedError(f"channel {self.pchannel}: stopped waiting for {collection!r}")
        raise TaskFailedError(
            f"channel {self.pchannel}: {collection!r} in {db!r} is not on the target "
            f"{WAIT_FOR_COLLECTION:.0f} s after the source used it"
        )
