"""Benchmark: the two metastore transactions of each write to a Milvus target, on their own: the
in-flight bound before the write and the position after it (replicator/pipeline/checkpoint.py),
on SQLite as the lag bench's daemon has it. The lag bench's "hold" holds the first, its
"position save" the second; this is what they cost with nothing else waiting for a core.

    python bench/position_commits.py [--writes 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from metastore import Position, TaskRecord, TaskState  # noqa: E402
from metastore.sql import SqlMetaStore  # noqa: E402
from metastore.sql_urls import sqlite_url  # noqa: E402
from replicator.pipeline.task_state import RunnerState  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    args = parser.parse_args()
    bound: list[float] = []
    save: list[float] = []
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        store = SqlMetaStore(sqlite_url(str(Path(tmp) / "meta.sqlite3")), "bench")
        now = time.time()
        spec = {"collection_infos": [{"name": "c"}]}
        store.create_task(TaskRecord("t1", TaskState.RUNNING, "", spec, now, now))
        state = RunnerState(store, "t1")
        expected: Position | None = None
        for i in range(args.writes):
            started = time.perf_counter()
            state.set_inflight_bound("bench-dml_0", i)
            bounded = time.perf_counter()
            position = Position("kafka", "bench-dml_0", i.to_bytes(8, "little"), 1000 + i)
            store.save_position("t1", position, expected)
            bound.append(bounded - started)
            save.append(time.perf_counter() - bounded)
            expected = position
        store.close()
    print(f"load average {' / '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for name, times in (("in-flight bound", bound), ("position save", save)):
        times.sort()
        print(
            f"{name}: {len(times)} transactions, ms: mean {statistics.mean(times) * 1000:.2f}, "
            f"p50 {times[len(times) // 2] * 1000:.2f}, "
            f"p99 {times[int(len(times) * 0.99)] * 1000:.2f}, "
            f"max {times[-1] * 1000:.2f}"
        )


if __name__ == "__main__":
    main()
