"""Benchmark: what a position save costs the daemon on the SQL metastore (SQLite), against the
same SQL run with the standard library's sqlite3 alone.

A channel saves its position after each commit to the target (a Kafka target: after each
transaction; a catch-up of 16 channels saves hundreds a second). Each save is one transaction
of the store's statements: the UPDATE that moves the channel's row only from the position the
saver read, and the read of the task's row (and of its lease, under a fleet). Measured here:

- *store*: ``SqlMetaStore.save_position`` (with a lease, as a daemon's tasks save), from
  ``--threads`` threads, each its own channel;
- *sqlite3*: the same three statements, in a transaction, through a ``sqlite3`` connection a
  thread (same file settings: WAL, synchronous=NORMAL): the floor under the store's work,
  the baseline of the same run.

Reported per way: saves a second, CPU per save (the process's, all threads), and the store's
CPU per save over sqlite3's.

    python bench/metastore_writes.py [--saves 3000] [--threads 1,16] [--runs 3]
                                     [--out bench/results/metastore_writes.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from results_file import append_result, code_version  # noqa: E402

from metastore import Position, TaskRecord, TaskState  # noqa: E402
from metastore.base import Lease  # noqa: E402
from metastore.sql import SqlMetaStore  # noqa: E402
from metastore.sql_urls import sqlite_url  # noqa: E402

TASK = "bench-task"


def position(channel: str, n: int) -> Position:
    return Position("kafka", channel, n.to_bytes(8, "little"), 1000 + n)


def in_threads(threads: int, work) -> tuple[float, float]:
    """``work(i)`` in ``threads`` threads at once: seconds and the process's CPU-seconds."""
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - t0, time.process_time() - cpu0


def store_saves(path: str, threads: int, per_thread: int) -> tuple[float, float]:
    store = SqlMetaStore(sqlite_url(path), "cdc")
    now = time.time()
    store.create_task(TaskRecord(TASK, TaskState.RUNNING, "", {}, now, now))
    lease = store.acquire_lease(TASK, "bench-owner", 3600.0)
    assert isinstance(lease, Lease), lease

    def channel(i: int) -> None:
        last = None
        for n in range(per_thread):
            at = position(f"ch{i}", n)
            store.save_position(TASK, at, last, lease=lease)
            last = at

    try:
        return in_threads(threads, channel)
    finally:
        store.close()


def sqlite3_saves(path: str, threads: int, per_thread: int) -> tuple[float, float]:
    """The store's statements for a save, as plain SQL on the store's own tables."""
    SqlMetaStore(sqlite_url(path), "cdc").close()  # the schema
    setup = sqlite3.connect(path)
    setup.execute(
        "INSERT INTO cdc_tasks (root_path, task_id, state, reason, spec, extra, created_at, "
        "updated_at, revision) VALUES ('cdc', ?, 'Running', '', '{}', '{}', 0, 0, 1)",
        (TASK,),
    )
    setup.execute(
        "INSERT INTO cdc_leases (root_path, task_id, owner, token, expires_at) "
        "VALUES ('cdc', ?, 'bench-owner', 1, ?)",
        (TASK, time.time() + 3600),
    )
    setup.commit()
    setup.close()

    def channel(i: int) -> None:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        last = None
        for n in range(per_thread):
            at = position(f"ch{i}", n)
            conn.execute("BEGIN")
            if last is None:
                conn.execute(
                    "INSERT INTO cdc_positions (root_path, task_id, pchannel, backend, msg_id, "
                    "ts, updated_at) VALUES ('cdc', ?, ?, ?, ?, ?, ?)",
                    (TASK, at.pchannel, at.backend, at.msg_id, at.ts, time.time()),
                )
            else:
                conn.execute(
                    "UPDATE cdc_positions SET backend = ?, msg_id = ?, ts = ?, updated_at = ? "
                    "WHERE root_path = 'cdc' AND task_id = ? AND pchannel = ? AND backend = ? "
                    "AND msg_id = ? AND ts = ? AND ts <= ?",
                    (at.backend, at.msg_id, at.ts, time.time(), TASK, at.pchannel,
                     last.backend, last.msg_id, last.ts, at.ts),
                )  # fmt: skip
            conn.execute(
                "SELECT revision FROM cdc_tasks WHERE root_path = 'cdc' AND task_id = ?", (TASK,)
            ).fetchone()
            conn.execute(
                "SELECT * FROM cdc_leases WHERE root_path = 'cdc' AND task_id = ?", (TASK,)
            ).fetchone()
            conn.execute("COMMIT")
            last = at
        conn.close()

    return in_threads(threads, channel)


WAYS = {"store": store_saves, "sqlite3": sqlite3_saves}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=3000, help="per line, all threads")
    parser.add_argument("--threads", default="1,16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench/results/metastore_writes.md"))
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(args.runs):  # the ways interleaved: a slow minute falls on each
        for threads in thread_counts:
            for way, saves in WAYS.items():
                with tempfile.TemporaryDirectory() as tmp:
                    per = args.saves // threads
                    seconds, cpu = saves(os.path.join(tmp, "meta.db"), threads, per)
                results.setdefault((way, threads), []).append(
                    (per * threads / seconds, cpu / (per * threads))
                )
    lines = [
        f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {code_version()}",
        "",
        f"`python bench/metastore_writes.py --saves {args.saves} --threads {args.threads} "
        f"--runs {args.runs}` ({platform.node()}, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} cores)",
        "",
        "| threads | way | saves/s (median) | CPU µs a save (median) | runs: µs a save "
        "| CPU over sqlite3's |",
        "|---|---|---|---|---|---|",
    ]
    for threads in thread_counts:
        floor = statistics.median(c for _, c in results[("sqlite3", threads)])
        for way in WAYS:
            rows = results[(way, threads)]
            cpu = statistics.median(c for _, c in rows)
            lines.append(
                f"| {threads} | {way} | {statistics.median(r for r, _ in rows):,.0f} "
                f"| {cpu * 1e6:.0f} | {', '.join(f'{c * 1e6:.0f}' for _, c in rows)} "
                f"| {cpu / floor:.2f} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    append_result(Path(args.out), "A position save on the SQL metastore (SQLite)", text)


if __name__ == "__main__":
    main()
