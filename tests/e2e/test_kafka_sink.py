"""A Kafka target end to end: a real Milvus 2.3.5 source replicated into a topic of the test
Kafka while a writer inserts, upserts and deletes (in two partitions), the daemon killed with
SIGKILL again and again; a consumer rebuilds every row from the events and equals the source
row by row, and every write of the source is one event, none missing, none repeated.

The consumer here is written from the event format in docs/guides/kafka-target.md, not from
the daemon's code.

The Kafka mock (librdkafka's) has transactions but no read isolation: its consumers see the
records of open and aborted transactions too, which a real broker hides from a read_committed
consumer (measured: tests/integration/test_kafka_mock_isolation.py). So the consumer keeps only
events whose transaction wrote its position (or model) record to the positions topic, the last
record of every transaction: what a read_committed consumer of a real broker sees, except a
transaction killed between that record and its commit, which the mock shows and the daemon
(reading the mock too) then treats as committed.

So the test accounts per transaction (issue 48): each position record names how many events its
transaction produced; the topic holds that many with its commit id when the transaction
committed. Fewer (a transaction "cut": its position record acked, some events not, then the
kill) can only be a transaction that never committed, shown by the mock; a real broker aborts it
and the daemon reads its records again. A loss or a repeat that such cut transactions account
for is reported as the mock's (an expected failure naming every count); any other fails. The
counts are printed either way, with the raw count of events whose transaction wrote no position
(cut off by a kill before it, and read again).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from harness.kafka_topics import read_topic as records
from harness.services import ServiceStartError, wait_until
from pymilvus import DataType, MilvusClient
from test_backfill import Writer
from test_replication import DIM, comparable, rows, source_config

pytestmark = pytest.mark.e2e

# 3 keeps the suite within its time, in CI or not; CDC_KAFKA_KILLS=10: the ten
KILLS = int(os.environ.get("CDC_KAFKA_KILLS", "3"))
POSITIONS_TOPIC = "milvus-cdc-positions"


class TrackedWrites:
    """Inserts, upserts and deletes in two partitions (a round each time the backfill tests'
    ``Writer`` calls), counting every write per key."""

    def __init__(self, collection: str) -> None:
        self.collection = collection
        self.ops: Counter[int] = Counter()  # key -> writes of it (insert, upsert or delete)
        self.partition_of: dict[int, str] = {}
        self.next_id = 0

    def __call__(self, client: MilvusClient, rnd: random.Random, n: int) -> None:
        partition = ("_default", "p1")[n % 2]
        ids = list(range(self.next_id, self.next_id + 20))
        self.next_id += 20
        client.insert(self.collection, make_rows(ids, f"i{n}"), partition_name=partition)
        self.partition_of.update(dict.fromkeys(ids, partition))
        self.ops.update(ids)
        alive = list(self.partition_of)
        if n % 2 == 1 and len(alive) > 40:
            touched = rnd.sample(alive, 10)
            for part in ("_default", "p1"):
                mine = [k for k in touched if self.partition_of[k] == part]
                if mine:
                    client.upsert(self.collection, make_rows(mine, f"u{n}"), partition_name=part)
                    self.ops.update(mine)
        if n % 3 == 2 and len(alive) > 40:
            gone = rnd.sample(alive, 5)
            client.delete(self.collection, ids=gone)
            for key in gone:
                del self.partition_of[key]
            self.ops.update(gone)


def make_rows(ids: list[int], tag: str) -> list[dict]:
    rnd = random.Random(ids[0] if ids else 0)
    return [
        {"id": i, "vec": [rnd.random() for _ in range(DIM)], "title": f"{tag}-{i}", "score": i / 4}
        for i in ids
    ]


def create_collection(client: MilvusClient, name: str) -> None:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("title", DataType.VARCHAR, max_length=64)
    schema.add_field("score", DataType.DOUBLE)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, num_shards=2)
    client.create_partition(name, "p1")


def read_topic(bootstrap: str, topic: str) -> list[tuple[int, int, dict[str, Any]]]:
    """Every committed record of a topic: (partition, offset, JSON value with its key as
    ``_key``), in each partition's order."""
    return [(r.partition, r.offset, {**r.value, "_key": r.key}) for r in records(bootstrap, topic)]


def committed(bootstrap: str, task_id: str) -> dict[str, int | None]:
    """The task's transactions that wrote their last record (a position or the model): commit
    id -> the events its position record names (None: a DDL's, which names none)."""
    return {
        value["commit"]: value.get("events")
        for _, _, value in read_topic(bootstrap, POSITIONS_TOPIC)
        if value.get("commit") and value["_key"].decode().startswith(f"{task_id}@")
    }


def committed_ids(bootstrap: str, task_id: str) -> set[str]:
    return set(committed(bootstrap, task_id))


class Rebuilt:
    """The rows a consumer of the topic holds after applying its events in order, and the
    per-transaction account: (commit id, events named, events found) of each transaction
    whose position record names more or fewer events than the topic holds."""

    def __init__(self, bootstrap: str, topic: str, task_id: str) -> None:
        named = committed(bootstrap, task_id)
        records = read_topic(bootstrap, topic)
        self.events = [v for _, _, v in records if v["source"]["commit"] in named]
        self.uncommitted = len(records) - len(self.events)
        found = Counter(e["source"]["commit"] for e in self.events if e["source"]["channel"])
        counted = {commit: n for commit, n in named.items() if n is not None}
        self.transactions = len(counted)
        self.unequal = [(c, n, found[c]) for c, n in counted.items() if found[c] != n]
        # events a kill cut off a transaction the mock shows as committed
        self.cut_off = sum(n - f for _c, n, f in self.unequal if f < n)
        self.rows: dict[Any, dict] = {}
        self.ddl: list[dict] = []
        for event in self.events:  # per key in offset order: its partition's order
            if "row" not in event:
                self.ddl.append(event)
            elif event["op"] == "delete":
                self.rows.pop(event["pk"], None)
            else:
                self.rows[event["pk"]] = {k: comparable(v) for k, v in event["row"].items()}

    def row_events(self) -> list[dict]:
        return [e for e in self.events if "row" in e]

    def account(self) -> str:
        return (
            f"{self.transactions} transactions with a position record; "
            f"{len(self.unequal)} whose events on the topic differ from the count it names "
            f"(commit, named, found): {self.unequal[:5]}; {self.cut_off} events cut off by a "
            f"kill; {self.uncommitted} events of transactions with no position record"
        )

    def explain(self, problem: str, size: int) -> None:
        """Fail on ``problem`` (``size`` events or rows lost or repeated), or, when transactions
        the mock showed though a kill cut them account for it, report it as the mock's."""
        more = any(f > n for _c, n, f in self.unequal)  # a committed transaction repeated
        if not more and 0 < size <= self.cut_off:
            pytest.xfail(
                f"the Kafka mock's lack of read isolation, not a loss: {problem}; "
                f"{self.account()} (a real broker aborts a transaction killed before its "
                "EndTxn, and the daemon reads its records again)"
            )
        pytest.fail(f"{problem}; {self.account()}")


def wait_rebuilt(bootstrap: str, topic: str, task_id: str, expected: dict, daemon) -> Rebuilt:
    """The topic once a consumer rebuilds ``expected`` from it; failing that within two
    minutes, what differs (or the mock's account of it), with the task as the daemon sees it
    (its channels' states and positions: a stalled channel told from a lost commit)."""

    def rebuilt_equal() -> Rebuilt | None:
        rebuilt = Rebuilt(bootstrap, topic, task_id)
        return rebuilt if rebuilt.rows == expected else None

    try:
        return wait_until(rebuilt_equal, 120, "the topic rebuilding the source")
    except ServiceStartError:
        rebuilt = Rebuilt(bootstrap, topic, task_id)
        missing = sorted(set(expected) - set(rebuilt.rows))
        extra = sorted(set(rebuilt.rows) - set(expected))
        changed = [k for k in expected if k in rebuilt.rows and rebuilt.rows[k] != expected[k]]
        task = daemon.call("get", {"task_id": task_id}).body
        rebuilt.explain(
            f"rebuilt from the topic: {len(missing)} missing {missing[:10]}, {len(extra)} "
            f"extra {extra[:10]}, {len(changed)} changed {changed[:5]}; log {daemon.log_path}"
            f"; the task: {json.dumps(task)[:4000]}",
            len(missing) + len(extra) + len(changed),
        )
        raise


def test_kafka_target_rebuilds_the_source_exactly_through_kills(
    daemon_factory, milvus_source, etcd_service, kafka_mock
):
    name = f"kafka_{uuid.uuid4().hex[:8]}"
    topic = f"events_{name}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    try:
        create_collection(source, name)
        source.insert(name, make_rows(list(range(-100, 0)), "before"))  # before the task
        daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
        created = daemon.call(
            "create",
            {
                "kafka_connect_param": {"address": kafka_mock.bootstrap, "topic": topic},
                "collection_infos": [{"name": name}],
            },
        )
        assert created.code == 200, created.body
        task_id = created.data["task_id"]
        writes = TrackedWrites(name)
        writer = Writer(milvus_source.uri, writes)
        writer.start()
        rnd = random.Random(99)
        for _ in range(KILLS):
            time.sleep(rnd.uniform(0.5, 3.0))
            daemon.kill()
            daemon.start()
        time.sleep(1)
        writer.finish()
        expected = rows(source, name, "id")
        rebuilt = wait_rebuilt(kafka_mock.bootstrap, topic, task_id, expected, daemon)
        print(f"kafka sink, per transaction: {rebuilt.account()}")
        assert not [u for u in rebuilt.unequal if u[2] > u[1]], rebuilt.account()
        row_events = rebuilt.row_events()
        pairs = Counter((e["pk"], e["ts"]["hybrid"]) for e in row_events)
        repeated = {pair: n for pair, n in pairs.items() if n > 1}
        if repeated:
            rebuilt.explain(f"events repeated: {list(repeated.items())[:10]}", len(repeated))
        # every write of the writer is one event (keys >= 0; the rows written before the task
        # are there too: a new task reads the collection's history from its creation)
        per_key = Counter(e["pk"] for e in row_events if e["pk"] >= 0)
        differ = [(k, per_key[k], n) for k, n in (per_key | writes.ops).items() if per_key[k] != n]
        differ += [(k, n, writes.ops[k]) for k, n in per_key.items() if writes.ops[k] != n]
        if differ:
            rebuilt.explain(
                f"(key, events, writes) that differ: {sorted(set(differ))[:10]}", len(set(differ))
            )
        if rebuilt.unequal:  # every transaction whole
            rebuilt.explain("transactions not whole", rebuilt.cut_off)
        assert sum(1 for e in row_events if e["op"] == "upsert") > 0
        assert {e["partition"] for e in row_events if e["op"] != "delete"} == {"_default", "p1"}
        ddl = Counter((e["op"], e.get("partition")) for e in rebuilt.ddl)
        assert ddl[("create_collection", None)] == 1, rebuilt.ddl
        assert ddl[("create_partition", "p1")] == 1, rebuilt.ddl
        schema = next(e for e in rebuilt.ddl if e["op"] == "create_collection")["schema"]
        assert [f["name"] for f in schema["fields"]] == ["id", "vec", "title", "score"]

        # the docs' example consumer, as a user would paste it, rebuilds the same rows
        page = Path(__file__).parents[2] / "docs" / "guides" / "kafka-target.md"
        example = page.read_text().split("Rebuilding a collection from the topic")[1]
        code = example.split("```python\n")[1].split("```")[0]
        code = code.replace('"kafka1:9092"', repr(kafka_mock.bootstrap))
        code = code.replace('"milvus-events"', repr(topic)).replace('"orders"', repr(name))
        scope: dict[str, Any] = {}
        exec(compile(code, str(page), "exec"), scope)
        assert {k: {f: comparable(v) for f, v in r.items()} for k, r in scope["rows"].items()} == (
            expected
        )

        source.drop_collection(name)
        wait_until(
            lambda: any(
                e["op"] == "drop_collection"
                for e in Rebuilt(kafka_mock.bootstrap, topic, task_id).ddl
            ),
            60,
            "the drop as an event",
        )
        task = daemon.call("get", {"task_id": task_id}).data["task"]
        assert task["state"] == "Running", task
        assert "password" not in json.dumps(task["kafka_connect_param"])
        print(
            f"kafka sink: {KILLS} kills, {writer.rounds} write rounds, {len(expected)} rows, "
            f"{len(row_events)} row events; {rebuilt.account()}"
        )
    finally:
        source.close()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_2_6_stream_into_kafka_with_transactions_broadcast_ddl_and_a_kill(
    daemon_factory, etcd_service, kafka_mock, stream, processes
):
    """The 2.6 test writer's stream (see test_streaming_source.py): transactions committed and
    rolled back, an upsert, a partition made by a broadcast to three vchannels, a kill -9 in
    the middle; the topic rebuilds exactly what the stream holds, each DDL once. With
    ``processes`` 2 the task's three pchannels run in two channel group processes
    (kafka_connect_param.processes): each broadcast is read by both groups."""
    from harness.streaming_writer import VECTOR_DIM

    w = stream.writer
    coll = 52001
    name = f"books_{uuid.uuid4().hex[:6]}"
    topic = f"events_{name}"
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    created = daemon.call(
        "create",
        {
            "kafka_connect_param": {
                "address": kafka_mock.bootstrap,
                "topic": topic,
                "processes": processes,
            },
            "collection_infos": [{"name": name}],
        },
    )
    assert created.code == 200, created.body
    task_id = created.data["task_id"]
    wait_until(
        lambda: (
            len(daemon.call("position", {"task_id": task_id}).data.get("positions") or [])
            >= stream.channels
        ),
        30,
        "the task has a position on every channel",
    )
    v0, v1, v2 = stream.vchannels(coll, 3)
    w.create_collection(coll, name, [v0, v1, v2, f"{stream.pchannel(0)}_vcchan"], partition_ids=[1])
    stream.tick_all()
    expected = {pk: f"row-{pk}" for pk in range(300)}
    w.insert(v0, coll, range(100))
    w.insert(v1, coll, range(100, 200))
    w.insert(v2, coll, range(200, 300))
    stream.tick_all()
    txn = w.begin_txn(v1)
    w.insert(v1, coll, range(300, 310), txn=txn)
    w.delete(v1, coll, range(100, 105), txn=txn)
    w.time_tick(stream.pchannel(1))
    w.end_txn(txn)
    expected.update({pk: f"row-{pk}" for pk in range(300, 310)})
    for pk in range(100, 105):
        del expected[pk]
    rolled = w.begin_txn(v2)
    w.insert(v2, coll, range(400, 410), txn=rolled)
    w.end_txn(rolled, commit=False)
    stream.tick_all()
    seen: list[int] = []

    def first_rows() -> bool:
        rows = Rebuilt(kafka_mock.bootstrap, topic, task_id).rows
        seen[:] = sorted(expected.keys() - rows.keys())
        return len(rows) == len(expected)

    try:  # 60 s ran out twice under the suite's load, with two processes
        wait_until(first_rows, 120, "the first rows as events", log_paths=[daemon.log_path])
    except ServiceStartError as exc:
        raise AssertionError(f"{exc}\nrows missing ({len(seen)}): {seen[:20]}") from None
    daemon.kill()
    w.upsert(v0, coll, range(10), tag="up")
    expected.update({pk: f"up-{pk}" for pk in range(10)})
    w.partition_ddl("CreatePartition", coll, name, 2, "recent", [v0, v1, v2])
    stream.tick_all()
    w.insert(v1, coll, range(500, 520), partition_id=2, partition_name="recent")
    expected.update({pk: f"row-{pk}" for pk in range(500, 520)})
    stream.tick_all()
    daemon.start()

    def rebuilt_equal() -> Rebuilt | None:
        rebuilt = Rebuilt(kafka_mock.bootstrap, topic, task_id)
        got = {pk: row["tag"] for pk, row in rebuilt.rows.items()}
        return rebuilt if got == expected else None

    rebuilt = wait_until(rebuilt_equal, 90, "the stream rebuilt from the topic")
    assert rebuilt.rows[510]["vector"] == [510.0] * VECTOR_DIM
    events = rebuilt.row_events()
    pairs = Counter((e["pk"], e["ts"]["hybrid"], e["op"]) for e in events)
    assert max(pairs.values()) == 1, [p for p, n in pairs.items() if n > 1][:10]
    assert sorted(e["pk"] for e in events if e["op"] == "upsert") == list(range(10))
    assert not any(400 <= e["pk"] < 410 for e in events)  # rolled back: never an event
    assert {e["partition"] for e in events if 500 <= e["pk"] < 520} == {"recent"}
    ddl = Counter((e["op"], e.get("partition")) for e in rebuilt.ddl)
    assert ddl == {("create_collection", None): 1, ("create_partition", "recent"): 1}, ddl
