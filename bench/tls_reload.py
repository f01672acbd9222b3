"""Benchmark: what reading the TLS files again (metastore/tls_files.py) costs an etcd
metastore's calls: `get_task` over mutual TLS through the client that checks its files before
each call (at most once a second) against the plain client as baseline, in the same run, on
the same etcd, interleaved in rounds; p50/p99 and the ratio. Also one file check alone.

    python bench/tls_reload.py [--requests 2000] [--rounds 5] [--out FILE.md]

Starts its own etcd (mutual TLS, certificates of tests/harness/tls.py) on free loopback ports.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness import services  # noqa: E402
from harness.tls import make_test_pki  # noqa: E402

from metastore import TaskRecord, TaskState  # noqa: E402
from metastore.etcd import EtcdMetaStore  # noqa: E402
from metastore.etcd_connect import EtcdTls, connect_etcd  # noqa: E402
from metastore.tls_files import TlsFiles  # noqa: E402
from replicator.config.connections import EtcdSettings  # noqa: E402
from replicator.config.stores import etcd_client_for  # noqa: E402


def timed(store: EtcdMetaStore, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        store.get_task("t1")
        times.append((time.perf_counter() - started) * 1000)
    return times


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_test_pki(Path(tmp) / "pki")
        tls = services.ServerTls(pki.server_cert, pki.server_key, pki.ca_file)
        files = EtcdTls(str(pki.ca_file), str(pki.client_cert), str(pki.client_key))
        with services.etcd_server(Path(tmp) / "etcd", tls=tls) as etcd:
            settings = EtcdSettings(
                address=[etcd.endpoint],
                enableTLS=True,
                tlsCACertPath=files.ca_cert_path,
                tlsCertPath=files.cert_path,
                tlsKeyPath=files.key_path,
            )
            plain = EtcdMetaStore(connect_etcd([etcd.endpoint], tls=files), "bench")
            checking = EtcdMetaStore(etcd_client_for(settings), "bench")
            plain.create_task(TaskRecord("t1", TaskState.PAUSED, "", {"x": 1}, 1.0, 1.0))
            base: list[float] = []
            reload: list[float] = []
            per_round = args.requests // args.rounds
            timed(plain, 200)  # warm both
            timed(checking, 200)
            for _ in range(args.rounds):
                base += timed(plain, per_round)
                reload += timed(checking, per_round)
            watch = TlsFiles(files.ca_cert_path, files.cert_path, files.key_path, interval=0.0)
            started = time.perf_counter()
            for _ in range(1000):
                watch.changed()
            check_us = (time.perf_counter() - started) * 1000
            plain.close()
            checking.close()
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    rows = [
        "# TLS files read again: the cost to an etcd metastore's calls",
        "",
        f"Command: `python bench/tls_reload.py --requests {args.requests} --rounds {args.rounds}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
        f"Python {platform.python_version()}, {platform.machine()}",
        "",
        f"`get_task` over mutual TLS to one etcd, {args.requests} sequential calls per client, "
        f"interleaved in {args.rounds} rounds. Baseline: the plain client (files read once); "
        "measured: the daemon's client (files checked at most once a second before a call). "
        "Times in ms.",
        "",
        "| client | p50 | p99 | p50 / baseline p50 | p99 / baseline p99 |",
        "|---|---|---|---|---|",
        f"| plain (baseline) | {p(base, 50):.3f} | {p(base, 99):.3f} | 1.00x | 1.00x |",
        f"| reads files again | {p(reload, 50):.3f} | {p(reload, 99):.3f} | "
        f"{p(reload, 50) / p(base, 50):.2f}x | {p(reload, 99) / p(base, 99):.2f}x |",
        "",
        f"One check that reads the three files (the at-most-once-a-second path): "
        f"{check_us:.1f} µs (mean of 1000).",
        "",
        "The machine is shared (2 cores, other suites running): p99 is its noise; the p50 ratio",
        "is the measure. Aim: no more than 1.05x at p50.",
    ]
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
