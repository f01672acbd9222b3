"""A task's verify job, run in a thread of the daemon: resolve the collections, plan their key
ranges with the backfill's planner, verify (and repair) each range, and keep the job's record
in the metastore up to date after every range.

The source is read through the daemon's ``sourceConfig.milvus``, the target through the task's
``milvus_connect_param``; both collections are loaded first when they are not (a query needs
it), and the job's notes say so.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import grpc
from pymilvus import MilvusClient

from metastore import MetaStore, TaskState
from replicator.backfill.job import plan_collection
from replicator.backfill.ranges import KeyRange
from replicator.backfill.state import CollectionPlan, CollectionRef
from replicator.backfill.transfer import connect
from replicator.compare.digest import Digest
from replicator.compare.gate import LiveApplied, applied_ts, now_ts
from replicator.compare.reader import ensure_loaded, schema_of
from replicator.compare.spark_launch import RangeDigests, SparkDigests, SparkVerifyError
from replicator.compare.state import CollectionResult, VerifyJob, VerifyState
from replicator.compare.verify import CollectionVerifier, RangeOutcome, VerifyOptions
from replicator.config.task_spec import DEFAULT_DB, TaskSpec
from replicator.log_context import log_context
from replicator.pipeline.selection import WILDCARD, TaskSelection
from replicator.sinks.milvus_status import GRPC_RETRIABLE

log = logging.getLogger(__name__)


class VerifyError(Exception):
    """The job cannot go on; the message says why."""


@dataclass(frozen=True)
class VerifyContext:
    store: MetaStore
    task_id: str
    spec: TaskSpec
    source: dict[str, Any]  # uri, username, password, token of the source Milvus
    options: VerifyOptions
    # the pchannels a source collection (db, name) is on; None: not known
    channels_of: Callable[[str, str], frozenset[str] | None] = lambda db, name: None
    # large collections' digests on Spark; None: every collection in the daemon
    spark: SparkDigests | None = None
    # the task's applied tick per pchannel while it runs in this daemon (see gate.applied_ts)
    live: LiveApplied = lambda: None


def resolve_collections(
    source: dict[str, Any], selection: TaskSelection, requested: list[str]
) -> list[CollectionRef]:
    """The source collections the task selects that the job names (all for '*')."""
    dbs = sorted({db for db, _ in selection.selection if db != WILDCARD})
    if any(db == WILDCARD for db, _ in selection.selection):
        client = connect(source, DEFAULT_DB)
        try:
            dbs = sorted(client.list_databases())
        finally:
            client.close()
    refs = []
    for db in dbs:
        client = connect(source, db)
        try:
            names = sorted(client.list_collections())
        finally:
            client.close()
        for name in names:
            if not selection.selects(db, name):
                continue
            if requested != [WILDCARD] and not {name, f"{db}.{name}"} & set(requested):
                continue
            target_db, target_name = selection.target_name(db, name)
            refs.append(CollectionRef(db, name, target_db, target_name))
    found = {n for r in refs for n in (r.name, r.label)}
    unknown = [] if requested == [WILDCARD] else sorted(set(requested) - found)
    if unknown:
        raise VerifyError(f"not collections of the source selected by the task: {unknown}")
    return refs


class VerifyRun:
    """Runs one job to its end; ``job`` is the record as it stands (read by the daemon)."""

    def __init__(
        self,
        context: VerifyContext,
        job: VerifyJob,
        stop: threading.Event,
        on_change: Callable[[VerifyJob], None] | None = None,
    ) -> None:
        self.context = context
        self.job = job
        self.stop = stop
        self._state = VerifyState(context.store, context.task_id)
        self._on_change = on_change

    def _save(self, job: VerifyJob) -> None:
        self.job = job
        self._state.save_job(job)
        if self._on_change is not None:
            self._on_change(job)

    def run(self) -> VerifyJob:
        with log_context(task_id=self.context.task_id, channel="verify"):
            self._save(self.job.with_(state="running", started_at=time.time()))
            try:
                self._run()
            except Exception as exc:  # any failure ends the job with its reason
                log.exception("verify %s failed", self.job.job_id)
                self._save(
                    self.job.with_(
                        state="failed",
                        reason=f"{type(exc).__name__}: {exc}",
                        finished_at=time.time(),
                    )
                )
                return self.job
            state = "failed" if self.stop.is_set() else "done"
            reason = "stopped before the end" if self.stop.is_set() else ""
            self._save(self.job.with_(state=state, reason=reason, finished_at=time.time()))
            view = self.job.view()
            log.info(
                "verify %s %s: %d rows compared, %d divergent, repaired %s",
                self.job.job_id,
                state,
                view["rows_compared"],
                view["divergent_rows"],
                view["repaired"],
            )
            return self.job

    def _run(self) -> None:
        context = self.context
        task = context.store.get_task(context.task_id)
        if task is not None and task.state is not TaskState.RUNNING:
            note = (
                f"the task is {task.state.value}: it applies nothing, so differing ranges cannot "
                "settle and end unsettled"
            )
            self._save(self.job.with_(notes=[*self.job.notes, note]))
        selection = TaskSelection.from_spec(context.spec)
        refs = resolve_collections(context.source, selection, self.job.requested)
        target_params = context.spec.target_param
        for ref in refs:
            if self.stop.is_set():
                return
            source = connect(context.source, ref.db)
            target = connect(target_params, ref.target_db)
            try:
                self._collection(ref, source, target)
            finally:
                source.close()
                target.close()

    def _collection(self, ref: CollectionRef, source: MilvusClient, target: MilvusClient) -> None:
        target_label = f"{ref.target_db}.{ref.target_name}"
        result = CollectionResult(ref.label, target_label)
        if not target.has_collection(ref.target_name):
            raise VerifyError(f"collection {ref.label}: {target_label} is not on the target")
        notes = [
            note
            for client, name, side in (
                (source, ref.name, "source"),
                (target, ref.target_name, "target"),
            )
            if (note := ensure_loaded(client, name, side)) is not None
        ]
        if notes:
            self._save(self.job.with_(notes=[*self.job.notes, *notes]))
        channels = self.context.channels_of(ref.db, ref.name)
        if channels is None:
            log.warning("%s: its channels are not known; waiting for every channel", ref.label)
        # keys read as of now (not Strong: each page would wait for the next time tick)
        plan = plan_collection(source, ref, self.context.options.range_rows, now_ts(), exact=False)
        ranges = sample_ranges(plan.ranges, self.job.sample, random.SystemRandom())
        plan = replace(plan, ranges=ranges)
        result = replace(result, ranges_total=len(ranges))
        self._save(self.job.with_collection(result))
        verifier = CollectionVerifier(
            source,
            target,
            plan,
            schema_of(source, ref.name),
            self.context.options,
            applied_ts(self.context.store, self.context.task_id, channels, self.context.live),
            self.stop,
            repair=self.job.repair,
        )
        firsts = self._spark_digests(plan, verifier)
        if self.stop.is_set():
            return
        lock = threading.Lock()

        def one(key_range: KeyRange) -> None:
            nonlocal result
            if self.stop.is_set():
                return
            outcome = verify_retrying(verifier, key_range, firsts.get(key_range.index), self.stop)
            with lock:
                result = _account(result, outcome)
                self._save(self.job.with_collection(result))

        parallelism = max(1, self.context.options.parallelism)
        with ThreadPoolExecutor(parallelism, thread_name_prefix="verify-range") as pool:
            # each range in a copy of this thread's context: its log lines name the task
            futures = [pool.submit(contextvars.copy_context().run, one, r) for r in ranges]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def _spark_digests(self, plan: CollectionPlan, verifier: CollectionVerifier) -> RangeDigests:
        """Every range's digests computed on Spark when the collection is large enough (the
        ranges to compare only: a sampled verify's), else nothing (each range is digested in
        the daemon)."""
        spark = self.context.spark
        if spark is None or not spark.wanted(plan):
            return {}
        target_params = self.context.spec.target_param
        started = time.monotonic()
        try:
            found = spark.run(
                self.context.task_id,
                plan,
                verifier.schema,
                (self.context.source, target_params),
                self.context.options.batch_rows,
                now_ts(),
                self.stop,
            )
        except SparkVerifyError as exc:
            # the daemon digests every range itself: slower, the same answer
            note = f"{plan.collection.label}: Spark ({spark.master}) failed, every range is "
            note += f"digested in the daemon instead: {exc}"
            log.warning("%s", note)
            self._save(self.job.with_(notes=[*self.job.notes, note]))
            return {}
        if found is None:
            return {}
        differing = sum(
            1 for source, target in found.values() if source is None or source != target
        )
        note = (
            f"{plan.collection.label}: {len(found)} ranges digested on Spark ({spark.master}) in "
            f"{time.monotonic() - started:.0f} s; {differing} compared again in the daemon"
        )
        log.info("%s", note)
        self._save(self.job.with_(notes=[*self.job.notes, note]))
        return found


# a range whose read failed on a connection (a server restarting, a GOAWAY) is read again
RANGE_TRIES = 3
RANGE_BACKOFF = 2.0  # seconds, times the attempt


def verify_retrying(
    verifier: CollectionVerifier,
    key_range: KeyRange,
    digests: tuple[Digest | None, Digest | None] | None,
    stop: threading.Event,
    tries: int = RANGE_TRIES,
) -> RangeOutcome:
    """``verifier.verify`` of one range, read again (up to ``tries`` times in all) when a call
    failed on its connection (gRPC UNAVAILABLE, DEADLINE_EXCEEDED, ...) rather than on its
    request: a verify reads and its repair writes idempotently, so a second attempt is
    safe. Any other failure, or the last one, ends the job with its reason."""
    for attempt in range(1, tries):
        try:
            return verifier.verify(key_range, digests if attempt == 1 else None)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            if code not in GRPC_RETRIABLE or stop.is_set():
                raise
            log.warning(
                "%s: a read failed (%s); reading the range again (attempt %d of %d)",
                key_range.describe(),
                code,
                attempt + 1,
                tries,
            )
            stop.wait(RANGE_BACKOFF * attempt)
    return verifier.verify(key_range, digests if tries == 1 else None)  # its failure ends the job


def sample_ranges(ranges: list[KeyRange], fraction: float, rnd: random.Random) -> list[KeyRange]:
    """A random ``fraction`` of ``ranges`` (at least one), in key order; all of them for 1."""
    if fraction >= 1:
        return list(ranges)
    count = max(1, math.ceil(len(ranges) * fraction))
    return sorted(rnd.sample(ranges, count), key=lambda r: r.index)


def _account(result: CollectionResult, outcome: RangeOutcome) -> CollectionResult:
    result = result.add(outcome.divergence)
    unsettled = result.unsettled
    if outcome.unsettled:
        unsettled = [*unsettled, f"{outcome.key_range.describe()}: {outcome.unsettled}"]
    return replace(
        result,
        ranges_done=result.ranges_done + 1,
        rows_compared=result.rows_compared + outcome.rows_compared,
        repaired=result.repaired + outcome.repaired,
        unsettled=unsettled,
    )
