"""Benchmark: verify's rows compared per second against reading both sides with pymilvus in one
process, same data, same run, same machine.

Two real Milvus 2.3.5 standalones (RocksMQ) hold the same R rows (int64 key, a DIM-float vector,
a 32-character title).

- baseline: one process iterates both collections with pymilvus's ``query_iterator`` (batches
  of B, key order) and compares them row by row as it goes (a merge on the key: nothing held);
- verify: the verify's own code (replicator/compare: plan the key ranges from the source's keys,
  then per range digest both sides from the query answers' columns and compare the digests),
  for several numbers of ranges and of ranges compared at once (threads,
  ``verify.parallelism``);
- verify as rows: the verify as it was before the column digests (planning with Strong pages,
  each range read on both sides as pymilvus rows, ``{key: row hash}``), for the
  ``--as-rows ranges:parallelism`` runs;
- verify on Spark: the digests of every range as one Spark job (``--spark`` numbers of ranges,
  on ``--spark-master``), as a collection of at least ``verify.sparkMinRows`` rows is verified.

The baseline runs before and after the verify runs; its mean is the reference. Both sides are
equal, so no range is read twice: this measures the common case.

    python bench/verify.py [--rows 1000000] [--dim 8] [--batch 5000] [--ranges 4,16]
        [--parallelism 1,2,4] [--as-rows 16:2] [--spark 8] [--spark-master local[2]]
        [--out bench/results/verify.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from backfill import create_collection, load_source  # noqa: E402  (bench/backfill.py)
from harness import services  # noqa: E402
from harness.milvus_source import milvus_source_rocksmq  # noqa: E402
from pymilvus import MilvusClient  # noqa: E402

from replicator.backfill.job import plan_collection  # noqa: E402
from replicator.backfill.ranges import range_rows_for  # noqa: E402
from replicator.backfill.state import CollectionRef  # noqa: E402
from replicator.compare.gate import now_ts  # noqa: E402
from replicator.compare.reader import range_digest, schema_of  # noqa: E402
from replicator.compare.spark_launch import SparkDigests  # noqa: E402
from replicator.compare.verify import CollectionVerifier, RangeOutcome, VerifyOptions  # noqa: E402

NAME = "bench"


def load(uris: list[str], rows: int, dim: int) -> float:
    """The same rows (bench/backfill.py's generator, one seed) into each side, flushed and
    loaded."""
    started = time.perf_counter()
    for uri in uris:
        client = MilvusClient(uri=uri, dedicated=True)
        create_collection(client, NAME, dim)
        load_source(client, NAME, rows, dim)
        client.load_collection(NAME)
        client.close()
    return time.perf_counter() - started


def _iterate(client: MilvusClient, batch: int) -> Any:
    pages = client.query_iterator(
        NAME, batch_size=batch, output_fields=["*"], consistency_level="Strong"
    )
    try:
        while page := pages.next():
            yield from page
    finally:
        pages.close()


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["title"] == b["title"] and list(map(float, a["vec"])) == list(map(float, b["vec"]))


def baseline(source_uri: str, target_uri: str, batch: int) -> tuple[float, int]:
    """Read both sides in key order in one process and compare them as they come."""
    source = MilvusClient(uri=source_uri, dedicated=True)
    target = MilvusClient(uri=target_uri, dedicated=True)
    started = time.perf_counter()
    compared = differing = 0
    left, right = _iterate(source, batch), _iterate(target, batch)
    a, b = next(left, None), next(right, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a["id"] < b["id"]):
            differing += 1
            a = next(left, None)
        elif a is None or b["id"] < a["id"]:
            differing += 1
            b = next(right, None)
        else:
            differing += not _same(a, b)
            a, b = next(left, None), next(right, None)
        compared += 1
    spent = time.perf_counter() - started
    source.close()
    target.close()
    assert differing == 0, f"the baseline found {differing} differing rows"
    return spent, compared


def _as_rows(verifier: CollectionVerifier, key_range: Any) -> RangeOutcome:
    """The verify as it was before the column digests: both sides read as pymilvus rows,
    ``{key: row hash}``, their digests compared (both sides are equal here, so the digests
    agree and nothing is read again)."""
    read = verifier._read(key_range)
    assert range_digest(read.source) == range_digest(read.target), key_range
    return RangeOutcome(key_range, len(read.source))


def verify(
    source_uri: str,
    target_uri: str,
    rows: int,
    ranges: int,
    parallelism: int,
    batch: int,
    as_rows: bool = False,
) -> tuple[float, float, int, int]:
    """The verify's code over the whole collection: (seconds, of which planning, rows compared,
    ranges). ``as_rows``: the verify before the column digests (planning with Strong pages,
    ranges read as pymilvus rows)."""
    source = MilvusClient(uri=source_uri, dedicated=True)
    target = MilvusClient(uri=target_uri, dedicated=True)
    options = VerifyOptions(range_rows_for(rows, ranges), batch, 4, 60.0, parallelism)
    ref = CollectionRef("default", NAME, "default", NAME)
    started = time.perf_counter()
    # planned as the job plans (replicator/compare/job.py)
    plan = plan_collection(source, ref, options.range_rows, 0 if as_rows else now_ts())
    planning = time.perf_counter() - started
    verifier = CollectionVerifier(
        source, target, plan, schema_of(source, NAME), options, lambda: 1 << 62, threading.Event()
    )
    compared = divergent = 0
    lock = threading.Lock()

    def one(key_range: Any) -> None:
        nonlocal compared, divergent
        outcome = _as_rows(verifier, key_range) if as_rows else verifier.verify(key_range)
        with lock:
            compared += outcome.rows_compared
            divergent += len(outcome.divergence.keys)

    with ThreadPoolExecutor(parallelism) as pool:
        list(pool.map(one, plan.ranges))
    spent = time.perf_counter() - started
    source.close()
    target.close()
    assert divergent == 0, f"the verify found {divergent} differing rows"
    return spent, planning, compared, len(plan.ranges)


def _pairs(spec: str) -> list[tuple[str, str]]:
    """ "16:2,4:1" as [("16", "2"), ("4", "1")] ("" as none)."""
    return [tuple(item.split(":", 1)) for item in spec.split(",") if item]  # type: ignore[misc]


def spark_verify(
    source_uri: str, target_uri: str, rows: int, ranges: int, batch: int, master: str
) -> tuple[float, float, int, int]:
    """The verify with its digests on Spark (as a collection of at least verify.sparkMinRows):
    plan, then one Spark job over the ranges (the session's start-up included); the ranges
    whose digests differ would then be compared by the daemon (here none do)."""
    source = MilvusClient(uri=source_uri, dedicated=True)
    ref = CollectionRef("default", NAME, "default", NAME)
    started = time.perf_counter()
    plan = plan_collection(source, ref, range_rows_for(rows, ranges), now_ts(), exact=False)
    planning = time.perf_counter() - started
    runner = SparkDigests(1, master, {"spark.ui.enabled": "false"}, tempfile.gettempdir())
    sides = ({"uri": source_uri}, {"uri": target_uri})
    found = runner.run(
        "bench", plan, schema_of(source, NAME), sides, batch, now_ts(), threading.Event()
    )
    spent = time.perf_counter() - started
    source.close()
    assert found is not None
    assert len(found) == len(plan.ranges), found
    differing = [i for i, (a, b) in found.items() if a is None or a != b]
    assert not differing, f"ranges {differing} differ"
    compared = sum(a.count for a, _ in found.values() if a is not None)
    return spent, planning, compared, len(plan.ranges)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--ranges", default="4,16")
    parser.add_argument("--parallelism", default="1,2,4")
    # numbers of ranges digested on Spark (--spark-master), e.g. "8,32"; "" for none
    parser.add_argument("--spark", default="")
    parser.add_argument("--spark-master", default="local[2]")
    # ranges:parallelism runs of the verify as it was before the column digests
    parser.add_argument("--as-rows", default="16:2")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "verify.md"))
    args = parser.parse_args()
    began = time.perf_counter()
    results: list[tuple[str, float, int]] = []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-verify-")))
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        src = stack.enter_context(
            milvus_source_rocksmq(work / "src", etcd.endpoint, root_path="vf-src")
        )
        dst = stack.enter_context(
            milvus_source_rocksmq(work / "dst", etcd.endpoint, root_path="vf-dst")
        )
        load_s = load([src.uri, dst.uri], args.rows, args.dim)
        print(f"both sides loaded: {args.rows:,} rows each in {load_s:.1f} s", flush=True)

        base = []
        for tag in ("before", "after"):
            if tag == "after":
                runs = [(int(r), int(p), True) for r, p in _pairs(args.as_rows)]
                runs += [
                    (ranges, parallelism, False)
                    for ranges in map(int, args.ranges.split(","))
                    for parallelism in map(int, args.parallelism.split(","))
                ]
                for ranges in [int(r) for r in args.spark.split(",") if r]:
                    spent, planning, compared, made = spark_verify(
                        src.uri, dst.uri, args.rows, ranges, args.batch, args.spark_master
                    )
                    assert compared == args.rows, compared
                    label = f"verify on Spark {args.spark_master}, {made} ranges"
                    results.append((label, spent, planning, compared))
                    print(f"{label}: {compared / spent:,.0f} rows/s", flush=True)
                for ranges, parallelism, as_rows in runs:
                    spent, planning, compared, made = verify(
                        src.uri, dst.uri, args.rows, ranges, parallelism, args.batch, as_rows
                    )
                    assert compared == args.rows, compared
                    how = "rows (before)" if as_rows else "columns"
                    label = f"verify as {how}, {made} ranges, {parallelism} at once"
                    results.append((label, spent, planning, compared))
                    print(f"{label}: {compared / spent:,.0f} rows/s", flush=True)
            spent, compared = baseline(src.uri, dst.uri, args.batch)
            assert compared == args.rows, compared
            base.append(spent)
            results.append((f"pymilvus, one process ({tag})", spent, 0.0, compared))
            print(f"baseline {tag}: {compared / spent:,.0f} rows/s", flush=True)
    base_rate = args.rows / (sum(base) / len(base))
    rows = [
        f"| {label} | {spent:.1f} | {f'{planning:.1f}' if planning else '-'} "
        f"| {compared / spent:,.0f} | {compared / spent / base_rate:.2f} |"
        for label, spent, planning, compared in results
    ]
    text = "\n".join(
        [
            "# Verify: rows compared per second against reading both sides in one process",
            "",
            f"`{' '.join(['python', 'bench/verify.py', *sys.argv[1:]])}` on this machine "
            f"({os.cpu_count()} cores, shared; Python {platform.python_version()}), "
            f"{time.strftime('%Y-%m-%d')}. Source and target: two real Milvus 2.3.5 standalones "
            f"(RocksMQ) on the same machine, each holding the same {args.rows:,} rows of int64 "
            f"key + {args.dim}-float vector + 32-character title; pages of {args.batch}.",
            "",
            "| comparer | seconds | of which planning | rows compared/s "
            "| ratio to the baseline (mean of 2) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "The verify rows include planning (reading every source key once to cut the "
            'ranges); "as rows" is the verify before the column digests (ranges read as '
            'pymilvus rows, planning with Strong pages), "columns" the verify now (ranges '
            "digested from the query answers' columns, planning at a timestamp). "
            "The Spark rows include the Spark session's start-up (a driver process, its JVM "
            "and Python workers) and planning. "
            f"Loading both sides took {load_s:.1f} s; the whole benchmark "
            f"{time.perf_counter() - began:.0f} s.",
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
