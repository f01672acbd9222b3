"""The daemon's verify jobs: one thread per task's job (the job itself is
:mod:`replicator.compare.job`), and the view of each task's last job for ``progress.verify``
and /metrics.

A job's record lives in the metastore, so the last verify is shown after a restart; a job that
was running when the daemon stopped is recorded as failed at the next start (a verify has no
effect to resume: ask it again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from metastore import MetaStore, TaskRecord
from replicator.backfill.__main__ import spark_master
from replicator.compare.job import VerifyContext, VerifyRun
from replicator.compare.spark_launch import SparkDigests
from replicator.compare.state import VerifyJob, VerifyState
from replicator.compare.verify import VerifyOptions
from replicator.config.connections import SourceSettings
from replicator.config.milvus_endpoint import milvus_param
from replicator.config.settings import CdcSettings
from replicator.config.stores import etcd_client_for
from replicator.config.task_spec import TaskSpec
from replicator.meta.catalog import SourceCatalog
from server.tasks.cluster_target import as_configured

log = logging.getLogger(__name__)

STOP_WAIT = 30.0


class VerifyManager:
    def __init__(
        self,
        store: MetaStore,
        settings: CdcSettings,
        live_applied: Callable[[str], Mapping[str, int] | None] = lambda task_id: None,
    ) -> None:
        """``live_applied``: a task's applied tick per pchannel while its runner is in this
        daemon (fresher than the positions an idle channel saves now and then)."""
        self._store = store
        self._settings = settings
        self._live_applied = live_applied
        self._views: dict[str, VerifyJob] = {}
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._lock = threading.Lock()

    # --- views --------------------------------------------------------------------------------
    def load(self, task_ids: list[str]) -> None:
        """Read every task's last job (blocking: call from a thread)."""
        for task_id in task_ids:
            state = VerifyState(self._store, task_id)
            job = state.job()
            if job is None:
                continue
            if job.active:
                job = job.with_(
                    state="failed", reason="the daemon stopped during the verify; ask it again"
                )
                state.save_job(job)
            self._views[task_id] = job

    def job(self, task_id: str) -> VerifyJob | None:
        return self._views.get(task_id)

    def view(self, task_id: str) -> dict[str, Any] | None:
        job = self._views.get(task_id)
        return None if job is None else job.view()

    def task_ids(self) -> list[str]:
        return list(self._views)

    def running(self, task_id: str) -> bool:
        with self._lock:
            entry = self._threads.get(task_id)
            return entry is not None and entry[0].is_alive()

    # --- jobs ---------------------------------------------------------------------------------
    def start(self, task: TaskRecord, job: VerifyJob) -> None:
        """Save ``job`` and run it in a thread of its own (blocking: call from a thread)."""
        VerifyState(self._store, task.task_id).save_job(job)
        self._views[task.task_id] = job
        spec = as_configured(TaskSpec.of(task), self._settings)  # a named target: as now
        source = self._settings.source_of(spec)
        verify = self._settings.verify
        context = VerifyContext(
            self._store,
            task.task_id,
            spec,
            milvus_param(source.milvus),
            VerifyOptions(
                verify.rangeRows,
                verify.batchRows,
                verify.tries,
                verify.settleSeconds,
                verify.parallelism,
            ),
            lambda db, name: self._channels_of(source, db, name),
            self._spark(),
            lambda: self._live_applied(task.task_id),
        )
        stop = threading.Event()

        def remember(changed: VerifyJob) -> None:
            self._views[task.task_id] = changed

        run = VerifyRun(context, job, stop, remember)
        thread = threading.Thread(target=run.run, name=f"verify-{task.task_id[:8]}", daemon=True)
        with self._lock:
            self._threads[task.task_id] = (thread, stop)
        thread.start()

    def _spark(self) -> SparkDigests | None:
        """How large collections are digested on Spark (the backfill's master and
        properties)."""
        minimum = self._settings.verify.sparkMinRows
        if not minimum:
            return None
        backfill = self._settings.backfill
        master, extra = spark_master(backfill.sparkMaster, backfill.taskMaxFailures)
        conf = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            **extra,
            **backfill.sparkConf,
        }
        return SparkDigests(minimum, master, conf, backfill.logDir)

    def _channels_of(self, source: SourceSettings, db: str, name: str) -> frozenset[str] | None:
        """The pchannels of a source collection, from the source's etcd catalog; None when the
        catalog cannot be read or does not know the collection."""
        try:
            client = etcd_client_for(source.etcd)
            try:
                catalog = SourceCatalog(client, source.root_path, source.meta_sub_path)
                collections = catalog.collections().values()
            finally:
                client.close()
        except Exception:  # any failure: the wait falls back to every channel
            log.warning("the source catalog could not be read", exc_info=True)
            return None
        for meta in collections:
            if (meta.db_name or "default", meta.name) == (db, name) and not meta.dropped:
                return frozenset(meta.pchannels)
        return None

    def stop(self, task_id: str) -> None:
        """Stop the task's job (blocking: call from a thread); it ends as failed."""
        with self._lock:
            entry = self._threads.pop(task_id, None)
        if entry is not None:
            thread, stop = entry
            stop.set()
            thread.join(STOP_WAIT)

    def forget(self, task_id: str) -> None:
        self.stop(task_id)
        self._views.pop(task_id, None)

    def stop_all(self) -> None:
        """Stop every job at once, then wait for them (``STOP_WAIT`` seconds in all)."""
        with self._lock:
            entries = list(self._threads.values())
            self._threads.clear()
        for _, stop in entries:
            stop.set()
        deadline = time.monotonic() + STOP_WAIT
        for thread, _ in entries:
            thread.join(max(0.0, deadline - time.monotonic()))
