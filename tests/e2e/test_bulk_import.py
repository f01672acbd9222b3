"""Bulk inserts on a real Milvus 2.3.5 source (``utility.do_bulk_insert`` of row-based JSON
files): their rows never pass through the WAL; the task finds the imports in the source's etcd,
shows them as pending, and copies them with a backfill while inserts, upserts and deletes go on;
the target ends equal to the source row by row.

The source keeps its files in local storage (the wheel's ``storageType: local``,
``localStorage.path`` = ``<base dir>/data``). Its import reads a file through the local chunk
manager, which takes the path as given: a path relative to ``localStorage.path`` fails ("stat
imports/a.json: no such file or directory"; the process runs in the base dir), an absolute one
works. So files are written under the source's base dir and named by absolute path.
"""

from __future__ import annotations

import json
import random
import time
import uuid
import warnings
from pathlib import Path

import etcd3
import pytest
from harness.services import wait_until
from pymilvus import MilvusClient, connections, utility
from pymilvus.decorators import PyMilvusDeprecationWarning
from test_backfill import Writer, backfill_config, task_view, wait_backfill
from test_replication import (
    create_source_collection,
    create_task,
    make_rows,
    source_config,
    wait_equal,
)

from replicator.meta.imports import ImportPhase, read_imports

pytestmark = pytest.mark.e2e


def write_rows_file(source, name: str, rows: list[dict]) -> str:
    """A row-based JSON file the source can read; its absolute path."""
    folder = Path(source.base_dir) / "imports"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def bulk_insert(source, collection: str, path: str) -> int:
    """``utility.do_bulk_insert`` (the ORM API pymilvus 3 deprecates: its warning is not ours);
    the import task's id."""
    alias = f"bulk-{uuid.uuid4().hex[:6]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PyMilvusDeprecationWarning)
        connections.connect(alias, uri=source.uri)
        try:
            return int(utility.do_bulk_insert(collection, files=[path], using=alias))
        finally:
            connections.disconnect(alias)


def import_state(source, task_id: int) -> str:
    alias = f"bulk-{uuid.uuid4().hex[:6]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PyMilvusDeprecationWarning)
        connections.connect(alias, uri=source.uri)
        try:
            return str(utility.get_bulk_insert_state(task_id, using=alias).state_name)
        finally:
            connections.disconnect(alias)


def wait_imported(source, task_id: int) -> None:
    state = wait_until(
        lambda: (s := import_state(source, task_id)) in ("Completed", "Failed") and s,
        120,
        f"bulk insert {task_id} to finish",
        interval=0.5,
    )
    assert state == "Completed", state


def imports_of(daemon, task_id: str) -> dict[int, dict]:
    progress = task_view(daemon, task_id)["progress"] or {}
    return {int(item["job_id"]): item for item in progress.get("imports") or []}


def source_imports(milvus_source, etcd_service) -> dict:
    client = etcd3.client(etcd_service.host, etcd_service.port)
    try:
        return {i.job_id: i for i in read_imports(client, f"{milvus_source.etcd_root_path}/meta/")}
    finally:
        client.close()


@pytest.mark.timeout(900)  # three backfills on Spark; its own waits name what did not happen
def test_bulk_inserts_before_during_and_around_the_task_are_copied(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """Import A completes before the task exists, B is started just before the task is created,
    C runs while the task streams under a writer that also upserts and deletes imported keys.
    Each one is shown as pending, then copied by a backfill the task asks by itself."""
    name = f"bulk_{uuid.uuid4().hex[:8]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_source_collection(source, name, dynamic=False)
        source.insert(name, make_rows(0, 500, "wal"))
        job_a = bulk_insert(
            milvus_source, name, write_rows_file(milvus_source, name, make_rows(10_000, 3000, "a"))
        )
        wait_imported(milvus_source, job_a)

        # the etcd record of a finished 2.3 import, read the way the daemon reads it
        recorded = source_imports(milvus_source, etcd_service)[job_a]
        assert recorded.collection_name == name and recorded.phase is ImportPhase.COMPLETED
        assert recorded.rows == 3000 and recorded.files[0].endswith(".json"), recorded

        daemon = daemon_factory(
            **backfill_config(milvus_source, etcd_service, kafka_mock, rangeRows=2000)
        ).start()
        job_b = bulk_insert(
            milvus_source, name, write_rows_file(milvus_source, name, make_rows(20_000, 3000, "b"))
        )
        task_id = create_task(daemon, milvus_source_rocksmq.uri, name)

        seen_pending: set[int] = set()

        def pending_seen(*jobs: int) -> bool:
            for job, item in imports_of(daemon, task_id).items():
                if item["state"] in ("pending", "copying"):
                    seen_pending.add(job)
            return all(
                job in seen_pending
                or imports_of(daemon, task_id).get(job, {}).get("state") == "copied"
                for job in jobs
            )

        wait_until(lambda: pending_seen(job_a, job_b), 60, "imports A and B known to the task")
        wait_until(
            lambda: all(
                imports_of(daemon, task_id).get(j, {}).get("state") == "copied"
                for j in (job_a, job_b)
            ),
            300,
            "imports A and B copied",
            interval=1,
        )
        wait_imported(milvus_source, job_b)
        assert job_a in seen_pending, "import A never shown as pending"

        def write(client: MilvusClient, rnd: random.Random, n: int) -> None:
            client.insert(name, make_rows(1_000_000 + n * 20, 20, f"new{n}"))
            touched = rnd.sample(range(10_000, 13_000), 20)  # keys import A loaded
            upserts = [make_rows(key, 1, f"upserted{n}")[0] for key in touched[:10]]
            client.upsert(name, upserts)
            client.delete(name, ids=touched[10:])

        writer = Writer(milvus_source.uri, write)
        writer.start()
        time.sleep(1)
        job_c = bulk_insert(
            milvus_source, name, write_rows_file(milvus_source, name, make_rows(30_000, 3000, "c"))
        )
        wait_until(lambda: pending_seen(job_c), 60, "import C shown as pending")
        wait_imported(milvus_source, job_c)
        wait_until(
            lambda: imports_of(daemon, task_id).get(job_c, {}).get("state") == "copied",
            300,
            "import C copied",
            interval=1,
        )
        assert job_c in seen_pending, "import C never shown as pending"
        wait_backfill(daemon, task_id)
        writer.finish()

        expected = wait_equal(source, target, name, "id", timeout=240)
        for start in (10_000, 20_000, 30_000):  # rows of every import are there
            assert any(start <= key < start + 3000 for key in expected), start
        assert any(str(r["title"]).startswith("upserted") for r in expected.values())

        task = task_view(daemon, task_id)
        assert task["state"] == "Running", task
        assert not task["progress"]["imports_pending"], task["progress"]
        assert "bulk-imported" not in task["reason"], task["reason"]
        metrics = daemon.get("/metrics")[1].decode()
        assert f'cdc_imports_pending{{task_id="{task_id}"}} 0.0' in metrics
        copied = imports_of(daemon, task_id)
        assert {job_a, job_b, job_c} <= set(copied), copied
        print(f"bulk import e2e: {len(expected)} rows, {writer.rounds} write rounds, {copied}")
    finally:
        source.drop_collection(name)
        source.close()
        target.close()


@pytest.mark.timeout(600)
def test_a_completed_import_waits_until_the_source_serves_it(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """ "Completed" is not "readable": an import into a collection released on the source
    completes, but no query sees its rows until the collection is loaded again. The task keeps
    it pending (saying what it waits for, and streaming on) instead of copying the collection
    without it, and copies it once the source serves its segments."""
    name = f"bulks_{uuid.uuid4().hex[:8]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_source_collection(source, name, dynamic=False)
        source.insert(name, make_rows(0, 300, "wal"))
        daemon = daemon_factory(
            **backfill_config(milvus_source, etcd_service, kafka_mock, rangeRows=2000)
        ).start()
        task_id = create_task(daemon, milvus_source_rocksmq.uri, name)
        wait_until(lambda: target.has_collection(name), 60, "the task running")

        source.release_collection(name)
        job = bulk_insert(
            milvus_source, name, write_rows_file(milvus_source, name, make_rows(40_000, 2000, "i"))
        )
        wait_imported(milvus_source, job)
        source.insert(name, make_rows(5000, 10, "after"))  # streamed meanwhile

        def waiting() -> dict | None:
            # shown waiting once the import completes, and why once the task's watcher asked
            # the source what it serves
            item = imports_of(daemon, task_id).get(job, {})
            detail = item.get("detail", "")
            return item if "query nodes to serve" in detail and "is it loaded?" in detail else None

        item = wait_until(waiting, 60, "the import shown waiting for the source to serve it")
        assert item["phase"] == "completed", item
        for _ in range(6):  # three looks of the task's watcher: still not copied
            item = imports_of(daemon, task_id)[job]
            assert item["state"] == "pending", item
            assert not task_view(daemon, task_id)["backfill"]
            time.sleep(1)
        source.load_collection(name)  # (the task releases and loads the target's copy too)
        wait_until(
            lambda: imports_of(daemon, task_id).get(job, {}).get("state") == "copied",
            300,
            "the import copied once the source serves it",
            interval=1,
        )
        wait_backfill(daemon, task_id)
        expected = wait_equal(source, target, name, "id", timeout=120)
        assert sum(40_000 <= key < 42_000 for key in expected) == 2000
        assert len(expected) == 2310
    finally:
        source.drop_collection(name)
        source.close()
        target.close()


def test_without_backfill_an_import_stays_pending_with_what_to_do(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq
):
    """A daemon that cannot backfill (no ``sourceConfig.milvus.uri``) keeps a completed import
    pending, says how to copy it, and streams on."""
    name = f"bulkp_{uuid.uuid4().hex[:8]}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_source_collection(source, name, dynamic=False)
        daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
        task_id = create_task(daemon, milvus_source_rocksmq.uri, name)
        wait_until(lambda: target.has_collection(name), 60, "the task running")
        job = bulk_insert(
            milvus_source, name, write_rows_file(milvus_source, name, make_rows(0, 200, "p"))
        )
        wait_imported(milvus_source, job)
        wait_until(
            lambda: imports_of(daemon, task_id).get(job, {}).get("phase") == "completed",
            60,
            "the completed import seen by the task",
        )
        source.insert(name, make_rows(5000, 10, "after"))
        wait_until(
            lambda: len(target.query(name, filter="id >= 5000", consistency_level="Strong")) == 10,
            60,
            "rows written after the import on the target",
        )
        task = task_view(daemon, task_id)
        (item,) = task["progress"]["imports_pending"]
        assert item["job_id"] == job and item["state"] == "pending", item
        command = f"milvus-cdc task backfill {task_id} --collection {name}"
        assert command in item["detail"] and "sourceConfig.milvus.uri" in item["detail"], item
        assert task["state"] == "Running" and f"job {job}" in task["reason"], task
        assert command in task["reason"], task["reason"]
        assert target.query(name, filter="id < 200", consistency_level="Strong") == []
        metrics = daemon.get("/metrics")[1].decode()
        assert f'cdc_imports_pending{{task_id="{task_id}"}} 1.0' in metrics
    finally:
        source.drop_collection(name)
        source.close()
        target.close()
