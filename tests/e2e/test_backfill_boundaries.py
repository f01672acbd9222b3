"""Backfill exactness where it is hardest: small key ranges (many boundaries), a writer that
deletes, re-inserts, upserts and inserts keys at the range boundaries during the whole copy, int64
keys and varchar keys with quotes, backslashes, spaces and unicode, two partitions, real Milvus
2.3.5 source and target; the first run and every other one after it kill the driver with SIGKILL
mid-copy.

The comparison reads neither side with the daemon's code: it asks both Milvus servers for every
key the test ever wrote, by key (``in [...]``), partition by partition, and checks each
partition's ``count(*)`` against the rows found, so a row on either side that the test did not
write fails it too.

``CDC_BACKFILL_RUNS`` sets the number of runs: 1 in CI (with the kill); the issue's ten runs in a
row: ``CDC_BACKFILL_RUNS=10 python3 -m pytest tests/e2e/test_backfill_boundaries.py``.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Callable, Iterable

import pytest
from harness.daemon import Daemon
from harness.services import wait_until
from pymilvus import DataType, MilvusClient
from test_backfill import (
    Writer,
    backfill_config,
    driver_log,
    kill_driver_midway,
    no_spark_left,
    task_view,
    wait_backfill,
)
from test_replication import DIM, comparable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

RUNS = int(os.environ.get("CDC_BACKFILL_RUNS", "1"))
RANGE_ROWS = 400
PARTITIONS = ("p1", "p2")
INT_ROWS = 8000  # even keys 0 .. 2 * INT_ROWS - 2: odd keys are free for inserts near bounds
TEXT_ROWS = 4000
# never written during the copy: its rows_total is exact
QUIET_ROWS = 2_000
# keys per read of the comparison: every read is a Strong one, which waits for the server's next
# time tick, so fewer and larger reads
READ_KEYS = 4_000

Key = int | str


def expr_literal(key: Key) -> str:
    """A key in a Milvus expression, escaped by JSON's rules (quote and backslash), written here
    rather than taken from the daemon so the check does not share its escaping."""
    return str(key) if isinstance(key, int) else json.dumps(key, ensure_ascii=False)


def text_key(n: int) -> str:
    marks = ['"', "\\", " ", "é", "中", "🙂", "'", ""]
    return f"{marks[n % len(marks)]}{(n * 7919) % 10_007:05d}{marks[(n // 8) % len(marks)]}{n}"


def int_partition(key: int) -> str:
    return PARTITIONS[(key // 2) % 2]


def text_partition(key: str) -> str:
    return PARTITIONS[sum(map(ord, key)) % 2]


def make_collection(client: MilvusClient, name: str, pk_type: DataType) -> None:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    if pk_type == DataType.VARCHAR:
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=64)
    else:
        schema.add_field("pk", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("note", DataType.VARCHAR, max_length=256)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index)
    for partition in PARTITIONS:
        client.create_partition(name, partition)


class Table:
    """One source collection the test writes: its keys' partitions, every key ever written."""

    def __init__(self, client: MilvusClient, name: str, partition_of: Callable[[Key], str]):
        self.client, self.name, self.partition_of = client, name, partition_of
        self.known: set[Key] = set()  # every key ever written
        self.alive: set[Key] = set()  # the keys the source holds
        self.rnd = random.Random(name)

    def row(self, key: Key, tag: str) -> dict:
        return {
            "pk": key,
            "vec": [self.rnd.random() for _ in range(DIM)],
            "note": f"{tag} {key!r} ✓",
        }

    def write(self, keys: Iterable[Key], tag: str, *, upsert: bool = False) -> None:
        """Insert keys the source does not hold (an insert of a held key would make a second
        row of it), or upsert any."""
        by_partition: dict[str, list[dict]] = {}
        for key in keys:
            if key in self.alive and not upsert:
                continue
            self.known.add(key)
            self.alive.add(key)
            by_partition.setdefault(self.partition_of(key), []).append(self.row(key, tag))
        for partition, rows in by_partition.items():
            call = self.client.upsert if upsert else self.client.insert
            call(self.name, rows, partition_name=partition)

    def delete(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        self.alive.difference_update(keys)
        if keys:
            self.client.delete(self.name, filter=f"pk in [{', '.join(map(expr_literal, keys))}]")


def side_rows(client: MilvusClient, name: str, keys: set[Key]) -> dict[str, dict]:
    """Every row of ``keys`` per partition, by key reads; a partition's count(*) must equal its
    rows found (no row the test did not write, no key twice)."""
    result: dict[str, dict] = {}
    ordered = sorted(keys)
    for partition in PARTITIONS:
        found: dict = {}
        for start in range(0, len(ordered), READ_KEYS):
            chunk = ordered[start : start + READ_KEYS]
            for row in client.query(
                name,
                filter=f"pk in [{', '.join(map(expr_literal, chunk))}]",
                output_fields=["*"],
                partition_names=[partition],
                consistency_level="Strong",
                timeout=60,
            ):
                assert row["pk"] not in found, f"{name}/{partition}: key {row['pk']!r} twice"
                found[row["pk"]] = {k: comparable(v) for k, v in row.items()}
        count = client.query(
            name,
            filter="",
            output_fields=["count(*)"],
            partition_names=[partition],
            consistency_level="Strong",
        )[0]["count(*)"]
        assert count == len(found), f"{name}/{partition}: count(*) {count}, by key {len(found)}"
        result[partition] = found
    return result


def difference(expected: dict[str, dict], actual: dict[str, dict]) -> str:
    lines = []
    for partition in PARTITIONS:
        want, got = expected[partition], actual.get(partition, {})
        missing = sorted(set(want) - set(got), key=str)
        extra = sorted(set(got) - set(want), key=str)
        changed = sorted((k for k in set(want) & set(got) if want[k] != got[k]), key=str)
        lines.append(
            f"{partition}: {len(missing)} missing {missing[:8]!r}, {len(extra)} extra "
            f"{extra[:8]!r}, {len(changed)} changed {changed[:8]!r}"
        )
    return "; ".join(lines)


def assert_equal(
    source: MilvusClient, target: MilvusClient, table: Table, daemon: Daemon, task_id: str
) -> int:
    """The target holds exactly the source's rows of ``table`` within 180 s; else a failure that
    names the differing keys, the task's state and the daemon's last warnings, first in the
    report (no traceback)."""
    expected = side_rows(source, table.name, table.known)
    last: list[str] = []

    def same() -> bool:
        target.load_collection(table.name, timeout=60)
        actual = side_rows(target, table.name, table.known)
        last[:] = [difference(expected, actual)]
        return actual == expected

    try:
        wait_until(same, 180, f"target {table.name} equal to the source")
    except Exception as exc:  # noqa: BLE001 - report what differs
        view = task_view(daemon, task_id)
        progress = view.get("progress") or {}
        summary = {
            "state": view.get("state"),
            "reason": view.get("reason"),
            "progress": {k: v for k, v in progress.items() if k not in ("channels", "backfill")},
            "channels": [
                (c.get("channel"), c.get("state"), c.get("lag_seconds"))
                for c in progress.get("channels") or []
            ],
        }
        pytest.fail(
            f"{table.name} not equal on the target after 180 s: "
            f"{last[0] if last else f'never read ({exc})'}; task {summary}; daemon log's last "
            f"warnings: {warnings(daemon)}",
            pytrace=False,
        )
    return sum(len(rows) for rows in expected.values())


def warnings(daemon: Daemon, last: int = 8) -> list[str]:
    lines = [line for line in daemon.log_text().splitlines() if '"level": "INFO"' not in line]
    return [line[:400] for line in lines[-last:]]


def load_in_segments(table: Table, keys: list[Key]) -> None:
    """The keys in no key order, flushed every 1,500 rows: several sealed segments and a growing
    one, each holding keys from all over the range (the layout in which Milvus 2.3.5's paged
    queries with pymilvus's iterator hints skip keys)."""
    shuffled = list(keys)
    random.Random(table.name).shuffle(shuffled)
    for start in range(0, len(shuffled), 1500):
        table.write(shuffled[start : start + 1500], "old")
        if start + 1500 < len(shuffled):
            table.client.flush(table.name)


def boundaries(keys: list[Key]) -> list[Key]:
    """The keys the planner cuts at: every ``RANGE_ROWS``-th key in order (rows deleted or
    inserted before planning move them a little, which only spreads the writes around them)."""
    ordered = sorted(keys)
    return ordered[RANGE_ROWS::RANGE_ROWS]


@pytest.mark.parametrize("run", range(RUNS))
def test_exact_copy_across_many_range_boundaries_under_writes(
    run, daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    kill = run % 2 == 0
    suffix = uuid.uuid4().hex[:8]
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        ints = Table(source, f"bbi_{suffix}", lambda k: int_partition(int(k)))
        texts = Table(source, f"bbt_{suffix}", lambda k: text_partition(str(k)))
        quiet = Table(source, f"bbq_{suffix}", lambda k: int_partition(int(k)))
        make_collection(source, ints.name, DataType.INT64)
        make_collection(source, texts.name, DataType.VARCHAR)
        make_collection(source, quiet.name, DataType.INT64)
        int_keys: list[Key] = list(range(0, 2 * INT_ROWS, 2))
        text_keys: list[Key] = [text_key(n) for n in range(TEXT_ROWS)]
        quiet_keys: list[Key] = list(range(0, 2 * QUIET_ROWS, 2))
        for table, keys in ((ints, int_keys), (texts, text_keys), (quiet, quiet_keys)):
            load_in_segments(table, keys)
        sorted_texts = sorted(text_keys)
        int_bounds, text_bounds = boundaries(int_keys), boundaries(text_keys)
        new_texts = iter(range(TEXT_ROWS, 10 * TEXT_ROWS))
        # keys deleted by the round before, inserted again by the next one
        deleted: dict[str, list[Key]] = {ints.name: [], texts.name: []}

        def write(client: MilvusClient, rnd: random.Random, n: int) -> None:
            # at an int boundary b: re-insert what the round before deleted, delete b and b-2,
            # insert the free odd keys around b, upsert b+2 and a key anywhere
            b = int(rnd.choice(int_bounds))
            ints.write(deleted[ints.name], f"again{n}")
            ints.delete([b, b - 2])
            deleted[ints.name] = [b, b - 2]
            ints.write([b - 1, b + 1, b + 3], f"new{n}")
            ints.write([b + 2, rnd.randrange(0, 2 * INT_ROWS, 2)], f"up{n}", upsert=True)
            # at a text boundary: the same with its neighbours in key order, and new keys that
            # sort anywhere
            i = sorted_texts.index(rnd.choice(text_bounds))
            texts.write(deleted[texts.name], f"again{n}")
            texts.delete([sorted_texts[i], sorted_texts[i - 1]])
            deleted[texts.name] = [sorted_texts[i], sorted_texts[i - 1]]
            texts.write([sorted_texts[i + 1]], f"up{n}", upsert=True)
            texts.write([text_key(next(new_texts)) for _ in range(3)], f"new{n}")

        daemon = daemon_factory(
            **backfill_config(
                milvus_source,
                etcd_service,
                kafka_mock,
                rangeRows=RANGE_ROWS,
                batchRows=150,
                parallelism=2,
            )
        ).start()
        writer = Writer(milvus_source.uri, write)
        writer.start()
        created = daemon.call(
            "create",
            {
                "milvus_connect_param": {"uri": milvus_source_rocksmq.uri},
                "collection_infos": [{"name": t.name} for t in (ints, texts, quiet)],
                "backfill": {"collections": ["*"]},
            },
        )
        assert created.code == 200, created.body
        task_id = created.data["task_id"]
        killed = kill_driver_midway(daemon, task_id, ranges_done=6) if kill else None
        backfill = wait_backfill(daemon, task_id, timeout=720)  # minutes more on a loaded machine
        writer.finish()

        assert backfill["ranges_done"] == backfill["ranges_total"], backfill
        assert backfill["ranges_total"] >= 30, backfill  # many boundaries in play
        assert backfill["rows_done"] <= backfill["rows_total"], backfill
        assert backfill["percent"] == 100.0, backfill
        by_collection = {c["collection"]: c for c in backfill["collections"]}
        assert by_collection[f"default.{quiet.name}"]["rows_total"] == QUIET_ROWS, backfill
        if killed:
            assert backfill["attempts"] == 1, backfill  # the killed driver was launched again
            assert "resuming:" in driver_log(daemon, task_id)
            assert wait_until(lambda: no_spark_left(killed["driver_pid"]), 30, "the JVM gone")
        metrics = daemon.get("/metrics")[1].decode()
        for table in (ints, texts, quiet):
            ranges = by_collection[f"default.{table.name}"]["ranges_total"]
            labels = f'collection="default.{table.name}",task_id="{task_id}"'
            assert f"cdc_backfill_ranges_done{{{labels}}} {ranges}.0" in metrics, metrics

        counts = [assert_equal(source, target, t, daemon, task_id) for t in (ints, texts, quiet)]
        assert counts[2] == QUIET_ROWS
        assert any(k in texts.known for k in text_bounds)
        task = task_view(daemon, task_id)
        assert task["state"] == "Running" and not task.get("reason"), task
        print(
            f"boundary backfill run {run} (kill={kill}): rows {counts}, {writer.rounds} write "
            f"rounds, {backfill['ranges_total']} ranges"
        )
    finally:
        source.close()
        target.close()
