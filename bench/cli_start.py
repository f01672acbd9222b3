"""Benchmark: how long ``milvus-cdc task list`` takes to start, against baselines in the same
run: the interpreter alone (``python -c pass``) and the import of everything the daemon loads
(``import server.app``: what every command imported before server/cli/main.py loaded a
command's work only when it runs).

    python bench/cli_start.py [--runs 15] [--out FILE.md]

The command asks an address where nothing listens (it fails at once with "cannot reach the
daemon"), so the time is the command's own start and exit.
"""

from __future__ import annotations

import argparse
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def median_seconds(argv: list[str], runs: int, expect_code: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, capture_output=True, check=False, timeout=120)
        times.append(time.perf_counter() - started)
        assert done.returncode == expect_code, (argv, done.returncode, done.stderr[-500:])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{closed_port()}"
    cases = [
        ("interpreter: python -c pass", [sys.executable, "-c", "pass"], 0),
        ("every import of the daemon: import server.app",
         [sys.executable, "-c", "import server.app"], 0),
        ("milvus-cdc task list (nothing listens)",
         [sys.executable, "-m", "server", "task", "list", "--url", url, "--timeout", "1"], 1),
    ]  # fmt: skip
    rows = []
    for _ in range(2):  # warm the file cache, then interleave the cases round by round
        for _name, argv, code in cases:
            median_seconds(argv, 1, code)
    results = {name: median_seconds(argv, args.runs, code) for name, argv, code in cases}
    floor = results[cases[0][0]]
    everything = results[cases[1][0]]
    for name, seconds in results.items():
        rows.append(f"| {name} | {seconds:.3f} | {seconds / everything:.2f}x |")
    text = "\n".join(
        [
            f"# `milvus-cdc task` start ({time.strftime('%Y-%m-%d')}, {platform.node()}, "
            f"Python {platform.python_version()}, median of {args.runs} runs)",
            "",
            f"`python bench/cli_start.py --runs {args.runs}`",
            "",
            "| what | seconds | of the daemon's imports |",
            "|---|---|---|",
            *rows,
            "",
            f"Above the interpreter's own start ({floor:.3f} s): the command "
            f"{results[cases[2][0]] - floor:.3f} s, "
            f"the daemon's imports {everything - floor:.3f} s.",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
