"""Benchmark: the daemon's memory does not grow with the backlog it catches up.

Runs the replicated phase of ``catch_up.py`` (a backlog of R rows written into a real Milvus
2.3.5 source with its WAL in RocksMQ while no task exists, then a task created and timed until
the target's count(*) reads R) once per backlog size, each on fresh services. The first size is
the baseline: the peak RSS (the kernel's VmHWM) of every other size is compared with it. The
daemon's CPU-seconds per GB of WAL come out of the same runs.

The source's WAL tail: RocksDB keeps its latest writes in memtables (Milvus's RocksMQ: 64 MB,
two of them) and in its WAL files until it flushes them into table files. A RocksDB secondary,
which is how the daemon reads RocksMQ, replays those WAL files into memtables of its own when it
opens, so the daemon holds the source's WAL tail (0 to the source's write buffers) on top of
what it needs itself. Where a backlog happens to end within the source's write buffer sets that
tail, not the backlog's length. Before each catch-up, filler rows in a collection no task
selects make the source start a new WAL file (``--keep-wal-tail``: not), so each run starts
with the same nearly empty tail; the tail is reported per run.

    python bench/backlog.py [--sizes 1000000,5000000] [--target lite|milvus] [--shards 1]
                            [--keep-wal-tail] [--out FILE.md]

Aim (issue 17): peak RSS for 5,000,000 rows within 10 % of that for 1,000,000.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import MB, add_memory_argument, memory_flag, run, write_report  # noqa: E402


def measure(args) -> list[dict]:
    results = []
    for rows in [int(n) for n in args.sizes.split(",")]:
        run_args = argparse.Namespace(**{**vars(args), "rows": rows})
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
            result = run(run_args, Path(tmp), direct=False)
        result.update(rows=rows, total_s=time.perf_counter() - started)
        print({k: v for k, v in result.items() if k != "rss_samples"}, flush=True)
        results.append(result)
    return results


def report(args, results: list[dict], total_s: float) -> str:
    base = results[0]
    target = "Milvus Lite" if args.target == "lite" else f"Milvus 2.3.5 ({args.shards} shards)"
    lines = [
        "# Daemon memory against the backlog's size",
        "",
        f"Command: `python bench/backlog.py --sizes {args.sizes} --target {args.target} "
        f"--shards {args.shards} --batch {args.batch}"
        f"{' --own-readers' if args.own_readers else ''}"
        f"{'' if args.roll_source_wal else ' --keep-wal-tail'}"
        f"{memory_flag(args)}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores; whole script {total_s:.0f} s",
        "",
        "Per size, on fresh services: the rows (int64 pk + 128-dim float vector) written into a "
        "real Milvus 2.3.5 source (WAL in RocksMQ) while no task exists, the source flushed and "
        f"left to settle, then a task created and timed until {target}'s count(*) reads every "
        "row (exactly: more fails the run). The daemon's RSS sampled every 0.1 s; its peak is "
        "the kernel's VmHWM. The baseline is the first size. "
        + (
            "Before each catch-up, filler rows in a collection no task selects made the source's "
            "RocksDB start a new WAL file (see the script's doc): the source WAL tail column is "
            "what a RocksDB secondary replays into memory when it opens."
            if args.roll_source_wal
            else "The source's WAL tail was left as the backlog left it (`--keep-wal-tail`)."
        ),
        "",
        "| backlog rows | WAL MB | source WAL tail MB | catch-up s | rows/s | daemon CPU s "
        "| CPU s per GB of WAL | idle RSS MB | median RSS MB | peak RSS MB "
        "| peak / baseline peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        samples = sorted(r["rss_samples"])
        median = samples[len(samples) // 2] / 1024 if samples else 0.0
        cpu = r["replicated_cpu"][2]
        lines.append(
            f"| {r['rows']:,} | {r['wal_mb']:,.0f} | {r['wal_tail_mb']:.1f} "
            f"| {r['replicated_s']:.1f} "
            f"| {r['rows'] / r['replicated_s']:,.0f} | {cpu:.1f} "
            f"| {cpu / (r['wal_mb'] / 1024):.1f} | {r['idle_rss_mb']:.0f} | {median:.0f} "
            f"| {r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f} |"
        )
    lines += window_peaks(results)
    lines += [
        "",
        "What the daemon's memory was made of at its largest scrape of `cdc_heap_*` (1 s apart; "
        "server/runtime/heap.py), MB (Python: millions of object blocks):",
        "",
        "| backlog rows | resident | malloc arenas | of them in use | free | malloc mapped "
        "| resident - arenas - mapped (libraries, Python's arenas, stacks; less the arenas' "
        "pages a trim gave back) | Python blocks (M) | trims |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        h = r.get("heap_at_peak") or {}
        if not h:
            continue
        mb = {k: v / MB for k, v in h.items() if k.endswith("_bytes")}
        rest = mb["resident_bytes"] - mb["malloc_arena_bytes"] - mb["malloc_mapped_bytes"]
        lines.append(
            f"| {r['rows']:,} | {mb['resident_bytes']:.0f} | {mb['malloc_arena_bytes']:.0f} "
            f"| {mb['malloc_in_use_bytes']:.0f} | {mb['malloc_free_bytes']:.0f} "
            f"| {mb['malloc_mapped_bytes']:.0f} | {rest:.0f} | {h['python_blocks'] / 1e6:.2f} "
            f"| {h['trims_total']:.0f} |"
        )
    lines += [
        "",
        "Every run: the target's count(*) equal to the backlog, a sample of rows compared value "
        "by value with the source ("
        + ", ".join(f"{r['compared']}" for r in results)
        + " rows), the task Running at the end.",
        "",
        "Aim (issue 17): the peak RSS of the largest backlog within 10 % of the smallest's.",
    ]
    return "\n".join(lines) + "\n"


def window_peaks(results: list[dict]) -> list[str]:
    """Each longer run cut into windows as long as the baseline's catch-up (its RSS samples,
    0.1 s apart): the peak RSS of every window. A daemon whose memory grows with the backlog
    has its later windows' peaks higher; one that does not has them scattered around the
    baseline's, and its whole-run peak is the highest of more windows, no more."""
    base = len(results[0]["rss_samples"])
    lines = []
    for r in results[1:]:
        samples = r["rss_samples"]
        if not base or len(samples) < 2 * base:
            continue
        peaks = [max(samples[i : i + base]) / 1024 for i in range(0, len(samples) - base + 1, base)]
        half = len(peaks) // 2
        lines += [
            "",
            f"The {r['rows']:,}-row run in {len(peaks)} windows as long as the baseline's "
            f"catch-up ({base:,} samples, {results[0]['replicated_s']:.0f} s), peak RSS MB of "
            "each in order: "
            + ", ".join(f"{p:.0f}" for p in peaks)
            + f". Highest window {max(peaks) / results[0]['peak_rss_mb']:.2f}x the baseline's "
            f"peak, median window {sorted(peaks)[len(peaks) // 2] / results[0]['peak_rss_mb']:.2f}"
            f"x; the later half's highest {max(peaks[half:]):.0f} MB against the earlier "
            f"half's {max(peaks[:half]):.0f} MB.",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--target", choices=["lite", "milvus"], default="lite")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=3600)
    add_memory_argument(parser)
    parser.add_argument(
        "--own-readers",
        action="store_true",
        help="sourceConfig.sharedReaders false: the task reads with readers of its own",
    )
    parser.add_argument(
        "--keep-wal-tail",
        dest="roll_source_wal",
        action="store_false",
        help="start each catch-up on whatever WAL tail the backlog left in the source's RocksDB "
        "(by default filler rows make it start a new WAL file first: see the module doc)",
    )
    parser.add_argument("--out", default=str(REPO / "bench/results/backlog.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    results = measure(args)
    write_report(args.out, report(args, results, time.perf_counter() - started))


if __name__ == "__main__":
    main()
