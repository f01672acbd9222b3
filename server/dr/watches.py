"""The stale-write watch of a reverse task (:mod:`stale_watch`), run on the daemon that runs the
task: after a switchover or a failback in sync, the old primary is watched for writes of stale
clients, a round every few seconds, its findings saved and shown as ``progress.stale_writes``.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from server.dr.stale_watch import ROUND_SECONDS, StaleWriteWatch, load_watch, save_watch
from server.dr.task_ops import TaskOperations
from server.dr.views import JobViews
from server.logs import log_context
from server.tasks.engine import cluster_context

log = logging.getLogger(__name__)


class StaleWatches:
    """The watches running on this daemon, by reverse task id."""

    def __init__(self, supervisor: TaskOperations, settings: CdcSettings, views: JobViews) -> None:
        self.sup = supervisor
        self.settings = settings
        self.views = views
        self._watches: dict[str, tuple[asyncio.Task[None], threading.Event]] = {}

    def start(self, task_id: str) -> bool:
        """Run the stale-write watch of ``task_id`` here while the task runs here; whether it
        runs here."""
        current = self._watches.get(task_id)
        if current is not None and not current[0].done():
            return True
        if self.sup.runner_of(task_id) is None:
            return False
        stop = threading.Event()
        work = self._run(task_id, stop)
        self._watches[task_id] = (asyncio.get_running_loop().create_task(work), stop)
        return True

    async def _run(self, task_id: str, stop: threading.Event) -> None:
        state = await asyncio.to_thread(load_watch, self.sup.store, task_id)
        if state is None:
            return
        spec = TaskSpec.of(await self.sup.get(task_id))

        def applied() -> int:
            runner = self.sup.runner_of(task_id)
            return runner.consistent_ts() if runner is not None else 0

        def refresh_consistent_ts() -> None:
            if (runner := self.sup.runner_of(task_id)) is not None:
                runner.wake_idle_readers()

        context = cluster_context(self.settings, state.watched, shared_readers=False)
        watch = StaleWriteWatch(self.settings, context, spec, applied, refresh_consistent_ts, stop)
        with log_context(task_id=task_id):
            log.info("watching %s for writes of stale clients", state.watched)
            try:
                while not stop.is_set() and self.sup.runner_of(task_id) is not None:
                    before = state.to_bytes()
                    try:
                        await asyncio.to_thread(watch.round, state)
                    except Exception as exc:  # noqa: BLE001 - a round failing is shown, retried
                        state.problem = f"{type(exc).__name__}: {exc}"
                        log.warning("stale-write watch round: %s", state.problem)
                    if state.to_bytes() != before and self.sup.runner_of(task_id) is not None:
                        await asyncio.to_thread(save_watch, self.sup.store, state)
                    self.views.remember(task_id, "stale_writes", state.view())
                    await asyncio.sleep(ROUND_SECONDS)
            finally:
                watch.close()

    def stop(self) -> list[asyncio.Task[None]]:
        """Ask every watch to stop; their tasks, to cancel."""
        for _, stop in self._watches.values():
            stop.set()
        return [work for work, _ in self._watches.values()]
