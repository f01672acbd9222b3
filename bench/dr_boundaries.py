"""The search over every boundary of the disaster-recovery jobs (tests/harness/dr_boundaries.py;
issue 48, Build item 2): each job x boundary x fault, with the invariants held or broken and
the time of each case, as a table.

One set of services for the whole run, reused by every case: one etcd (both clusters' metadata
and the fleet's metastore), the librdkafka mock, cluster ``a`` a Milvus 2.3.5 on the mock (the
home of the flow: a failover kills it) and ``b`` one on RocksMQ, both restartable; one flow
under a writer; fleet members m1 (and m2 for the stalls).

    python bench/dr_boundaries.py [--jobs switchover,failover,failback] [--points p,q]
        [--faults kill,stall,...] [--skip N] [--limit N] [--out bench/results/dr_boundaries.md]

The table is written after every case, so a run stopped part-way leaves what it ran.
"""

from __future__ import annotations

import argparse
import logging
import platform
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness.dr_boundaries import (  # noqa: E402
    FAULTS,
    BoundarySearch,
    CaseResult,
    all_cases,
    table,
)

from bench.dr_walk import code_version, say, walk_on_services  # noqa: E402
from server.dr.flows import BOUNDARIES  # noqa: E402

logging.getLogger("pymilvus").setLevel(logging.CRITICAL)  # the writer's refusals, by design


def report(
    results: list[CaseResult], command: str, began: datetime, total: float, left: int
) -> str:
    broken = [r for r in results if r.broke]
    held = sum(1 for r in results if r.held)
    lines = [
        "# Disaster-recovery boundaries searched",
        "",
        f"Command: `{command}`",
        f"Code: {code_version()}",
        f"Run: {began:%Y-%m-%d %H:%M} UTC, {platform.node()}, Python "
        f"{platform.python_version()}, {total:.0f} s",
        "",
        f"Boundaries: {', '.join(f'{job} {len(p)}' for job, p in BOUNDARIES.items())}; "
        f"faults per boundary: {len(FAULTS)} ({', '.join(FAULTS)}); all combinations: "
        f"{len(all_cases())}.",
        f"This run: {len(results)} case(s), {held} held at their boundary, "
        f"{len(broken)} with an invariant broken; {left} of the selection not run.",
        "",
        "Each case: the job held at the boundary, the fault applied, the hold released, the "
        "walk's invariants (tests/harness/dr_walk.py) and never_both_directions, the verbs' "
        "answers (2xx, or 409 naming the state), then the flow driven home by verbs alone and "
        "every invariant of the walk again.",
        "",
        *table(results),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default=",".join(BOUNDARIES))
    parser.add_argument("--points", default="", help="only these boundaries (comma-separated)")
    parser.add_argument("--faults", default="", help="only these faults (comma-separated)")
    parser.add_argument("--skip", type=int, default=0, help="skip the first N of the selection")
    parser.add_argument("--limit", type=int, default=0, help="run at most N cases")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dr_boundaries.md")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: the services stopped too
    cases = all_cases([j for j in args.jobs.split(",") if j])
    if args.points:
        cases = [c for c in cases if c.point in args.points.split(",")]
    if args.faults:
        cases = [c for c in cases if c.fault in args.faults.split(",")]
    cases = cases[args.skip :]
    if args.limit:
        cases = cases[: args.limit]
    command = "python bench/dr_boundaries.py " + " ".join(sys.argv[1:])
    began, start = datetime.now(UTC), time.monotonic()
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="dr-boundaries-") as d:
        work = Path(d)
        with walk_on_services(work, 1, keep_going=True) as walk:
            search = BoundarySearch(walk, work / "holds", say)
            search.prepare_fleet()
            walk.setup(home="a", flows=1)
            for index, case in enumerate(cases):
                results.append(search.run(case))
                text = report(
                    results, command, began, time.monotonic() - start, len(cases) - index - 1
                )
                args.out.write_text(text)
    print(report(results, command, began, time.monotonic() - start, len(cases) - len(results)))


if __name__ == "__main__":
    main()
