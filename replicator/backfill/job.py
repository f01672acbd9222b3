"""The backfill job's driver: plan the key ranges, copy them as Spark tasks, record each one.

Run as a process of its own (``python -m replicator.backfill``, which the daemon launches, or
under ``spark-submit``). Per collection of the task's current job:

1. plan (once per job, kept in the metastore): the key field, the partitions, and equal-count
   key ranges cut from the keys read with a query iterator;
2. copy every range not yet done: one Spark job of one task per range, up to ``parallelism`` at
   once from driver threads, so each range is recorded as done (from the driver) the moment it
   finishes and has proved itself (``proof``); a failed Spark task is retried by Spark
   (``spark.task.maxFailures``);
3. a range whose task failed every attempt stops the job: the reason, naming the collection and
   the range, is recorded, the other ranges are cancelled, the exit code is ``EXIT_RANGE_FAILED``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from pymilvus import MilvusClient

from replicator.backfill.columns import ColumnPage, page_keys, query_columns
from replicator.backfill.pages import MAX_BATCH, read_unchecked
from replicator.backfill.ranges import Key, KeyOrderError, KeyRange, cut_ranges
from replicator.backfill.state import BackfillState, CollectionPlan, CollectionRef
from replicator.backfill.transfer import (
    connect,
    copy_range,
    every_key_filter,
    guarantee_after,
    pages_by_key,
    read_ahead,
)

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_RANGE_FAILED = 3
EXIT_BAD_JOB = 4


class RangeFailedError(Exception):
    """A range failed on every attempt; the message names the collection and the range."""


@dataclass(frozen=True)
class JobOptions:
    source: dict[str, Any]  # uri, username, password, token of the source Milvus
    target: dict[str, Any]  # the task's milvus_connect_param
    range_rows: int
    batch_rows: int
    parallelism: int  # 0: Spark's default parallelism
    # extra key=value settings for the Spark session; the master is one of them unless the job
    # runs under spark-submit (which sets it)
    spark_conf: dict[str, str]


# --- planning ------------------------------------------------------------------------------
def _keys(client: MilvusClient, ref: CollectionRef, pk: str, guarantee_ts: int) -> Iterator[Key]:
    """Every key of the collection in ascending order, exactly: pages checked against counts
    (``pages.read_pages``), so a backfill's ``rows_total`` is the rows it has to copy."""
    for page in pages_by_key(client, ref.name, pk, "", [pk], None, MAX_BATCH, guarantee_ts):
        for row in page:
            yield row[pk]


def _keys_unchecked(
    client: MilvusClient, ref: CollectionRef, pk: str, guarantee_ts: int
) -> Iterator[Key]:
    """Every key of the collection in ascending order, read as protobuf columns (pymilvus's
    rows cost most of a read's CPU), pages of ``MAX_BATCH`` read ahead. Not checked against
    counts: a key missed only makes a range larger or smaller, never leaves a key outside every
    range (the first and the last range are open). For a verify, whose ranges need no exact
    size; a backfill's ``rows_total`` must be exact (issue 18), so it reads with ``_keys``."""

    def query(where: str, limit: int) -> ColumnPage:
        return query_columns(client, ref.db, ref.name, pk, where, None, limit, guarantee_ts, [pk])

    everything = every_key_filter(client, ref.name, pk)
    for page in read_ahead(read_unchecked(query, page_keys, pk, "", MAX_BATCH, everything)):
        yield from sorted(page.keys)


def plan_collection(
    client: MilvusClient,
    ref: CollectionRef,
    range_rows: int,
    guarantee_ts: int = 0,
    *,
    exact: bool = True,
) -> CollectionPlan:
    """The collection's key ranges; ``exact``: every key counted (a backfill's progress), else
    read as fast as the server answers (a verify's)."""
    described = client.describe_collection(ref.name)
    fields = described["fields"]
    pk = next(f["name"] for f in fields if f.get("is_primary"))
    partition_key = any(f.get("is_partition_key") for f in fields)
    partitions = [] if partition_key else list(client.list_partitions(ref.name))
    keys = _keys if exact else _keys_unchecked
    try:
        ranges = cut_ranges(keys(client, ref, pk, guarantee_ts), range_rows)
    except KeyOrderError:
        # a source that does not iterate in key order: sort the keys in memory
        ranges = cut_ranges(sorted(keys(client, ref, pk, guarantee_ts)), range_rows)
    return CollectionPlan(ref, pk, ranges, partitions)


def ensure_target_partitions(client: MilvusClient, plan: CollectionPlan) -> None:
    name = plan.collection.target_name
    if not client.has_collection(name):
        raise RangeFailedError(
            f"collection {plan.collection.label}: {plan.collection.target_db}.{name} is not on "
            "the target"
        )
    existing = set(client.list_partitions(name))
    for partition in plan.partitions:
        if partition not in existing:
            client.create_partition(name, partition)


# --- copying -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RangeWork:
    collection_index: int
    plan: CollectionPlan
    key_range: KeyRange

    def payload(self, options: JobOptions, guarantee_ts: int) -> dict[str, Any]:
        ref = self.plan.collection
        return {
            "guarantee_ts": guarantee_ts,
            "source": options.source,
            "target": options.target,
            "db": ref.db,
            "name": ref.name,
            "pk": self.plan.pk,
            "target_db": ref.target_db,
            "target_name": ref.target_name,
            "filter": self.key_range.filter(self.plan.pk),
            "partitions": self.plan.partitions,
            "batch_rows": options.batch_rows,
        }

    def describe(self) -> str:
        return f"collection {self.plan.collection.label} {self.key_range.describe()}"


def spark_task(work: dict[str, Any]) -> tuple[dict[str, int], int]:
    """The function each Spark task runs: (what ``copy_range`` returns, attempt number)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    return copy_range(work), attempt


def spark_session(options: JobOptions, app_name: str) -> Any:
    return session_with(options.spark_conf, app_name)


def session_with(spark_conf: dict[str, str], app_name: str) -> Any:
    """A Spark session with these properties (the master among them, unless under
    spark-submit)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise RuntimeError(
            "Spark (a backfill, a large verify) needs the Python package 'pyspark' "
            "(pip install 'pyspark>=4,<5') and Java 17"
        ) from exc
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def copy_ranges(
    works: list[RangeWork],
    run_one: Callable[[RangeWork], dict[str, int]],
    on_done: Callable[[RangeWork, dict[str, int]], None],
    parallelism: int,
    cancel: Callable[[], None],
) -> None:
    """Run ``run_one`` over ``works``, ``parallelism`` at a time, calling ``on_done`` as each
    one finishes; the first failure cancels the rest and raises ``RangeFailedError``."""
    stop = threading.Event()

    def one(work: RangeWork) -> None:
        if stop.is_set():
            return
        on_done(work, run_one(work))

    with ThreadPoolExecutor(max_workers=max(1, parallelism), thread_name_prefix="range") as pool:
        futures: dict[Future[None], RangeWork] = {pool.submit(one, w): w for w in works}
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            stop.set()
            cancel()
            for future in futures:
                future.cancel()
            first = failed[0]
            error = first.exception()
            raise RangeFailedError(f"{futures[first].describe()}: {_short(error)}") from error


_PYTHON_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*")


def _short(error: BaseException | None) -> str:
    """The cause of a failed Spark job: the last Python exception line of the task's traceback
    (Spark wraps it in a JVM stack trace), else the first line."""
    text = str(error) if error is not None else ""
    lines = [
        line
        for line in text.splitlines()
        if _PYTHON_ERROR.match(line) and not line.startswith(("org.apache", "java.", "py4j"))
    ]
    chosen = lines[-1] if lines else (text.splitlines() or [type(error).__name__])[0]
    return chosen[:500]


def run_job(
    state: BackfillState, options: JobOptions, master: str | None, session: Any = None
) -> int:
    """Run the task's current backfill job to its end; the exit code. ``session``: a Spark
    session to use (and leave running) instead of one of its own."""
    job = state.job()
    if job is None or job.state != "running" or not job.collections:
        log.error("no running backfill job with resolved collections for task %s", state.task_id)
        return EXIT_BAD_JOB
    plans: dict[int, CollectionPlan] = state.plans(job.job_id)
    # what every read must see: the writes made before the job's positions were saved
    seen = guarantee_after(job.started_at or job.created_at)
    for index, ref in enumerate(job.collections):
        if index in plans:
            continue
        started = time.monotonic()
        source = connect(options.source, ref.db)
        target = connect(options.target, ref.target_db)
        try:
            plan = plan_collection(source, ref, options.range_rows, seen)
            ensure_target_partitions(target, plan)
        except RangeFailedError as exc:
            state.record_failure(job.job_id, str(exc))
            return EXIT_RANGE_FAILED
        finally:
            source.close()
            target.close()
        state.save_plan(job.job_id, index, plan)
        plans[index] = plan
        log.info(
            "planned %s: %d rows in %d ranges (%.1f s)",
            ref.label,
            plan.rows,
            len(plan.ranges),
            time.monotonic() - started,
        )
    done = state.done(job.job_id)
    works = [
        RangeWork(index, plan, key_range)
        for index, plan in sorted(plans.items())
        for key_range in plan.ranges
        if (index, key_range.index) not in done
    ]
    if done:
        log.info("resuming: %d range(s) done before, %d to copy", len(done), len(works))
    if not works:
        return EXIT_OK
    own_session = session is None
    if own_session:
        spark_conf = dict(options.spark_conf)
        if master and "PYSPARK_GATEWAY_PORT" not in os.environ:  # spark-submit sets the master
            spark_conf["spark.master"] = master
        session = spark_session(
            JobOptions(**{**options.__dict__, "spark_conf": spark_conf}),
            f"milvus-cdc-backfill-{state.task_id}",
        )
    context = session.sparkContext
    parallelism = options.parallelism or int(context.defaultParallelism)
    log.info("copying %d range(s), %d at a time, on %s", len(works), parallelism, context.master)

    def run_one(work: RangeWork) -> dict[str, int]:
        context.setJobDescription(work.describe())
        rdd = context.parallelize([work.payload(options, seen)], 1)
        ((copied, attempt),) = rdd.map(spark_task).collect()
        if attempt:
            log.info("%s copied on attempt %d", work.describe(), attempt + 1)
        return dict(copied)

    def on_done(work: RangeWork, copied: dict[str, int]) -> None:
        state.mark_done(job.job_id, work.collection_index, work.key_range.index, copied["rows"])
        log.info(
            "%s: %d rows copied; the proof found %d alive on the source and not yet written",
            work.describe(),
            copied["rows"],
            copied["added_by_proof"],
        )

    try:
        copy_ranges(works, run_one, on_done, parallelism, context.cancelAllJobs)
    except RangeFailedError as exc:
        reason = f"{exc} (after {_attempts(session)} attempts)"
        log.error("backfill stopped: %s", reason)
        state.record_failure(job.job_id, reason)
        return EXIT_RANGE_FAILED
    finally:
        if own_session:
            session.stop()
    return EXIT_OK


def _attempts(session: Any) -> str:
    conf = session.sparkContext.getConf()
    failures = conf.get("spark.task.maxFailures", None)
    if failures:
        return str(failures)
    master = str(session.sparkContext.master)
    if master.startswith("local[") and "," in master:
        return master.split(",", 1)[1].rstrip("]")
    return "1"
