"""Benchmark: how long pause, resume, delete and SIGTERM take when the source hangs (its etcd and
Kafka behind a listener that accepts and never answers, so each task's runner is stuck in a
blocking call), against the same requests with a healthy source (the baseline, same run).

    python bench/control_latency.py [--tasks 5] [--cycles 10] [--out FILE.md]

Starts its own etcd, Kafka mock cluster and Milvus Lite (the target) on free loopback ports and
real daemons sharing one SQLite store: tasks are created on a healthy source, then the daemon is
started again on the healthy or the hung source and timed. The issue's bound is 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness import services  # noqa: E402
from harness.blackhole import BlackHole  # noqa: E402
from harness.daemon import Daemon  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402


def source(etcd: str, kafka: str) -> dict:
    return {
        "etcd": {"address": [etcd]},
        "etcdRootPath": "no-source",
        "kafka": {"address": kafka},
        "dmlChannelNum": 2,
    }


def timed(call) -> float:
    started = time.perf_counter()
    reply = call()
    took = time.perf_counter() - started
    assert reply.code == 200, reply.body
    return took


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(workdir: Path, config: dict, task_ids: list[str], cycles: int) -> dict[str, list]:
    daemon = Daemon(workdir=workdir, config=config).start()
    time.sleep(2)  # every runner inside its first source call
    times: dict[str, list] = {"pause": [], "resume": [], "delete": [], "sigterm": []}
    for _ in range(cycles):
        for task_id in task_ids:
            times["pause"].append(timed(lambda t=task_id: daemon.call("pause", {"task_id": t})))
        for task_id in task_ids:
            times["resume"].append(timed(lambda t=task_id: daemon.call("resume", {"task_id": t})))
        time.sleep(1)
    assert daemon.process is not None
    started = time.perf_counter()
    os.kill(daemon.process.pid, signal.SIGTERM)
    daemon.process.wait(timeout=60)
    times["sigterm"].append(time.perf_counter() - started)
    daemon = Daemon(workdir=workdir, config=config).start()
    time.sleep(2)
    for task_id in task_ids:
        times["delete"].append(timed(lambda t=task_id: daemon.call("delete", {"task_id": t})))
    daemon.stop()
    return times


def create_tasks(workdir: Path, config: dict, target: str, count: int) -> list[str]:
    daemon = Daemon(workdir=workdir, config=config).start()
    ids = []
    for i in range(count):
        reply = daemon.call(
            "create",
            {
                "milvus_connect_param": {"uri": target},
                "collection_infos": [{"name": f"c{i}"}],
            },
        )
        assert reply.code == 200, reply.body
        ids.append(str(reply.data["task_id"]))
    daemon.stop()
    return ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "control_latency.md"))
    args = parser.parse_args()
    began = time.perf_counter()
    results: dict[str, dict[str, list]] = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-ctl-")))
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        lite = stack.enter_context(services.milvus_lite_server(work / "lite"))
        hole = stack.enter_context(BlackHole())
        for name, (etcd_at, kafka_at) in {
            "healthy source": (etcd.endpoint, kafka.bootstrap),
            "hung source": (hole.endpoint, hole.endpoint),
        }.items():
            workdir = work / name.replace(" ", "-")
            workdir.mkdir()
            store = {"storeType": "sqlite", "sqlitePath": str(workdir / "meta.db")}
            healthy = {
                "metaStoreConfig": store,
                "sourceConfig": source(etcd.endpoint, kafka.bootstrap),
                "drainTimeoutSeconds": 30,
            }
            ids = create_tasks(workdir, healthy, lite.uri, args.tasks)
            config = {**healthy, "sourceConfig": source(etcd_at, kafka_at)}
            results[name] = measure(workdir, config, ids, args.cycles)
            print(name, {k: round(max(v), 3) for k, v in results[name].items()}, flush=True)
    lines = [
        "# Control requests while the source hangs",
        "",
        f"`python bench/control_latency.py --tasks {args.tasks} --cycles {args.cycles}` on this "
        f"machine ({os.cpu_count()} cores, {platform.python_version()}), "
        f"{time.strftime('%Y-%m-%d')}. {args.tasks} Running tasks on one daemon (SQLite); the "
        "hung source is a listener that accepts connections and never answers (etcd and "
        "Kafka), so every runner is inside a blocking call; the healthy source is a real etcd "
        "and Kafka mock cluster (the baseline). Seconds, per request as the client sees it; "
        "SIGTERM: from the signal to the process's exit, with every task Running.",
        "",
        "| request | source | n | p50 | p99 | max | p50 ratio to healthy |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in ("pause", "resume", "delete", "sigterm"):
        base = statistics.median(results["healthy source"][kind])
        for name, times in results.items():
            values = times[kind]
            p50 = statistics.median(values)
            lines.append(
                f"| {kind} | {name} | {len(values)} | {p50:.3f} | {percentile(values, 0.99):.3f} "
                f"| {max(values):.3f} | {p50 / base:.2f} |"
            )
    lines += ["", f"The whole benchmark took {time.perf_counter() - began:.0f} s.", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
