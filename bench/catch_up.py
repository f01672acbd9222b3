"""Benchmark: catching up a backlog, end to end, against writing the same rows straight into the
target, in one run.

A real Milvus 2.3.5 source with its WAL in RocksMQ (which keeps a backlog of any size, unlike the
librdkafka mock's ~5 MB per partition), a Milvus Lite target, the daemon on SQLite.

1. Backlog: R rows (int64 pk + 128-dim float vector) written into the source with pymilvus
   MilvusClient.insert in batches of B while no task exists; then the source is flushed and left
   until it is quiet (its own segment work would otherwise compete for the cores with what is
   measured next).
2. Direct (baseline): the same R rows written the same way straight into Milvus Lite, until its
   count(*) reads R.
3. Replicated: the daemon starts (its idle RSS is noted), a task is created, and the time until
   the target's count(*) reads R is the catch-up time (count(*) is asked once the daemon reports
   R rows written: asked all along, it makes Milvus Lite scan the growing collection). The
   daemon's RSS is sampled every 0.1 s; its peak is the kernel's VmHWM at the end. count(*) must
   reach exactly R (more fails: a row doubled), and a sample of rows is compared value by value
   with the source.
CPU seconds of the source, the target and the daemon are noted for both timed phases.

    python bench/catch_up.py [--rows 1000000] [--batch 5000] [--target lite|milvus]
                             [--shards 1] [--roll-source-wal] [--out FILE.md]

``--target milvus``: the target is a second Milvus 2.3.5 standalone instead of Milvus Lite (the
baseline then writes into it too), the collections with ``--shards`` shards on both sides. The
daemon's CPU-seconds per GB of WAL are reported as well (issue 17: at most half of 31 s/GB).

Aims (issue 3): replicated rows/s >= 0.9 of direct; peak RSS < 500 MB while catching up a
1,000,000-row backlog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from harness import services  # noqa: E402
from harness.daemon import Daemon  # noqa: E402
from harness.milvus_source import milvus_source_rocksmq  # noqa: E402
from harness.process_tree import descendants  # noqa: E402
from replication_throughput import (  # noqa: E402
    DIM,
    create_collection,
    create_task,
    start_daemon,
    wait_count,
)

MB = 1024 * 1024


def batches(rows: int, batch: int) -> Iterator[list[dict]]:
    """The same rows on every call (seeded), made one batch at a time."""
    rng = np.random.default_rng(7)
    for lo in range(0, rows, batch):
        n = min(batch, rows - lo)
        vectors = rng.random((n, DIM), dtype=np.float32)
        yield [{"id": lo + i, "vec": vectors[i]} for i in range(n)]


def write(client, name: str, rows: int, batch: int) -> float:
    started = time.perf_counter()
    for chunk in batches(rows, batch):
        client.insert(name, chunk)
    return time.perf_counter() - started


def wal_files(rocksmq: Path) -> dict[str, int]:
    """The source RocksDB's WAL files (``*.log``) and their sizes: what its memtables hold and
    its table files do not yet. A RocksDB secondary replays them into memtables of its own when
    it opens, so the daemon holds about that much whatever its backlog (at most the source's
    write buffers)."""
    return {f.name: f.stat().st_size for f in rocksmq.glob("*.log")}


def roll_source_wal(client, rocksmq: Path, batch: int, limit_mb: float = 512) -> float:
    """Write rows into a collection of their own (no task selects it) until the source's
    RocksDB starts a new WAL file and drops the ones it had: their memtables are then in table
    files, and the WAL tail a reader replays is nearly empty, whatever the backlog left in it.
    The MB written."""
    old = set(wal_files(rocksmq))
    name = f"filler_{uuid.uuid4().hex[:8]}"
    create_collection(client, name)
    chunk = next(batches(batch, batch))
    written = 0.0
    while not wal_files(rocksmq).keys() - old:
        if written > limit_mb:
            raise RuntimeError(f"the source's WAL did not roll over after {written:.0f} MB")
        client.insert(name, chunk)
        written += batch * (DIM * 4 + 8) / MB
    deadline = time.monotonic() + 60
    while old & wal_files(rocksmq).keys():
        if time.monotonic() > deadline:
            raise RuntimeError("the source kept its old WAL files 60 s after a new one began")
        time.sleep(0.5)
    return written


def memory_kb(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def cpu_seconds(*pids: int) -> list[float]:
    """User + system CPU seconds of each process (and its reaped children) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    result = []
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        result.append(sum(int(v) for v in fields[11:15]) / tick)
    return result


def tree_cpu(pid: int) -> float:
    """CPU-seconds of ``pid``, its reaped children and its descendants alive now."""
    total = 0.0
    for each in descendants(pid):
        try:
            total += cpu_seconds(each)[0]
        except OSError:  # ended meanwhile (then reaped: counted in the parent's)
            continue
    return total


def spent(before: list[float], after: list[float]) -> list[float]:
    return [b - a for a, b in zip(before, after, strict=False)]


def settle(pid: int, quiet: float = 0.15, window: float = 5.0, limit: float = 180.0) -> float:
    """Wait until the process uses under `quiet` of a core over `window` seconds; the wait."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        (before,) = cpu_seconds(pid)
        time.sleep(window)
        (after,) = cpu_seconds(pid)
        if (after - before) / window < quiet:
            break
    return time.perf_counter() - started


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, KeyError):
                self.samples.append(memory_kb(self.pid)["VmRSS"])
            self.stop.wait(self.interval)


def tree_memory_kb(pid: int) -> tuple[int, int]:
    """Resident and proportional (PSS: a page shared by N processes counts 1/N in each) kB of
    ``pid`` and its descendants alive now (a daemon's channel group processes)."""
    rss = pss = 0
    for each in descendants(pid):
        with contextlib.suppress(OSError):  # ended meanwhile
            for line in Path(f"/proc/{each}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "Rss":
                    rss += int(value.split()[0])
                elif key == "Pss":
                    pss += int(value.split()[0])
    return rss, pss


class TreeMemorySampler(RssSampler):
    """The peak of :func:`tree_memory_kb` over the samples: ``peak`` is (RSS kB, PSS kB), each
    its own maximum."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(pid, interval)
        self.peak = (0, 0)

    def run(self) -> None:
        while not self.stop.is_set():
            rss, pss = tree_memory_kb(self.pid)
            self.peak = (max(self.peak[0], rss), max(self.peak[1], pss))
            self.stop.wait(self.interval)


class HeapSampler(threading.Thread):
    """The daemon's ``cdc_heap_*`` metrics (server/runtime/heap.py) every ``interval`` s; keeps the
    scrape with the largest resident size: what the memory was made of at its peak."""

    def __init__(self, daemon: Daemon, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.target, self.interval = daemon, interval
        self.at_peak: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            with contextlib.suppress(OSError):
                status, body = self.target.get("/metrics")
                if status != 200:
                    continue
                heap = {
                    sample.name.removeprefix("cdc_heap_"): sample.value
                    for family in text_string_to_metric_families(body.decode())
                    for sample in family.samples
                    if sample.name.startswith("cdc_heap_")
                }
                if heap.get("resident_bytes", 0) > self.at_peak.get("resident_bytes", 0):
                    self.at_peak = heap


def wait_progress(daemon: Daemon, task_id: str, rows: int, timeout: float) -> None:
    """Until the task reports `rows` rows written to the target (acknowledged by it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        if task["state"] != "Running":
            raise AssertionError(f"task {task['state']}: {task['reason']}")
        if ((task.get("progress") or {}).get("rows") or 0) >= rows:
            return
        time.sleep(0.25)
    raise TimeoutError(f"the task did not report {rows} rows in {timeout:g} s")


def same_sample(src, dst, name: str, rows: int) -> int:
    """Compare 200 rows spread over the key range, value by value; how many were compared."""
    ids = sorted({int(i) for i in np.linspace(0, rows - 1, 200)})
    expr = f"id in {ids}"

    def read(client) -> dict:
        found = client.query(name, filter=expr, output_fields=["id", "vec"], timeout=60)
        return {r["id"]: [float(x) for x in r["vec"]] for r in found}

    expected, actual = read(src), read(dst)
    assert len(expected) == len(ids), "the source lost rows of the sample"
    assert actual == expected, "target rows differ from the source"
    return len(ids)


def run(args, work: Path, direct: bool = True) -> dict:
    """The phases of the module doc; ``direct=False`` leaves out the baseline (bench/backlog.py
    compares backlog sizes instead)."""
    from pymilvus import MilvusClient

    result: dict = {}
    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        source = stack.enter_context(
            milvus_source_rocksmq(work / "source", etcd.endpoint, root_path="bench")
        )
        if args.target == "lite":
            lite = stack.enter_context(services.milvus_lite_server(work / "lite"))
        else:  # a second Milvus 2.3.5 standalone (its WAL in RocksMQ), as the target
            lite = stack.enter_context(
                milvus_source_rocksmq(work / "target", etcd.endpoint, root_path="target")
            )
        result["startup_s"] = time.perf_counter() - started
        src = MilvusClient(uri=source.uri, dedicated=True)
        stack.callback(src.close)
        dst = MilvusClient(uri=lite.uri, dedicated=True)
        stack.callback(dst.close)

        name = f"backlog_{uuid.uuid4().hex[:8]}"
        create_collection(src, name, args.shards)
        result["source_write_s"] = write(src, name, args.rows, args.batch)
        result["wal_mb"] = (
            sum(f.stat().st_size for f in source.rocksmq_path.rglob("*") if f.is_file()) / MB
        )
        src.flush(name)
        if args.roll_source_wal:
            result["filler_mb"] = roll_source_wal(src, source.rocksmq_path, args.batch)
        result["settle_s"] = settle(source.pid)

        if direct:
            result.update(write_direct(args, dst, source.pid, lite.pid))

        daemon = start_daemon(
            stack,
            work,
            etcd.endpoint,
            source,
            mqType="rocksmq",
            rocksmq={"path": str(source.rocksmq_path)},
            sharedReaders=not args.own_readers,
            **({"readChanLen": args.read_chan_len} if args.read_chan_len is not None else {}),
            daemon_config={"memory": args.memory} if args.memory else None,
        )
        assert daemon.process is not None
        pid = daemon.process.pid
        time.sleep(2)
        result["idle_rss_mb"] = memory_kb(pid)["VmRSS"] / 1024
        sampler, heap = RssSampler(pid), HeapSampler(daemon)
        sampler.start()
        heap.start()
        before = cpu_seconds(source.pid, lite.pid, pid)
        result["wal_tail_mb"] = sum(wal_files(source.rocksmq_path).values()) / MB
        t0 = time.perf_counter()
        task_id = create_task(daemon, lite.uri, name)
        try:
            # the daemon's progress first (cheap), then count(*) to confirm: polling count(*)
            # all along would make Milvus Lite scan a growing collection 4 times a second
            wait_progress(daemon, task_id, args.rows, args.timeout)
            result["replicated_s"] = wait_count(dst, name, args.rows, args.timeout) - t0
        except (TimeoutError, AssertionError):
            print(daemon.call("get", {"task_id": task_id}).body, file=sys.stderr)
            print(daemon.log_text()[-3000:], file=sys.stderr)
            raise
        result["replicated_cpu"] = spent(before, cpu_seconds(source.pid, lite.pid, pid))
        for thread in (sampler, heap):
            thread.stop.set()
            thread.join()
        result["heap_at_peak"] = heap.at_peak
        result["peak_rss_mb"] = memory_kb(pid)["VmHWM"] / 1024
        result["rss_samples"] = sampler.samples
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        assert task["state"] == "Running", task
        result["progress_rows"] = task["progress"]["rows"]
        result["compared"] = same_sample(src, dst, name, args.rows)
    return result


def write_direct(args, dst, source_pid: int, target_pid: int) -> dict:
    """The baseline: the same rows written straight into the target."""
    result: dict = {}
    direct = f"direct_{uuid.uuid4().hex[:8]}"
    create_collection(dst, direct, args.shards)
    before = cpu_seconds(source_pid, target_pid)
    t0 = time.perf_counter()
    result["direct_write_s"] = write(dst, direct, args.rows, args.batch)
    result["direct_s"] = wait_count(dst, direct, args.rows, args.timeout) - t0
    result["direct_cpu"] = spent(before, cpu_seconds(source_pid, target_pid))
    dst.drop_collection(direct)
    if args.target != "lite":
        result["target_settle_s"] = settle(target_pid)
    return result


def fmt_cpu(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values) + (" / -" if len(values) == 2 else "")


def report(args, r: dict, total_s: float) -> str:
    rows = args.rows
    target = (
        "Milvus Lite"
        if args.target == "lite"
        else f"Milvus 2.3.5 standalone (WAL in RocksMQ), collection of {args.shards} shards"
    )
    short = "Milvus Lite" if args.target == "lite" else "Milvus 2.3.5"
    daemon_cpu = r["replicated_cpu"][2]
    direct_rps = rows / r["direct_s"]
    repl_rps = rows / r["replicated_s"]
    samples = sorted(r["rss_samples"])
    p50 = samples[len(samples) // 2] / 1024 if samples else 0.0
    lines = [
        "# Catching up a backlog",
        "",
        f"Command: `python bench/catch_up.py --rows {rows} --batch {args.batch} "
        f"--target {args.target} --shards {args.shards}"
        f"{' --own-readers' if args.own_readers else ''}"
        f"{' --roll-source-wal' if args.roll_source_wal else ''}"
        f"{memory_flag(args)}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores; whole script {total_s:.0f} s; services up in "
        f"{r['startup_s']:.0f} s",
        "",
        f"{rows:,} rows (int64 pk + {DIM}-dim float vector), written with MilvusClient.insert in "
        f"batches of {args.batch:,}. Source: Milvus 2.3.5 standalone, WAL in RocksMQ "
        f"({r['wal_mb']:,.0f} MB on disk after the writes). Target: {target}. Daemon: SQLite "
        "metastore. All on this one machine: the source, the target, the daemon and the writer "
        "share its cores.",
        "",
        "## End-to-end rows/s",
        "",
        "| path | what is timed | s | rows/s | ratio to direct |",
        "|---|---|---|---|---|",
        f"| direct: pymilvus -> {short} | first write until the target's count(*) reads all "
        f"| {r['direct_s']:.1f} | {direct_rps:,.0f} | 1.00 |",
        f"| replicated: source WAL -> daemon -> {short} | task create until the target's "
        f"count(*) reads all (a backlog: every row already in the WAL) | {r['replicated_s']:.1f} "
        f"| {repl_rps:,.0f} | {repl_rps / direct_rps:.2f} |",
        f"| (for scale) pymilvus -> Milvus 2.3.5 source | writes returned | "
        f"{r['source_write_s']:.1f} | {rows / r['source_write_s']:,.0f} | "
        f"{rows / r['source_write_s'] / direct_rps:.2f} |",
        "",
        f"CPU seconds during each timed phase (source Milvus / {short} target / daemon): "
        f"direct {fmt_cpu(r['direct_cpu'])}; replicated {fmt_cpu(r['replicated_cpu'])}: the "
        f"daemon spent {daemon_cpu / (r['wal_mb'] / 1024):.1f} CPU-seconds per GB of WAL. The "
        f"source was flushed and left to settle for {r['settle_s']:.0f} s after the backlog "
        "writes, before either timed phase.",
        "",
        f"The target's count(*) reached exactly {rows:,} (more would fail the run: a doubled "
        f"row); {r['compared']} rows spread over the key range were compared value by value with "
        f"the source. Daemon progress at the end: {r['progress_rows']:,} rows.",
        "",
        "## Daemon memory while catching up",
        "",
        "| measure | MB |",
        "|---|---|",
        f"| idle, before the task (baseline) | {r['idle_rss_mb']:.0f} |",
        f"| median while catching up ({len(samples)} samples, 0.1 s apart) | {p50:.0f} |",
        f"| peak (VmHWM) | {r['peak_rss_mb']:.0f} |",
        f"| peak / idle | {r['peak_rss_mb'] / r['idle_rss_mb']:.2f} |",
        "",
        "Aims: replicated rows/s >= 0.9 of direct; peak RSS < 500 MB for a 1,000,000-row backlog.",
    ]
    return "\n".join(lines) + "\n"


def write_report(out: str, text: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(text)


def add_memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory",
        type=json.loads,
        default={},
        help="the daemon's memory settings as JSON, e.g. '{\"trimSeconds\": 0}' "
        "(server/runtime/heap.py)",
    )
    parser.add_argument(
        "--read-chan-len",
        type=int,
        default=None,
        help="sourceConfig.readChanLen (the daemon's default when not given)",
    )


def memory_flag(args) -> str:
    """``--memory`` and ``--read-chan-len`` as the report's command line shows them (nothing
    when not given)."""
    flags = f" --memory '{json.dumps(args.memory)}'" if args.memory else ""
    if args.read_chan_len is not None:
        flags += f" --read-chan-len {args.read_chan_len}"
    return flags


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--target", choices=["lite", "milvus"], default="lite")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=1800)
    add_memory_argument(parser)
    parser.add_argument(
        "--own-readers",
        action="store_true",
        help="sourceConfig.sharedReaders false: the task reads with readers of its own",
    )
    parser.add_argument(
        "--roll-source-wal",
        action="store_true",
        help="before the catch-up, filler rows make the source's RocksDB start a new WAL file, "
        "so the daemon does not replay the backlog's unflushed tail (bench/backlog.py's default)",
    )
    parser.add_argument("--out", default=str(REPO / "bench/results/catch_up.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        result = run(args, Path(tmp))
    write_report(args.out, report(args, result, time.perf_counter() - started))


if __name__ == "__main__":
    main()
