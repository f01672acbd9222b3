"""Backfill end to end: rows already in a real Milvus 2.3.5 source (WAL on the Kafka mock, which
no longer holds them) copied by the Spark job into a real Milvus 2.3.5 target while inserts,
upserts and deletes continue; the job's driver is killed with SIGKILL mid-way and resumes; the
target ends equal to the source row by row, with no primary key twice (``rows`` checks both).

The copy asked at create time, under the hardest writes and with many range boundaries, is
tested in ``test_backfill_boundaries.py``; here: a backfill asked later on a running task with
the CLI, and a range that keeps failing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from harness.daemon import REPO_ROOT, Daemon
from harness.services import wait_until
from pymilvus import DataType, MilvusClient
from test_replication import (
    DIM,
    create_source_collection,
    create_task,
    source_config,
    wait_equal,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # Spark; its own waits name what is late


def backfill_config(milvus_source, etcd_service, kafka_mock, **backfill: object) -> dict:
    config = source_config(milvus_source, etcd_service, kafka_mock)
    config["sourceConfig"]["milvus"] = {"uri": milvus_source.uri}
    config["backfill"] = {
        "sparkMaster": "local[2]",
        "taskMaxFailures": 2,
        "batchRows": 2000,
        **backfill,
    }
    return config


def vector(rnd: random.Random) -> list[float]:
    return [rnd.random() for _ in range(DIM)]


def int_rows(ids, tag: str, seed: int = 0) -> list[dict]:
    rnd = random.Random(seed)
    return [{"id": i, "vec": vector(rnd), "title": f"{tag}-{i}", "score": i * 0.5} for i in ids]


class Writer(threading.Thread):
    """Inserts of new keys, upserts and deletes of keys the backfill is copying, a few hundred
    rows a second (the Kafka mock keeps only a few MB per partition)."""

    def __init__(self, uri: str, write) -> None:
        super().__init__(daemon=True)
        self.uri, self.write = uri, write
        self.stop = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        client = MilvusClient(uri=self.uri, dedicated=True)
        rnd = random.Random(11)
        try:
            while not self.stop.is_set():
                self.write(client, rnd, self.rounds)
                self.rounds += 1
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            client.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=60)
        assert self.error is None, self.error
        assert self.rounds >= 5, "the writer hardly wrote during the backfill"


def task_view(daemon: Daemon, task_id: str) -> dict:
    status, _, body = daemon.request("GET", f"/v1/tasks/{task_id}")
    assert status == 200, body
    return body["task"]


def kill_driver_midway(daemon: Daemon, task_id: str, ranges_done: int) -> dict:
    """SIGKILL the backfill's driver once ``ranges_done`` ranges are copied (and some are not);
    the backfill view at that moment."""

    def copying() -> dict | None:
        backfill = task_view(daemon, task_id)["backfill"]
        if backfill and backfill["driver_pid"] and backfill["ranges_done"] >= ranges_done:
            return backfill
        return None

    seen = wait_until(copying, 600, "the backfill copying its ranges", interval=0.2)
    assert seen["ranges_done"] < seen["ranges_total"], f"finished before the kill: {seen}"
    os.kill(seen["driver_pid"], signal.SIGKILL)
    return seen


def create_backfilled(daemon: Daemon, target_uri: str, name: str) -> str:
    """Create a task of the collection ``name`` asking its backfill; the task's id."""
    created = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": target_uri},
            "collection_infos": [{"name": name}],
            "backfill": {"collections": ["*"]},
        },
    )
    assert created.code == 200, created.body
    return str(created.data["task_id"])


def wait_backfill(daemon: Daemon, task_id: str, state: str = "done", timeout: float = 600) -> dict:
    def finished() -> dict | None:
        backfill = task_view(daemon, task_id)["backfill"]
        return backfill if backfill and backfill["state"] in ("done", "failed") else None

    backfill = wait_until(finished, timeout, "the backfill to finish", interval=0.5)
    assert backfill["state"] == state, backfill
    return backfill


def driver_log(daemon: Daemon, task_id: str) -> str:
    return (daemon.workdir / "data" / "backfill" / f"{task_id}.log").read_text(errors="replace")


def no_spark_left(pid: int) -> bool:
    """No process of the killed driver's group is alive (its JVM, its Python workers)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pid:
                    return False
            except ProcessLookupError:
                continue
    return True


def create_varchar_collection(client: MilvusClient, name: str) -> None:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=True)
    schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("note", DataType.VARCHAR, max_length=1024)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, num_shards=1)


QUOTE, BACKSLASH = '"', "\\"


def text_key(n: int) -> str:
    """Keys in no insertion order, a quote or a backslash in some (escaped in expressions)."""
    mark = (QUOTE if n % 97 == 0 else "") + (BACKSLASH if n % 89 == 0 else "")
    return f"{(n * 2654435761) % 100_003:06d}{mark}-{n}"


def varchar_rows(numbers, tag: str, seed: int = 0) -> list[dict]:
    rnd = random.Random(seed)
    return [
        {
            "key": text_key(n),
            "vec": vector(rnd),
            "note": f"{tag}-{n}-" + "x" * 300,
            "extra": n,
        }
        for n in numbers
    ]


def partitioned_rows(ids, tag: str, seed: int = 0) -> list[dict]:
    rnd = random.Random(seed)
    return [{"id": i, "vec": vector(rnd), "title": f"{tag}-{i}", "score": 1.0} for i in ids]


PARTITIONS = ["_default", "p1", "p2", "p3"]


def test_varchar_and_partitioned_backfilled_later_with_the_cli_and_a_kill(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """Asked on a running task (its workers stop for the copy) with ``milvus-cdc task backfill
    --follow``: a varchar-key collection and one with four partitions, 30,000 rows each, with
    about 12 MB of notes each so the queue no longer holds them."""
    suffix = uuid.uuid4().hex[:8]
    text_name, part_name = f"bfv_{suffix}", f"bfp_{suffix}"
    rows_each = 30_000
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_varchar_collection(source, text_name)
        create_source_collection(source, part_name, dynamic=False)
        for partition in PARTITIONS[1:]:
            source.create_partition(part_name, partition)
        for start in range(0, rows_each, 5000):
            source.insert(text_name, varchar_rows(range(start, start + 5000), "old", start))
            for p, partition in enumerate(PARTITIONS):
                ids = range(start + p, start + 5000, len(PARTITIONS))
                rows = [dict(r, title=r["title"] + "y" * 40) for r in partitioned_rows(ids, "o")]
                source.insert(part_name, rows, partition_name=partition)
        daemon = daemon_factory(
            **backfill_config(milvus_source, etcd_service, kafka_mock, rangeRows=5000)
        ).start()
        task_id = create_task(daemon, milvus_source_rocksmq.uri, text_name, part_name)
        wait_until(lambda: target.has_collection(part_name), 60, "the task running")

        new_numbers = iter(range(1_000_000, 2_000_000))

        def write(client: MilvusClient, rnd: random.Random, n: int) -> None:
            client.insert(text_name, varchar_rows([next(new_numbers) for _ in range(10)], "new"))
            touched = rnd.sample(range(rows_each), 15)
            client.upsert(text_name, varchar_rows(touched[:10], f"upserted{n}", n))
            # (pymilvus puts the keys into an expression unescaped: plain ones only)
            plain = [k for k in touched[10:] if k % 97 and k % 89]
            client.delete(text_name, ids=[text_key(k) for k in plain])
            partition = PARTITIONS[n % len(PARTITIONS)]
            ids = [i for i in rnd.sample(range(rows_each), 40) if i % 4 == n % 4][:10]
            client.upsert(
                part_name, partitioned_rows(ids, f"upserted{n}", n), partition_name=partition
            )
            client.insert(
                part_name,
                partitioned_rows([next(new_numbers) for _ in range(10)], "new"),
                partition_name=partition,
            )
            client.delete(part_name, ids=rnd.sample(range(rows_each), 5))

        writer = Writer(milvus_source.uri, write)
        writer.start()
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
        env["PYTHONPATH"] = str(REPO_ROOT)
        command = ["task", "backfill", task_id, *daemon.cli_args, "--follow"]
        cli = subprocess.Popen(
            [sys.executable, "-m", "server", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=daemon.workdir,
        )
        try:
            killed = kill_driver_midway(daemon, task_id, ranges_done=2)
            output, _ = cli.communicate(timeout=300)
        finally:
            if cli.poll() is None:
                cli.kill()
        text = output.decode(errors="replace")
        assert cli.returncode == 0, text
        assert "[" + "#" * 30 + "]" in text and "done" in text, text
        writer.finish()
        backfill = task_view(daemon, task_id)["backfill"]
        assert backfill["state"] == "done" and backfill["attempts"] == 1, backfill
        assert killed["ranges_done"] < backfill["ranges_total"] == 12, backfill
        by_collection = {c["collection"]: c for c in backfill["collections"]}
        assert by_collection[f"default.{text_name}"]["ranges_done"] == 6, backfill
        assert "resuming:" in driver_log(daemon, task_id)

        # keys with quotes: read with the escaped key cursor
        texts = wait_equal(source, target, text_name, "key", timeout=240, by_key=True)
        assert any('"' in key for key in texts) and any("\\" in key for key in texts)
        parts = wait_equal(source, target, part_name, "id", timeout=240)
        assert len(texts) > rows_each - 5 * writer.rounds
        assert len(parts) > rows_each - 5 * writer.rounds
        for partition in PARTITIONS:  # every row in its partition

            def ids_in(client: MilvusClient, partition: str = partition) -> set:
                found = client.query(
                    part_name,
                    filter="id >= 0",
                    output_fields=["id"],
                    partition_names=[partition],
                    limit=16384,
                    consistency_level="Strong",
                )
                return {r["id"] for r in found}

            assert ids_in(source) == ids_in(target), partition
    finally:
        source.close()
        target.close()


def test_a_range_that_keeps_failing_stops_the_backfill_and_streaming_goes_on(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """The target's collection takes titles of 8 characters at most (made so beforehand); the
    rows of the second key range have longer ones, so every attempt of that range is refused by
    the target. The backfill stops naming the collection and the range; the task streams on."""
    name = f"bff_{uuid.uuid4().hex[:8]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_source_collection(source, name, dynamic=False)
        source.insert(name, int_rows(range(1000), "s"))  # "s-123": fits
        source.insert(name, int_rows(range(1000, 2000), "far-too-long-a-title"))
        narrow = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        narrow.add_field("id", DataType.INT64, is_primary=True)
        narrow.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
        narrow.add_field("title", DataType.VARCHAR, max_length=8)
        narrow.add_field("score", DataType.DOUBLE)
        index = target.prepare_index_params()
        index.add_index("vec", index_type="FLAT", metric_type="L2")
        target.create_collection(name, schema=narrow, index_params=index)

        daemon = daemon_factory(
            **backfill_config(milvus_source, etcd_service, kafka_mock, rangeRows=1000)
        ).start()
        task_id = create_backfilled(daemon, milvus_source_rocksmq.uri, name)
        backfill = wait_backfill(daemon, task_id, state="failed", timeout=240)
        reason = backfill["reason"]
        assert f"collection default.{name} range 1 [1000, +inf)" in reason, reason
        assert "after 2 attempts" in reason, reason
        assert backfill["ranges_done"] == 1 and backfill["rows_done"] == 1000, backfill

        task = task_view(daemon, task_id)
        assert task["state"] == "Running", task
        assert "backfill" in task["reason"] and "range 1" in task["reason"], task
        source.insert(name, int_rows(range(5000, 5010), "s"))
        wait_until(
            lambda: len(target.query(name, filter="id >= 5000", consistency_level="Strong")) == 10,
            60,
            "rows written after the failed backfill on the target",
        )
        # a second backfill may be asked once the first has stopped
        again = daemon.call("backfill", {"task_id": task_id, "collections": [name]})
        assert again.code == 200, again.body
        assert again.data["job_id"] != backfill["job_id"]
        refused = daemon.call("backfill", {"task_id": task_id, "collections": ["other"]})
        assert refused.code in (400, 409), refused.body
    finally:
        source.close()
        target.close()
