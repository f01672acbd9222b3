"""The daemon's periodic jobs, run by an APScheduler ``AsyncIOScheduler`` that starts and stops
with the application (``scheduler`` in cdc.yaml):

progress sampling    every ``progressSampleSeconds``: each running task's rows and lag, kept for
                     a few minutes; gives rows/s to /v1/tasks, the dashboard and
                     ``cdc_task_rows_per_second``.
metastore health     every ``metastoreCheckSeconds``: a ping with a timeout; ``cdc_metastore_up``
                     and the ``metastore_watch`` part of /readyz; changes are logged.
scheduled verify     every ``verify.scheduleCheckSeconds``: a verify of each Running task whose
                     interval has passed (server/runtime/verify_schedule.py).
reachability         every ``reachabilitySeconds``: the source's queue and etcd and each running
                     task's target are probed; one that does not answer is a warning on the
                     tasks that use it, withdrawn when it answers (server/tasks/reachability.py);
                     ``cdc_endpoint_up``.
transient retry      every ``retry.checkSeconds``: a task in Failed whose reason contains one of
                     ``retry.transientReasons`` is resumed (the same call as the API's resume)
                     after ``initialBackoffSeconds * multiplier^(attempt-1)`` seconds, at most
                     ``maxBackoffSeconds``; ``maxAttempts`` (0: no limit) bounds the attempts.
switchover recovery  every RECOVER_SECONDS: a switchover job whose daemon is gone is finished
                     (its reverse task exists) or rolled back (server/dr/manager.py).
store format         every store_format.RETRY_SECONDS while a breaking step of the metastore's
                     format waits for older fleet members: tried again
                     (server/runtime/store_format.py).

Saving positions of idle channels is not a job here: each channel worker of the engine saves
its position on a time tick when it has saved nothing for a while (replicator/pipeline), in the
thread that owns that position, so positions stay compare-and-set from one writer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from metastore import MetaStore, MetaStoreError, TaskRecord, TaskState
from replicator.config.connections import SourceSettings
from replicator.config.daemon import RetrySettings, SchedulerSettings, VerifySettings
from replicator.config.task_spec import TaskSpec
from replicator.daemon_thread import in_daemon_thread
from replicator.errors import CdcError
from server.app_state import DISASTER, METRICS, STORE, STORE_FORMAT, SUPERVISOR
from server.errors import ApiError
from server.logs import log_context
from server.runtime.store_format import RETRY_SECONDS, StoreFormatKeeper
from server.runtime.verify_schedule import run_scheduled
from server.tasks.certificates import (
    CertificateCollector,
    CertificateWatch,
    ClientCertificate,
    source_certificates,
    target_certificates,
)
from server.tasks.reachability import Endpoint, ReachabilityWatch, source_endpoints, target_endpoint
from server.tasks.supervisor import TaskSupervisor

SourceOf = Callable[[TaskSpec], SourceSettings]
# seconds between looks for switchover jobs a stopped fleet member left (its leases' life)
RECOVER_SECONDS = 10.0

log = logging.getLogger(__name__)

SAMPLES_KEPT = 60  # the lag samples a task view carries
RATE_WINDOW = 6  # samples (30 s at the default interval) behind rows/s
HISTORY_SECONDS = 3600.0  # the charts' window: samples older than this are dropped
PING_TIMEOUT = 3.0


# --- progress sampling ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    at: float
    rows: int
    lag_seconds: float | None
    # each channel's lag at that moment (channels that have seen data or time ticks)
    channel_lags: tuple[tuple[str, float | None], ...] = ()


class ProgressSampler:
    """Each task's (time, rows, lag, channel lags) samples over the last hour, in a bounded ring
    per task: ``HISTORY_SECONDS / interval`` samples at most. A task that stops being sampled
    (paused, failed) keeps its history until it ages out; a deleted task's goes at once."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._kept = max(SAMPLES_KEPT, math.ceil(HISTORY_SECONDS / interval) + 1)
        self._samples: dict[str, deque[Sample]] = {}
        self._live: set[str] = set()

    def sample(
        self, progress: Mapping[str, Mapping[str, Any]], now: float, known: Iterable[str] = ()
    ) -> None:
        """``progress``: the running tasks' status; ``known``: every stored task (others are
        forgotten)."""
        keep = set(known) | set(progress)
        for task_id in list(self._samples):
            samples = self._samples[task_id]
            if task_id not in keep or (samples and samples[-1].at < now - HISTORY_SECONDS):
                del self._samples[task_id]
        self._live = set(progress)
        for task_id, status in progress.items():
            samples = self._samples.setdefault(task_id, deque(maxlen=self._kept))
            lags = tuple(
                (str(c["channel"]), c.get("lag_seconds")) for c in status.get("channels") or ()
            )
            samples.append(
                Sample(now, int(status.get("rows") or 0), status.get("lag_seconds"), lags)
            )

    def rows_per_second(self, task_id: str) -> float | None:
        """Rows applied per second over the last samples; None before two samples and for a
        task not running."""
        if task_id not in self._live:
            return None
        samples = list(self._samples.get(task_id, ()))[-RATE_WINDOW:]
        if len(samples) < 2 or samples[-1].at <= samples[0].at:
            return None
        rows = max(0, samples[-1].rows - samples[0].rows)
        return round(rows / (samples[-1].at - samples[0].at), 3)

    def view(self, task_id: str) -> dict[str, Any]:
        samples = list(self._samples.get(task_id, ()))[-SAMPLES_KEPT:]
        return {
            "rows_per_second": self.rows_per_second(task_id),
            "lag_samples": [s.lag_seconds for s in samples] if task_id in self._live else [],
        }

    def history(self, task_id: str) -> list[dict[str, Any]]:
        """The task's samples, oldest first, each with the rows/s since the one before (None
        for the first, and after a runner restart, whose row count starts again)."""
        result: list[dict[str, Any]] = []
        before: Sample | None = None
        for sample in self._samples.get(task_id, ()):
            rate = None
            if before is not None and sample.at > before.at and sample.rows >= before.rows:
                rate = round((sample.rows - before.rows) / (sample.at - before.at), 3)
            result.append(
                {
                    "at": round(sample.at, 3),
                    "lag_seconds": sample.lag_seconds,
                    "rows_per_second": rate,
                    "channels": dict(sample.channel_lags),
                }
            )
            before = sample
        return result


# --- metastore health ----------------------------------------------------------------------------
@dataclass
class MetastoreHealth:
    healthy: bool | None = None  # None: not checked yet
    checked_at: float | None = None
    consecutive_failures: int = 0
    last_error: str = ""

    async def check(self, store: MetaStore, now: float) -> None:
        try:
            await asyncio.wait_for(asyncio.to_thread(store.ping), timeout=PING_TIMEOUT)
        except (MetaStoreError, TimeoutError) as exc:
            error = str(exc) or f"no answer within {PING_TIMEOUT:.0f} s"
            if self.healthy is not False:
                log.warning("metastore health check failed: %s", error)
            self.healthy = False
            self.consecutive_failures += 1
            self.last_error = error
        else:
            if self.healthy is False:
                log.info(
                    "metastore healthy again after %d failed check(s)", self.consecutive_failures
                )
            self.healthy = True
            self.consecutive_failures = 0
            self.last_error = ""
        self.checked_at = now

    def view(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "checked_at": self.checked_at,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }


# --- retry of transient failures -----------------------------------------------------------------
def backoff_seconds(policy: RetrySettings, attempt: int) -> float:
    """Wait before retry number ``attempt`` (1-based)."""
    delay = policy.initialBackoffSeconds * policy.multiplier ** max(0, attempt - 1)
    return float(min(policy.maxBackoffSeconds, delay))


def is_transient(policy: RetrySettings, reason: str) -> bool:
    text = reason.lower()
    return any(marker.lower() in text for marker in policy.transientReasons if marker)


@dataclass
class RetryState:
    attempts: int = 0
    next_at: float = 0.0
    waiting: bool = False  # a resume is scheduled and not made yet
    last_retry_at: float | None = None
    gave_up: bool = False


@dataclass
class TransientRetrier:
    policy: RetrySettings
    states: dict[str, RetryState] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)  # resumes made, per task

    def _forget_settled(self, tasks: Iterable[TaskRecord], now: float) -> None:
        current = {t.task_id: t for t in tasks}
        for task_id, state in list(self.states.items()):
            task = current.get(task_id)
            if task is None or task.state in (TaskState.PAUSED, TaskState.INITIAL):
                del self.states[task_id]  # deleted, or an operator took it over
            elif (
                task.state is TaskState.RUNNING
                and state.last_retry_at is not None
                and now - state.last_retry_at > self.policy.maxBackoffSeconds
            ):
                del self.states[task_id]  # has run long enough: count afresh next time

    async def run_once(self, supervisor: TaskSupervisor, now: float) -> list[str]:
        """Resume the Failed tasks whose wait is over; returns their ids."""
        tasks = await supervisor.list()
        self._forget_settled(tasks, now)
        resumed = []
        for task in tasks:
            if task.state is not TaskState.FAILED or not is_transient(self.policy, task.reason):
                continue
            state = self.states.setdefault(task.task_id, RetryState())
            if not state.waiting and not state.gave_up:
                self._schedule(task.task_id, state, now)  # a failure not yet answered
            if state.gave_up or now < state.next_at:
                continue
            with log_context(task_id=task.task_id):
                log.info(
                    "resuming a task stopped by a transient error (attempt %d): %s",
                    state.attempts,
                    task.reason,
                )
                try:
                    await supervisor.resume(task.task_id)
                except ApiError as exc:  # resumed, paused or deleted meanwhile
                    log.info("retry skipped: %s", exc.message)
                    continue
            state.waiting = False
            state.last_retry_at = now
            self.retries[task.task_id] = self.retries.get(task.task_id, 0) + 1
            resumed.append(task.task_id)
        return resumed

    def _schedule(self, task_id: str, state: RetryState, now: float) -> None:
        limit = self.policy.maxAttempts
        if limit and state.attempts >= limit:
            state.gave_up = True
            with log_context(task_id=task_id):
                log.warning("left Failed after %d automatic resumes (retry.maxAttempts)", limit)
            return
        state.attempts += 1
        state.next_at = now + backoff_seconds(self.policy, state.attempts)
        state.waiting = True

    def view(self, task_id: str) -> dict[str, Any] | None:
        state = self.states.get(task_id)
        if state is None:
            return None
        return {
            "attempts": state.attempts,
            "next_at": state.next_at if state.waiting else None,
            "gave_up": state.gave_up,
        }


# --- the jobs together ---------------------------------------------------------------------------
class _JobsCollector(Collector):
    def __init__(self, jobs: DaemonJobs) -> None:
        self._jobs = jobs

    def collect(self) -> Iterable[Metric]:
        jobs = self._jobs
        up = GaugeMetricFamily(
            "cdc_metastore_up", "1 when the last metastore health check answered, else 0"
        )
        up.add_metric([], 1.0 if jobs.health.healthy else 0.0)
        yield up
        rate = GaugeMetricFamily(
            "cdc_task_rows_per_second",
            "Rows applied to the target per second, over the last progress samples",
            labels=["task_id"],
        )
        for task_id in jobs.supervisor.all_progress():
            value = jobs.sampler.rows_per_second(task_id)
            if value is not None:
                rate.add_metric([task_id], value)
        yield rate
        retries = CounterMetricFamily(
            "cdc_task_retries",
            "Automatic resumes of tasks stopped by a transient error",
            labels=["task_id"],
        )
        for task_id, count in jobs.retrier.retries.items():
            retries.add_metric([task_id], count)
        yield retries
        endpoints = GaugeMetricFamily(
            "cdc_endpoint_up",
            "1 when the endpoint answered the last probe, else 0: the source's queue and etcd "
            "and the targets of the tasks running here",
            labels=["role", "endpoint"],
        )
        for (role, label), answered in jobs.reachability.probed.items():
            endpoints.add_metric([role, label], 1.0 if answered else 0.0)
        yield endpoints


class DaemonJobs:
    """The scheduler and the state its jobs keep."""

    def __init__(
        self,
        settings: SchedulerSettings,
        supervisor: TaskSupervisor,
        store: MetaStore,
        verify: VerifySettings | None = None,
        source_of: SourceOf | None = None,
        recover_jobs: Callable[[], Awaitable[None]] | None = None,
        store_format: StoreFormatKeeper | None = None,
        certificates: Sequence[ClientCertificate] = (),
    ):
        """``source_of``: the source cluster a task reads (``CdcSettings.source_of``); None: the
        sources are not probed. ``recover_jobs``: finishes or rolls back the disaster-recovery
        jobs a stopped daemon left (``DisasterRecovery.recover``). ``store_format``: raises the
        store's format once every fleet member reads it. ``certificates``: the daemon's own
        client certificates (server/tasks/certificates.py), looked at with the tasks' at each
        reachability round."""
        self.recover_jobs = recover_jobs
        self.store_format = store_format
        self.settings = settings
        self.source_of = source_of
        self.verify = verify or VerifySettings()
        self.supervisor = supervisor
        self.store = store
        self.sampler = ProgressSampler(settings.progressSampleSeconds)
        self.health = MetastoreHealth()
        self.retrier = TransientRetrier(settings.retry)
        self.reachability = ReachabilityWatch()
        self.daemon_certificates = list(certificates)
        self.certificates = CertificateWatch(settings.certificateWarningDays)
        self.scheduler = AsyncIOScheduler(timezone=UTC)

    async def sample_progress(self) -> None:
        known = self.supervisor.task_states()
        self.sampler.sample(self.supervisor.all_progress(), time.time(), known)

    async def check_metastore(self) -> None:
        await self.health.check(self.store, time.time())

    async def check_reachability(self) -> None:
        runners = self.supervisor.runners_here()
        used: dict[str, list[Endpoint]] = {
            task_id: [*self._source_endpoints(spec), target_endpoint(spec)]
            for task_id, spec, _ in runners
        }
        probed = [endpoint for endpoints in used.values() for endpoint in endpoints]
        outages = await in_daemon_thread(self.reachability.check, probed)
        certificates = {
            task_id: [*self._source_certificates(spec), *target_certificates(spec)]
            for task_id, spec, _ in runners
        }
        everyone = [cert for certs in certificates.values() for cert in certs]
        await asyncio.to_thread(self.certificates.look, [*self.daemon_certificates, *everyone])
        now = time.time()
        for task_id, _, runner in runners:
            warnings = [outages[e.key].warning(e) for e in used[task_id] if e.key in outages]
            warnings += self.certificates.warnings(certificates[task_id], now)
            try:
                await asyncio.to_thread(runner.unreachable, warnings)
            except (MetaStoreError, CdcError) as exc:
                with log_context(task_id=task_id):
                    log.warning("reachability warnings not recorded: %s", exc)

    def _source_endpoints(self, spec: TaskSpec) -> list[Endpoint]:
        if self.source_of is None:
            return []
        try:
            return source_endpoints(self.source_of(spec))
        except KeyError:  # a cluster no longer configured: the runner says so itself
            return []

    def _source_certificates(self, spec: TaskSpec) -> list[ClientCertificate]:
        if self.source_of is None:
            return []
        try:
            return source_certificates(self.source_of(spec))
        except KeyError:
            return []

    async def recover_switchovers(self) -> None:
        """Switchover jobs whose daemon is gone are finished or rolled back (server/dr)."""
        if self.recover_jobs is not None:
            await self.recover_jobs()

    async def raise_store_format(self) -> None:
        """A breaking step of the store's format tried again (it waits for older members)."""
        if self.store_format is not None:
            await self.store_format.retry()

    async def retry_transient(self) -> None:
        try:
            await self.retrier.run_once(self.supervisor, time.time())
        except MetaStoreError as exc:
            log.warning("transient-retry job: metastore unavailable: %s", exc)

    async def verify_scheduled(self) -> None:
        try:
            await run_scheduled(self.supervisor, self.verify, time.time())
        except MetaStoreError as exc:
            log.warning("scheduled-verify job: metastore unavailable: %s", exc)

    def start(self) -> None:
        jobs = [
            (self.sample_progress, self.settings.progressSampleSeconds),
            (self.check_metastore, self.settings.metastoreCheckSeconds),
            (self.verify_scheduled, self.verify.scheduleCheckSeconds),
            (self.check_reachability, self.settings.reachabilitySeconds),
            (self.recover_switchovers, RECOVER_SECONDS),
        ]
        if self.settings.retry.enabled:
            jobs.append((self.retry_transient, self.settings.retry.checkSeconds))
        if self.store_format is not None and self.store_format.pending:
            jobs.append((self.raise_store_format, RETRY_SECONDS))
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            # APScheduler logs two INFO lines per run of every job; keep its warnings and errors
            logging.getLogger("apscheduler").setLevel(logging.WARNING)
        now = datetime.now(UTC)
        for job, seconds in jobs:
            self.scheduler.add_job(
                job,
                "interval",
                seconds=seconds,
                id=job.__name__,
                next_run_time=now,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=None,
            )
        self.scheduler.start()
        log.info("scheduler started: %s", ", ".join(job.__name__ for job, _ in jobs))

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def task_extras(self, task_id: str) -> dict[str, Any]:
        """What the jobs know about one task, for /v1 views."""
        return {**self.sampler.view(task_id), "retry": self.retrier.view(task_id)}


JOBS = web.AppKey("jobs", DaemonJobs)


def install_jobs(
    app: web.Application,
    settings: SchedulerSettings,
    verify: VerifySettings | None = None,
    source_of: SourceOf | None = None,
    certificates: Sequence[ClientCertificate] = (),
) -> None:
    """Run the jobs while the application runs (after the supervisor is up, stopped before it
    drains)."""

    async def jobs_ctx(app: web.Application) -> AsyncIterator[None]:
        disaster = app.get(DISASTER)
        recover = disaster.recover if disaster is not None else None
        jobs = DaemonJobs(
            settings,
            app[SUPERVISOR],
            app[STORE],
            verify,
            source_of,
            recover,
            app.get(STORE_FORMAT),
            certificates,
        )
        app[METRICS].registry.register(_JobsCollector(jobs))
        app[METRICS].registry.register(CertificateCollector(jobs.certificates))
        app[JOBS] = jobs
        jobs.start()
        yield
        jobs.stop()

    app.cleanup_ctx.append(jobs_ctx)
