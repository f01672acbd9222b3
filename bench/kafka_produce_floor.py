"""Benchmark: what producing alone costs, the floor under a Kafka target's CPU per event.

The same records (the shape of ``bench/kafka_sink.py``'s events: a JSON value of about 480
bytes, a key ``["db","collection",pk]``, 20 topics) written into a fresh librdkafka mock by one
confluent-kafka producer, in three ways, each in a fresh interpreter of its own after a
warm-up of the same records into topics of their own:

- *loop*: ``produce`` called from a Python loop, a record at a time, no transactions (the raw
  producer ``bench/kafka_sink.py`` compares the daemon with): the baseline;
- *mapped*: the daemon's own ``produce_runs`` (``replicator/sinks/kafka.py``: ``produce``
  mapped over a transaction's messages in C), here a run of one topic, no transactions;
- *transactions*: the same in transactions of 20,000 records (a channel's commit of an
  insert), with the daemon's producer settings (``PRODUCER_SETTINGS``, a transactional id):
  what the daemon's producer costs when it has nothing else to do.

Reported, median of ``--runs`` runs each (a fresh mock each): records/s, CPU per record of the
whole process (the client's threads included) and of the calling thread alone
(``time.thread_time``: the ``produce`` calls), and each way's CPU per record over the loop's
in the same run.

    python bench/kafka_produce_floor.py [--records 400000] [--runs 3]
                                        [--out bench/results/kafka_produce_floor.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import cpu_seconds  # noqa: E402
from results_file import append_result, code_version  # noqa: E402

from replicator.sinks.kafka import PRODUCER_SETTINGS, produce_runs  # noqa: E402

TOPICS = 20
PER_TRANSACTION = 20_000
WAYS = ("loop", "mapped", "transactions")
VECTOR = "[0.1,0.2,0.30000001192092896,0.4000000059604645,0.5,0.6000000238418579,0.7,0.8]"
SOURCE = '{"channel":"by-dev-rootcoord-dml_0","position":"0a00000000000000","commit":"%s"}' % (
    "c" * 32
)


def records(count: int) -> tuple[list[bytes], list[bytes]]:
    """Keys and values of ``count`` row events of the Kafka bench's shape."""
    keys, values = [], []
    for pk in range(count):
        keys.append(b'["default","bench_c0",%d]' % pk)
        values.append(
            (
                '{"op":"insert","db":"default","collection":"bench_c0","partition":"_default",'
                f'"pk":{pk},"row":{{"id":{pk},"vec":{VECTOR},"title":"title-{pk:010d}"}},'
                f'"ts":{{"physical":1796630400000,"logical":5}},"source":{SOURCE}}}'
            ).encode()
        )
    return keys, values


def _cpu() -> float:
    return cpu_seconds(os.getpid())[0]


def _producer(bootstrap: str, way: str, name: str) -> Any:
    from confluent_kafka import Producer

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5}
    if way == "transactions":
        config.update(
            {
                **PRODUCER_SETTINGS,
                "transactional.id": name,
                "on_delivery": lambda _error, _message: None,
            }
        )
    producer = Producer(config)
    if way == "transactions":
        producer.init_transactions(30)
    return producer


def produce_all(bootstrap: str, way: str, prefix: str, count: int) -> dict[str, float]:
    """``count`` records written ``way``, until flushed (committed): seconds, CPU-seconds of
    the process and of this thread."""
    keys, values = records(count)
    producer = _producer(bootstrap, way, f"floor-{prefix}")
    topics = [f"{prefix}{n}" for n in range(TOPICS)]
    cpu0, thread0, t0 = _cpu(), time.thread_time(), time.perf_counter()
    for n, start in enumerate(range(0, count, PER_TRANSACTION)):
        topic = topics[n % TOPICS]
        run_keys = keys[start : start + PER_TRANSACTION]
        run_values = values[start : start + PER_TRANSACTION]
        if way == "loop":
            for key, value in zip(run_keys, run_values, strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key)
                        break
                    except BufferError:
                        producer.poll(0.05)
            continue
        if way == "transactions":
            producer.begin_transaction()
        produce_runs(producer, [(topic, run_keys, run_values)])
        if way == "transactions":
            producer.commit_transaction(60)
    if way != "transactions":
        producer.flush(60)
    return {
        "seconds": time.perf_counter() - t0,
        "cpu": _cpu() - cpu0,
        "thread": time.thread_time() - thread0,
    }


def child(bootstrap: str, way: str, count: int) -> None:
    produce_all(bootstrap, way, "warm_", min(count, 200_000))  # untimed: the client's memory
    print(json.dumps(produce_all(bootstrap, way, "t_", count)), flush=True)


def run_way(way: str, count: int) -> dict[str, float]:
    from harness.kafka_mock import kafka_mock_cluster

    with tempfile.TemporaryDirectory() as workdir, kafka_mock_cluster(Path(workdir)) as mock:
        done = subprocess.run(
            [sys.executable, __file__, "--child", way, mock.bootstrap, str(count)],
            check=True,
            capture_output=True,
            text=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(count: int, runs: int, results: dict[str, list[dict[str, float]]], began: str) -> str:
    import confluent_kafka

    lines = [
        f"## {began} UTC: {count:,} records, {runs} runs a way ({code_version()})",
        "",
        f"`python bench/kafka_produce_floor.py --records {count} --runs {runs}` on this machine "
        f"({platform.machine()}, Python {platform.python_version()}, confluent-kafka "
        f"{confluent_kafka.version()}, librdkafka {confluent_kafka.libversion()[0]}).",
        "",
        "| way | records/s (median) | CPU / record, process (median) | of it the calling "
        "thread | the process's CPU / record over the loop's | runs: µs / record |",
        "|---|---|---|---|---|---|",
    ]
    per_record = {way: [r["cpu"] / count * 1e6 for r in rows] for way, rows in results.items()}
    loop = statistics.median(per_record["loop"])
    for way, rows in results.items():
        cpu = statistics.median(per_record[way])
        thread = statistics.median(r["thread"] / count * 1e6 for r in rows)
        rate = statistics.median(count / r["seconds"] for r in rows)
        each = ", ".join(f"{v:.2f}" for v in per_record[way])
        lines.append(
            f"| {way} | {rate:,.0f} | {cpu:.2f} µs | {thread:.2f} µs | {cpu / loop:.2f} | {each} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[3], sys.argv[2], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench/results/kafka_produce_floor.md"))
    args = parser.parse_args()
    began = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(args.runs):  # the ways interleaved: a slow minute falls on each
        for way in WAYS:
            results[way].append(run_way(way, args.records))
            print(way, json.dumps(results[way][-1]), flush=True)
    text = report(args.records, args.runs, results, began)
    print(text)
    title = "What producing alone costs (the floor under the Kafka target)"
    append_result(Path(args.out), title, text)


if __name__ == "__main__":
    main()
