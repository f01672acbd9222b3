"""Benchmark: POST /cdc `list` with 1,000 stored tasks, p50/p99, on SQLite and etcd (MySQL too
when MariaDB is installed), against baselines taken in the same run on the same daemon:
GET /livez (the HTTP floor) and `get` of one task (a one-row read).

    python bench/list_latency.py [--tasks 1000] [--requests 500] [--out FILE.md]

Starts its own etcd/MariaDB on free loopback ports and a real daemon per backend.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness import services  # noqa: E402
from harness.daemon import Daemon  # noqa: E402

from metastore import TaskRecord, TaskState  # noqa: E402
from metastore.etcd import EtcdMetaStore  # noqa: E402
from metastore.etcd_connect import connect_etcd  # noqa: E402
from metastore.sql import SqlMetaStore  # noqa: E402
from metastore.sql_urls import mysql_url_from_source, sqlite_url  # noqa: E402
from replicator.config.settings import load_settings  # noqa: E402
from server.tasks.requests import CreateRequest, parse_model  # noqa: E402
from server.tasks.spec import validate_create  # noqa: E402


def make_spec(i: int) -> dict:
    request = {
        "milvus_connect_param": {
            "host": f"target-{i % 7}.example",
            "port": 19530,
            "username": "root",
            "password": f"secret-{i}",
            "connect_timeout": 10,
        },
        "db_collections": {f"db_{i}": [{"name": f"coll_{i}_{k}"} for k in range(3)]},
        "name_mapping": [
            {"source_db": f"db_{i}", "target_db": f"copy_{i}", "collection_mapping": {}}
        ],
    }
    return validate_create(parse_model(CreateRequest, request), load_settings(None, {}))


def populate(store, n: int) -> str:
    now = time.time()
    first = ""
    for i in range(n):
        task_id = uuid.uuid4().hex
        first = first or task_id
        state = [TaskState.PAUSED, TaskState.INITIAL, TaskState.FAILED][i % 3]
        store.create_task(TaskRecord(task_id, state, "bench", make_spec(i), now + i, now + i))
    return first


def timed(fn, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(daemon: Daemon, task_id: str, requests: int, expect: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)

    def post_raw(body: bytes) -> bytes:
        """Latency ends at the last byte received; the client's own JSON parsing is not timed."""
        conn.request("POST", "/cdc", body=body)
        return conn.getresponse().read()

    def post(body: bytes) -> dict:
        return json.loads(post_raw(body))

    def livez() -> None:
        conn.request("GET", "/livez")
        conn.getresponse().read()

    list_body = json.dumps({"request_type": "list"}).encode()
    get_body = json.dumps({"request_type": "get", "request_data": {"task_id": task_id}}).encode()
    listed = post(list_body)
    assert len(listed["data"]["tasks"]) == expect, "daemon does not see the stored tasks"
    assert "secret-" not in json.dumps(listed)
    for _ in range(20):  # warm-up
        post(list_body)
        post(get_body)
    result = {}
    # interleave the three so machine noise hits all alike
    rounds = 5
    samples: dict[str, list[float]] = {"livez": [], "get": [], "list": []}
    for _ in range(rounds):
        samples["livez"] += timed(livez, requests // rounds)
        samples["get"] += timed(lambda: post_raw(get_body), requests // rounds)
        samples["list"] += timed(lambda: post_raw(list_body), requests // rounds)
    conn.close()
    for name, values in samples.items():
        result[name] = {
            "p50": pct(values, 0.50),
            "p99": pct(values, 0.99),
            "mean": statistics.fmean(values),
        }
    result["bytes"] = len(json.dumps(listed))
    return result


def run_backend(name: str, store_config: dict, store, tasks: int, requests: int, work: Path):
    started = time.perf_counter()
    task_id = populate(store, tasks)
    fill_s = time.perf_counter() - started
    store.close()
    daemon = Daemon(workdir=work / name, config={"metaStoreConfig": store_config})
    daemon.workdir.mkdir(parents=True)
    daemon.start()
    try:
        result = measure(daemon, task_id, requests, tasks)
    finally:
        daemon.stop()
    result["fill_s"] = fill_s
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--out", default=str(REPO / "bench/results/list_latency.md"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        root = "bench"
        path = str(work / "meta.sqlite3")
        results["sqlite"] = run_backend(
            "sqlite",
            {"storeType": "sqlite", "sqlitePath": path, "rootPath": root},
            SqlMetaStore(sqlite_url(path), root),
            args.tasks,
            args.requests,
            work,
        )
        etcd = stack.enter_context(services.etcd_server(work / "etcd-data"))
        results["etcd"] = run_backend(
            "etcd",
            {"storeType": "etcd", "etcd": {"address": [etcd.endpoint]}, "rootPath": root},
            EtcdMetaStore(connect_etcd([etcd.endpoint]), root),
            args.tasks,
            args.requests,
            work,
        )
        try:
            maria = stack.enter_context(services.mariadb_server(work / "mariadb-data"))
        except services.MissingBinaryError:
            maria = None
        if maria is not None:
            results["mysql"] = run_backend(
                "mysql",
                {"storeType": "mysql", "mysqlSourceUrl": maria.go_dsn, "rootPath": root},
                SqlMetaStore(mysql_url_from_source(maria.go_dsn), root),
                args.tasks,
                args.requests,
                work,
            )
    report(args, results)


def report(args, results: dict) -> None:
    lines = [
        "# `list` latency with stored tasks",
        "",
        f"Command: `python bench/list_latency.py --tasks {args.tasks} --requests {args.requests}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, {platform.machine()}",
        "",
        f"{args.tasks} tasks stored; {args.requests} sequential requests of each kind over one "
        "keep-alive connection, interleaved in 5 rounds. Baselines on the same daemon in the same "
        "run: GET /livez (HTTP floor) and `get` of one task. Times in ms.",
        "",
        "| store | list p50 | list p99 | get p50 | get p99 | livez p50 | livez p99 "
        "| list p99 / livez p99 | list body |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['list']['p50']:.2f} | {r['list']['p99']:.2f} | {r['get']['p50']:.2f} "
            f"| {r['get']['p99']:.2f} | {r['livez']['p50']:.2f} | {r['livez']['p99']:.2f} "
            f"| {r['list']['p99'] / r['livez']['p99']:.1f}x | {r['bytes'] / 1024:.0f} KiB |"
        )
    lines += ["", "Aim: list p99 under 50 ms with 1,000 tasks."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
