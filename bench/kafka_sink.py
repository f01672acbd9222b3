"""Benchmark: a Kafka target's events per second and MB/s, against a raw confluent-kafka producer
writing the same bytes, in one run.

A real Milvus 2.3.5 source with its WAL in RocksMQ, the librdkafka mock as the target Kafka
(it keeps about 5 MB per partition, so the backlog is sized to stay inside it), the daemon on
SQLite.

1. Backlog: R rows (int64 key + DIM-float vector + a 16-character title) written into the
   source with pymilvus while no task exists; the source is flushed and left until quiet.
2. Daemon: a task with a Kafka target is created (its positions topic made first, as an
   operator would); the time until its topic holds R row events (end offsets polled; then read
   back with read_committed and counted: exactly R, one per row) is the daemon's time.
   It includes reading the WAL, decoding, the JSON events and the transactions.
3. Baseline: the same keys and values (as read back) written by one confluent-kafka producer
   (linger.ms 5, no transactions) into a topic of their own, until flushed.

    python bench/kafka_sink.py [--rows 20000] [--dim 8] [--out bench/results/kafka_sink.md]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from catch_up import cpu_seconds, settle, spent  # noqa: E402
from harness import services  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.milvus_source import milvus_source_rocksmq  # noqa: E402
from replication_throughput import start_daemon  # noqa: E402

MB = 1024 * 1024


def write_backlog(client, name: str, rows: int, dim: int, batch: int = 5000) -> None:
    import numpy as np
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("title", DataType.VARCHAR, max_length=32)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, num_shards=1)
    vectors = np.random.default_rng(3).random((rows, dim), dtype=np.float32)
    for lo in range(0, rows, batch):
        hi = min(rows, lo + batch)
        client.insert(
            name,
            [{"id": i, "vec": vectors[i], "title": f"title-{i:010d}"} for i in range(lo, hi)],
        )
    client.flush(name)


def read_all(bootstrap: str, topic: str, timeout: float = 120) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        waiting, found = set(partitions), []
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for message in consumer.consume(5000, 0.5):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        waiting.discard(message.partition())
                    continue
                found.append((message.key() or b"", message.value() or b""))
        return found
    finally:
        consumer.close()


def row_events(records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in records if b'"row":' in v]


def end_offsets(bootstrap: str, topic: str) -> int:
    """The sum of the topic's end offsets (its records, transaction markers included)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in found.partitions
        )
    finally:
        consumer.close()


def wait_events(bootstrap: str, topic: str, rows: int, timeout: float) -> float:
    """Until the topic holds ``rows`` row events (its end offsets, polled every 0.1 s, pass
    ``rows``; then the events are read and counted); the time the offsets passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if end_offsets(bootstrap, topic) >= rows:
            seen = time.perf_counter()
            if len(row_events(read_all(bootstrap, topic))) >= rows:
                return seen
        time.sleep(0.1)
    raise TimeoutError(f"{topic}: fewer than {rows} row events after {timeout:g} s")


def make_positions_topic(bootstrap: str) -> None:
    """What an operator does before the first task (the mock makes a topic on first use)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("milvus-cdc-positions", b"{}", b"bench")
    producer.flush(10)


def raw_produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    t0 = time.perf_counter()
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return time.perf_counter() - t0


def run(args, work: Path) -> dict:
    from pymilvus import MilvusClient

    result: dict = {}
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(services.etcd_server(work / "etcd"))
        source = stack.enter_context(
            milvus_source_rocksmq(work / "source", etcd.endpoint, root_path="bench")
        )
        kafka = stack.enter_context(kafka_mock_cluster(work / "kafka"))
        src = MilvusClient(uri=source.uri, dedicated=True)
        stack.callback(src.close)
        name = f"ks_{uuid.uuid4().hex[:8]}"
        write_backlog(src, name, args.rows, args.dim)
        settle(source.pid)
        daemon = start_daemon(
            stack,
            work,
            etcd.endpoint,
            source,
            mqType="rocksmq",
            rocksmq={"path": str(source.rocksmq_path)},
        )
        assert daemon.process is not None
        topic = f"events_{name}"
        make_positions_topic(kafka.bootstrap)
        before = cpu_seconds(daemon.process.pid)
        t0 = time.perf_counter()
        created = daemon.call(
            "create",
            {
                "kafka_connect_param": {"address": kafka.bootstrap, "topic": topic},
                "collection_infos": [{"name": name}],
            },
        )
        assert created.code == 200, created.body
        result["daemon_s"] = wait_events(kafka.bootstrap, topic, args.rows, args.timeout) - t0
        result["daemon_cpu_s"] = spent(before, cpu_seconds(daemon.process.pid))[0]
        records = row_events(read_all(kafka.bootstrap, topic))
        keys = {k for k, _ in records}
        assert len(records) == args.rows == len(keys), (len(records), len(keys), args.rows)
        result["events"] = len(records)
        result["mb"] = sum(len(k) + len(v) for k, v in records) / MB
        result["raw_s"] = raw_produce(kafka.bootstrap, f"raw_{name}", records)
        assert len(read_all(kafka.bootstrap, f"raw_{name}")) == len(records)
    return result


def report(args, r: dict) -> str:
    daemon_rate, raw_rate = r["events"] / r["daemon_s"], r["events"] / r["raw_s"]
    command = f"python bench/kafka_sink.py --rows {args.rows} --dim {args.dim}"
    lines = [
        "| writer | seconds | events/s | MB/s | ratio to raw |",
        "|---|---|---|---|---|",
        f"| raw confluent-kafka producer, same bytes (baseline) | {r['raw_s']:.2f} "
        f"| {raw_rate:,.0f} | {r['mb'] / r['raw_s']:.1f} | 1.00 |",
        f"| the daemon: WAL read, decode, JSON events, transactions | {r['daemon_s']:.2f} "
        f"| {daemon_rate:,.0f} | {r['mb'] / r['daemon_s']:.1f} | {daemon_rate / raw_rate:.2f} |",
    ]
    table = "\n".join(lines)
    return f"""# Kafka target: events per second against a raw producer

`{command}` on this machine ({platform.machine()}, Python {platform.python_version()}),
{time.strftime("%Y-%m-%d")}. A real Milvus 2.3.5 source (RocksMQ) holding {args.rows:,} rows
(int64 key, {args.dim}-float vector, 16-character title), the librdkafka mock as the Kafka.

{table}

{r["events"]:,} row events, {r["mb"]:.1f} MB of keys and values, counted back with
read_committed (one event per row, no key twice). The daemon used {r["daemon_cpu_s"]:.1f}
CPU-seconds ({r["daemon_cpu_s"] / r["events"] * 1e6:.0f} µs per event). Its time runs from the
create request until the topic's end offsets passed {r["events"]:,} records (polled every
0.1 s): it includes creating the task and starting its Kafka producer.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "kafka_sink.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        result = run(args, Path(tmp))
    text = report(args, result)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
