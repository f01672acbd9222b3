"""Long seeded walks over disaster recovery (tests/harness/dr_walk.py; issue 41, Build item 6),
with results: each seed's steps, the invariants checked, the first that broke (if any) and the
time each verb took (count, median, max).

Fresh services per seed: one etcd (both clusters' metadata and the fleet's metastore), the
librdkafka mock, cluster ``a`` a Milvus 2.3.5 on the mock and ``b`` one on RocksMQ, both
restartable (either may be killed by a failover step); daemons as fleet members.

    python bench/dr_walk.py --seeds 7 --steps 30 [--out bench/results/dr_walk.md]

A seed whose walk broke an invariant is reproduced by the same command with that seed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness import services  # noqa: E402
from harness.daemon import Daemon  # noqa: E402
from harness.dr_walk import Walk  # noqa: E402
from harness.dr_walk_model import ClusterHandle, InvariantError, WalkResult  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import restartable_milvus  # noqa: E402

from bench.results_file import code_version  # noqa: E402

logging.getLogger("pymilvus").setLevel(logging.CRITICAL)  # the writers' refusals, by design


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


@contextlib.contextmanager
def walk_on_services(work: Path, seed: int, keep_going: bool) -> Iterator[Walk]:
    """A walk (not set up) on fresh services below ``work``: one etcd, the librdkafka mock,
    cluster ``a`` a Milvus 2.3.5 on the mock, ``b`` one on RocksMQ, both restartable; its
    daemons and services stopped at the end."""
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        a = stack.enter_context(
            restartable_milvus(
                work / "a", etcd.endpoint, kafka_bootstrap=kafka.bootstrap, root_path="walk-a"
            )
        )
        b = stack.enter_context(restartable_milvus(work / "b", etcd.endpoint, root_path="walk-b"))

        def make_daemon(name: str, **config: Any) -> Daemon:
            workdir = work / name
            workdir.mkdir(exist_ok=True)
            settings: dict[str, Any] = {
                "sourceConfig": {
                    "etcd": {"address": [etcd.endpoint]},
                    "etcdRootPath": "no-source",
                    "kafka": {"address": kafka.bootstrap},
                    "dmlChannelNum": 2,
                },
                "drainTimeoutSeconds": 5,
                "auth": {"allowAnonymous": True},
                **config,
            }
            return Daemon(workdir=workdir, config=settings)

        walk = Walk(
            seed=seed,
            clusters={
                "a": ClusterHandle("a", a.source, a),
                "b": ClusterHandle("b", b.source, b),
            },
            etcd_endpoint=etcd.endpoint,
            make_daemon=make_daemon,
            workdir=work,
            say=say,
            keep_going=keep_going,
        )
        try:
            yield walk
        finally:
            walk.close()
            for daemon in walk.fleet.members.values():  # killed ones are already gone
                if daemon.process is not None and daemon.process.poll() is None:
                    daemon.kill()


def one_walk(seed: int, steps: int, work: Path, args: argparse.Namespace) -> WalkResult:
    with walk_on_services(work, seed, args.keep_going) as walk:
        try:
            walk.setup(home="a")
            walk.run(steps)
        except InvariantError as failure:
            say(str(failure))
    return walk.result


def timings_table(results: list[WalkResult]) -> list[str]:
    merged: dict[str, list[float]] = {}
    for result in results:
        for verb, seconds in result.timings.items():
            merged.setdefault(verb, []).extend(seconds)
    lines = ["| verb | count | median s | max s |", "|---|---|---|---|"]
    for verb, seconds in sorted(merged.items()):
        lines.append(
            f"| {verb} | {len(seconds)} | {statistics.median(seconds):.1f} | {max(seconds):.1f} |"
        )
    return lines


def report(results: list[WalkResult], command: str, began: datetime, total: float) -> str:
    lines = [
        "# Disaster-recovery walks",
        "",
        f"Command: `{command}`",
        f"Code: {code_version()}",
        f"Run: {began:%Y-%m-%d %H:%M} UTC, {platform.node()}, Python "
        f"{platform.python_version()}, whole script {total:.0f} s",
        "",
        "Two Milvus 2.3.5 standalones (a on the Kafka mock, b on RocksMQ, both restartable), a "
        "fleet of daemons on one etcd metastore, two flows of one cluster pair under a writer "
        "each (tests/harness/dr_walk.py). A walk stops at the first invariant that breaks, "
        "unless `--keep-going`.",
        "",
        "| seed | steps run | result | seconds |",
        "|---|---|---|---|",
    ]
    for r in results:
        broke = sorted({f.check for f in r.failures})
        verdict = f"broke: **{', '.join(broke)}**" if broke else "every invariant held"
        if r.jobs_failed:
            verdict += f"; {len(r.jobs_failed)} job(s) ended failed (listed below)"
        lines.append(f"| {r.seed} | {len(r.steps)} | {verdict} | {r.seconds:.0f} |")
    lines += ["", "Time per verb and per check (all seeds):", "", *timings_table(results), ""]
    for r in results:
        checks = ", ".join(f"{name} {n}" for name, n in sorted(r.checks.items()))
        lines += [f"## Seed {r.seed}", "", f"Invariants that held (times checked): {checks}", ""]
        lines += [
            f"Export keys compared with their failover's target (over all checks): "
            f"{r.export_keys_compared}, of which the writer had retried there (a batch the lost "
            f"cluster did not acknowledge): {r.export_keys_retried}; marked maybe_on_target: "
            f"{r.export_keys_in_doubt}, of which on the target: "
            f"{r.export_keys_in_doubt_on_target}",
            "",
        ]
        tally = r.stale_checks
        ended = ", ".join(f"{state} {n}" for state, n in sorted(tally.ended.items())) or "none"
        lines += [
            f"Stale-write checks asked: {tally.asked}; ended: {ended}; superseded by a later "
            f"switchover of the task: {tally.superseded}; done with a stale writer's rows "
            f"found: {tally.stale_found}",
            "",
        ]
        if tally.not_done:
            lines += ["Checks not ended done (state, reason):", ""]
            lines += [f"- {line}" for line in tally.not_done] + [""]
        lines += [s.line() for s in r.steps]
        if r.jobs_failed:
            lines += ["", "Jobs that ended failed (the model follows the documented end):"]
            lines += [f"- {job}" for job in r.jobs_failed]
        for failure in r.failures:
            lines += [
                "",
                f"Broke after step {len(failure.steps)}: `{failure.check}`: {failure.detail}",
            ]
        if r.failure is not None:
            lines += [
                "",
                f"Reproduce the first: the command above with `--seeds {r.seed} --steps "
                f"{len(r.failure.steps)}`",
            ]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="7", help="comma-separated seeds, one walk each")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="record a broken invariant and walk on (the keys it named are excused after it)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dr_walk.md")
    args = parser.parse_args()
    began, start = datetime.now(UTC), time.monotonic()
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"dr-walk-{seed}-{uuid.uuid4().hex[:4]}-") as d:
            results.append(one_walk(seed, args.steps, Path(d), args))
    command = f"python bench/dr_walk.py --seeds {args.seeds} --steps {args.steps}"
    if args.keep_going:
        command += " --keep-going"
    text = report(results, command, began, time.monotonic() - start)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
