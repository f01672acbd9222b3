"""Benchmark: backfill rows/s on Spark local[2] against a single-process copier, same data, same
run, same machine.

A real Milvus 2.3.5 source holds R rows (int64 key, a DIM-float vector, a 32-character title);
each copy goes into a fresh collection of a second real Milvus 2.3.5 (the target).

- baseline: one process iterates the source with pymilvus's query_iterator (batches of B) and
  inserts each page into the target;
- Spark: the backfill job itself (replicator/backfill/job.py ``run_job``: plan the key ranges
  by reading the keys, then copy the ranges as Spark tasks, each recorded in a SQLite
  metastore), for several numbers of ranges, on one local[2] session started beforehand (its
  start-up and the first task's Python worker start are reported apart).

The baseline runs before and after the Spark runs; its mean is the reference. Each copy is
checked with one count(*) on the target at the end (not timed).

    python bench/backfill.py [--rows 200000] [--dim 8] [--batch 4000] [--ranges 2,4,8,16]
        [--master local[2]] [--out bench/results/backfill.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness import services  # noqa: E402
from harness.milvus_source import milvus_source_rocksmq  # noqa: E402
from pymilvus import DataType, MilvusClient  # noqa: E402

from metastore import TaskRecord, TaskState  # noqa: E402
from metastore.sql import SqlMetaStore  # noqa: E402
from metastore.sql_urls import sqlite_url  # noqa: E402
from replicator.backfill.job import EXIT_OK, JobOptions, plan_collection, run_job  # noqa: E402
from replicator.backfill.ranges import range_rows_for  # noqa: E402
from replicator.backfill.state import BackfillJob, BackfillState, CollectionRef  # noqa: E402
from replicator.backfill.transfer import CLOCK_MARGIN, guarantee_after  # noqa: E402


def create_collection(client: MilvusClient, name: str, dim: int) -> None:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("title", DataType.VARCHAR, max_length=64)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, num_shards=1)


def load_source(client: MilvusClient, name: str, rows: int, dim: int) -> float:
    vectors = np.random.default_rng(3).random((rows, dim), dtype=np.float32)
    started = time.perf_counter()
    for lo in range(0, rows, 10_000):
        batch = [
            {"id": i, "vec": vectors[i].tolist(), "title": f"row-{i:08d}-{'t' * 19}"}
            for i in range(lo, min(rows, lo + 10_000))
        ]
        client.insert(name, batch)
    client.flush(name)
    return time.perf_counter() - started


def count(client: MilvusClient, name: str) -> int:
    client.load_collection(name)
    found = client.query(name, filter="", output_fields=["count(*)"], consistency_level="Strong")
    return int(found[0]["count(*)"])


def single_process_copy(source_uri: str, target: MilvusClient, name: str, into: str, batch: int):
    source = MilvusClient(uri=source_uri, dedicated=True)
    started = time.perf_counter()
    pages = source.query_iterator(
        name, batch_size=batch, output_fields=["*"], consistency_level="Strong"
    )
    copied = 0
    try:
        while page := pages.next():
            target.insert(into, list(page))
            copied += len(page)
    finally:
        pages.close()
        source.close()
    return time.perf_counter() - started, copied


def spark_copy(store, session, source_uri, target_uri, name, into, rows, ranges, batch):
    task_id = f"bench-{uuid.uuid4().hex[:8]}"
    now = time.time()
    spec = {"milvus_connect_param": {"uri": target_uri}}
    store.create_task(TaskRecord(task_id, TaskState.RUNNING, "", spec, now, now))
    state = BackfillState(store, task_id)
    # In the daemon a job starts when its positions are saved, and the driver's Spark start-up
    # (measured apart, longer than CLOCK_MARGIN) passes before its first read, so its reads never
    # wait for the timestamp they must see; the session here is started beforehand, so the job
    # is dated as if that start-up had passed.
    job = BackfillJob.new(["*"]).with_(
        state="running",
        collections=[CollectionRef("default", name, "default", into)],
        started_at=time.time() - CLOCK_MARGIN,
    )
    state.save_job(job)
    options = JobOptions(
        source={"uri": source_uri},
        target=spec["milvus_connect_param"],
        range_rows=range_rows_for(rows, ranges),
        batch_rows=batch,
        parallelism=0,
        spark_conf={},
    )
    started = time.perf_counter()
    code = run_job(state, options, None, session=session)
    spent = time.perf_counter() - started
    assert code == EXIT_OK, f"backfill exit code {code}"
    plan = state.plans(job.job_id)[0]
    done = state.done(job.job_id)
    return spent, sum(done.values()), len(plan.ranges)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4000)
    parser.add_argument("--ranges", default="2,4,8,16")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "backfill.md"))
    args = parser.parse_args()
    ranges_list = [int(x) for x in args.ranges.split(",")]
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-backfill-")))
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        src = stack.enter_context(
            milvus_source_rocksmq(work / "src", etcd.endpoint, root_path="bf-src")
        )
        dst = stack.enter_context(
            milvus_source_rocksmq(work / "dst", etcd.endpoint, root_path="bf-dst")
        )
        source = MilvusClient(uri=src.uri, dedicated=True)
        target = MilvusClient(uri=dst.uri, dedicated=True)
        create_collection(source, "bench", args.dim)
        load_s = load_source(source, "bench", args.rows, args.dim)
        assert count(source, "bench") == args.rows
        print(f"source loaded: {args.rows} rows in {load_s:.1f} s", flush=True)

        results: list[tuple[str, float, int, str]] = []

        def baseline(tag: str) -> float:
            into = f"base_{tag}"
            create_collection(target, into, args.dim)
            spent, copied = single_process_copy(src.uri, target, "bench", into, args.batch)
            assert copied == args.rows
            assert count(target, into) == args.rows
            results.append((f"single process ({tag})", spent, copied, "-"))
            print(f"baseline {tag}: {copied / spent:,.0f} rows/s", flush=True)
            return spent

        base = [baseline("before")]

        from pyspark.sql import SparkSession

        started = time.perf_counter()
        session = (
            SparkSession.builder.master(args.master)
            .appName("bench-backfill")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        session_s = time.perf_counter() - started
        started = time.perf_counter()
        session.sparkContext.parallelize([1, 2], 2).map(lambda x: x).collect()
        first_task_s = time.perf_counter() - started
        started = time.perf_counter()
        # read as the job's planning reads: at a timestamp the source has passed (a Strong read
        # waits for a time tick per page)
        planned = plan_collection(
            source,
            CollectionRef("default", "bench", "default", "x"),
            args.rows // 8,
            guarantee_after(time.time() - CLOCK_MARGIN),
        )
        plan_s = time.perf_counter() - started
        assert sum(r.rows for r in planned.ranges) == args.rows
        store = SqlMetaStore(sqlite_url(str(work / "meta.sqlite3")), "bench")
        spark_runs = []
        try:
            for ranges in ranges_list:
                into = f"spark_{ranges}"
                create_collection(target, into, args.dim)
                spent, copied, made = spark_copy(
                    store, session, src.uri, dst.uri, "bench", into, args.rows, ranges, args.batch
                )
                assert copied == args.rows
                assert count(target, into) == args.rows
                results.append((f"Spark {args.master}, {made} ranges", spent, copied, str(made)))
                spark_runs.append((made, spent))
                print(f"spark {made} ranges: {copied / spent:,.0f} rows/s", flush=True)
        finally:
            session.stop()
            store.close()
        base.append(baseline("after"))
        source.close()
        target.close()
    base_rate = args.rows / (sum(base) / len(base))
    total_s = time.perf_counter() - began
    lines = [
        "# Backfill: Spark job vs a single-process copier",
        "",
        f"`{' '.join(['python', 'bench/backfill.py', *sys.argv[1:]])}` on "
        f"{platform.node() and 'this machine'} ({os.cpu_count()} cores, "
        f"{platform.python_version()}), {time.strftime('%Y-%m-%d')}. Source and target: two "
        f"real Milvus 2.3.5 standalones (RocksMQ) on the same machine; {args.rows:,} rows of "
        f"int64 key + {args.dim}-float vector + 32-character title; batches of {args.batch}.",
        "",
        "| copier | seconds | rows/s | ratio to single process (mean of before/after) |",
        "|---|---|---|---|",
    ]
    for label, spent, copied, _ in results:
        rate = copied / spent
        lines.append(f"| {label} | {spent:.1f} | {rate:,.0f} | {rate / base_rate:.2f} |")
    lines += [
        "",
        f"Spark session start-up ({args.master}): {session_s:.1f} s; first task (Python worker "
        f"start): {first_task_s:.2f} s. Not included in the Spark rows above, which time the job "
        "itself: planning (reading every key once to cut equal-count ranges) and the copy.",
        f"Planning alone (reading the {args.rows:,} keys, cutting the ranges) takes {plan_s:.2f} "
        "s of each Spark run.",
        f"Loading the source took {load_s:.1f} s; the whole benchmark {total_s:.0f} s.",
        "",
    ]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
