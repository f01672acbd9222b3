"""A runner's start-up: where each channel starts, read from the source and saved before it runs.

A new task's start positions are decided from the source's channel ends and catalog (within the
task's connect timeout, :class:`PrepareBudget`) and saved before create answers (see
:mod:`bootstrap`); a Kafka target's own committed positions win over older saved ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from metastore import MetaStore, Position, TaskRecord
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.log_context import log_context
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.bootstrap import channel_starts, replicate_start
from replicator.pipeline.checkpoint import newer
from replicator.pipeline.selection import TaskSelection
from replicator.pipeline.status import TaskWarnings
from replicator.sources.base import ChannelReader, SourceUnavailableError, WalSource

log = logging.getLogger(__name__)


def history_lost(channels: list[str]) -> str:
    """The warning for channels whose WAL no longer holds the selected collections' creation."""
    return (
        f"the WAL no longer holds the creation of the selected collections on "
        f"{', '.join(channels)}: replication there starts at the end of the WAL, and older "
        f"rows are not copied (use a backfill)"
    )


class PrepareBudget:
    """How long fixing a task's start may wait for the source (its connect timeout), and
    what it waits for now (named when it takes too long)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._until = time.monotonic() + seconds
        self.waiting_for = "the source"

    def seconds_left_for(self, waiting_for: str) -> float:
        """Seconds left for the next read, of ``waiting_for``; none left raises."""
        self.waiting_for = waiting_for
        left = self._until - time.monotonic()
        if left <= 0:
            raise SourceUnavailableError(self.describe_what_is_late())
        return left

    def describe_what_is_late(self) -> str:
        """What the budget ran out waiting for, as an error message."""
        return f"{self.waiting_for} did not answer within {self.seconds:g} s"


class BoundedSource:
    """A source whose reads of the channels' ends wait what is left of a budget at most."""

    def __init__(self, source: WalSource, budget: PrepareBudget) -> None:
        self.inner = source
        self.backend = source.backend
        self.budget = budget

    def open_channel(self, pchannel: str, start: Position | None) -> ChannelReader:
        return self.inner.open_channel(pchannel, start)

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        left = self.budget.seconds_left_for(f"the source queue ({self.backend})")
        return self.inner.watermarks(pchannel, left if timeout is None else min(timeout, left))

    def offset_of(self, msg_id: bytes) -> int:
        return self.inner.offset_of(msg_id)

    def position_before(self, offset: int) -> bytes | None:
        return self.inner.position_before(offset)


@dataclass
class SourceRead:
    """What a runner read of the source before it starts: the catalog and the channels' ends."""

    source: WalSource
    catalog: dict[int, CollectionMeta]
    saved: dict[str, Position]  # the positions saved so far
    watermarks: dict[str, tuple[int, int]]  # ends of the DML channels without a position


class RunnerStartup:
    """Reads the source and fixes the start position of every channel of one task."""

    def __init__(
        self,
        task: TaskRecord,
        store: MetaStore,
        selection: TaskSelection,
        warnings: TaskWarnings,
        source: Callable[[], WalSource],
        catalog: Callable[[], dict[int, CollectionMeta]],
        dml_channels: list[str],
        rpc_channel: str,
        backfills: bool,
        start_at_end: bool,
    ) -> None:
        """``start_at_end``: a new task starts at its channels' ends (the spec's ``start_at``)."""
        self.task = task
        self.start_at_end = start_at_end
        self.store = store
        self.selection = selection
        self.warnings = warnings
        self._source = source
        self._catalog = catalog
        self._dml_channels = dml_channels
        self.rpc_channel = rpc_channel
        self._channels = [*dml_channels, *([rpc_channel] if rpc_channel else [])]
        self._backfills = backfills  # the daemon can launch a backfill job

    def fix_starts(self, budget: PrepareBudget | None = None) -> None:
        """Where a new task starts, decided and saved before create answers (see
        :mod:`bootstrap`): every write after the answer is then after the start, whenever
        the workers get there. ``budget``: how long the source may take."""
        saved = self.store.get_positions(self.task.task_id)
        if all(ch in saved for ch in self._channels):
            return  # nothing to decide: the source is not read (a resume needs no source)
        with log_context(task_id=self.task.task_id):
            read = self.read_source(saved, budget)
            backfills = self._backfills
            job = BackfillState(self.store, self.task.task_id).job() if backfills else None
            self.starts(read, job)

    def starts(self, read: SourceRead, backfill: BackfillJob | None) -> dict[str, Position]:
        """Every channel's start (the replicate channel's too): its saved position, else the
        initial one, saved now, with a warning when the queue no longer holds the selected
        history (unless a backfill is asked, which copies it)."""
        active = backfill if backfill is not None and backfill.active else None
        starts = channel_starts(
            self.store,
            self.task.task_id,
            read.source,
            self._dml_channels,
            read.saved,
            read.watermarks,
            read.catalog,
            self.selection,
            at_end=(active is not None and active.covers_all) or self.start_at_end,
        )
        if starts.history_lost and active is None:
            self.warnings.warn(history_lost(starts.history_lost))
        positions = dict(starts.positions)
        if self.rpc_channel:
            positions[self.rpc_channel] = replicate_start(
                self.store,
                self.task.task_id,
                read.source,
                self.rpc_channel,
                read.saved.get(self.rpc_channel),
                at_end=self.start_at_end,
            )
        missing = [ch for ch in self._channels if ch not in read.saved]
        if missing:
            log.info("start positions saved on %d channel(s)", len(missing))
        return positions

    def read_source(
        self, saved: dict[str, Position] | None = None, budget: PrepareBudget | None = None
    ) -> SourceRead:
        source = self._source()
        if budget is not None:
            source = BoundedSource(source, budget)
        # The ends of the channels a new task has no position on are read BEFORE the catalog:
        # a collection created in between is then in the catalog or after the start in the WAL.
        if saved is None:
            saved = self.store.get_positions(self.task.task_id)
        watermarks = {ch: source.watermarks(ch) for ch in self._dml_channels if ch not in saved}
        if budget is not None:
            budget.seconds_left_for("the source etcd")  # its client's own timeout bounds the read
        return SourceRead(source, self._catalog(), saved, watermarks)

    def adopt_newer_target_positions(
        self, read: SourceRead, committed: dict[str, Position]
    ) -> None:
        """A target that commits positions with its events (Kafka) is ahead of the metastore
        after a crash between the two: its positions win (their events are written)."""
        for pchannel, position in committed.items():
            saved = read.saved.get(pchannel)
            if newer(position, saved, read.source.offset_of):
                self.store.save_position(self.task.task_id, position, saved)
                read.saved[pchannel] = position
                read.watermarks.pop(pchannel, None)
                log.info(
                    "channel %s: starting after the position the Kafka target committed (%s)",
                    pchannel,
                    position.msg_id.hex(),
                )


__all__ = ["BoundedSource", "PrepareBudget", "RunnerStartup", "SourceRead", "history_lost"]
