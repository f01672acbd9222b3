"""Benchmark: one task catching up a backlog over many pchannels with its daemon on 1 core and
on 2 cores (the daemon's threads pinned with sched_setaffinity, as ``taskset -a -c``), into a
Milvus target and into a Kafka target, in one run.

A real Milvus 2.3.5 source with its WAL in RocksMQ holds R rows (int64 key, DIM-float vector,
16-character title) over C collections of ``--shards`` shards each (so the task reads that many
pchannels or more; the source has 16). Then, per round, for each core set and each target, a
fresh daemon (SQLite) is started, pinned, and one task replicates every collection:

- Milvus target: a second Milvus 2.3.5 standalone; timed from the create request until the
  daemon reports R rows acknowledged by the target (then the target's count(*) must read R;
  the collections are dropped before the next run);
- Kafka target: a fresh librdkafka mock a run (a topic per collection), timed until the
  topics' end offsets stop growing, then read back with read_committed: exactly R row events.
  Its collections are made without an index (so not loaded): the WAL is the same, and a
  collection is made in 25 ms instead of 3 s, so a backlog of millions of rows (a collection
  per 20,000: the mock keeps about 5 MB a partition) is written in a minute or two.

Per run: events/s, MB of WAL per second (the Insert messages' bytes the daemon reports), the
daemon's CPU-seconds per GB of WAL, the cores it used on average, and the load average of the
machine when the run ended (the machine may be shared: the load says how far to trust a run).
The baseline of the same run is the line of the same round, target, code and settings on the
first core set (1 core): the table's ratio is each line's events/s over it, the scaling from 1
to 2 cores of that daemon.

    python bench/catch_up_by_cores.py [--rows 400000] [--dims milvus=128,kafka=8] [--shards 8]
        [--rounds 3] [--targets milvus,kafka] [--cores 0:0,1] [--daemon-configs JSON]
        [--code LABEL=CHECKOUT ...] [--out bench/results/catch_up_by_cores.md]

``--pause-source``: the source Milvus (every process of it) is stopped with SIGSTOP once the
task is created and continued once the line ends, so its own background work (the backlog's
segments compacted and indexed, its time ticks) takes nothing of the cores the daemon is pinned
to: the daemon reads the WAL from RocksMQ's files and the metadata from etcd, neither of which
needs the source's process. In production the source runs on machines of its own; on this
2-core machine it took 0.35-0.43 of a core during each catch-up, which is what a 1-to-2-core
ratio cannot tell from the daemon's scaling. The source's cores column then reads about 0.

``--daemon-configs``: a JSON list of top-level daemon settings, each measured in every round
(default ``[{}]``; a Milvus target runs with the first settings only); the report names them.
``--raw-baseline``: after each Kafka line (its daemon stopped), the events it wrote, as read
back, are written again by raw producers, one process per channel group of the daemon (the
topics dealt among them), pinned to the line's cores, into a fresh mock: what producing the
same bytes alone makes on the same cores, with the mock sharing them as it does with the
daemon. Its own 1-to-2-core ratio is the machine's for producing; a daemon's ratio below it
is the daemon's, the rest is the machine's.
``--code``: as in ``kafka_sink.py``, a checkout whose daemon runs as ``python -m server``
(several: each in every round, on the same backlog, the label before the settings in the
table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pickle
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import TreeMemorySampler, settle, tree_cpu  # noqa: E402
from harness import services  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import milvus_source_rocksmq  # noqa: E402
from harness.process_tree import descendants  # noqa: E402
from kafka_sink import (  # noqa: E402
    EVENTS_PER_TOPIC,
    SHM,
    EndOffsets,
    make_positions_topic,
    raw_in_own_processes,
    read_all,
    row_events,
    watch,
    write_backlog,
)
from replication_throughput import add_code_option, code_choices, count, start_daemon  # noqa: E402
from results_file import code_version  # noqa: E402

MB = 1024 * 1024


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants (the fork server of its channel groups)
    on ``cpus`` (threads and processes they start later inherit it)."""
    for each in descendants(pid):
        with contextlib.suppress(OSError):  # ended meanwhile
            for tid in os.listdir(f"/proc/{each}/task"):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def source_paused(pid: int, paused: bool):
    """Every process of ``pid``'s tree stopped (SIGSTOP) while the block runs, when ``paused``;
    continued after, however the block ends."""
    stopped = descendants(pid) if paused else []
    for each in stopped:
        os.kill(each, signal.SIGSTOP)
    try:
        yield
    finally:
        for each in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)


def follow_progress(daemon, task_id: str, pid: int, rows: int, timeout: float) -> dict:
    """Poll the task until it reports ``rows`` rows acknowledged by the target: the moments
    (and the daemon's CPU) of the first rows reported and of the last."""
    deadline = time.monotonic() + timeout
    first = None
    cpu_first = 0.0
    while time.monotonic() < deadline:
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        if task["state"] != "Running":
            raise AssertionError(f"task {task['state']}: {task['reason']}")
        done = (task.get("progress") or {}).get("rows") or 0
        now = time.perf_counter()
        if done and first is None:
            first, cpu_first = now, tree_cpu(pid)
        if done >= rows:
            return {"first": first, "last": now, "cpu_first": cpu_first, "cpu_last": tree_cpu(pid)}
        time.sleep(0.1)
    raise TimeoutError(f"the task did not report {rows} rows in {timeout:g} s")


def raw_producers(
    records: list[tuple[str, bytes, bytes]], cpus: set[int], processes: int, work: Path
) -> dict:
    """The line's row events, as read back, written again into a fresh mock by ``processes``
    raw producers (a process each, the topics dealt among them, as the daemon deals its
    channels among its groups) pinned to the line's cores: what producing those bytes alone
    makes on those cores, the mock sharing them as it shares them with the daemon."""
    topics = sorted({topic for topic, _, _ in records})
    share = {topic: at % processes for at, topic in enumerate(topics)}
    parts: list[list[tuple[str, bytes, bytes]]] = [[] for _ in range(processes)]
    for record in records:
        parts[share[record[0]]].append(record)
    with tempfile.TemporaryDirectory(dir=SHM) as shm:  # RAM: no disk writeback meanwhile
        files = []
        for at, part in enumerate(parts):
            path = Path(shm) / f"records{at}.pickle"
            with path.open("wb") as f:
                pickle.dump(part, f, protocol=pickle.HIGHEST_PROTOCOL)
            files.append(path)
        del parts
        with kafka_mock_cluster(work / "kafka-raw") as kafka:
            mock0: list[float] = []
            results = raw_in_own_processes(
                kafka.bootstrap, files, "raw_", cpus, lambda: mock0.append(tree_cpu(kafka.pid))
            )
            mock_cpu = tree_cpu(kafka.pid) - mock0[0]
    seconds = max(s for s, _ in results)
    mock_cores = mock_cpu / seconds
    return {
        "raw_events_s": len(records) / seconds,
        "raw_cores_used": sum(cpu for _, cpu in results) / seconds,
        "raw_mock_cores": mock_cores,
    }


def task_bytes(daemon, task_id: str) -> int:
    task = daemon.call("get", {"task_id": task_id}).data["task"]
    return int((task.get("progress") or {}).get("bytes") or 0)


def one_run(
    args, work: Path, env: dict, target: str, cpus: set[int], config: dict, n: int, code=("", "")
) -> dict:
    """One catch-up of the whole backlog by a fresh daemon of ``code`` (label, checkout or "":
    the installed one) pinned to ``cpus``."""
    source, dst = env["source"], env["dst"]
    names = env["names"][target]
    run_dir = work / f"run{n}"
    run_dir.mkdir()
    raw: dict = {}
    records: list[tuple[str, bytes, bytes]] = []
    with contextlib.ExitStack() as stack:
        kafka = None
        if target == "kafka":  # a fresh mock a line: one that kept every earlier line's
            # topics (GBs of events) took 0.3-0.5 of a core by the second round
            kafka = stack.enter_context(kafka_mock_cluster(run_dir / "kafka"))
            make_positions_topic(kafka.bootstrap)
        daemon = start_daemon(
            stack,
            run_dir,
            env["etcd"],
            source,
            config,
            mqType="rocksmq",
            rocksmq={"path": str(source.rocksmq_path)},
            checkout=code[1],
        )
        assert daemon.process is not None
        pid = daemon.process.pid
        pin(pid, cpus)
        settle(pid, window=2.0, limit=30)
        cpu0 = tree_cpu(pid)
        others = [source.pid, kafka.pid if kafka is not None else env["dst_pid"]]
        others0 = [tree_cpu(other) for other in others]
        memory = TreeMemorySampler(pid, interval=0.2)
        memory.start()
        stack.callback(memory.stop.set)
        infos = [{"name": name} for name in names]
        t0 = time.perf_counter()
        if target == "milvus":
            created = daemon.call(
                "create",
                {"milvus_connect_param": {"uri": env["dst_uri"]}, "collection_infos": infos},
            )
            assert created.code == 200, created.body
            task_id = str(created.data["task_id"])
            with source_paused(source.pid, args.pause_source):
                seen = follow_progress(daemon, task_id, pid, args.rows, args.timeout)
            wal = task_bytes(daemon, task_id)
        else:
            prefix = f"ev{n}_"
            topics = [f"{prefix}{name}" for name in names]
            ends = EndOffsets(kafka.bootstrap, topics)
            created = daemon.call(
                "create",
                {
                    "kafka_connect_param": {
                        "address": kafka.bootstrap,
                        "topic": prefix + "{collection}",
                        "ddl_topic": f"ddl{n}_{uuid.uuid4().hex[:6]}",
                    },
                    "collection_infos": infos,
                },
            )
            assert created.code == 200, created.body
            task_id = str(created.data["task_id"])
            with source_paused(source.pid, args.pause_source):
                seen = watch(ends, pid, args.rows, args.timeout, quiet=2.0)
            wal = task_bytes(daemon, task_id)
        load = os.getloadavg()
        others_s = [tree_cpu(other) - before for other, before in zip(others, others0, strict=True)]
        memory.stop.set()
        memory.join()
        if kafka is not None:  # each row once (the line's mock is stopped with the block)
            records = row_events(read_all(kafka.bootstrap, topics))
            keys = {(t, k) for t, k, _ in records}
            assert len(records) == args.rows == len(keys), (len(records), len(keys), args.rows)
            del keys
    if records and args.raw_baseline:  # once the daemon and the line's mock are stopped
        processes = max(1, int(config.get("kafkaTargetProcesses") or 1))
        raw = raw_producers(records, cpus, processes, run_dir)
    del records
    if target == "milvus":
        total = sum(count(dst, name) for name in names)
        assert total == args.rows, f"the target holds {total} rows, not {args.rows}"
        for name in names:
            dst.drop_collection(name)
    seconds = seen["last"] - t0
    # both count the daemon's whole tree (its channel group processes included)
    cpu = seen["cpu_last"] - cpu0
    steady = seen["last"] - seen["first"]
    steady_cpu = seen["cpu_last"] - seen["cpu_first"]
    return {
        "target": target,
        "settings": " ".join(
            filter(None, [code[0], json.dumps(config, separators=(",", ":")) if config else ""])
        )
        or "-",
        "cores": len(cpus),
        "seconds": seconds,
        "events_s": args.rows / seconds,
        "steady_s": steady,
        "steady_events_s": args.rows / steady,
        "steady_mb_s": wal / MB / steady,
        "wal_mb": wal / MB,
        "cpu_s": cpu,
        "cpu_per_gb": cpu / (wal / 1024**3) if wal else math.nan,
        "steady_cpu_per_gb": steady_cpu / (wal / 1024**3) if wal else math.nan,
        "cores_used": steady_cpu / steady,
        # what the machine's other busy processes took meanwhile (from create to the last event)
        "others_cores": [spent / seconds for spent in others_s],
        "peak_rss_mb": memory.peak[0] / 1024,
        "peak_pss_mb": memory.peak[1] / 1024,
        "load": load,
        **raw,
    }


def run(args, work: Path) -> tuple[list[dict], dict]:
    from pymilvus import MilvusClient

    info: dict = {}
    runs: list[dict] = []
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        source = stack.enter_context(
            milvus_source_rocksmq(work / "source", etcd.endpoint, root_path="bench")
        )
        env: dict = {"etcd": etcd.endpoint, "source": source}
        dst = None
        if "milvus" in args.targets:
            target = stack.enter_context(
                milvus_source_rocksmq(work / "target", etcd.endpoint, root_path="target")
            )
            env["dst_uri"], env["dst_pid"] = target.uri, target.pid
            dst = MilvusClient(uri=target.uri, dedicated=True)
            stack.callback(dst.close)
        env["dst"] = dst
        src = MilvusClient(uri=source.uri, dedicated=True)
        stack.callback(src.close)
        run_id = uuid.uuid4().hex[:6]
        env["names"] = {}
        started = time.perf_counter()
        for target_kind in args.targets:
            dim = args.dims[target_kind]
            collections = args.collections or math.ceil(
                args.rows / (EVENTS_PER_TOPIC if target_kind == "kafka" else 200_000)
            )
            names = [f"{target_kind}_{run_id}_{i:03d}" for i in range(collections)]
            env["names"][target_kind] = names
            # a Kafka target's collections are not indexed (nor loaded): only a Milvus target's
            # rows are counted, by a query of the target
            write_backlog(
                src, names, args.rows, dim, shards=args.shards, index=target_kind == "milvus"
            )
        info["write_s"] = time.perf_counter() - started
        info["collections"] = {t: len(names) for t, names in env["names"].items()}
        settle(source.pid)
        n = 0
        for round_ in range(args.rounds):
            for target_kind in args.targets:
                # a Milvus target runs the first settings only (the others are a Kafka target's)
                configs = args.daemon_configs if target_kind == "kafka" else args.daemon_configs[:1]
                for code in args.code:
                    for config in configs:
                        for cpus in args.cores:
                            n += 1
                            result = one_run(args, work, env, target_kind, cpus, config, n, code)
                            result["round"] = round_ + 1
                            runs.append(result)
                            print(json.dumps(result), flush=True)
    return runs, info


def report(args, runs: list[dict], info: dict, command: str) -> str:
    lines = [
        "| round | target | daemon settings | cores | s from create | s first to last event "
        "(steady) | steady events/s | steady MB WAL/s | CPU-s (from create) | CPU-s per GB WAL "
        "(from create / steady) | cores used (steady) | steady events/s over the same daemon's "
        "on the first core set | source / target cores used (from create) "
        "| peak RSS / PSS MB (daemon and groups) "
        "| load average 1/5/15 min at its end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[tuple[str, str, int], list[float]] = {}
    for r in runs:
        first = next(
            x
            for x in runs
            if (x["round"], x["target"], x["settings"]) == (r["round"], r["target"], r["settings"])
        )
        ratio = ""
        if first is not r:
            value = r["steady_events_s"] / first["steady_events_s"]
            ratios.setdefault((r["target"], r["settings"], r["cores"]), []).append(value)
            ratio = f"{value:.2f}"
        lines.append(
            f"| {r['round']} | {r['target']} | {r['settings']} | {r['cores']} "
            f"| {r['seconds']:.1f} | {r['steady_s']:.1f} | {r['steady_events_s']:,.0f} "
            f"| {r['steady_mb_s']:.1f} | {r['cpu_s']:.1f} "
            f"| {r['cpu_per_gb']:.1f} / {r['steady_cpu_per_gb']:.1f} | {r['cores_used']:.2f} "
            f"| {ratio} | {' / '.join(f'{v:.2f}' for v in r['others_cores'])} "
            f"| {r['peak_rss_mb']:.0f} / {r['peak_pss_mb']:.0f} "
            f"| {' / '.join(f'{v:.1f}' for v in r['load'])} |"
        )
    summary = [
        f"- {target}, settings {settings}, {cores} core(s): "
        f"{', '.join(f'{v:.2f}' for v in values)}x the same daemon on the first core set "
        f"(median {statistics.median(values):.2f})"
        for (target, settings, cores), values in ratios.items()
    ]
    raws = [r for r in runs if "raw_events_s" in r]
    if raws:
        summary += ["", *raw_lines(raws)]
    wal_mb = {
        t: statistics.median(r["wal_mb"] for r in runs if r["target"] == t) for t in args.targets
    }
    backlogs = "; ".join(
        f"for the {t} target {args.rows:,} rows (int64 key, {args.dims[t]}-float vector, "
        f"16-character title) over {info['collections'][t]} collections of {args.shards} "
        f"shards, {wal_mb.get(t, 0.0):.1f} MB of Insert messages"
        for t in args.targets
    )
    return "\n".join(
        [
            f"Command: `{command}`",
            f"Code: {code_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{platform.node()}, Python {platform.python_version()}, {os.cpu_count()} cores",
            "",
            f"Backlogs in a Milvus 2.3.5 source on RocksMQ, written in {info['write_s']:.0f} s: "
            f"{backlogs}. Each line a fresh daemon and task catching up "
            "all of it; CPU, cores used and memory are the daemon's (its descendant processes "
            "included: RSS counts a page shared by two processes twice, PSS splits it; peak "
            "from the create request to the last event, sampled every 0.2 s; the source, the "
            "target and the bench share the machine's cores"
            + (
                "; the source Milvus stopped with SIGSTOP from each create to the line's end)."
                if args.pause_source
                else ")."
            ),
            "",
            *lines,
            "",
            *summary,
            "",
        ]
    )


def raw_lines(raws: list[dict]) -> list[str]:
    """The raw producers' baseline (``--raw-baseline``): a table of each Kafka line's events/s
    beside the raw producers' on the same cores, and the raw producers' own scaling."""
    lines = [
        "Baseline of each Kafka line (`--raw-baseline`): its events, as read back, written "
        "again by raw confluent-kafka producers (one process per channel group of the daemon, "
        "the topics dealt among them, no transactions) pinned to the same cores, into a fresh "
        "mock:",
        "",
        "| round | daemon settings | cores | daemon steady events/s | raw producers events/s "
        "| daemon over raw | raw producers' cores used (their processes / the mock) "
        "| raw events/s over the raw on the first core set |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in raws:
        first = next(x for x in raws if (x["round"], x["settings"]) == (r["round"], r["settings"]))
        lines.append(
            f"| {r['round']} | {r['settings']} | {r['cores']} | {r['steady_events_s']:,.0f} "
            f"| {r['raw_events_s']:,.0f} | {r['steady_events_s'] / r['raw_events_s']:.2f} "
            f"| {r['raw_cores_used']:.2f} / {r['raw_mock_cores']:.2f} "
            f"| {r['raw_events_s'] / first['raw_events_s']:.2f} |"
        )
    return lines


def parse_cores(text: str) -> list[set[int]]:
    return [{int(c) for c in part.split(",")} for part in text.split(":")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument(
        "--dims",
        default="milvus=128,kafka=8",
        help="vector size per target (a Kafka topic of the mock keeps ~20 MB: small rows)",
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument(
        "--collections",
        type=int,
        default=0,
        help="per target; default: one per 20,000 rows (Kafka), 200,000 rows (Milvus)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default="milvus,kafka")
    parser.add_argument(
        "--cores", default="0:0,1", help="core sets to pin the daemon to, ':' between sets"
    )
    parser.add_argument(
        "--daemon-configs",
        type=json.loads,
        default=[{}],
        help="a JSON list of the daemon settings to run with (each a line per core set)",
    )
    parser.add_argument(
        "--pause-source",
        action="store_true",
        help="stop the source Milvus (SIGSTOP) from the create to the line's end",
    )
    add_code_option(parser, "")
    parser.add_argument(
        "--raw-baseline",
        action="store_true",
        help="after each Kafka line, its events written again by raw producers (as many "
        "processes as the daemon's kafkaTargetProcesses) pinned to the same cores",
    )
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default=str(REPO / "bench/results/catch_up_by_cores.md"))
    args = parser.parse_args()
    args.code = code_choices(args.code, "")
    args.dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(","))}
    args.targets = args.targets.split(",")
    command = "python bench/catch_up_by_cores.py " + shlex.join(sys.argv[1:])
    args.cores = parse_cores(args.cores)
    with tempfile.TemporaryDirectory(prefix="bench-cores-") as tmp:
        runs, info = run(args, Path(tmp))
    text = report(args, runs, info, command)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
