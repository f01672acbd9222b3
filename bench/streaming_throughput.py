"""Benchmark: the 2.6 pipeline's MB/s against a raw consume of the same topics, in one run.

Topics of the librdkafka mock cluster are filled with a Milvus 2.6 stream written by the test
writer (tests/harness/streaming_writer.py): per round of a topic, Inserts of ``--rows`` rows
(int64 pk, ``--dim``-dim float vector, varchar tag) with ``_tt`` taken in pairs and appended in
the other order, an upsert as a transaction (BeginTxn, Insert, Delete, CommitTxn), a repeated
append, and a TimeTick. Baseline: a raw confluent-kafka Consumer (assign + consume) of each
topic, counting bytes. Pipeline: the real ChannelWorker (KafkaChannelReader, decode_any, the
sequencer's tick order, dedupe and transactions, BatchApplier, in-flight bound and positions in
SqlMetaStore on SQLite) into a target that discards the writes. Raw and pipeline alternate
topic by topic; the median of ``--rounds`` rounds is reported.

    python bench/streaming_throughput.py [--topics 12] [--rounds-per-topic 4] [--rows 1000]
        [--dim 128] [--rounds 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.streaming_writer import StreamingWriter, collection_schema  # noqa: E402
from replication_throughput import consumer_config, raw_consume, run_pipeline  # noqa: E402

from replicator.pipeline.worker import ChannelWorker  # noqa: E402

COLLECTION_ID = 449_000_000_000_000_026
MB = 1_000_000


def write_topic(bootstrap: str, topic: str, rounds: int, rows: int, dim: int) -> dict:
    """The stream of one pchannel, built in memory by the writer and produced in one go."""
    writer = StreamingWriter(None)
    vchannel = f"{topic}_{COLLECTION_ID}v0"
    pk = 0
    inserted = deleted = 0
    for _ in range(rounds):
        early, late = writer.tso.next(), writer.tso.next()
        writer.insert(vchannel, COLLECTION_ID, range(pk + rows, pk + 2 * rows), tt=late, dim=dim)
        first = writer.insert(vchannel, COLLECTION_ID, range(pk, pk + rows), tt=early, dim=dim)
        writer.repeat(first)
        txn = writer.begin_txn(vchannel)
        writer.insert(vchannel, COLLECTION_ID, range(pk, pk + rows // 10), txn=txn, dim=dim)
        writer.delete(vchannel, COLLECTION_ID, range(pk, pk + rows // 10), txn=txn)
        writer.end_txn(txn)
        writer.time_tick(topic)
        inserted += 2 * rows + rows // 10
        deleted += rows // 10
        pk += 2 * rows
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 8 * MB}
    )
    size = 0
    for record in writer.written:
        producer.produce(
            topic,
            record.payload,
            partition=0,
            headers=[(k, v.encode()) for k, v in record.properties.items()],
        )
        size += len(record.payload)
        producer.poll(0)
    assert producer.flush(60) == 0, "records not delivered to the Kafka mock"
    check = Consumer(consumer_config(bootstrap))
    low, high = check.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    check.close()
    records = len(writer.written)
    assert (low, high) == (0, records), (
        f"{topic}: the mock kept offsets {low}..{high} of {records} (it keeps about 5 MB per "
        "partition): use fewer --rounds-per-topic"
    )
    return {"records": records, "bytes": size, "rows": inserted, "deleted": deleted}


def sequenced(worker: ChannelWorker) -> None:
    """The 2.6 path was taken: repeats dropped, transactions committed."""
    assert worker.sequencer.stats.repeats > 0, "the repeated appends were not dropped"
    assert worker.sequencer.stats.committed > 0, "no transaction was committed"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=12)
    parser.add_argument(
        "--rounds-per-topic", type=int, default=2, help="about 1.7 MB each; the mock keeps ~5 MB"
    )
    parser.add_argument("--rows", type=int, default=1000, help="rows per Insert")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="raw/pipeline pairs")
    parser.add_argument("--out", default=str(REPO / "bench/results/streaming_throughput.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        work = Path(tmp)
        with kafka_mock_cluster(work / "kafka") as kafka:
            names = [f"bench26-rootcoord-dml_{i}" for i in range(args.topics)]
            shapes = [
                write_topic(kafka.bootstrap, n, args.rounds_per_topic, args.rows, args.dim)
                for n in names
            ]
            raw_consume(kafka.bootstrap, names[0], shapes[0]["records"])  # warm-up
            runs: dict[str, list[tuple[float, float]]] = {"raw": [], "pipe": []}
            for _ in range(args.rounds):
                total = {"raw": [0.0, 0.0], "pipe": [0.0, 0.0]}
                for name, shape in zip(names, shapes, strict=True):
                    whole, streaming, size = raw_consume(kafka.bootstrap, name, shape["records"])
                    assert size == shape["bytes"], (size, shape["bytes"])
                    total["raw"][0] += whole
                    total["raw"][1] += streaming
                    whole, streaming, _ = run_pipeline(
                        kafka.bootstrap,
                        name,
                        work,
                        shape["rows"],
                        None,
                        collection_id=COLLECTION_ID,
                        schema=collection_schema("bench", args.dim),
                        check=sequenced,
                        deleted_rows=shape["deleted"],
                    )
                    total["pipe"][0] += whole
                    total["pipe"][1] += streaming
                for key, (whole, streaming) in total.items():
                    runs[key].append((whole, streaming))
    report(args, shapes, runs, time.perf_counter() - started)


def report(args, shapes: list[dict], runs: dict, total_s: float) -> None:
    size = sum(s["bytes"] for s in shapes)
    rows = sum(s["rows"] for s in shapes)

    def rate(key: str, which: int) -> float:
        return size / statistics.median(r[which] for r in runs[key]) / MB

    raw_w, raw_s, pipe_w, pipe_s = rate("raw", 0), rate("raw", 1), rate("pipe", 0), rate("pipe", 1)
    # a raw consume gets a whole topic in one call: its "streaming" time is then no measure
    one_call = statistics.median(r[1] for r in runs["raw"]) < 0.01 * args.topics
    raw_s_text = "n/a (one call)" if one_call else f"{raw_s:.0f}"
    ratio_s_text = "n/a" if one_call else f"{pipe_s / raw_s:.2f}"
    command = (
        f"python bench/streaming_throughput.py --topics {args.topics} "
        f"--rounds-per-topic {args.rounds_per_topic} --rows {args.rows} --dim {args.dim} "
        f"--rounds {args.rounds}"
    )
    lines = [
        "# 2.6 pipeline throughput",
        "",
        f"Command: `{command}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, {len(os.sched_getaffinity(0))} cores; "
        f"whole script {total_s:.0f} s",
        "",
        f"{args.topics} topics, each {args.rounds_per_topic} rounds of: two Inserts of "
        f"{args.rows} rows ({args.dim}-dim vectors) appended in the reverse order of their "
        "ticks, a repeated append, an upsert transaction (BeginTxn, Insert, Delete, CommitTxn) "
        f"of {args.rows // 10} rows, a TimeTick. {size / MB:.1f} MB of payload, {rows:,} rows "
        "written to the discarding target. Raw = confluent-kafka assign + consume(1000); "
        "pipeline = the real ChannelWorker on the 2.6 path into a target that discards. "
        f"Median of {args.rounds} rounds.",
        "",
        "| reader | MB/s whole | MB/s streaming | rounds (whole s / streaming s) | ratio, whole "
        "| ratio, streaming |",
        "|---|---|---|---|---|---|",
        f"| raw consume | {raw_w:.0f} | {raw_s_text} | "
        f"{', '.join(f'{w:.2f}/{s:.2f}' for w, s in runs['raw'])} | 1.00 | 1.00 |",
        f"| 2.6 pipeline, discarding target | {pipe_w:.0f} | {pipe_s:.0f} | "
        f"{', '.join(f'{w:.2f}/{s:.2f}' for w, s in runs['pipe'])} | {pipe_w / raw_w:.2f} "
        f"| {ratio_s_text} |",
        "",
        "`whole` counts from client creation to the last byte/row; `streaming` from the first "
        "records in hand (the raw consume's wait for more records, up to 0.2 s per call, is in "
        "its `whole`, as in bench/replication_throughput.py). Absolute numbers move with the "
        "machine's load; the ratios are the result.",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
