"""Benchmark: how long the librdkafka mock cluster (the tests' and benches' Kafka) holds a fetch,
read by the daemon's own Kafka channel reader, per ``fetch.wait.max.ms``.

A caught-up reader's fetch finds no record and asks the broker to wait up to
``fetch.wait.max.ms`` for one (``fetch.min.bytes`` 1, librdkafka's default). A Kafka broker
answers it as soon as a record arrives; the mock (rdkafka_mock_handlers.c, its Fetch handler)
delays every empty answer by the whole wait and does not cut it short. Here one record is
produced at a time (``linger.ms`` 0, each delivered before the next), at random gaps longer
than the longest wait measured, and read by ``KafkaChannelReader.read_batch`` as the daemon's
shared reader calls it. Per wait: the time from the produce call to the record in the reader's
hands. If the mock answered at once, that is about a millisecond whatever the wait; if it holds
the fetch, it is spread evenly over 0 .. the wait (mean about half of it).

Baseline in the same run: the same records with the wait at 0 ms (every fetch answered at once:
the shortest a broker can do). Then each wait's idle cost: the reader polling a quiet topic for
``--idle-seconds``, CPU of this process (the reader and its librdkafka threads) and of the mock.

    python bench/fetch_hold.py [--waits 0,2,5,20,100,500] [--records 40] [--idle-seconds 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import cpu_seconds, spent, write_report  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402

from replicator.sources.kafka import KafkaChannelReader  # noqa: E402


def deliver(producer: Producer, topic: str, value: bytes) -> None:
    producer.produce(topic, value, partition=0)
    producer.flush(10)


def measure(bootstrap: str, wait_ms: int, records: int, gap: tuple[float, float]) -> list[float]:
    """Seconds from each record's produce call to its read, one record at a time."""
    topic = f"hold-{wait_ms}-{os.getpid()}-{time.monotonic_ns()}"
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    deliver(producer, topic, b"first")  # creates the topic
    reader = KafkaChannelReader(
        {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": wait_ms}, topic, None
    )
    received: dict[bytes, float] = {}
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for record in reader.read_batch(1000, 0.05):
                received[record.payload] = time.perf_counter()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while b"first" not in received and time.monotonic() < deadline:
        time.sleep(0.01)
    rng = random.Random(wait_ms)
    sent: dict[bytes, float] = {}
    for i in range(records):
        time.sleep(rng.uniform(*gap))
        key = f"r{i}".encode()
        sent[key] = time.perf_counter()
        deliver(producer, topic, key)
    deadline = time.monotonic() + 10
    while len(received) < records + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    thread.join(5)
    reader.close()
    missing = [k for k in sent if k not in received]
    assert not missing, f"wait {wait_ms} ms: {len(missing)} records never read"
    return [received[k] - sent[k] for k in sent]


def idle_cpu(bootstrap: str, mock_pid: int, wait_ms: int, seconds: float) -> tuple[float, float]:
    """CPU seconds per second of (this process, the mock) while a reader polls a quiet topic."""
    topic = f"idle-{wait_ms}-{os.getpid()}-{time.monotonic_ns()}"
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    deliver(producer, topic, b"first")
    reader = KafkaChannelReader(
        {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": wait_ms}, topic, None
    )
    while not reader.read_batch(1000, 0.5):
        pass
    time.sleep(1)
    before = cpu_seconds(os.getpid(), mock_pid)
    until = time.monotonic() + seconds
    while time.monotonic() < until:  # the daemon's shared reader's call, 0.05 s at a time
        reader.read_batch(1000, 0.05)
    used = spent(before, cpu_seconds(os.getpid(), mock_pid))
    reader.close()
    return used[0] / seconds, used[1] / seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", default="0,2,5,20,100,500", help="fetch.wait.max.ms values")
    parser.add_argument("--records", type=int, default=40, help="records per wait")
    parser.add_argument("--idle-seconds", type=float, default=10)
    parser.add_argument("--out", default=str(REPO / "bench/results/fetch_hold.md"))
    args = parser.parse_args()
    waits = [int(w) for w in args.waits.split(",")]
    gap = (0.55, 0.75)  # longer than the longest wait: each record finds a held fetch
    started = time.perf_counter()
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp,
        kafka_mock_cluster(Path(tmp) / "kafka") as kafka,
    ):
        for wait in waits:
            lags = measure(kafka.bootstrap, wait, args.records, gap)
            own, mock = idle_cpu(kafka.bootstrap, kafka.pid, wait, args.idle_seconds)
            rows.append((wait, lags, own, mock))
    base = statistics.mean(rows[0][1]) if waits[0] == 0 else None
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# How long the librdkafka mock holds a fetch",
        "",
        f"Command: `python bench/fetch_hold.py --waits {args.waits} --records {args.records} "
        f"--idle-seconds {args.idle_seconds:g}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"commit {commit}, {len(os.sched_getaffinity(0))} cores, load average "
        f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())}; whole script "
        f"{time.perf_counter() - started:.0f} s",
        "",
        f"{args.records} records per wait, one at a time, {gap[0]:g}-{gap[1]:g} s apart, each "
        "read by the daemon's KafkaChannelReader (read_batch(1000, 0.05) in a loop); "
        "milliseconds from the produce call to the record in the reader's hands. Idle: the "
        f"same reader on a quiet topic for {args.idle_seconds:g} s, CPU seconds per second.",
        "",
        "| fetch.wait.max.ms | mean | p50 | p90 | max | mean / wait | mean over the 0 ms "
        "baseline | idle CPU, reader | idle CPU, mock |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for wait, lags, own, mock in rows:
        mean = statistics.mean(lags)
        ratio = f"{mean * 1000 / wait:.2f}" if wait else "n/a"
        over = f"{(mean - base) * 1000:+.1f} ms" if base is not None else "n/a"
        lines.append(
            f"| {wait} | {mean * 1000:.1f} | {pct(lags, 0.5) * 1000:.1f} "
            f"| {pct(lags, 0.9) * 1000:.1f} | {max(lags) * 1000:.1f} | {ratio} | {over} "
            f"| {own:.3f} | {mock:.3f} |"
        )
    write_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
