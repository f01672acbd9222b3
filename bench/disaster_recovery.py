"""Benchmark: how long a switchover and a failover take, phase by phase, against what Milvus
itself takes to stop and resume writes (the fence's floor) and what a verify of the same task
takes, both measured in the same run.

Two real Milvus 2.3.5 standalones on this machine: ``a`` (WAL on the librdkafka mock) and ``b``
(RocksMQ), metadata in one etcd under two roots; one daemon on SQLite with both as named
clusters. A collection of ``--rows`` rows (int64 key, 8-dim vector) replicated a -> b; a writer
inserts ``--rate`` rows/s into the primary throughout. Per round:

- baseline 1, Milvus's own fence: ``forceDeny`` written into b's etcd (b takes no writes) until a
  probe write is refused, then deleted until one is accepted;
- baseline 2, a verify of the task (``POST verify``) to its end;
- a switchover a -> b under the writer (phases from the job's steps), then one b -> a (the
  original task started again) with the writer moved to b; the writer's refused window (first
  to last refused write) is what its clients saw.

Then a failover under the writer: the time to its answer, and the records exported.

    python bench/disaster_recovery.py [--rows 20000] [--rate 500] [--rounds 3] [--out FILE.md]
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
from datetime import datetime
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from harness import services  # noqa: E402
from harness.daemon import Daemon  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import milvus_source, milvus_source_rocksmq  # noqa: E402
from replication_throughput import count, create_collection  # noqa: E402

DIM = 8
PHASES = ("fencing", "draining", "verifying", "reversing")


class Writer(threading.Thread):
    """Inserts ``rate`` rows/s in batches every 0.1 s into ``uri``; notes refused writes."""

    def __init__(self, uri: str, name: str, rate: int, first: int) -> None:
        super().__init__(daemon=True)
        from pymilvus import MilvusClient

        self.client = MilvusClient(uri=uri, dedicated=True)
        self.name, self.batch, self.next = name, max(1, rate // 10), first
        self.refused: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from pymilvus.exceptions import MilvusException

        rng = np.random.default_rng(5)
        while not self.stop.is_set():
            keys = range(self.next, self.next + self.batch)
            rows = [
                {"id": k, "vec": v}
                for k, v in zip(keys, rng.random((self.batch, DIM)), strict=True)
            ]
            try:
                self.client.insert(self.name, rows)
                self.next += self.batch
            except MilvusException:
                self.refused.append(time.time())
            time.sleep(0.1)
        self.client.close()


def seconds_between(steps: list[dict], first: str, then: str) -> float:
    at = {s["state"]: datetime.fromisoformat(s["at"].replace("Z", "+00:00")) for s in steps}
    return (at[then] - at[first]).total_seconds()


def wait_job(daemon: Daemon, task_id: str, key: str, done: tuple[str, ...], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        job = (task.get("progress") or {}).get(key) or {}
        if job.get("state") in done:
            return job
        time.sleep(0.1)
    raise TimeoutError(f"{key} of {task_id} did not end in {timeout} s")


def consistent(daemon: Daemon, task_id: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        if (task.get("progress") or {}).get("consistent_up_to"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"consistent_up_to of {task_id}")


def raw_fence(etcd_endpoint: str, root: str, uri: str, name: str) -> tuple[float, float]:
    """Milvus's own times: forceDeny written -> a write refused, deleted -> a write accepted."""
    import etcd3
    from pymilvus import MilvusClient
    from pymilvus.exceptions import MilvusException

    host, port = etcd_endpoint.rsplit(":", 1)
    kv = etcd3.client(host=host.split("//")[-1], port=int(port))
    client = MilvusClient(uri=uri, dedicated=True)
    key = f"{root}/config/quotaAndLimits/limitWriting/forceDeny"

    def refused() -> bool:
        try:
            client.delete(name, filter="id > 1 and id < 0")
            return False
        except MilvusException:
            return True

    try:
        start = time.perf_counter()
        kv.put(key, "true")
        while not refused():
            time.sleep(0.05)
        fence = time.perf_counter() - start
        start = time.perf_counter()
        kv.delete(key)
        while refused():
            time.sleep(0.05)
        return fence, time.perf_counter() - start
    finally:
        kv.delete(key)
        kv.close()
        client.close()


def run(args, work: Path) -> dict:
    from pymilvus import MilvusClient

    result: dict = {"raw_fence": [], "raw_lift": [], "verify": [], "switchovers": []}
    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        a = stack.enter_context(milvus_source(work / "a", etcd.endpoint, kafka.bootstrap))
        b = stack.enter_context(milvus_source_rocksmq(work / "b", etcd.endpoint, root_path="b"))
        result["startup_s"] = time.perf_counter() - started
        clusters = {}
        for label, milvus in (("a", a), ("b", b)):
            queue = (
                {"kafka": {"address": milvus.kafka_bootstrap}}
                if milvus.mq_type == "kafka"
                else {"rocksmq": {"path": str(milvus.rocksmq_path)}}
            )
            clusters[label] = {
                "etcd": {"address": [etcd.endpoint]},
                "etcdRootPath": milvus.etcd_root_path,
                "channelPrefix": milvus.chan_prefix,
                "mqType": milvus.mq_type,
                "milvus": {"uri": milvus.uri},
                **queue,
            }
        (work / "daemon").mkdir()
        daemon = Daemon(
            workdir=work / "daemon",
            config={
                "metaStoreConfig": {"storeType": "sqlite", "sqlitePath": str(work / "meta.db")},
                "drainTimeoutSeconds": 5,
                "clusters": clusters,
                "auth": {"allowAnonymous": True},
            },
        )
        daemon.start()
        stack.callback(daemon.stop)
        name = f"dr_{uuid.uuid4().hex[:6]}"
        client_a = MilvusClient(uri=a.uri, dedicated=True)
        create_collection(client_a, name, dim=DIM)
        vectors = np.random.default_rng(1).random((args.rows, DIM))
        for lo in range(0, args.rows, 5000):
            client_a.insert(
                name, [{"id": i, "vec": vectors[i]} for i in range(lo, min(args.rows, lo + 5000))]
            )
        ab = "ab"
        created = daemon.call(
            "create",
            {
                "task_id": ab,
                "source_cluster": "a",
                "target_cluster": "b",
                "collection_infos": [{"name": name}],
            },
        )
        assert created.code == 200, created.body
        client_b = MilvusClient(uri=b.uri, dedicated=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                client_b.load_collection(name)
                if count(client_b, name) == args.rows:
                    break
            time.sleep(0.5)
        first = 10_000_000
        primary, task_id = a, ab
        for _ in range(args.rounds):
            fence, lift = raw_fence(etcd.endpoint, b.etcd_root_path, b.uri, name)
            result["raw_fence"].append(fence)
            result["raw_lift"].append(lift)
            started = time.perf_counter()
            asked = daemon.call("verify", {"task_id": ab})
            assert asked.code == 200, asked.body
            verify = wait_job(daemon, ab, "verify", ("done", "failed"), 600)
            assert verify["divergent_rows"] == 0, verify
            result["verify"].append(time.perf_counter() - started)
            for _direction in range(2):
                consistent(daemon, task_id)
                writer = Writer(primary.uri, name, args.rate, first)
                writer.start()
                time.sleep(2)
                started = time.perf_counter()
                asked = daemon.call(
                    "switchover",
                    {"task_id": task_id, "max_lag_seconds": 30, "stale_check_seconds": 0},
                )
                assert asked.code == 200, asked.body
                # the writer moves (stops here) once the job reverses the flow, before the old
                # primary takes writes again: a write after that would be a stale client's
                wait_job(daemon, task_id, "switchover", ("reversing", "done", "failed"), 600)
                writer.stop.set()
                job = wait_job(daemon, task_id, "switchover", ("done", "failed"), 600)
                total = time.perf_counter() - started
                writer.join(30)
                first = writer.next + 1_000_000
                assert job["state"] == "done", job
                steps = [s["state"] for s in job["steps"]]
                phases = {
                    p: seconds_between(job["steps"], p, steps[steps.index(p) + 1]) for p in PHASES
                }
                refused = writer.refused
                result["switchovers"].append(
                    {
                        "direction": f"{job['source_cluster']} -> {job['target_cluster']}",
                        "total": total,
                        **phases,
                        "refused_window": (refused[-1] - refused[0]) if refused else 0.0,
                        "rows_compared": job["verify"].get("collections"),
                    }
                )
                task_id = job["reverse_task_id"]
                primary = b if primary is a else a
        consistent(daemon, task_id)
        writer = Writer(primary.uri, name, args.rate, first)
        writer.start()
        time.sleep(3)
        started = time.perf_counter()
        answer = daemon.call("failover", {"task_id": task_id})
        result["failover_s"] = time.perf_counter() - started
        writer.stop.set()
        writer.join(30)
        assert answer.code == 200, answer.body
        result["failover"] = answer.data
        result["rows_final"] = count(client_a, name)
        client_a.close()
        client_b.close()
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(args, r: dict, total_s: float) -> str:
    switches = r["switchovers"]
    raw = median(r["raw_fence"])
    verify = median(r["verify"])
    lines = [
        "# Switchover and failover times",
        "",
        f"Command: `python bench/disaster_recovery.py --rows {args.rows} --rate {args.rate} "
        f"--rounds {args.rounds}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, {len(os.sched_getaffinity(0))} cores; whole "
        f"script {total_s:.0f} s; services up in {r['startup_s']:.0f} s",
        "",
        "Two Milvus 2.3.5 standalones on this machine (a on the Kafka mock, b on RocksMQ), one "
        f"daemon on SQLite; a collection of {args.rows:,} rows replicated a -> b; a writer "
        f"inserting {args.rate} rows/s into the primary during each switchover. Seconds, "
        "medians over the rounds (each switchover listed below):",
        "",
        "| measure | median | ratio to its baseline |",
        "|---|---|---|",
        f"| baseline: Milvus's own fence (forceDeny written -> a write refused) | {raw:.2f} | |",
        f"| baseline: Milvus's own lift (deleted -> a write accepted) | "
        f"{median(r['raw_lift']):.2f} | |",
        f"| baseline: a verify of the task | {verify:.2f} | |",
        f"| switchover: fencing | {median([s['fencing'] for s in switches]):.2f} | "
        f"{median([s['fencing'] for s in switches]) / raw:.2f}x the fence |",
        f"| switchover: draining | {median([s['draining'] for s in switches]):.2f} | |",
        f"| switchover: verifying | {median([s['verifying'] for s in switches]):.2f} | "
        f"{median([s['verifying'] for s in switches]) / verify:.2f}x the verify |",
        f"| switchover: reversing (pause, create, lift and see the lift) | "
        f"{median([s['reversing'] for s in switches]):.2f} | "
        f"{median([s['reversing'] for s in switches]) / median(r['raw_lift']):.2f}x the lift |",
        f"| switchover: asked -> done | {median([s['total'] for s in switches]):.2f} | "
        f"{median([s['total'] for s in switches]) / (raw + verify + median(r['raw_lift'])):.2f}x "
        "fence + verify + lift |",
        f"| writer's refused window (first to last refused write) | "
        f"{median([s['refused_window'] for s in switches]):.2f} | |",
        f"| failover: asked -> answered (with the export) | {r['failover_s']:.2f} | |",
        "",
        "| switchover | total | fencing | draining | verifying | reversing | refused window |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {s['direction']} | {s['total']:.2f} | {s['fencing']:.2f} | {s['draining']:.2f} "
            f"| {s['verifying']:.2f} | {s['reversing']:.2f} | {s['refused_window']:.2f} |"
            for s in switches
        ),
        "",
        f"Failover: consistent up to {r['failover']['consistent_up_to']['time']}, "
        f"RPO {r['failover']['rpo_seconds']} s; the export found "
        f"{r['failover']['unreplicated']['records']} record(s) after it "
        f"(complete: {r['failover']['unreplicated']['complete']}).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-dr-") as work:
        result = run(args, Path(work))
    text = report(args, result, time.perf_counter() - started)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
