"""The source-side harness: a Kafka mock, and a real Milvus 2.3.5 whose WAL is on it.

These tests check the harness itself and print what a real source writes (topics, message types,
etcd keys), which is what the replicator has to read.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from harness.kafka_mock import KafkaMock
    from harness.milvus_source import MilvusSource
    from harness.services import EtcdService

pytestmark = pytest.mark.e2e

DIM = 8


# --------------------------------------------------------------------------------------------
# Helpers


def _consumer(bootstrap: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"harness-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )


def _read_partition(bootstrap: str, topic: str, start: int = 0, timeout: float = 20.0) -> list[Any]:
    """Every record of `topic` partition 0 from offset `start` (or the oldest one the broker
    still holds: the librdkafka mock drops a partition's oldest message sets beyond its size
    limit, and the session's Milvus writes these topics all along) up to the current high
    watermark, read with assign + offset (no group subscription)."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        start = max(start, low)
        consumer.assign([TopicPartition(topic, 0, start)])
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        next_offset = start
        while next_offset < high:
            assert time.monotonic() < deadline, f"{topic}: read {next_offset} of {high}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            records.append(msg)
            next_offset = msg.offset() + 1
        return records
    finally:
        consumer.close()


def _topics(bootstrap: str) -> dict[str, int]:
    """Topic name -> number of partitions, as the broker reports them."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def _msg_type_name(value: int) -> str:
    from pymilvus.grpc_gen import common_pb2

    try:
        return str(common_pb2.MsgType.Name(value))
    except ValueError:
        return str(value)


@pytest.fixture
def milvus_client(milvus_source: MilvusSource) -> Iterator[Any]:
    from pymilvus import MilvusClient

    # dedicated: a shared pymilvus 3 channel outlives close() and keeps pinging the server
    client = MilvusClient(uri=milvus_source.uri, timeout=30, dedicated=True)
    try:
        yield client
    finally:
        client.close()


def _create_and_write(client: Any, name: str) -> int:
    """Collection `name` (int64 pk "id", 8-dim "vec"), 10 rows inserted, ids 0 and 1 deleted;
    returns its collection id."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    client.create_collection(name, schema=schema, shards_num=1)
    rows = [{"id": i, "vec": [float(i) + d / 10 for d in range(DIM)]} for i in range(10)]
    inserted = client.insert(name, rows)
    assert inserted["insert_count"] == 10
    client.delete(name, ids=[0, 1])
    return int(client.describe_collection(name)["collection_id"])


def _released_by(ticks: list[tuple[int, int]], offset: int, timestamp: int) -> bool:
    """Does a TimeTick after ``offset`` (in ``ticks``, (offset, ts) in offset order) carry a
    timestamp at or past ``timestamp``?"""
    return any(o > offset and ts >= timestamp for o, ts in ticks)


def _etcd_client(endpoint: str) -> Any:
    import etcd3

    host, _, port = endpoint.replace("http://", "").rpartition(":")
    return etcd3.client(host=host, port=int(port))


# --------------------------------------------------------------------------------------------
# (a) the Kafka mock


def test_kafka_mock_round_trip(kafka_mock: KafkaMock) -> None:
    from confluent_kafka import Producer, TopicPartition

    topic = f"harness-{uuid.uuid4().hex[:12]}"
    producer = Producer({"bootstrap.servers": kafka_mock.bootstrap, "acks": "all"})
    delivered: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered.append(msg)

    for i in range(5):
        producer.produce(
            topic,
            value=f"value-{i}".encode(),
            key=f"key-{i}".encode(),
            partition=0,
            headers=[("msg_type", b"Insert"), ("n", str(i).encode()), ("empty", b"")],
            on_delivery=on_delivery,
        )
    assert producer.flush(10) == 0
    assert [m.offset() for m in delivered] == [0, 1, 2, 3, 4]

    # watermarks
    consumer = _consumer(kafka_mock.bootstrap)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 5)
    finally:
        consumer.close()

    # the whole partition, by assign + offset
    records = _read_partition(kafka_mock.bootstrap, topic, start=0)
    assert [r.value() for r in records] == [f"value-{i}".encode() for i in range(5)]
    assert [r.key() for r in records] == [f"key-{i}".encode() for i in range(5)]
    assert [r.offset() for r in records] == [0, 1, 2, 3, 4]
    assert records[3].headers() == [("msg_type", b"Insert"), ("n", b"3"), ("empty", b"")]

    # from an offset in the middle
    tail = _read_partition(kafka_mock.bootstrap, topic, start=3)
    assert [r.value() for r in tail] == [b"value-3", b"value-4"]

    partitions = _topics(kafka_mock.bootstrap)
    print(
        f"\nkafka mock {kafka_mock.bootstrap}: auto-created {topic!r} with "
        f"{partitions[topic]} partitions"
    )
    assert partitions[topic] >= 1


# --------------------------------------------------------------------------------------------
# (b) a real Milvus source on the Kafka mock


def test_source_writes_etcd_metadata_and_kafka_dml(
    milvus_source: MilvusSource, milvus_client: Any, kafka_mock: KafkaMock
) -> None:
    from pymilvus.grpc_gen import common_pb2, msg_pb2

    name = f"harness_{uuid.uuid4().hex[:10]}"
    collection_id = _create_and_write(milvus_client, name)
    print(f"\ncollection {name!r} id {collection_id} on {milvus_source.uri}")

    # ---- etcd: the collection's metadata under <root>/meta/root-coord/...
    root = milvus_source.etcd_root_path
    etcd = _etcd_client(milvus_source.etcd_endpoint)
    try:
        info_key = f"{root}/meta/root-coord/database/collection-info/1/{collection_id}"
        value, _meta = etcd.get(info_key)
        assert value, f"{info_key} is missing"
        assert name.encode() in value
        keys = sorted(
            meta.key.decode()
            for _value, meta in etcd.get_prefix(f"{root}/meta/")
            if str(collection_id) in meta.key.decode()
        )
    finally:
        etcd.close()
    print(f"etcd keys naming collection {collection_id}:")
    for key in keys:
        print(f"  {key}")
    assert f"{root}/meta/root-coord/fields/{collection_id}/100" in keys
    assert f"{root}/meta/root-coord/fields/{collection_id}/101" in keys
    assert any(k.startswith(f"{root}/meta/root-coord/partitions/{collection_id}/") for k in keys)

    # ---- Kafka: the DML topics, partition 0 from the beginning
    prefix = milvus_source.chan_prefix
    topics = _topics(kafka_mock.bootstrap)
    print(f"topics on the kafka mock ({len(topics)}):")
    for topic, partitions in sorted(topics.items()):
        print(f"  {topic} ({partitions} partitions)")
    dml_topics = sorted(t for t in topics if t.startswith(f"{prefix}-rootcoord-dml_"))
    assert dml_topics, f"no {prefix}-rootcoord-dml_* topic"

    deadline = time.monotonic() + 30
    while True:
        per_topic: dict[str, Counter[str]] = {}
        headers_seen: dict[str, set[str]] = defaultdict(set)
        ours: list[tuple[str, int, int, Any]] = []  # (topic, offset, msg_type, parsed)
        ticks: dict[str, list[tuple[int, int]]] = defaultdict(list)  # topic -> (offset, ts)
        for topic in dml_topics:
            counts: Counter[str] = Counter()
            for record in _read_partition(kafka_mock.bootstrap, topic):
                header = common_pb2.MsgHeader.FromString(record.value())
                msg_type = header.base.msg_type
                counts[_msg_type_name(msg_type)] += 1
                headers_seen[_msg_type_name(msg_type)].update(k for k, _ in record.headers() or [])
                parsed: Any = None
                if msg_type == common_pb2.MsgType.Insert:
                    parsed = msg_pb2.InsertRequest.FromString(record.value())
                elif msg_type == common_pb2.MsgType.Delete:
                    parsed = msg_pb2.DeleteRequest.FromString(record.value())
                elif msg_type == common_pb2.MsgType.CreateCollection:
                    parsed = msg_pb2.CreateCollectionRequest.FromString(record.value())
                elif msg_type == common_pb2.MsgType.TimeTick:
                    tick = msg_pb2.TimeTickMsg.FromString(record.value())
                    ticks[topic].append((record.offset(), tick.base.timestamp))
                if parsed is not None and parsed.collectionID == collection_id:
                    ours.append((topic, record.offset(), msg_type, parsed))
            per_topic[topic] = counts
        inserted = any(m == common_pb2.MsgType.Insert for _t, _o, m, _p in ours)
        deleted = any(m == common_pb2.MsgType.Delete for _t, _o, m, _p in ours)
        # done when every record of ours is released: a later TimeTick on its topic carries a
        # timestamp at or past its own (ticks come about 5 per second). The tick right after a
        # record may be older than it: 2.3 computes a channel's tick before producing it, so a
        # record stamped meanwhile lands first (seen in CI: a tick 150 ms older right after the
        # CreateCollection, Insert and Delete). The replicator holds a record until the tick that
        # covers it (replicator/pipeline/sequencer.py), not the next one.
        released = all(_released_by(ticks[t], o, p.base.timestamp) for t, o, _m, p in ours)
        if inserted and deleted and released:
            break
        assert time.monotonic() < deadline, (
            f"no Insert, Delete and a TimeTick covering them of {collection_id}: {ours} "
            f"{ {t: v[-3:] for t, v in ticks.items()} }"
        )
        time.sleep(0.5)

    print("message types per DML topic (partition 0, whole topic):")
    for topic, counts in per_topic.items():
        print(f"  {topic}: {dict(counts)}")
    print("Kafka header keys per message type:")
    for type_name, keys_seen in sorted(headers_seen.items()):
        print(f"  {type_name}: {sorted(keys_seen) or '(no headers)'}")
    print(f"records of collection {collection_id}:")
    for topic, offset, msg_type, parsed in ours:
        extra = ""
        if msg_type == common_pb2.MsgType.Insert:
            extra = f" shard={parsed.shardName} rows={parsed.num_rows} ids={list(parsed.rowIDs)}"
        elif msg_type == common_pb2.MsgType.Delete:
            extra = (
                f" shard={parsed.shardName} rows={parsed.num_rows} "
                f"pks={list(parsed.primary_keys.int_id.data)}"
            )
        elif msg_type == common_pb2.MsgType.CreateCollection:
            extra = (
                f" vchannels={list(parsed.virtualChannelNames)} "
                f"pchannels={list(parsed.physicalChannelNames)}"
            )
        print(f"  {topic}@{offset}: {_msg_type_name(msg_type)} ts={parsed.base.timestamp}{extra}")

    for topic, topic_ticks in sorted(ticks.items()):
        offset, timestamp = topic_ticks[-1]
        print(f"  {topic}@{offset}: last TimeTick ts={timestamp} (physical ms {timestamp >> 18})")
    for topic, offset, msg_type, parsed in ours:
        after = [(o, ts) for o, ts in ticks[topic] if o > offset]
        print(
            f"  {_msg_type_name(msg_type)}@{offset}: next tick {after[0]}, "
            f"{(after[0][1] - parsed.base.timestamp) >> 18} ms later in hybrid time"
        )

    inserts = [p for _t, _o, t, p in ours if t == common_pb2.MsgType.Insert]
    deletes = [p for _t, _o, t, p in ours if t == common_pb2.MsgType.Delete]
    assert sum(p.num_rows for p in inserts) == 10
    assert inserts[0].collection_name == name
    assert sorted(pk for p in deletes for pk in p.primary_keys.int_id.data) == [0, 1]
    assert all(topic.startswith(f"{prefix}-rootcoord-dml_") for topic, *_ in ours)
    # no tick before a record of ours claims its time: a tick T promises every record with a
    # timestamp at or below T came before it
    for topic, offset, _type, parsed in ours:
        before = [ts for o, ts in ticks[topic] if o < offset]
        assert not before or max(before) < parsed.base.timestamp, (topic, offset, before[-3:])


# --------------------------------------------------------------------------------------------
# (c) the RocksMQ variant, with its own etcd root path and channel prefix


def test_source_on_rocksmq(etcd_service: EtcdService, tmp_path: Path) -> None:
    from harness.milvus_source import milvus_source_rocksmq
    from pymilvus import MilvusClient

    root = f"rmq-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with milvus_source_rocksmq(tmp_path / "milvus", etcd_service.endpoint, root_path=root) as src:
        print(f"\nrocksmq source up in {time.monotonic() - started:.1f} s: {src.uri}")
        assert src.rocksmq_path is not None
        assert src.chan_prefix == root
        client = MilvusClient(uri=src.uri, timeout=30, dedicated=True)
        try:
            name = f"harness_{uuid.uuid4().hex[:10]}"
            collection_id = _create_and_write(client, name)
        finally:
            client.close()
        etcd = _etcd_client(etcd_service.endpoint)
        try:
            value, _meta = etcd.get(
                f"{root}/meta/root-coord/database/collection-info/1/{collection_id}"
            )
        finally:
            etcd.close()
        assert value, "collection-info missing under the custom root path"
        # the channel names recorded in CollectionInfo carry the custom prefix
        assert f"{root}-rootcoord-dml_".encode() in value
        assert src.rocksmq_path.is_dir()
        assert Path(f"{src.rocksmq_path}_meta_kv").is_dir()
        print(
            f"rocksmq at {src.rocksmq_path}: {sorted(p.name for p in src.rocksmq_path.iterdir())}"
        )
