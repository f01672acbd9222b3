"""Benchmark: replication lag under a steady write load, against the source's own
read-your-write latency measured in the same run.

A real Milvus 2.3.5 source on the librdkafka mock cluster (metadata in etcd), a Milvus Lite
target, the daemon on SQLite. A writer inserts `--rate` rows/s into the source in batches every
0.1 s for `--seconds`. Two probers follow the batches in order, one on each side: for each batch
they look up its last primary key (a point query) until it is there. Per batch:

- replication lag = time the daemon reports the batch's rows written to the target (its
  writes are acknowledged by the target before they are counted; the daemon's `get` is polled
  every `--ack-poll-ms`, 25 ms: at 10 ms the daemon spent about 5 CPU seconds a minute more
  answering) - time the source write returned; at the end the target's count(*) must read
  every row;
- baseline = time it is first seen on the source (consistency Strong, so the query waits for the
  source's own time tick) - the same write return: what a client of the source itself waits.
  Sampled: the prober takes the newest batch each time it is free.

The daemon reads with ``fetchWaitMs`` 5 (``--fetch-wait-ms``): a Kafka broker answers a waiting
fetch as soon as a record arrives, the librdkafka mock only at the end of the wait however soon
one arrives (bench/fetch_hold.py), so a short wait makes the mock answer about as a broker does.
Before the writes, the daemon's and the mock's CPU are measured while the tasks read the quiet
source (``--idle-seconds``, 10): the price of that wait.

The daemon's own `lag_seconds` (source time tick vs what is on the target) is sampled from `get`
every 0.5 s as well. At the end the daemon's own histograms of the loaded task are read from
/metrics (replicator/pipeline/timings.py): per data event, its source time to its read, its
read to the tick that releases it, its source time to the target's acknowledgement; per write,
the target's write time. They do not depend on the bench's polling.

    python bench/lag.py [--rate 5000] [--seconds 60] [--tasks 1,10] [--out FILE.md]

With ``--tasks 1,10`` the measure runs once per task count, on fresh services: the first task
replicates the loaded collection, each other task an empty collection of its own on the same
source and target, all of them reading every source channel (the daemon's shared readers).

Aims: p99 replication lag under 1 s at 5,000 rows/s (issue 3); with 10 tasks sharing readers,
no worse than with one task (issue 17).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import cpu_seconds, spent  # noqa: E402
from harness import services  # noqa: E402
from harness.daemon import Daemon  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import milvus_source, milvus_source_rocksmq  # noqa: E402
from replication_throughput import (  # noqa: E402
    count,
    create_collection,
    create_task,
    start_daemon,
)

PERIOD = 0.1  # seconds between batches


class Writer(threading.Thread):
    def __init__(self, client, name: str, rate: int, seconds: float, dim: int) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.dim = client, name, dim
        self.batch = max(1, int(rate * PERIOD))
        self.count = int(seconds / PERIOD)
        self.written: list[tuple[int, float]] = []  # (last id of the batch, write returned)
        self.late = 0  # batches that could not start on time (the source was slower)
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(3)
        start = time.perf_counter()
        try:
            for i in range(self.count):
                due = start + i * PERIOD
                if (wait := due - time.perf_counter()) > 0:
                    time.sleep(wait)
                else:
                    self.late += 1
                vectors = rng.random((self.batch, self.dim), dtype=np.float32)
                first = i * self.batch
                self.client.insert(
                    self.name, [{"id": first + j, "vec": vectors[j]} for j in range(self.batch)]
                )
                self.written.append((first + self.batch - 1, time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001
            self.error = exc


class TargetInserts(threading.Thread):
    """The target's own insert time, a baseline for the daemon's target write: while the writer
    runs, a batch of the writer's size inserted straight into a collection of its own on the
    target every ``period`` seconds, timed from the call to its return."""

    def __init__(self, client, name: str, writer: Writer, period: float, dim: int) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.writer = client, name, writer
        self.period, self.dim = period, dim
        self.times: list[float] = []

    def run(self) -> None:
        rng = np.random.default_rng(7)
        first = 0
        while self.writer.is_alive():
            vectors = rng.random((self.writer.batch, self.dim), dtype=np.float32)
            rows = [{"id": first + j, "vec": vectors[j]} for j in range(self.writer.batch)]
            started = time.perf_counter()
            self.client.insert(self.name, rows)
            self.times.append(time.perf_counter() - started)
            first += self.writer.batch
            time.sleep(max(0.0, self.period - (time.perf_counter() - started)))


class Prober(threading.Thread):
    """Samples the writer's batches on one side with point queries: it takes the newest batch
    written, queries until the batch's last key is there, notes the time, and moves to the
    newest batch again (a query loop cannot follow every batch: each query takes a while)."""

    def __init__(self, client, name: str, writer: Writer, consistency: str) -> None:
        super().__init__(daemon=True)
        self.client, self.name, self.writer = client, name, writer
        self.consistency = consistency
        self.lags: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        done = -1
        while not self.done.is_set():
            newest = len(self.writer.written) - 1
            if newest <= done:
                if not self.writer.is_alive():
                    return
                time.sleep(0.005)
                continue
            last_id, written_at = self.writer.written[newest]
            while not self.done.is_set():
                found = self.client.query(
                    self.name,
                    filter=f"id == {last_id}",
                    output_fields=["id"],
                    consistency_level=self.consistency,
                    timeout=30,
                )
                if found:
                    self.lags.append(time.perf_counter() - written_at)
                    break
                time.sleep(0.01)
            done = newest


class AckProber(threading.Thread):
    """Follows the writer's batches on the target side through the daemon: batch i is on the
    target when the task reports at least (i + 1) * batch rows written (each target write is
    acknowledged before it is counted). Polling `get` costs the target nothing, where a query
    loop on Milvus Lite scans its growing collection. Also samples the daemon's lag_seconds."""

    def __init__(self, daemon: Daemon, task_id: str, writer: Writer, poll: float) -> None:
        super().__init__(daemon=True)
        self.daemon_, self.task_id, self.writer = daemon, task_id, writer
        self.poll = poll
        self.lags: list[float] = []
        self.reported: list[float] = []
        self.state = "Running"
        self.reason = ""

    def run(self) -> None:
        i, last_sample = 0, 0.0
        while i < self.writer.count:
            task = self.daemon_.call("get", {"task_id": self.task_id}).data["task"]
            now = time.perf_counter()
            self.state, self.reason = task["state"], task["reason"]
            if self.state != "Running":
                return
            progress = task.get("progress") or {}
            rows = progress.get("rows") or 0
            if now - last_sample >= 0.5 and progress.get("lag_seconds") is not None:
                self.reported.append(float(progress["lag_seconds"]))
                last_sample = now
            while i < len(self.writer.written) and rows >= (i + 1) * self.writer.batch:
                self.lags.append(now - self.writer.written[i][1])
                i += 1
            if i >= len(self.writer.written) and not self.writer.is_alive():
                return
            time.sleep(self.poll)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# the daemon's histograms of where the lag goes, as /metrics names them
TIMINGS = {
    "cdc_read_delay_seconds": "(a) source time -> read by the channel worker",
    "cdc_tick_wait_seconds": "(b) read -> the releasing time tick read",
    "cdc_target_write_seconds": "(c) target write, per write request",
    "cdc_apply_delay_seconds": "(a+b+c) source time -> acknowledged by the target",
    # the daemon's own part, from the WAL's time of the releasing tick
    "cdc_read_wait_seconds": "ours: releasing tick in the WAL -> read by the worker",
    "cdc_decode_seconds": "ours: decode, per data event",
    "cdc_hold_seconds": "ours: releasing tick read -> its write starts",
    "cdc_position_save_seconds": "ours: acknowledged -> position saved, per write",
    "cdc_own_delay_seconds": "ours, all: releasing tick in the WAL -> position saved",
}


def daemon_timings(daemon: Daemon, task_id: str) -> dict[str, dict[str, float]]:
    """The task's lag histograms from the daemon's /metrics: count, mean and quantiles
    (interpolated in the buckets, as Prometheus's histogram_quantile does)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = daemon.get("/metrics")
    assert status == 200, body[:200]
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name not in TIMINGS:
            continue
        buckets: list[tuple[float, float]] = []
        total = count = 0.0
        for sample in family.samples:
            if sample.labels.get("task_id") != task_id:
                continue
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
        buckets.sort()
        row = {"count": count, "mean": total / count if count else 0.0}
        for q in (0.5, 0.9, 0.99):
            row[f"p{round(q * 100)}"] = _bucket_quantile(buckets, q, count)
        found[family.name] = row
    return found


def _bucket_quantile(buckets: list[tuple[float, float]], q: float, count: float) -> float:
    rank, lower, below = q * count, 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = bound, cumulative
    return lower


def run(args, work: Path, tasks: int = 1) -> dict:
    from pymilvus import MilvusClient

    result: dict = {}
    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        source = stack.enter_context(milvus_source(work / "source", etcd.endpoint, kafka.bootstrap))
        if args.target == "lite":
            lite = stack.enter_context(services.milvus_lite_server(work / "lite"))
        else:  # a second Milvus 2.3.5 standalone (its WAL in RocksMQ), as the target
            lite = stack.enter_context(
                milvus_source_rocksmq(work / "target", etcd.endpoint, root_path="target")
            )
        result["startup_s"] = time.perf_counter() - started
        clients = [MilvusClient(uri=uri, dedicated=True) for uri in (source.uri, lite.uri) * 2]
        for client in clients:
            stack.callback(client.close)
        src_write, dst_probe, src_probe, _ = clients

        name = f"lag_{uuid.uuid4().hex[:8]}"
        create_collection(src_write, name, args.shards, args.dim)
        reader = {"address": kafka.bootstrap}
        if args.fetch_wait_ms is not None:
            reader["fetchWaitMs"] = args.fetch_wait_ms
        settings = {} if args.gil_switch_ms is None else {"gilSwitchMs": args.gil_switch_ms}
        daemon = start_daemon(stack, work, etcd.endpoint, source, settings, kafka=reader)
        task_id = create_task(daemon, lite.uri, name)
        # the other tasks: an empty collection each, every task reading every channel
        others = [f"{name}_other{i}" for i in range(1, tasks)]
        for other in others:
            create_collection(src_write, other, 1, args.dim)
            create_task(daemon, lite.uri, other)
        for collection in (name, *others):
            services.wait_until(
                lambda c=collection: dst_probe.has_collection(c), 120, f"target {collection}"
            )
        result["tasks"] = tasks
        # the index (and the load) reach the target through the replicate channel
        services.wait_until(
            lambda: dst_probe.load_collection(name, timeout=10) is None, 60, "target loaded"
        )
        src_probe.load_collection(name)

        writer = Writer(src_write, name, args.rate, args.seconds, args.dim)
        target_prober = AckProber(daemon, task_id, writer, args.ack_poll_ms / 1000)
        source_prober = Prober(src_probe, name, writer, "Strong")
        probes: list[threading.Thread] = [writer, target_prober, source_prober]
        direct: TargetInserts | None = None
        if args.target_inserts_s > 0:  # a collection on the target no task replicates into
            direct_client = MilvusClient(uri=lite.uri, dedicated=True)
            stack.callback(direct_client.close)
            create_collection(direct_client, f"{name}_direct", 1, args.dim)
            direct = TargetInserts(
                direct_client, f"{name}_direct", writer, args.target_inserts_s, args.dim
            )
            probes.append(direct)
        assert daemon.process is not None
        pids = (source.pid, lite.pid, daemon.process.pid)
        if args.idle_seconds > 0:  # before the writes: what reading a quiet source costs
            time.sleep(2)
            idle_pids = (daemon.process.pid, kafka.pid)
            before = cpu_seconds(*idle_pids)
            time.sleep(args.idle_seconds)
            result["idle_cpu"] = [
                used / args.idle_seconds for used in spent(before, cpu_seconds(*idle_pids))
            ]
        before = cpu_seconds(*pids)
        for thread in probes:
            thread.start()
        writer.join()
        result["cpu"] = spent(before, cpu_seconds(*pids))
        result["load"] = " / ".join(f"{v:.1f}" for v in os.getloadavg())
        if writer.error is not None:
            raise writer.error
        target_prober.join(120)
        source_prober.done.set()
        source_prober.join(30)
        assert len(target_prober.lags) == writer.count, (
            f"the target showed {len(target_prober.lags)} of {writer.count} batches "
            f"(task {target_prober.state}: {target_prober.reason})"
        )
        total = writer.count * writer.batch
        services.wait_until(
            lambda: count(dst_probe, name) == total, 60, f"count(*) on the target reads {total}"
        )
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        assert task["state"] == "Running", task
        result["timings"] = daemon_timings(daemon, task_id)
        if direct is not None:
            direct.join(30)
            result["direct"] = direct.times
        result.update(
            batch=writer.batch,
            batches=writer.count,
            late=writer.late,
            write_s=writer.written[-1][1] - writer.written[0][1] if writer.written else 0.0,
            target=target_prober.lags,
            source=source_prober.lags,
            reported=target_prober.reported,
            rows=task["progress"]["rows"],
        )
    return result


def _options(args) -> str:
    text = "" if args.fetch_wait_ms == 5 else f" --fetch-wait-ms {args.fetch_wait_ms}"
    if args.gil_switch_ms is not None:
        text += f" --gil-switch-ms {args.gil_switch_ms:g}"
    if args.target_inserts_s:
        text += f" --target-inserts-s {args.target_inserts_s:g}"
    if args.idle_seconds != 10:
        text += f" --idle-seconds {args.idle_seconds:g}"
    return text if args.ack_poll_ms == 25 else f"{text} --ack-poll-ms {args.ack_poll_ms:g}"


def report(args, r: dict, total_s: float) -> str:
    def row(label: str, values: list[float], ratio_to: list[float] | None) -> str:
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        ratio = (
            f"{p50 / statistics.median(ratio_to):.1f} / {p99 / percentile(ratio_to, 0.99):.1f}"
            if ratio_to
            else "1.0 / 1.0"
        )
        return (
            f"| {label} | {len(values)} | {p50:.3f} | {percentile(values, 0.9):.3f} "
            f"| {p99:.3f} | {max(values):.3f} | {ratio} |"
        )

    achieved = r["batches"] * r["batch"] / r["write_s"] if r["write_s"] else 0.0
    lines = [
        "# Replication lag under a steady write load",
        "",
        f"Command: `python bench/lag.py --rate {args.rate} --seconds {args.seconds:g} "
        f"--shards {args.shards} --dim {args.dim} --target {args.target}{_options(args)}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores; whole script {total_s:.0f} s; services up in "
        f"{r['startup_s']:.0f} s; load average {r['load']}",
        "",
        f"Source: Milvus 2.3.5 on the librdkafka mock, the collection in {args.shards} shard(s) "
        "(pchannels; the mock keeps only about 5 MB per partition: a reader further behind "
        "than that loses records to the mock's purge, so the vectors are kept small; the "
        f"daemon's fetch wait {args.fetch_wait_ms} ms, which the mock holds every empty fetch "
        "for, where a broker answers as a record arrives); target: "
        f"{'Milvus Lite' if args.target == 'lite' else 'a second Milvus 2.3.5 standalone'}; "
        "daemon on SQLite; "
        f"all on this machine. The writer inserted {r['batches']} batches of {r['batch']} rows "
        f"(int64 pk + {args.dim}-dim float vector) every {PERIOD:g} s: {achieved:,.0f} rows/s "
        f"achieved ({r['late']} batches started late because the previous write had not "
        "returned). Lags in seconds, per batch, from the source write returning:",
        "",
        "| measure | n | p50 | p90 | p99 | max | ratio to baseline p50 / p99 |",
        "|---|---|---|---|---|---|---|",
        row("baseline: seen on the source (Strong)", r["source"], None),
        row("replication: written to the target", r["target"], r["source"]),
        row("daemon's lag_seconds (get, every 0.5 s)", r["reported"], None).replace(
            "| 1.0 / 1.0 |", "| n/a |"
        ),
        "",
        f"Every batch reached the target; daemon progress at the end: {r['rows']:,} rows. CPU "
        "seconds while the writer ran (source Milvus / target / daemon): "
        + " / ".join(f"{v:.1f}" for v in r["cpu"])
        + f" over {r['write_s']:.0f} s on {len(os.sched_getaffinity(0))} cores."
        + (
            f" Before the writes, idle for {args.idle_seconds:g} s: daemon "
            f"{r['idle_cpu'][0]:.3f}, Kafka mock {r['idle_cpu'][1]:.3f} CPU-s per second."
            if "idle_cpu" in r
            else ""
        ),
        "",
        "Inside the daemon, the loaded task's histograms from /metrics (seconds; quantiles "
        "interpolated in the buckets, so to about a bucket's width: 5-10 ms up to 0.06 s, "
        "15-25 ms up to 0.1 s, 50 ms up to 0.5 s, then 0.1-0.25 s up to 1 s):",
        "",
        "| phase | n | mean | p50 | p90 | p99 |",
        "|---|---|---|---|---|---|",
        *(
            f"| {label} | {t['count']:.0f} | {t['mean']:.3f} | {t['p50']:.3f} | {t['p90']:.3f} "
            f"| {t['p99']:.3f} |"
            for name, label in TIMINGS.items()
            if (t := r["timings"].get(name)) is not None
        ),
        *(
            [
                "",
                f"Baseline of the target write, same run: {len(r['direct'])} inserts of "
                f"{r['batch']} rows straight into the target (a collection of their own, every "
                f"{args.target_inserts_s:g} s), seconds from the call to its return: mean "
                f"{statistics.mean(r['direct']):.3f}, p50 {statistics.median(r['direct']):.3f}, "
                f"p90 {percentile(r['direct'], 0.9):.3f}, p99 {percentile(r['direct'], 0.99):.3f},"
                f" max {max(r['direct']):.3f}.",
            ]
            if r.get("direct")
            else []
        ),
        "",
        "Aim: p99 replication lag under 1 s at 5,000 rows/s.",
    ]
    return "\n".join(lines) + "\n"


def by_task_count(args, results: list[dict], texts: list[str]) -> str:
    """The runs side by side (replication lag of the loaded task, against the first run), then
    each run's own report."""
    first = results[0]["target"]
    lines = [
        "# Replication lag with several tasks sharing the source's readers",
        "",
        f"Command: `python bench/lag.py --rate {args.rate} --seconds {args.seconds:g} "
        f"--shards {args.shards} --dim {args.dim} --target {args.target} --tasks {args.tasks}"
        f"{_options(args)}`",
        "",
        "Each task count is a run of its own on fresh services (below). The first task "
        "replicates the loaded collection; each other task an empty collection of its own, "
        "reading every source channel like the first (shared readers). Replication lag of the "
        "loaded task, seconds per batch:",
        "",
        "| tasks | batches | p50 | p90 | p99 | max | p99 ratio to the first run | source "
        "baseline p99 (same run) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lags = r["target"]
        lines.append(
            f"| {r['tasks']} | {len(lags)} | {statistics.median(lags):.3f} "
            f"| {percentile(lags, 0.9):.3f} | {percentile(lags, 0.99):.3f} | {max(lags):.3f} "
            f"| {percentile(lags, 0.99) / percentile(first, 0.99):.2f} "
            f"| {percentile(r['source'], 0.99):.3f} |"
        )
    body = "\n".join(
        t.replace("# Replication lag under a steady write load", f"## {r['tasks']} task(s)")
        for t, r in zip(texts, results, strict=True)
    )
    return "\n".join(lines) + "\n\n" + body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=5000, help="rows per second")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="the collection's shards (pchannels): the Kafka mock keeps ~5 MB per partition",
    )
    parser.add_argument(
        "--target",
        choices=("lite", "milvus"),
        default="lite",
        help="Milvus Lite, or a second Milvus 2.3.5 standalone",
    )
    parser.add_argument(
        "--dim",
        type=int,
        default=32,
        help="vector size; 32 keeps one shard at ~0.8 MB/s, 6 s of the mock's ~5 MB",
    )
    parser.add_argument(
        "--tasks",
        default="1",
        help="task counts to measure one after the other (e.g. 1,10): the first replicates "
        "the load, the others an empty collection each",
    )
    parser.add_argument(
        "--ack-poll-ms",
        type=float,
        default=25,
        help="how often the target side's prober asks the daemon for its progress",
    )
    parser.add_argument(
        "--fetch-wait-ms",
        type=int,
        default=5,
        help="the daemon's sourceConfig.kafka.fetchWaitMs (default 5; the daemon's own is 500). "
        "A Kafka broker answers a waiting fetch as soon as a record arrives; the librdkafka "
        "mock holds every empty fetch for the whole wait (bench/fetch_hold.py), so the bench "
        "models a broker with a short wait: at 5 ms the mock adds at most 5 ms to a read "
        "(3 ms on average) for about 0.03 of a core of empty fetches (daemon and mock, idle)",
    )
    parser.add_argument(
        "--gil-switch-ms",
        type=float,
        default=None,
        help="the daemon's gilSwitchMs (default: the daemon's own)",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10,
        help="before the writes, the daemon's and the mock's CPU while the tasks read a quiet "
        "source, over this long (0: not measured)",
    )
    parser.add_argument(
        "--target-inserts-s",
        type=float,
        default=0,
        help="a baseline for the daemon's target write: every this many seconds, a batch of "
        "the writer's size inserted straight into the target and timed (0: none)",
    )
    parser.add_argument("--out", default=str(REPO / "bench/results/lag.md"))
    args = parser.parse_args()
    counts = [int(n) for n in str(args.tasks).split(",")]
    texts, results = [], []
    for tasks in counts:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
            result = run(args, Path(tmp), tasks)
        results.append(result)
        texts.append(report(args, result, time.perf_counter() - started))
    text = texts[0] if len(texts) == 1 else by_task_count(args, results, texts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
