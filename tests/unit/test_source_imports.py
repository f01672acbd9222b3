"""Bulk imports: the source's etcd records decoded, and a task's view of them (pending, waiting
for the source to serve a completed import's segments, copying, copied, failed on the source,
waiting for an operator).

The 2.3 values below are bytes a real Milvus 2.3.5 wrote under ``by-dev/meta/importtask/<id>``
for two ``utility.do_bulk_insert`` calls (one with a relative path it could not read, one that
completed); tests/e2e/test_bulk_import.py reads such records from a live source with the same
decoder. The 2.4+ record is built from the field numbers of Milvus's ``datapb.ImportJob``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metastore import TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.backfill.state import BackfillJob
from replicator.codec.wire import encode_varint
from replicator.meta.imports import (
    ImportPhase,
    SourceImport,
    decode_import_job,
    decode_import_task,
)
from replicator.pipeline.imports import TaskImports
from replicator.pipeline.status import TaskWarnings
from replicator.pipeline.task_state import RunnerState

COMPLETED_23 = (
    b"\x08\x92\x80\xa0\xf5\xcf\xd5\x87\xc4\x06\x18\x01 \x8c\x80\xa0\xf5\xcf\xd5\x87\xc4\x06"
    b"(\x8d\x80\xa0\xf5\xcf\xd5\x87\xc4\x062+by-dev-rootcoord-dml_0_470659889415847948v0"
    b"J//tmp/imp-explore/run/milvus/data/imports/a.jsonP\xe2\x85\x90\xd8\x06Z\x0f\x08\x06"
    b"\x12\t\x96\x80\xa0\xf5\xcf\xd5\x87\xc4\x06 db\x03impj\x08_defaultr\x17\n\x10"
    b"progress_percent\x12\x03100r\x14\n\x0cpersist_cost\x12\x040.25x\xe2\x85\x90\xd8\x06"
)
FAILED_23 = (
    b"\x08\x90\x80\xa0\xf5\xcf\xd5\x87\xc4\x06\x18\x01 \x8c\x80\xa0\xf5\xcf\xd5\x87\xc4\x06"
    b"(\x8d\x80\xa0\xf5\xcf\xd5\x87\xc4\x062+by-dev-rootcoord-dml_0_470659889415847948v0"
    b"J\x0eimports/a.jsonP\xe2\x85\x90\xd8\x06Z|\x08\x01*xfailed to get file size of "
    b"'imports/a.json', error:stat imports/a.json: no such file or directory: importing data "
    b"failedb\x03impj\x08_defaultr\x15\n\x10progress_percent\x12\x010x\xe2\x85\x90\xd8\x06"
)
COLLECTION_ID = 470659889415847948
TASK = "t-imports"


def test_a_completed_2_3_import_task():
    record = decode_import_task(COMPLETED_23)
    assert record == SourceImport(
        job_id=470659889415847954,
        collection_id=COLLECTION_ID,
        collection_name="imp",
        phase=ImportPhase.COMPLETED,
        files=("/tmp/imp-explore/run/milvus/data/imports/a.json",),
        partition="_default",
        rows=100,
        created="1795424994",
        segments=(470659889415847958,),  # ImportTaskState.segments: the one it wrote
    )
    assert record.label == "default.imp"


def test_a_failed_2_3_import_task_keeps_its_reason():
    record = decode_import_task(FAILED_23)
    assert record.phase is ImportPhase.FAILED and record.rows == 0
    assert record.files == ("imports/a.json",)
    assert "no such file or directory" in record.reason


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return encode_varint(number << 3) + encode_varint(value)
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        (1, ImportPhase.RUNNING),
        (3, ImportPhase.RUNNING),
        (4, ImportPhase.FAILED),
        (5, ImportPhase.COMPLETED),
        (6, ImportPhase.RUNNING),
    ],
)
def test_a_2_4_import_job(state: int, phase: ImportPhase):
    import_file = _field(1, 7) + _field(2, b"s3://b/x.parquet") + _field(2, b"s3://b/y.parquet")
    value = b"".join(
        [
            _field(1, 9001),
            _field(2, 2),
            _field(3, 555),
            _field(4, b"orders"),
            _field(5, b"\x01\x02"),  # packed partition ids
            _field(6, b"dml_0_555v0"),
            _field(11, state),
            _field(12, b"" if state != 4 else b"bad file"),
            _field(14, import_file),
            _field(16, b"2026-11-23T09:00:00Z"),
        ]
    )
    record = decode_import_job(value, {2: "shop"})
    assert (record.job_id, record.collection_id, record.label) == (9001, 555, "shop.orders")
    assert record.phase is phase
    assert record.files == ("s3://b/x.parquet", "s3://b/y.parquet")
    assert record.reason == ("bad file" if state == 4 else "")


# --- the task's view ----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path):
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.sqlite3")), "test")
    now = time.time()
    store.create_task(TaskRecord(TASK, TaskState.RUNNING, "", {}, now, now))
    yield store
    store.close()


def imports_of(store, blocker: str = "") -> TaskImports:
    state = RunnerState(store, TASK)
    warnings = TaskWarnings(store, state, TASK)
    warnings.load()
    imports = TaskImports(state, warnings, TASK, blocker)
    imports.load()
    return imports


def resolve(collection_id: int) -> tuple[str, str] | None:
    return ("default.imp", "default.imp_copy") if collection_id == COLLECTION_ID else None


def seen(
    phase: ImportPhase,
    job_id: int = 1,
    collection_id: int = COLLECTION_ID,
    segments: tuple[int, ...] = (3,),
) -> SourceImport:
    return SourceImport(
        job_id, collection_id, "imp", phase, ("/f.json",), rows=10, segments=segments
    )


def served(imports: TaskImports) -> None:
    """The source serves every completed import's segments now (tests/unit/test_import_serving.py
    covers the wait before)."""
    for item in imports.unserved():
        imports.serving_seen(item["job_id"], [])


def test_an_import_is_pending_then_copied_by_the_backfill_that_followed_it(store):
    imports = imports_of(store)
    assert not imports.observe(
        [seen(ImportPhase.RUNNING), seen(ImportPhase.RUNNING, 2, 99)], resolve
    )
    (item,) = imports.pending  # the unselected collection's import is not the task's
    assert item["state"] == "pending" and item["detail"] == "running on the source"
    assert "job 1" in store.get_task(TASK).reason
    assert not imports.observe([seen(ImportPhase.COMPLETED)], resolve)
    served(imports)
    assert imports.ready() == ["default.imp"]

    job = BackfillJob.new(imports.ready())
    imports.backfill_starts(job)
    assert imports.pending[0]["state"] == "copying" and not imports.ready()
    imports.backfill_ended(job.with_(state="done"))
    assert imports.pending == []
    (item,) = imports.items
    assert item["state"] == "copied" and job.job_id in item["detail"]
    assert "bulk-imported" not in store.get_task(TASK).reason  # the warning is withdrawn
    assert imports_of(store).items == imports.items  # kept across a restart


def test_a_backfill_started_before_an_import_completed_does_not_count(store):
    imports = imports_of(store)
    imports.observe([seen(ImportPhase.RUNNING)], resolve)
    job = BackfillJob.new(["*"])
    imports.backfill_starts(job)  # the import was still running: not copied by this job
    imports.observe([seen(ImportPhase.COMPLETED)], resolve)
    served(imports)
    imports.backfill_ended(job.with_(state="done"))
    assert [i["state"] for i in imports.pending] == ["pending"]
    assert imports.ready() == ["default.imp"]


def test_a_failed_backfill_leaves_the_import_to_an_operator(store):
    imports = imports_of(store)
    imports.observe([seen(ImportPhase.COMPLETED)], resolve)
    served(imports)
    job = BackfillJob.new(imports.ready())
    imports.backfill_starts(job)
    imports.backfill_ended(job.with_(state="failed", reason="range 0 refused"))
    (item,) = imports.pending
    assert item["state"] == "pending" and "range 0 refused" in item["detail"]
    assert f"milvus-cdc task backfill {TASK} --collection imp" in item["detail"]
    assert imports.ready() == []  # no second automatic attempt


def test_without_backfill_an_import_waits_with_the_remedy(store):
    imports = imports_of(store, blocker="set sourceConfig.milvus.uri")
    assert not imports.observe([seen(ImportPhase.COMPLETED)], resolve)
    (item,) = imports.pending
    assert f"milvus-cdc task backfill {TASK} --collection imp" in item["detail"]
    assert "set sourceConfig.milvus.uri" in item["detail"]
    assert "set sourceConfig.milvus.uri" in store.get_task(TASK).reason


def test_an_import_that_failed_on_the_source_is_not_pending(store):
    imports = imports_of(store)
    imports.observe([seen(ImportPhase.RUNNING)], resolve)
    imports.observe(
        [SourceImport(1, COLLECTION_ID, "imp", ImportPhase.FAILED, reason="bad")], resolve
    )
    assert imports.pending == [] and not imports.ready()
    (item,) = imports.items
    assert item["state"] == "failed_on_source" and "bad" in item["detail"]
    assert "bulk-imported" not in store.get_task(TASK).reason


def test_a_record_of_an_earlier_version_is_read_and_copied_by_a_later_backfill(store):
    """Before imports were followed, a 2.6 Import message left only these fields and a warning
    saying to ask a backfill; a backfill asked after it copies it and withdraws the warning."""
    old_warning = (
        "the source bulk-imported into default.imp (job 9001); imported rows do not pass "
        "through the WAL and are not on the target yet: ask a backfill of imp to copy them"
    )
    state = RunnerState(store, TASK)
    record = {"job_id": 9001, "collection": "default.imp", "source_collection": "default.imp"}
    state.record_import(9001, {**record, "files": [["s3://b/x"]], "ts": 5})
    TaskWarnings(store, state, TASK).warn(old_warning)
    assert old_warning in store.get_task(TASK).reason
    imports = imports_of(store)
    (item,) = imports.pending
    assert (item["state"], item["phase"]) == ("pending", "unknown")
    assert imports.ready() == []  # its completion is not known: not copied by itself
    imports.backfill_ended(BackfillJob.new(["imp"]).with_(state="done"))
    assert imports.pending == [] and imports.items[0]["state"] == "copied"
    assert old_warning not in store.get_task(TASK).reason


def test_finished_imports_are_forgotten_once_the_source_forgets_them(store):
    imports = imports_of(store)
    imports.observe([seen(ImportPhase.COMPLETED), seen(ImportPhase.RUNNING, 2)], resolve)
    served(imports)
    job = BackfillJob.new(["imp"])
    imports.backfill_starts(job)
    imports.backfill_ended(job.with_(state="done"))
    imports.observe([seen(ImportPhase.RUNNING, 2)], resolve)  # the source's retention ended 1
    assert [i["job_id"] for i in imports.items] == [2]  # 2 is still to be copied
    assert [i["job_id"] for i in imports_of(store).items] == [2]


def test_an_import_into_a_dropped_collection_has_nothing_left_to_copy(store):
    imports = imports_of(store)
    imports.observe([seen(ImportPhase.COMPLETED)], resolve)
    served(imports)
    imports.collections_left(lambda collection_id: collection_id == COLLECTION_ID)
    assert imports.ready() == ["default.imp"]
    imports.collections_left(lambda _collection_id: False)
    assert imports.pending == [] and imports.ready() == []
    assert imports.items[0]["state"] == "collection_dropped"
    assert "bulk-imported" not in store.get_task(TASK).reason


# --- a completed import waits until the source serves it ---------------------------------------


def test_a_completed_import_is_copied_only_once_the_source_serves_its_segments(store):
    imports = imports_of(store)
    assert not imports.observe([seen(ImportPhase.COMPLETED, segments=(11, 12))], resolve)
    assert imports.ready() == [] and [i["job_id"] for i in imports.unserved()] == [1]
    job = BackfillJob.new(["*"])
    imports.backfill_starts(job)  # a backfill now would read the collection without them
    assert imports.pending[0]["state"] == "pending"
    imports.backfill_ended(job.with_(state="done"))
    assert imports.pending[0]["state"] == "pending"

    imports.serving_seen(1, [12], "")
    (item,) = imports.pending
    assert "query nodes to serve 1 of its 2 segments (12)" in item["detail"], item
    assert imports_of(store).unserved()  # kept across a restart
    imports.serving_seen(1, [], "")
    assert imports.ready() == ["default.imp"] and imports.unserved() == []
    assert imports.pending[0]["detail"] == "completed on the source; a backfill copies it"
    job = BackfillJob.new(imports.ready())
    imports.backfill_starts(job)
    imports.backfill_ended(job.with_(state="done"))
    assert imports.pending == [] and imports.items[0]["state"] == "copied"


def test_what_the_source_said_is_shown_and_an_operator_told_what_to_do_after(store):
    imports = imports_of(store, blocker="needs the Python package 'pyspark'")
    imports.observe([seen(ImportPhase.COMPLETED, segments=(11, 12))], resolve)
    imports.serving_seen(1, [11, 12], "it serves no segment of the collection: is it loaded?")
    (item,) = imports.pending
    assert "is it loaded?" in item["detail"], item
    assert f"then ask a backfill of imp (milvus-cdc task backfill {TASK}" in item["detail"], item


def test_an_import_recorded_before_segments_were_followed_is_checked_again(store):
    """A record saved by an earlier version (completed, no segments, no ``served``) is taken
    as ready only until the source's record, with its segments, is seen again."""
    state = RunnerState(store, TASK)
    state.record_import(
        1,
        {
            "job_id": 1,
            "collection_id": COLLECTION_ID,
            "collection": "default.imp_copy",
            "source_collection": "default.imp",
            "files": [["/f.json"]],
            "ts": 1,
            "phase": "completed",
            "rows": 10,
            "state": "pending",
            "detail": "completed on the source; a backfill copies it",
            "backfill_job": "",
            "warning": "w",
        },
    )
    imports = imports_of(store)
    assert imports.ready() == ["default.imp"]
    imports.observe([seen(ImportPhase.COMPLETED, segments=(11, 12))], resolve)
    assert imports.ready() == [] and imports.unserved()[0]["segments"] == [11, 12]


@pytest.mark.parametrize(("copied", "state"), [(9, "pending"), (10, "copied"), (500, "copied")])
def test_a_backfill_that_copied_fewer_rows_than_the_import_loaded_does_not_count(
    store, copied: int, state: str
):
    imports = imports_of(store)
    imports.observe([seen(ImportPhase.COMPLETED, segments=(11, 12))], resolve)
    imports.serving_seen(1, [], "")
    job = BackfillJob.new(imports.ready())
    imports.backfill_starts(job)
    imports.backfill_ended(job.with_(state="done"), {"default.imp": copied})
    (item,) = imports.items
    assert item["state"] == state, item
    if state == "pending":
        assert f"copied {copied} rows of default.imp, fewer than the 10" in item["detail"]
        assert f"milvus-cdc task backfill {TASK} --collection imp" in item["detail"]
        assert "bulk-imported into default.imp (job 1)" in store.get_task(TASK).reason
        assert imports.ready() == []  # not copied again by itself: an operator looks first
