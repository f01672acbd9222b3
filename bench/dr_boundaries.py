"""The search over every boundary of the disaster-recovery jobs (tests/harness/dr_boundaries.py;
issue 48, Build item 2): each job x boundary x fault, with the invariants held or broken and
the time of each case, as a table.

One set of services for the whole run, reused by every case: one etcd (both clusters' metadata
and the fleet's metastore), the librdkafka mock, cluster ``a`` a Milvus 2.3.5 on the mock (the
home of the flow: a failover kills it) and ``b`` one on RocksMQ, both restartable; one flow
under a writer; fleet members m1 (and m2 for the stalls).

    python bench/dr_boundaries.py [--jobs switchover,failover,failback] [--points p,q]
        [--faults kill,stall,...] [--skip N] [--limit N] [--out bench/results/dr_boundaries.md]
    python bench/dr_boundaries.py --plan "switchover:verbs;failover:all;failback:all" ...

The operator verbs of one boundary are judged in one held world (tests/harness/dr_verb_batch.py:
a refused verb changes nothing; the first accepted one goes on as its own case, the rest in a
fresh held world); kill and stall are a case each. ``--plan``: groups run one after another,
each ``job:faults`` (faults comma-separated, or ``verbs``, or ``all``); within a group, point by
point, the verbs first. ``--no-batch``: every verb a case of its own (as before the batches).

The table is written after every boundary, so a run stopped part-way leaves what it ran.
"""

from __future__ import annotations

import argparse
import contextlib
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
    Case,
    CaseResult,
    all_cases,
    table,
)

from bench.dr_walk import say, walk_on_services  # noqa: E402
from bench.results_file import code_version  # noqa: E402
from server.dr.flows import BOUNDARIES  # noqa: E402


def report(
    results: list[CaseResult], command: str, began: datetime, total: float, left: int, code: str
) -> str:
    broken = [r for r in results if r.broke]
    held = sum(1 for r in results if r.held)
    lines = [
        "# Disaster-recovery boundaries searched",
        "",
        f"Command: `{command}`",
        f"Code: {code} (when the run started)",
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
        "every invariant of the walk again. The verbs of one boundary share a held world "
        "while they are refused (never_both_directions, no_ownerless_fence and "
        "refused_verb_changed_nothing checked after each); the first accepted goes on alone. "
        "A row's s: its own ask and checks, an even share of its world's reach, and the "
        "world's end (release, settle, drive home) if it was the verb accepted there, else an "
        "even share of it (tests/harness/dr_verb_batch.py).",
        "",
        *table(results),
        "",
    ]
    return "\n".join(lines)


SINGLE = ("kill", "stall")  # a case each: they change the world by design


def planned(plan: str) -> list[tuple[Case, bool]]:
    """The cases of ``--plan`` in its order, each with whether it may share a held world."""
    cases: list[tuple[Case, bool]] = []
    for group in (g.strip() for g in plan.split(";") if g.strip()):
        spec, single = group.removesuffix("/single"), group.endswith("/single")
        spec, _, at = spec.partition("@")
        job, _, faults = spec.partition(":")
        chosen = []
        for token in faults.split(",") if faults else ["all"]:
            if token == "all":
                chosen += FAULTS
            elif token == "verbs":
                chosen += [f for f in FAULTS if f not in SINGLE]
            else:
                chosen.append(token)
        points = at.split(",") if at else list(BOUNDARIES.get(job, ()))
        unknown = sorted(set(chosen) - set(FAULTS)) + ([job] if job not in BOUNDARIES else [])
        unknown += sorted(set(points) - set(BOUNDARIES.get(job, ())))
        if unknown:
            raise SystemExit(f"--plan {group!r}: unknown {unknown}")
        cases += [(Case(job, p, f), not single) for p in points for f in FAULTS if f in chosen]
    return cases


def batches(cases: list[tuple[Case, bool]]) -> list[list[Case]]:
    """The cases as they run: consecutive verbs of one job and point together (those that may
    share a held world)."""
    runs: list[list[Case]] = []
    joinable = False
    for case, batch in cases:
        last = runs[-1] if runs else []
        joins = (
            joinable
            and batch
            and case.fault not in SINGLE
            and (last[0].job, last[0].point) == (case.job, case.point)
        )
        if joins:
            last.append(case)
        else:
            runs.append([case])
        joinable = batch and case.fault not in SINGLE
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default=",".join(BOUNDARIES))
    parser.add_argument("--points", default="", help="only these boundaries (comma-separated)")
    parser.add_argument("--faults", default="", help="only these faults (comma-separated)")
    parser.add_argument("--skip", type=int, default=0, help="skip the first N of the selection")
    parser.add_argument("--limit", type=int, default=0, help="run at most N cases")
    parser.add_argument("--plan", default="", help="job:faults groups, ';'-separated, in order")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="no switchover there and back before the first case (the flow has one task)",
    )
    parser.add_argument("--no-batch", action="store_true", help="every verb a case of its own")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (the daemons' logs)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dr_boundaries.md")
    args = parser.parse_args()
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)  # the writer's refusals, by design
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: the services stopped too
    if args.plan:
        cases = planned(args.plan)
    else:  # point by point, the verbs of a point first, together
        order = {f: (f in SINGLE, i) for i, f in enumerate(FAULTS)}
        chosen = all_cases([j for j in args.jobs.split(",") if j])
        chosen.sort(key=lambda c: order[c.fault])
        chosen.sort(key=lambda c: (list(BOUNDARIES).index(c.job), BOUNDARIES[c.job].index(c.point)))
        cases = [(c, not args.no_batch) for c in chosen]
    if args.points:
        cases = [(c, b) for c, b in cases if c.point in args.points.split(",")]
    if args.faults:
        cases = [(c, b) for c, b in cases if c.fault in args.faults.split(",")]
    cases = cases[args.skip :]
    if args.limit:
        cases = cases[: args.limit]
    command = "python bench/dr_boundaries.py " + " ".join(sys.argv[1:])
    began, start, code = datetime.now(UTC), time.monotonic(), code_version()
    results: list[CaseResult] = []
    with contextlib.ExitStack() as stack:
        if args.keep:  # the daemons' logs read after the run
            work = Path(tempfile.mkdtemp(prefix="dr-boundaries-"))
            say(f"work directory (kept): {work}")
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dr-boundaries-")))
        with walk_on_services(work, 1, keep_going=True) as walk:
            search = BoundarySearch(walk, work / "holds", say)
            search.prepare_fleet()
            walk.setup(home="a", flows=1)
            if not args.no_warm_up:
                say(f"warm-up: {search.round_trip()}")
            for run in batches(cases):
                if len(run) == 1:
                    results.append(search.run(run[0]))
                else:
                    results.extend(search.run_verbs(run))
                left = len(cases) - len(results)
                text = report(results, command, began, time.monotonic() - start, left, code)
                args.out.write_text(text)
    left = len(cases) - len(results)
    print(report(results, command, began, time.monotonic() - start, left, code))


if __name__ == "__main__":
    main()
