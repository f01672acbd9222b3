"""The replication runner of one task: a fiber that connects to the source and the target,
prepares the task (:mod:`bootstrap`, a pending backfill: :mod:`handover`), and runs a worker
fiber per source pchannel (:mod:`worker`, :mod:`replicate_worker`) until the task stops. The
fibers of every task take turns on the daemon's pool of threads (:mod:`replicator.fibers`): a
task waiting for records holds no thread.

Source, target and metastore outages are retried with backoff (the task stays Running, its lag
grows); what needs an operator (an undecodable record, a write the target rejects, a position
the queue no longer holds) fails the task with a reason naming the channel and the cause. How
a record travels, and why a ``kill -9`` loses and doubles nothing, is told in the README
("How a record travels") and in :mod:`checkpoint`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from metastore import (
    MetaStore,
    MetaStoreError,
    TaskNotFoundError,
    TaskRecord,
)
from metastore.fenced import Fence, FencedStore
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.config.task_spec import TaskSpec
from replicator.daemon_thread import in_daemon_thread
from replicator.errors import CdcError, TaskFailedError, is_retriable
from replicator.fibers import Fiber, Steps, pause
from replicator.hybrid_time import from_seconds
from replicator.log_context import log_context
from replicator.pipeline.aliases import AliasMirror
from replicator.pipeline.bootstrap import (
    register_collections,
    source_at,
)
from replicator.pipeline.channel_reads import MAX_BACKOFF
from replicator.pipeline.context import TaskContext
from replicator.pipeline.fiber_group import NamedBody, run_fiber_group
from replicator.pipeline.group_layout import fence_recorded_groups
from replicator.pipeline.handover import BackfillStage
from replicator.pipeline.imports import ImportWatcher, TaskImports
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.runner_context import RunnerContext
from replicator.pipeline.runner_end import end_reason, report_failure
from replicator.pipeline.runner_startup import PrepareBudget, RunnerStartup, SourceRead
from replicator.pipeline.selection import TaskSelection
from replicator.pipeline.status import (
    ChannelStatus,
    TaskWarnings,
    collection_totals,
    consistent_view,
    skipped_totals,
    task_consistent_ts,
)
from replicator.pipeline.stop_signal import StopSignal
from replicator.pipeline.stream_ddl import StreamDdlApplier, TaskNames
from replicator.pipeline.task_state import RunnerState
from replicator.pipeline.task_workers import Worker, task_workers
from replicator.pipeline.timings import TaskTimings
from replicator.sinks.kafka import KafkaTarget
from replicator.sinks.milvus import MilvusTarget
from replicator.sources.base import SourceUnavailableError, WalSource
from replicator.task_runner import FailureCallback

log = logging.getLogger(__name__)

# seconds stop() waits for the runner's fiber before letting it go
STOP_WAIT = 1.0
# seconds prepare() waits past the task's connect timeout for a source read to give up by itself
# (and say why) before it answers without it
PREPARE_SLACK = 0.5


def _rows_copied(view: dict[str, Any] | None) -> dict[str, int] | None:
    """Rows a backfill copied by source collection (``db.name``), from its progress view."""
    if not view:
        return None
    return {c["collection"]: int(c["rows_done"]) for c in view.get("collections") or []}


@dataclass
class _Connection:
    read: SourceRead
    target: MilvusTarget


class ReplicationRunner:
    def __init__(
        self,
        task: TaskRecord,
        store: MetaStore,
        on_failure: FailureCallback,
        context: RunnerContext,
    ) -> None:
        self.task = task
        # every write of the runner (store and target) goes through its fence: closed when the
        # runner is let go or its lease may be lost. The supervisor passes a fenced store
        # carrying the task's lease; any other store gets a fence of its own.
        if not isinstance(store, FencedStore):
            store = FencedStore(store, Fence(f"the runner of task {task.task_id}"))
        self.fence = store.fence
        self.store: MetaStore = store
        self.on_failure = on_failure
        self.context = context
        self.spec = TaskSpec.of(task)
        self.selection = TaskSelection.from_spec(self.spec)
        self.rpc_channel = self.spec.rpc_channel if context.replicate_channel else ""
        # the Go tool's ignore_partition: every row goes to the target's default partition
        milvus = self.spec.milvus_connect_param or {}
        self.single_partition = bool(milvus.get("ignore_partition"))
        # a Kafka target takes no backfill: there is no copy to make there (see README)
        self.kafka = self.spec.is_kafka
        self._channels = [*context.channels, *([self.rpc_channel] if self.rpc_channel else [])]
        self.statuses = {
            ch: ChannelStatus(ch, has_ticks=ch != self.rpc_channel) for ch in self._channels
        }
        self.state = RunnerState(self.store, task.task_id)
        self.warnings = TaskWarnings(self.store, self.state, task.task_id)
        blocker = context.backfill_blocker
        if self.kafka:
            blocker = "a Kafka target takes no backfill"
        elif context.backfill is None:
            blocker = blocker or "this daemon launches no backfill jobs"
        self.imports = TaskImports(self.state, self.warnings, task.task_id, blocker)
        self.startup = RunnerStartup(
            task,
            self.store,
            self.selection,
            self.warnings,
            context.source,
            context.catalog,
            context.channels,
            self.rpc_channel,
            backfills=context.backfill is not None,
            start_at_end=self.spec.start_at_end,
        )
        self.timings = TaskTimings()  # where the lag goes (/metrics), across reconnects
        self._stop = StopSignal()  # set to stop the workers: by stop() or a worker error
        self._stop_requested = False  # stop() was called: a failure then is not reported
        self._failure_reported = False  # the runner ended on a failure (see ``finished``)
        # set with _stop when an import is ready to copy: the workers stop, the runner goes on
        self._restart = threading.Event()
        self._fiber: Fiber | None = None
        self._wake: Callable[[], None] = lambda: None  # the runner's fiber goes on
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backfill: BackfillStage | None = None

    async def prepare(self) -> None:
        """Fix the start positions (:meth:`RunnerStartup.fix_starts`), within the task's
        connect timeout: every source read is bounded by what is left of it, and should one not
        return, the answer does not wait for it: the runner's fence is closed, so the read, when
        it returns, writes nothing. A thread of its own, not the loop's executor, which a read
        that never returns would keep."""
        budget = PrepareBudget(self.spec.connect_timeout)
        fixing = in_daemon_thread(
            self.startup.fix_starts, budget, name=f"prepare-{self.task.task_id[:8]}"
        )
        try:
            await asyncio.wait_for(fixing, budget.seconds + PREPARE_SLACK)
        except TimeoutError:
            self.fence.revoke()
            raise SourceUnavailableError(budget.describe_what_is_late()) from None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fiber = self.context.pool.spawn(
            self._main, name=f"task-{self.task.task_id[:8]}", wake_on=self._stop
        )

    async def stop(self) -> None:
        """Stop the workers (each saves its position) and wait for the runner's fiber, at most
        ``STOP_WAIT`` seconds: a fiber still inside a blocking call then (a source or target
        that does not answer) is let go, its fence revoked, so it can write nothing when the
        call returns. Nothing is lost: what it read and did not save is read again by the next
        start, from the saved positions."""
        self._stop_requested = True
        self._stop.set()
        fiber = self._fiber
        if fiber is None:
            return
        await asyncio.to_thread(fiber.done.wait, STOP_WAIT)
        if not fiber.done.is_set():
            self.fence.revoke()
            with log_context(task_id=self.task.task_id):
                log.warning(
                    "runner still inside a blocking call after %.1f s: abandoned (it ends when "
                    "the call returns and can no longer save a position or state)",
                    STOP_WAIT,
                )

    def wait_stopped(self, timeout: float) -> bool:
        fiber = self._fiber
        return fiber is None or fiber.done.wait(timeout)

    @property
    def finished(self) -> bool:
        """The runner's fiber has ended without reporting a failure (fenced off, or the task
        deleted): a failure is the supervisor's to record, through ``on_failure``."""
        ended = self._fiber is not None and self._fiber.done.is_set()
        return ended and not self._failure_reported

    def applied_ticks(self) -> dict[str, int]:
        return {ch: status.applied_ts for ch, status in list(self.statuses.items())}

    def wake_idle_readers(self) -> None:
        """End the workers' idle reads now: each reads the ticks that came meanwhile, so its
        applied time is fresh (an idle read otherwise waits up to 5 s for data)."""
        self._stop.nudge()

    def read_to_end_since(self, moment: float) -> bool:
        return all(
            not status.caught_up or status.caught_up_at >= moment
            for status in list(self.statuses.values())
            if status.has_ticks
        )

    def consistent_ts(self) -> int:
        """The source time up to which every write of the task is on the target (0: not known
        yet); see ``ChannelStatus.consistent_ts``."""
        return task_consistent_ts(list(self.statuses.values()))

    def unreachable(self, warnings: list[str]) -> None:
        with log_context(task_id=self.task.task_id):
            self.warnings.unreachable(warnings)

    def status(self) -> dict[str, Any]:
        """Progress for get/list and /metrics: totals and every channel that has seen data or
        time ticks (a task reads every DML channel of the source; idle ones are left out)."""
        channels = [s for s in self.statuses.values() if s.applied_ts or s.rows]
        lags = [lag for s in channels if (lag := s.lag_seconds) is not None]
        return {
            "rows": sum(s.rows for s in channels),
            "collections": collection_totals(self.statuses.values()),
            "bytes": sum(s.bytes for s in channels),
            "lag_seconds": round(max(lags), 3) if lags else None,
            "consistent_up_to": consistent_view(task_consistent_ts(self.statuses.values())),
            "channels": [s.view() for s in channels],
            "skipped": skipped_totals(self.statuses.values()),
            "warnings": list(self.warnings.items),
            "imports_pending": self.imports.pending,
            "imports": self.imports.items,
            "backfill": None if self._backfill is None else self._backfill.view,
        }

    # --- the task's main fiber ---------------------------------------------------------------
    def _main(self, wake: Callable[[], None]) -> Steps:
        self._wake = wake
        with log_context(task_id=self.task.task_id):
            try:
                yield from self._run()
            except Exception as exc:  # noqa: BLE001 - every end is told (runner_end)
                reason = end_reason(exc, log)
                if reason is not None:
                    self._report(reason)

    def _report(self, reason: str) -> None:
        self._failure_reported = True
        if not self._stop_requested:
            report_failure(self._loop, self.on_failure, self.task.task_id, reason)

    def _run(self) -> Steps:
        """Connect and run the workers; source, target and store outages are retried."""
        backoff = 1.0
        while not self._stop.is_set():
            try:
                connection = self._connect()
                try:
                    yield from self._run_workers(connection)
                finally:
                    connection.target.close()
                if not self._restarts():
                    return
                backoff = 1.0
            except (CdcError, MetaStoreError, OSError) as exc:
                if isinstance(exc, (TaskFailedError, TaskNotFoundError)) or not is_retriable(exc):
                    raise
                log.warning("source or target unavailable, retrying in %.0f s: %s", backoff, exc)
                yield from pause(self._stop, backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)

    def _copy_imports(self) -> None:
        """An import is ready to copy (the watcher's thread): stop the workers (their
        positions are saved) and run again, with the backfill."""
        self._restart.set()
        self._stop.set()

    def _restarts(self) -> bool:
        """After the workers stopped: run them again when an import asked it (not when the
        runner itself is being stopped)."""
        if not self._restart.is_set() or self._stop_requested:
            return False
        self._restart.clear()
        self._stop.clear()
        if self._stop_requested:  # stop() came in between: keep it
            self._stop.set()
            return False
        log.info("workers stopped to copy bulk imports; running again with the backfill")
        return True

    def _connect(self) -> _Connection:
        read = self.startup.read_source()
        if self.kafka and not self.context.group:
            fence_recorded_groups(self.state, self.spec.target_param, self.task.task_id)
        target = self.context.target_factory(self.task)
        target.fence = self.fence
        target.warn = self.warnings.warn
        if isinstance(target, KafkaTarget):
            try:
                # this runner's channels only: a channel group's are the other groups' own
                committed = target.committed_positions
                mine = {ch: p for ch, p in committed.items() if ch in self.statuses}
                self.startup.adopt_newer_target_positions(read, mine)
            except BaseException:
                target.close()
                raise
        return _Connection(read, target)

    def _task_context(self, connection: _Connection) -> TaskContext:
        read = connection.read
        registry = CollectionRegistry(
            self.selection, self.context.default_partition, single_partition=self.single_partition
        )
        context = self.context
        describe = context.collection or (lambda collection: context.catalog().get(collection))
        names = TaskNames.for_task(registry.resolve, self.selection)
        rbac = self.spec.rbac
        # a channel group's processes make the collections they find at start one at a time
        # (each asks the target whether it has one, then makes it)
        with self.context.ddl_lock or nullcontext():
            register_collections(registry, names, connection.target, read.catalog, self.state)
        return TaskContext.build(
            self.task.task_id,
            self.store,
            registry,
            connection.target,
            self._stop,
            describe=describe,
            ddl=StreamDdlApplier(connection.target, names, rbac=rbac),
            open_wal=context.open_wal,
            task_ts=from_seconds(self.task.created_at),
            read_ahead=context.read_ahead,
            imports=self.imports,
            timings=self.timings,
            ddl_lock=self.context.ddl_lock,
        )

    def _run_workers(self, connection: _Connection) -> Steps:
        task = self._task_context(connection)
        read = connection.read
        source = read.source
        self.warnings.load()
        self.imports.load()
        watcher = self._import_watcher(task)
        if watcher is not None:
            watcher.poll()  # which imports have completed before a backfill starts
        self.imports.collections_left(task.registry.wanted)
        # a pending backfill of every selected collection copies their history: a new task then
        # starts streaming at the end of each channel instead of at the collections' creation
        backfill = self._import_backfill(self._backfill_job(source))
        starts = self.startup.starts(read, backfill)
        self.warnings.show()
        dml = {ch: starts[ch] for ch in self.context.channels}
        stage = self._backfill
        if backfill is not None and stage is not None:
            if backfill.state == "pending":
                self.imports.backfill_starts(backfill)
            finished = stage.run(backfill, read.catalog, task.registry, dml)
            if finished is None:
                return  # stopped during the backfill; it resumes at the next start
            # (again for an old job: changes nothing)
            self.imports.backfill_ended(finished, _rows_copied(stage.view))
        replicate = (self.rpc_channel, starts[self.rpc_channel]) if self.rpc_channel else None
        workers = task_workers(
            task,
            source,
            self.state,
            self.statuses,
            dml,
            replicate,
            open_wal=self.context.open_wal,
            selection=self.selection,
        )
        yield from self._run_fibers(task, workers, watcher)

    def _import_watcher(self, task: TaskContext) -> ImportWatcher | None:
        read = self.context.imports
        if read is None:
            return None
        registry = task.registry

        def resolve(collection_id: int) -> tuple[str, str] | None:
            target = registry.resolve(collection_id)
            source = registry.source_name(collection_id)
            if target is None or source is None:
                return None
            return f"{source[0]}.{source[1]}", f"{target.db}.{target.name}"

        return ImportWatcher(
            read,
            self.imports,
            resolve,
            self._stop,
            self._copy_imports,
            serving=self.context.import_serving,
        )

    def _import_backfill(self, job: BackfillJob | None) -> BackfillJob | None:
        """The task's backfill job; a new one when imports wait to be copied and none is under
        way."""
        stage = self._backfill
        ready = self.imports.ready()
        if stage is None or not ready or (job is not None and job.active):
            return job
        job = BackfillJob.new(ready)
        BackfillState(self.store, self.task.task_id).save_job(job)
        log.info("backfill %s of %s asked to copy their bulk imports", job.job_id, ready)
        return stage.job()

    def _run_fibers(
        self, task: TaskContext, workers: list[Worker], watcher: ImportWatcher | None = None
    ) -> Steps:
        """A fiber per worker (and one each for the alias mirror and the import watcher); the
        first error stops them all and is raised once every fiber has ended."""
        bodies: list[NamedBody] = []
        if watcher is not None:
            bodies.append(("imports", None, lambda wake: watcher.steps()))
        if self.context.aliases is not None:
            # its own target connection: gRPC calls of the workers are not held up by it
            mirror = AliasMirror(
                self.context.aliases, task.registry, task.target.sibling(), self._stop
            )
            bodies.append(("aliases", None, lambda wake: self._mirror(mirror)))
        bodies += [(w.pchannel, w.pchannel, w.steps) for w in workers]
        yield from run_fiber_group(
            self.context.pool, self.task.task_id, bodies, self._stop, self._wake
        )

    def _mirror(self, mirror: AliasMirror) -> Steps:
        """The alias mirror's fiber: its errors are its own (logged), not the task's."""
        try:
            yield from mirror.steps()
        except Exception:
            log.exception("the alias mirror stopped")
        finally:
            mirror.close()

    def _backfill_job(self, source: WalSource) -> BackfillJob | None:
        """The task's backfill job (its progress is shown from now on); None without one or
        when the daemon cannot backfill."""
        if self.context.backfill is None or self.kafka:
            return None
        open_wal = self.context.open_wal
        self._backfill = BackfillStage(
            self.task.task_id,
            self.store,
            self.state,
            self.context.backfill,
            self._stop,
            self.warnings,
            lambda pchannel, start: source_at(source, self.state, open_wal, pchannel, start),
        )
        return self._backfill.job()
