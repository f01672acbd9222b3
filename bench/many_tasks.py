"""Benchmark: many tasks on one source, with the daemon's shared channel readers and with a reader
per task (``sourceConfig.sharedReaders: false``, the daemon before issue 17), in one run.

A real Milvus 2.3.5 source on the librdkafka mock cluster (16 DML channels, metadata in etcd), a
Milvus Lite target per measured configuration, the daemon on SQLite.

- The source holds N collections; a writer inserts ``--rate`` rows/s (int64 pk + 128-dim float
  vector, a batch every 0.1 s) into the first one for the whole run: one steady load.
- For each mode (shared, own) and each task count N (``--tasks``): a fresh daemon and target;
  N tasks, task i selecting collection i (task 0 replicates the load; the others read every
  channel too, and find nothing of theirs there). Once every task is Running and task 0 applies
  the load, the daemon is measured over ``--seconds``: its CPU-seconds, peak and median RSS
  (sampled every 0.1 s), its threads; and the rows task 0 applied meanwhile (it must keep up).
- Reading cost = daemon CPU-seconds over the window / those of one task in the same mode. The
  1-task run of the shared mode is the baseline for every ratio in the table.

    python bench/many_tasks.py [--tasks 1,10,50] [--modes shared,own] [--rate 2000]
                               [--seconds 40] [--out FILE.md]

``--tasks 0,1,100`` adds the daemon with no task as the memory baseline of the same run: the
table then shows each row's peak RSS over it, and per task beyond the fewest tasks measured.

Aims (issue 17): reading cost for 50 tasks at most 3x that of one task; RSS at most 500 MB for
50 tasks.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import RssSampler, cpu_seconds, memory_kb  # noqa: E402
from harness import services  # noqa: E402
from harness.daemon import Daemon  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import milvus_source  # noqa: E402
from replication_throughput import DIM, create_collection  # noqa: E402

PERIOD = 0.1


class SteadyLoad(threading.Thread):
    """``rate`` rows/s into one collection, a batch every 0.1 s, until stopped."""

    def __init__(self, uri: str, name: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.uri, self.name = uri, name
        self.batch = max(1, int(rate * PERIOD))
        self.rows = 0
        self.late = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from pymilvus import MilvusClient

        client = MilvusClient(uri=self.uri, dedicated=True)
        rng = np.random.default_rng(5)
        start, i = time.perf_counter(), 0
        try:
            while not self.stop.is_set():
                due = start + i * PERIOD
                if (wait := due - time.perf_counter()) > 0:
                    self.stop.wait(wait)
                else:
                    self.late += 1
                vectors = rng.random((self.batch, DIM), dtype=np.float32)
                rows = [{"id": self.rows + j, "vec": vectors[j]} for j in range(self.batch)]
                client.insert(self.name, rows)
                self.rows += self.batch
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc
        finally:
            client.close()


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def task_rows(daemon: Daemon, task_id: str) -> int:
    task = daemon.call("get", {"task_id": task_id}).data["task"]
    if task["state"] != "Running":
        raise AssertionError(f"task {task_id} {task['state']}: {task['reason']}")
    return int((task.get("progress") or {}).get("rows") or 0)


def readers(daemon: Daemon, task_ids: list[str]) -> dict[str, int]:
    """How many DML channels of the tasks read a shared reader or one of their own."""
    seen = {"shared": 0, "own": 0}
    for task in daemon.call("list").data["tasks"]:
        if str(task["task_id"]) not in task_ids:
            continue
        for channel in (task.get("progress") or {}).get("channels") or []:
            if "-rootcoord-dml_" in channel["channel"] and channel.get("reader") in seen:
                seen[channel["reader"]] += 1
    return seen


def reading(daemon: Daemon, task_ids: list[str]) -> tuple[int, ...]:
    """How many DML channels each task reads (shows in its progress), in task order."""
    found = dict.fromkeys(task_ids, 0)
    for task in daemon.call("list").data["tasks"]:
        if str(task["task_id"]) in found:
            channels = (task.get("progress") or {}).get("channels") or []
            found[str(task["task_id"])] = sum("-rootcoord-dml_" in c["channel"] for c in channels)
    return tuple(found.values())


def measure(args, work: Path, etcd, kafka, source, names: list[str], mode: str, n: int) -> dict:
    with contextlib.ExitStack() as stack:
        lite = stack.enter_context(services.milvus_lite_server(work / "lite"))
        daemon = Daemon(
            workdir=work / "daemon",
            config={
                "metaStoreConfig": {"storeType": "sqlite", "sqlitePath": str(work / "meta.db")},
                "drainTimeoutSeconds": 5,
                "maxTaskNum": max(100, n),
                "sourceConfig": {
                    "etcd": {"address": [etcd.endpoint]},
                    "etcdRootPath": source.etcd_root_path,
                    "channelPrefix": source.chan_prefix,
                    "mqType": "kafka",
                    "kafka": {"address": kafka.bootstrap},
                    "sharedReaders": mode == "shared",
                },
            },
        )
        (work / "daemon").mkdir(parents=True)
        daemon.start()
        stack.callback(daemon.stop)
        assert daemon.process is not None
        pid = daemon.process.pid
        time.sleep(2)
        idle_rss = memory_kb(pid)["VmRSS"] / 1024
        sampler = RssSampler(pid)
        sampler.start()
        t0 = time.perf_counter()
        task_ids = []
        for name in names[:n]:
            created = daemon.call(
                "create",
                {"milvus_connect_param": {"uri": lite.uri}, "collection_infos": [{"name": name}]},
            )
            assert created.code == 200, created.body
            task_ids.append(str(created.data["task_id"]))
        created_s = time.perf_counter() - t0
        # every task reads (a position on every channel) before the load starts: the mock
        # cluster keeps only a few MB per partition, a start behind that would be lost
        seen: list[tuple[int, ...]] = []

        def all_reading() -> bool:
            counts = reading(daemon, task_ids)
            seen.append(counts)
            # every task reads as many channels as the others (the source ticks those that
            # hold collections), and that stays so for two polls
            return len(seen) > 1 and seen[-2] == counts and min(counts) == max(counts) > 0

        if task_ids:
            services.wait_until(all_reading, 600, "every task reading every channel", interval=1)
        started_s = time.perf_counter() - t0
        load = SteadyLoad(source.uri, names[0], args.rate)
        load.start()
        stack.callback(load.join, 30)
        stack.callback(load.stop.set)
        if task_ids:  # task 0 applies the load: its rows grow (every task is Running, or raises)
            first = task_rows(daemon, task_ids[0])
            services.wait_until(
                lambda: task_rows(daemon, task_ids[0]) > first + 10 * args.rate,
                300,
                "task 0 applies",
            )
        for task_id in task_ids:
            task_rows(daemon, task_id)
        time.sleep(3)
        rows_before = task_rows(daemon, task_ids[0]) if task_ids else 0
        sampler.samples.clear()
        (cpu_before,) = cpu_seconds(pid)
        started = time.perf_counter()
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            out = args.profile / f"{mode}-{n}.txt"
            subprocess.run(
                ["py-spy", "record", "--nonblocking", "-p", str(pid), "-d", str(int(args.seconds)),
                 "-r", "10",
                 "-f", "raw", "-o", str(out)],
                check=True, capture_output=True,
            )  # fmt: skip
        else:
            time.sleep(args.seconds)
        (cpu_after,) = cpu_seconds(pid)
        window = time.perf_counter() - started
        rows_after = task_rows(daemon, task_ids[0]) if task_ids else 0
        sampler.stop.set()
        sampler.join()
        if load.error is not None:
            raise load.error
        result = {
            "mode": mode,
            "tasks": n,
            "create_s": created_s,
            "started_s": started_s,
            "load_rows": load.rows,
            "load_late": load.late,
            "cpu_s": cpu_after - cpu_before,
            "window_s": window,
            "applied_rows_s": (rows_after - rows_before) / window,
            "idle_rss_mb": idle_rss,
            "rss_peak_mb": max(sampler.samples) / 1024,
            "rss_median_mb": statistics.median(sampler.samples) / 1024,
            "threads": threads_of(pid),
            "readers": readers(daemon, task_ids),
        }
        print(result, flush=True)
        return result


def run(args) -> tuple[list[dict], dict]:
    from pymilvus import MilvusClient

    counts = counts_of(args)
    modes = args.modes.split(",")
    info: dict = {}
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        started = time.perf_counter()
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        source = stack.enter_context(
            milvus_source(work / "source", etcd.endpoint, kafka.bootstrap, root_path="bench")
        )
        info["startup_s"] = time.perf_counter() - started
        src = MilvusClient(uri=source.uri, dedicated=True)
        stack.callback(src.close)
        run_id = uuid.uuid4().hex[:6]
        names = [f"mt_{run_id}_{i:02d}" for i in range(max(counts))]
        t0 = time.perf_counter()
        for i, name in enumerate(names):
            # the loaded collection on 4 shards: its writes spread over 4 partitions of the mock,
            # which keeps a few MB each
            create_collection(src, name, 4 if i == 0 else 1)
        info["collections_s"] = time.perf_counter() - t0
        for mode in modes:
            for n in counts:
                if mode == "own" and n > args.own_max:
                    results.append(
                        {"mode": mode, "tasks": n, "failed": f"not run (--own-max {args.own_max})"}
                    )
                    continue
                try:
                    results.append(
                        measure(args, work / f"{mode}-{n}", etcd, kafka, source, names, mode, n)
                    )
                except (AssertionError, services.ServiceStartError) as exc:
                    # a configuration the daemon cannot carry here is a result too
                    print(f"{mode} {n}: failed: {exc}", flush=True)
                    results.append({"mode": mode, "tasks": n, "failed": str(exc)[:300]})
        info["total_s"] = time.perf_counter() - started
    return results, info


def report(args, results: list[dict], info: dict) -> str:
    measured = [r for r in results if "failed" not in r]
    first_mode = results[0]["mode"]
    base = min(
        (r for r in results if r["mode"] == first_mode and r["tasks"] > 0),
        key=lambda r: r["tasks"],
    )
    assert "failed" not in base, base
    # the memory baselines of the same run: the daemon with no task, and with the fewest tasks
    empty = next((r for r in measured if r["mode"] == first_mode and r["tasks"] == 0), None)
    lines = [
        "# Many tasks on one source: shared channel readers",
        "",
        f"Command: `python bench/many_tasks.py --tasks {args.tasks} --modes {args.modes} "
        f"--rate {args.rate} --seconds {args.seconds:g}"
        + (f" --own-max {args.own_max}`" if args.own_max < max(counts_of(args)) else "`"),
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, Python "
        f"{platform.python_version()}, {platform.machine()}, 2 cores; whole script "
        f"{info['total_s']:.0f} s",
        "",
        f"Source: Milvus 2.3.5 standalone, WAL on the librdkafka mock cluster (16 DML channels), "
        f"{args.rate:,} rows/s (int64 pk + {DIM}-dim float vector) inserted into one collection "
        "(4 shards) once every task reads, until the row's measure ends. "
        "Task i selects collection i; task 0's collection takes the load, the others' are empty "
        "(every task still reads every channel). Target: a fresh Milvus Lite per row of the "
        "table. Each row is measured over a window once task 0 applies the load (0 tasks: the "
        "same daemon with no task, the load running on the source, nothing reading it).",
        "",
        "| readers | tasks | all reading after s | daemon CPU s | CPU ratio to the baseline | "
        "task 0 rows/s applied | RSS median MB | RSS peak MB | peak over 0 tasks MB | "
        f"MB per task beyond {base['tasks']} | idle RSS MB | threads | "
        "channels on shared / own |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['mode']} | {r['tasks']} | failed: {r['failed']} |||||||||||")
            continue
        ratio = (r["cpu_s"] / r["window_s"]) / (base["cpu_s"] / base["window_s"])
        over_empty = (
            f"{r['rss_peak_mb'] - empty['rss_peak_mb']:+.0f}"
            if empty is not None and r["mode"] == empty["mode"]
            else "n/a"
        )
        per_task = (
            f"{(r['rss_peak_mb'] - base['rss_peak_mb']) / (r['tasks'] - base['tasks']):.2f}"
            if r["tasks"] > base["tasks"] and r["mode"] == base["mode"]
            else "n/a"
        )
        lines.append(
            f"| {r['mode']} | {r['tasks']} | {r['started_s']:.0f} | "
            f"{r['cpu_s']:.1f} in {r['window_s']:.0f} s | "
            f"{ratio:.2f} | {r['applied_rows_s']:,.0f} | {r['rss_median_mb']:.0f} | "
            f"{r['rss_peak_mb']:.0f} | {over_empty} | {per_task} | {r['idle_rss_mb']:.0f} | "
            f"{r['threads']} | {r['readers']['shared']} / {r['readers']['own']} |"
        )
    lines += [
        "",
        f"Baseline: the {base['mode']} run with {base['tasks']} task(s): the CPU ratio, and MB "
        "per task = (peak RSS - its peak RSS) / (tasks - its tasks). Aims (issue 17): reading "
        "cost (CPU) for 50 tasks at most 3x that of one task; RSS at most 500 MB for 50 tasks.",
    ]
    return "\n".join(lines) + "\n"


def counts_of(args) -> list[int]:
    return [int(x) for x in args.tasks.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="1,10,50")
    parser.add_argument("--modes", default="shared,own")
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--own-max",
        type=int,
        default=50,
        help="measure own readers only up to this many tasks (50 of them exhaust the threads "
        "of this machine; see bench/results/many_tasks.md)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a directory: py-spy samples the daemon during each measure (raw folded stacks, "
        "--nonblocking); the sampler takes a core of its own and misses most samples of a "
        "daemon with hundreds of threads: good for 1 or 10 tasks, and the CPU figures of "
        "such a run are not to be compared",
    )
    args = parser.parse_args()
    results, info = run(args)
    text = report(args, results, info)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
