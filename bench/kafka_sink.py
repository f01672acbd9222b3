"""Benchmark: a Kafka target's events per second and MB/s, against a raw confluent-kafka producer
writing the same bytes, in one run.

A real Milvus 2.3.5 source with its WAL in RocksMQ, the librdkafka mock as the target Kafka, the
daemon on SQLite. The mock keeps about 5 MB per partition (older record batches are dropped) and
makes every topic with 4 partitions, so a large backlog is spread over C collections, each with
an event topic of its own (``events_{collection}``), about 20,000 events (10 MB) a topic.

1. Backlog: R rows (int64 key + DIM-float vector + a 16-character title) written into the
   source with pymilvus over C collections while no task exists; the source is flushed and
   left until quiet.
2. Daemon: a task with a Kafka target is created (its positions topic made first, as an
   operator would). The topics' end offsets are polled (every 0.1 s, one ListOffsets request)
   until they stop growing; then every topic is read back with read_committed and counted:
   exactly R row events, one per row. Two times are reported: from the create request (task
   start included) and from the first event seen on a topic (the steady per-event path: WAL
   read, decode, JSON events, transactions), both until the last growth of the offsets. The
   daemon's CPU-seconds are taken at the same three moments.
3. Baseline: the same keys and values (as read back, topic by topic) written by one
   confluent-kafka producer (linger.ms 5, no transactions) into topics of their own (one per
   collection, as the daemon's) of a fresh mock, until flushed; three times (the machine is
   shared and its load varies), the median counts. The producer runs in a fresh interpreter
   of its own, the records handed over in a file: run in the bench's process, it made every
   later daemon round slower. The producer's process CPU is noted too:
   CPU per event compares the two writers whatever the load.

    python bench/kafka_sink.py [--rows 20000] [--dim 8] [--collections N] [--rounds N]
                               [--code LABEL=CHECKOUT ...] [--daemon-configs JSON]
                               [--out bench/results/kafka_sink.md] [--profile FILE]
                               [--profile-idle] [--profile-gil]

Steps 2 and 3 run ``--rounds`` times on the one backlog, each round with a fresh mock and a
fresh metastore, once for every ``--code`` (a checkout whose daemon runs as ``python -m
server``: ``--code before=/tmp/old --code after=.`` compares two trees on the same backlog and
against the same baseline's rounds; default: the installed daemon), and once for every
``--daemon-configs`` entry (top-level daemon settings: ``'[{}, {"kafkaTargetProcesses": 2}]'``
runs the task in the daemon and in two channel group processes; CPU is the daemon's with its
child processes). The report is appended to
``--out``. ``--profile``: py-spy (in the virtualenv or on PATH)
samples the daemon at 100 Hz without pausing it, from the create request to the last event;
its collapsed stacks are written to FILE (``--profile-idle``: the waiting threads too, each
thread apart: where the daemon waits; ``--profile-gil``: only the samples of a thread holding
the interpreter lock, at 250 Hz: where its Python CPU goes, even on a loaded machine), channel
group processes included, one file a round (``FILE.round<n>_<code>_<config>``) when there are
several.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import cpu_seconds, settle, tree_cpu  # noqa: E402
from harness import services  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import milvus_source_rocksmq  # noqa: E402
from harness.process_tree import descendants  # noqa: E402
from replication_throughput import add_code_option, code_choices, start_daemon  # noqa: E402

MB = 1024 * 1024
RAW_RUNS = 3
WARM_UP = 200_000  # records the raw producer's process writes first, untimed
# where the raw producer finds the records (memory: no disk writeback during its runs)
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None
EVENTS_PER_TOPIC = 20_000  # about 10 MB a topic: 2.5 MB a partition, under the mock's 5 MB


def write_backlog(
    client,
    names: list[str],
    rows: int,
    dim: int,
    batch: int = 5000,
    shards: int = 1,
    index: bool = True,
) -> None:
    """``rows`` rows over the collections ``names`` (ids 0..rows-1, a contiguous range each) of
    ``shards`` shards each; ``index`` False: the collections made without an index, so not
    loaded either (25 ms a collection of 8 shards against 3 s: the WAL holds the same)."""
    import numpy as np
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("title", DataType.VARCHAR, max_length=32)
    index_params = client.prepare_index_params()
    index_params.add_index("vec", index_type="FLAT", metric_type="L2")
    vectors = np.random.default_rng(3).random((rows, dim), dtype=np.float32)
    share = math.ceil(rows / len(names))
    for n, name in enumerate(names):
        client.create_collection(
            name, schema=schema, index_params=index_params if index else None, num_shards=shards
        )
        first, last = n * share, min(rows, (n + 1) * share)
        for lo in range(first, last, batch):
            hi = min(last, lo + batch)
            client.insert(
                name,
                [{"id": i, "vec": vectors[i], "title": f"title-{i:010d}"} for i in range(lo, hi)],
            )
    for name in names:
        client.flush(name)


def read_all(
    bootstrap: str, topics: list[str], timeout: float = 300
) -> list[tuple[str, bytes, bytes]]:
    """Every record of ``topics`` as (topic, key, value), read with read_committed."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # a partition the mock trimmed (past 5 MB) is read from its first record kept: the
            # count then falls short and says so, where a reset to the end read nothing
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(timeout=10).topics
        assigned = [
            TopicPartition(topic, p, OFFSET_BEGINNING)
            for topic in topics
            for p in metadata[topic].partitions
        ]
        consumer.assign(assigned)
        waiting = {(tp.topic, tp.partition) for tp in assigned}
        found: list[tuple[str, bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for message in consumer.consume(10000, 0.5):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        waiting.discard((message.topic(), message.partition()))
                    continue
                found.append((message.topic(), message.key() or b"", message.value() or b""))
        if waiting:
            raise TimeoutError(f"{len(waiting)} partitions not read to their end")
        return found
    finally:
        consumer.close()


def row_events(records: list[tuple[str, bytes, bytes]]) -> list[tuple[str, bytes, bytes]]:
    return [r for r in records if b'"row":' in r[2]]


class EndOffsets:
    """The sum of some topics' end offsets (records and transaction markers), one ListOffsets
    request for all their partitions."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.topics = topics
        self.partitions: list = []

    def total(self) -> int:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if len(self.partitions) < 4 * len(self.topics):  # topics appear as the task writes
            known = self.admin.list_topics(timeout=10).topics
            self.partitions = [
                TopicPartition(t, p) for t in self.topics if t in known for p in known[t].partitions
            ]
        if not self.partitions:
            return 0
        futures = self.admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in self.partitions}, request_timeout=10
        )
        return sum(f.result().offset for f in futures.values())


def librdkafka_cpu(pid: int) -> float:
    """CPU seconds so far of the librdkafka threads (named ``rdk:...``) of the process and its
    descendants alive now (a daemon's channel groups): the part of its CPU spent outside the
    interpreter (it runs beside it, on another core when there is one)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for each in descendants(pid):
        try:
            tasks = list(Path(f"/proc/{each}/task").iterdir())
        except OSError:  # the process ended meanwhile
            continue
        for task in tasks:
            try:
                if not (task / "comm").read_text().startswith("rdk:"):
                    continue
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            total += int(fields[11]) + int(fields[12])
    return total / tick


def watch(ends: EndOffsets, pid: int, rows: int, timeout: float, quiet: float = 3.0) -> dict:
    """Poll the end offsets until they passed ``rows`` and did not grow for ``quiet`` seconds:
    the moments of the first and of the last growth, and the daemon's CPU (its child
    processes included; and its librdkafka threads') at each."""
    deadline = time.monotonic() + timeout
    first = last = None
    cpu_first = cpu_last = rdk_first = rdk_last = 0.0
    seen = 0
    while time.monotonic() < deadline:
        now, total = time.perf_counter(), ends.total()
        if total > seen:
            cpu = tree_cpu(pid)
            rdk = librdkafka_cpu(pid)
            if first is None:
                first, cpu_first, rdk_first = now, cpu, rdk
            last, cpu_last, rdk_last, seen = now, cpu, rdk, total
        elif seen >= rows and last is not None and now - last > quiet:
            return {
                "first": first,
                "last": last,
                "cpu_first": cpu_first,
                "cpu_last": cpu_last,
                "rdk_steady": rdk_last - rdk_first,
            }
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {rows} records after {timeout:g} s ({seen})")


def make_positions_topic(bootstrap: str) -> None:
    """What an operator does before the first task (the mock makes a topic on first use)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("milvus-cdc-positions", b"{}", b"bench")
    producer.flush(10)


def raw_produce(
    bootstrap: str, records: list[tuple[str, bytes, bytes]], prefix: str
) -> tuple[float, float]:
    """Seconds until flushed, and this process's CPU-seconds meanwhile (the client's threads
    included)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    (cpu0,) = cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    for topic, key, value in records:
        while True:
            try:
                producer.produce(prefix + topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    seconds = time.perf_counter() - t0
    return seconds, cpu_seconds(os.getpid())[0] - cpu0


def raw_in_own_process(bootstrap: str, records_file: Path, prefix: str) -> tuple[float, float]:
    """:func:`raw_produce` of the records pickled in ``records_file``, in a fresh interpreter
    (``--raw-child``). Run in this process, the baseline made every later round of a daemon
    in two processes 25-30% slower (2.51 s steady, then 3.22 s after two rounds' raw runs,
    2026-12-07; 2.44 s once the raw producer ran apart), and a forked child producing from
    this process's records paid copy-on-write on every page it touched (2x slower)."""
    ((seconds, cpu),) = raw_in_own_processes(bootstrap, [records_file], prefix)
    return seconds, cpu


def raw_in_own_processes(
    bootstrap: str,
    records_files: list[Path],
    prefix: str,
    cpus: set[int] | None = None,
    on_go: Callable[[], None] | None = None,
) -> list[tuple[float, float]]:
    """:func:`raw_in_own_process` of each file, each file's records by a producer of its own
    (as a daemon's channel groups each have theirs), every process pinned to ``cpus`` when
    given (``taskset``): each one's seconds and CPU-seconds. The timed runs begin together,
    once every process made its warm-up (``on_go`` is called just before)."""
    pinned = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
    children = [
        subprocess.Popen(
            [*pinned, sys.executable, __file__, "--raw-child", str(path), bootstrap, prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in records_files
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            child.kill()
    results = []
    if on_go is not None:
        on_go()
    for child in children:  # go
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write("go\n")
            child.stdin.flush()  # closed by communicate()
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            raise subprocess.CalledProcessError(child.returncode, child.args, out, err)
        seconds, cpu = json.loads(out.strip().splitlines()[-1])
        results.append((float(seconds), float(cpu)))
    return results


def raw_child(records_file: str, bootstrap: str, prefix: str) -> None:
    """The raw producer's run in its own interpreter, after a warm-up of WARM_UP records into
    topics of their own, untimed (a fresh process first pays for the memory its client's
    copies take; the daemon, long-running, has it)."""
    with open(records_file, "rb") as f:
        records = pickle.load(f)
    raw_produce(bootstrap, records[:WARM_UP], "warm_")
    print("ready", flush=True)
    sys.stdin.readline()  # the parent's go: every producer of a run begins together
    print(json.dumps(raw_produce(bootstrap, records, prefix)), flush=True)


@contextlib.contextmanager
def profiled(pid: int, out: Path, idle: bool = False, gil: bool = False):
    """py-spy sampling ``pid`` (not pausing it, 100 Hz) while the block runs; its collapsed
    stacks written to ``out`` (``idle``: waiting threads too, each thread's stacks apart; an
    ``out`` ending in ``.json``: speedscope's format, each thread's samples in time order)."""
    import shutil
    import signal
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    form = "speedscope" if out.suffix == ".json" else "raw"
    command = [spy, "record", "--nonblocking", "--format", form, "-p", str(pid), "-o", str(out)]
    command += ["--subprocesses"]  # a channel group's process too, each stack under its pid
    command += ["--idle", "--threads"] if idle else []
    command += ["--gil", "--rate", "250"] if gil else []
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)


def profile_file(args, work: Path) -> Path:
    """``--profile``'s file; with more than one daemon round, one file a round, the round's
    name (``round<n>_<code>_<config>``) before its suffix."""
    out = Path(args.profile)
    if args.rounds * len(args.code) * len(args.daemon_configs) == 1:
        return out
    return out.with_name(f"{out.stem}.{work.name}{out.suffix}")


def daemon_round(
    args, work: Path, source, etcd_endpoint: str, names: list[str], code, config: dict
) -> dict:
    """One round: a fresh Kafka mock, a daemon of ``code`` (label, checkout or "": the
    installed one) with the top-level settings ``config`` on a fresh metastore reading the
    whole backlog, then the raw producer of the same bytes three times, each into a fresh
    mock."""
    label, checkout = code
    settings = json.dumps(config, separators=(",", ":")) if config else ""
    result: dict = {
        "code": " ".join(filter(None, [label, settings])),
        "load_before": os.getloadavg(),
    }
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        daemon = start_daemon(
            stack,
            work,
            etcd_endpoint,
            source,
            config,
            mqType="rocksmq",
            rocksmq={"path": str(source.rocksmq_path)},
            checkout=checkout,
        )
        assert daemon.process is not None
        run_id = uuid.uuid4().hex[:8]
        topics = [f"events_{name}" for name in names]
        make_positions_topic(kafka.bootstrap)
        ends = EndOffsets(kafka.bootstrap, topics)
        spy = (
            profiled(
                daemon.process.pid, profile_file(args, work), args.profile_idle, args.profile_gil
            )
            if args.profile
            else None
        )
        with spy or contextlib.nullcontext():
            before = tree_cpu(daemon.process.pid)
            t0 = time.perf_counter()
            created = daemon.call(
                "create",
                {
                    "kafka_connect_param": {
                        "address": kafka.bootstrap,
                        "topic": "events_{collection}",
                        "ddl_topic": f"ddl_{run_id}",
                    },
                    "collection_infos": [{"name": name} for name in names],
                },
            )
            assert created.code == 200, created.body
            seen = watch(ends, daemon.process.pid, args.rows, args.timeout)
        result["daemon_s"] = seen["last"] - t0
        result["steady_s"] = seen["last"] - seen["first"]
        result["daemon_cpu_s"] = seen["cpu_last"] - before
        result["steady_cpu_s"] = seen["cpu_last"] - seen["cpu_first"]
        result["steady_rdk_s"] = seen["rdk_steady"]
        daemon.stop()
        records = row_events(read_all(kafka.bootstrap, topics))
        keys = {(t, k) for t, k, _ in records}
        assert len(records) == args.rows == len(keys), (len(records), len(keys), args.rows)
        result["events"] = len(records)
        result["mb"] = sum(len(k) + len(v) for _, k, v in records) / MB
    # three times, each into a fresh mock as the daemon had (a mock holding a run's 500 MB
    # already took 2-4x longer for the next): the machine is shared, its load varies
    raws = []
    with tempfile.TemporaryDirectory(dir=SHM) as shm:  # gone however the runs end (RAM)
        records_file = Path(shm) / "records.pickle"
        with records_file.open("wb") as f:
            pickle.dump(records, f, protocol=pickle.HIGHEST_PROTOCOL)
        for n in range(RAW_RUNS):
            with kafka_mock_cluster(work / f"kafka-raw{n}") as kafka:
                raws.append(raw_in_own_process(kafka.bootstrap, records_file, "raw_"))
                if n == 0:
                    written = read_all(kafka.bootstrap, ["raw_" + t for t in topics])
                    assert len(written) == len(records)
    result["raw_all_s"] = [s for s, _ in raws]
    result["raw_s"], result["raw_cpu_s"] = sorted(raws)[RAW_RUNS // 2]
    result["load_after"] = os.getloadavg()
    return result


def run(args, work: Path) -> dict:
    from pymilvus import MilvusClient

    result: dict = {"rounds": []}
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        source = stack.enter_context(
            milvus_source_rocksmq(work / "source", etcd.endpoint, root_path="bench")
        )
        src = MilvusClient(uri=source.uri, dedicated=True)
        stack.callback(src.close)
        run_id = uuid.uuid4().hex[:8]
        names = [f"ks_{run_id}_{n:03d}" for n in range(args.collections)]
        t_write = time.perf_counter()
        write_backlog(src, names, args.rows, args.dim, index=False)  # the WAL is the same
        result["write_s"] = time.perf_counter() - t_write
        settle(source.pid)
        for n in range(args.rounds):
            for m, code in enumerate(args.code):
                for c, config in enumerate(args.daemon_configs):
                    round_work = work / f"round{n}_{m}_{c}"
                    round_work.mkdir()
                    done = daemon_round(
                        args, round_work, source, etcd.endpoint, names, code, config
                    )
                    print(round_line(done), flush=True)
                    result["rounds"].append(done)
    return result


def round_line(r: dict) -> str:
    events = r["events"]
    load = f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"
    if r["steady_s"] > 0:
        steady = (
            f"{r['steady_s']:.2f} ({events / r['steady_s']:,.0f}) "
            f"| **{r['raw_s'] / r['steady_s']:.2f}** "
            f"| {r['steady_cpu_s'] / events * 1e6:.1f} µs "
            f"({r['steady_rdk_s'] / events * 1e6:.1f} µs) "
            f"| {r['steady_cpu_s'] / r['steady_s']:.2f}"
        )
    else:  # every event appeared between two looks at the offsets: no window to measure
        steady = "no window (every event in one look) | - | - | -"
    return (
        f"| {r['code']} | {r['raw_s']:.2f} ({events / r['raw_s']:,.0f}) "
        f"| {', '.join(f'{x:.2f}' for x in r['raw_all_s'])} "
        f"| {steady} "
        f"| {r['raw_cpu_s'] / events * 1e6:.1f} µs "
        f"| {r['daemon_s']:.2f} ({r['raw_s'] / r['daemon_s']:.2f}) | {load} |"
    )


def report(args, r: dict) -> str:
    command = (
        f"python bench/kafka_sink.py --rows {args.rows} --dim {args.dim} "
        f"--collections {args.collections} --rounds {args.rounds}"
        + "".join(f" --code {label}={path or '.'}" for label, path in args.code)
        + (
            f" --daemon-configs '{json.dumps(args.daemon_configs)}'"
            if args.daemon_configs != [{}]
            else ""
        )
    )
    first = r["rounds"][0]
    lines = [
        "| code (daemon settings) | raw: median s (events/s) | raw runs: s "
        "| daemon, steady: s (events/s) "
        "| ratio to raw | daemon CPU / event (of it librdkafka's threads) "
        "| daemon cores used (steady) | raw CPU / event "
        "| daemon from create: s (ratio) | load average (1 min) before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(round_line(done) for done in r["rounds"]),
    ]
    table = "\n".join(lines)
    machine = f"{platform.machine()}, Python {platform.python_version()}"
    return f"""`{command}` on this machine ({machine}),
{time.strftime("%Y-%m-%d %H:%M")} UTC. A real Milvus 2.3.5 source (RocksMQ) holding {args.rows:,}
rows over {args.collections} collections (int64 key, {args.dim}-float vector, 16-character title;
written in {r["write_s"]:.0f} s), the librdkafka mock as the Kafka, a topic per collection. Each
round: a fresh mock and a daemon on a fresh metastore reading the whole backlog, then the raw
producer of the same {first["events"]:,} events ({first["mb"]:.1f} MB of keys and values) three
times, each into a fresh mock and in a process of its own (after {WARM_UP:,} records untimed),
its median the baseline of that round.

{table}
"""


def main() -> None:
    if sys.argv[1:2] == ["--raw-child"]:
        raw_child(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument(
        "--collections",
        type=int,
        default=0,
        help=f"default: one per {EVENTS_PER_TOPIC:,} rows (the mock keeps ~5 MB a partition)",
    )
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--rounds", type=int, default=1, help="daemon rounds on one backlog")
    add_code_option(parser, "this")
    parser.add_argument(
        "--daemon-configs",
        type=json.loads,
        default=[{}],
        help="JSON list of top-level daemon settings, each run in every round (e.g. "
        "'[{}, {\"kafkaTargetProcesses\": 2}]')",
    )
    parser.add_argument("--profile", help="py-spy's collapsed stacks of the daemon to this file")
    parser.add_argument(
        "--profile-idle", action="store_true", help="with --profile: waiting threads too"
    )
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: only samples holding the interpreter lock (its CPU), at 250 Hz",
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "kafka_sink.md"))
    args = parser.parse_args()
    args.collections = args.collections or math.ceil(args.rows / EVENTS_PER_TOPIC)
    args.code = code_choices(args.code, "this")
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        result = run(args, Path(tmp))
    text = report(args, result)
    print(text)
    if args.out != "-":
        out = Path(args.out)
        with out.open("a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
