"""The runner's side of a backfill (see :mod:`replicator.backfill.phase`): run a pending job
before the workers start, then hand over to streaming.

The positions P the workers start from are saved before the job reads anything. When it ends,
every channel's in-flight bound is raised to the channel's end, so the workers replay the
whole overlap in WAL order with inserts written as upserts (rows the job copied are replaced,
never doubled), and a start that splits the records of one timestamp (an upsert's halves) is
moved back before them.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from metastore import MetaStore, Position
from replicator.backfill.handover import group_start
from replicator.backfill.phase import BackfillPhase, DriverLauncher
from replicator.backfill.state import BackfillJob, BackfillState, CollectionRef
from replicator.log_context import log_context
from replicator.meta.catalog import CollectionMeta
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.status import TaskWarnings
from replicator.pipeline.task_state import RunnerState
from replicator.sources.base import WalSource
from replicator.sources.shared_source import unshared

log = logging.getLogger(__name__)

HAND_OVER_READERS = 8  # channels read at once at the hand-over


class BackfillStage:
    def __init__(
        self,
        task_id: str,
        store: MetaStore,
        state: RunnerState,
        launcher: DriverLauncher,
        stop: threading.Event,
        warnings: TaskWarnings,
        source_at: Callable[[str, Position | None], WalSource],
    ) -> None:
        self._task_id = task_id
        self._store = store
        self._state = state
        self._jobs = BackfillState(store, task_id)
        self._phase = BackfillPhase(task_id, self._jobs, launcher, stop)
        self._warnings = warnings
        self._source_at = source_at  # the WAL a channel's position is on

    @property
    def view(self) -> dict[str, Any] | None:
        return self._phase.view

    def job(self) -> BackfillJob | None:
        """The task's backfill job, if it has one; its progress is shown from now on."""
        job = self._jobs.job()
        if job is not None:
            self._phase.refresh(job)
        return job

    def run(
        self,
        job: BackfillJob,
        catalog: dict[int, CollectionMeta],
        registry: CollectionRegistry,
        starts: dict[str, Position],
    ) -> BackfillJob | None:
        """Run a pending or interrupted job; the job as it ended (as given when it had
        ended before), None when the runner was stopped meanwhile. ``starts`` (the workers'
        start positions) may be moved back by the hand-over."""
        if not job.active:
            return job
        with log_context(task_id=self._task_id, channel="backfill"):
            collections, missing = selected_collections(job, catalog, registry)
            if missing:
                collections = []
            finished = self._phase.run(job, collections, lambda: self._hand_over(starts))
            if finished is None:
                return None
            if missing:
                finished = finished.with_(
                    state="failed", reason=f"not selected collections of the source: {missing}"
                )
                self._jobs.save_job(finished)
                self._phase.refresh(finished)
            if finished.state == "failed":
                self._warnings.warn(f"backfill {finished.job_id} failed: {finished.reason}")
        return finished

    def _hand_over(self, starts: dict[str, Position]) -> None:
        """Each channel's start, moved back where it splits a timestamp, and its in-flight
        bound; the channels are read side by side (each read waits mostly on its queue)."""

        def look(pchannel: str) -> tuple[Position | None, int]:
            start = starts[pchannel]
            wal = unshared(self._source_at(pchannel, start))  # the WAL the channel is on now
            earlier = group_start(wal, start) if start is not None and start.msg_id else start
            return earlier, wal.watermarks(pchannel)[1]

        channels = list(starts)
        with ThreadPoolExecutor(HAND_OVER_READERS, thread_name_prefix="hand-over") as pool:
            # each in a copy of this thread's context: its log lines name the task
            found = list(pool.map(lambda ch: contextvars.copy_context().run(look, ch), channels))
        for pchannel, (earlier, latest) in zip(channels, found, strict=True):
            start = starts[pchannel]
            if earlier is not None and earlier != start:
                self._store.save_position(self._task_id, earlier, start)
                starts[pchannel] = earlier
            bound = max(latest, self._state.inflight_bound(pchannel))
            self._state.set_inflight_bound(pchannel, bound)
        log.info("backfill finished; streaming starts from the recorded positions")


def selected_collections(
    job: BackfillJob, catalog: dict[int, CollectionMeta], registry: CollectionRegistry
) -> tuple[list[CollectionRef], list[str]]:
    """The selected source collections the job names (all for '*'), and names that match
    none."""
    refs = []
    matched: set[str] = set()
    for meta in sorted(catalog.values(), key=lambda m: (m.db_name, m.name)):
        target = registry.resolve(meta.collection_id)
        if meta.dropped or target is None:
            continue
        names = {meta.name, f"{meta.db_name}.{meta.name}"}
        if job.covers_all or names & set(job.requested):
            matched |= names
            refs.append(CollectionRef(meta.db_name, meta.name, target.db, target.name))
    missing = [] if job.covers_all else sorted(set(job.requested) - matched)
    return refs, missing
