"""Bulk imports as the source's etcd records them: rows a source imports never pass through the
WAL, so a task learns of them here (and, on 2.6, from the WAL's Import message).

Two layouts, both under ``<root>/<meta>/``:

``importtask/<taskID>`` (Milvus 2.3, the root coordinator's import manager,
``internal/rootcoord/import_manager.go`` ``BuildImportTaskKey``; one task per row-based file, or
per set of column-based files), value ``datapb.ImportTaskInfo``::

    1 id, 3 datanode_id, 4 collection_id, 5 partition_id, 6 channel_names, 9 files,
    10 create_ts (unix seconds), 11 state (ImportTaskState: 1 stateCode, 2 segments,
    3 row_ids, 4 row_count, 5 error_message), 12 collection_name, 13 partition_name,
    14 infos (KeyValuePair), 15 start_ts, 16 database_name (absent for the default database)

    stateCode (common.ImportState): 0 pending, 2 started, 5 persisted, 8 flushed,
    6 completed, 1 failed, 7 failed and cleaned

  The imported segments stay invisible to queries until the task is completed (the manager
  flips persisted to completed once the segments are flushed and indexed); a failed task's
  segments are dropped. Completed is not readable: the query nodes load the new segments later
  (seconds, or never while the collection is released), so a copy waits until they serve
  ``segments`` (:mod:`replicator.meta.segments`). Records older than
  ``rootCoord.importTaskRetention`` (24 h by default) are removed.

``datacoord-meta/import-job/<jobID>`` (Milvus 2.4 and later, the data coordinator's import v2,
``internal/metastore/kv/datacoord`` ``buildImportJobKey``), value ``datapb.ImportJob``::

    1 jobID, 2 dbID, 3 collectionID, 4 collection_name, 5 partitionIDs, 6 vchannels,
    11 state (internal.ImportJobState: 0 none, 1 pending, 2 pre-importing, 3 importing,
    4 failed, 5 completed, 6 index building, 7 sorting), 12 reason, 13 complete_time,
    14 files (ImportFile: 1 id, 2 paths), 16 create_time

``datacoord-meta/import-task/<taskID>`` (2.4+), value ``datapb.ImportTaskV2``: 1 jobID,
2 taskID, 3 collectionID, 4 segmentIDs (the job's segments are those of its tasks; a job
completes once they are indexed, again before the query nodes load them). A pre-import task
(``preimport-task/``) writes no segments. Where the data coordinator sorts imported segments
into new ones (``sorted_segmentIDs``, 10) the new ones name the old in ``compactionFrom``, which
:func:`replicator.meta.segments.unserved` follows.

The 2.3 layout was read from a real Milvus 2.3.5 here (tests/e2e/test_bulk_import.py
reads it live); the 2.4+ layout is taken from Milvus's ``pkg/proto/data_coord.proto`` and
``internal.proto`` and tested with records built from those numbers only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from replicator.codec.wire import WireError, int64s, iter_fields, to_signed64

T = TypeVar("T")

IMPORT_TASKS_23 = "importtask/"
IMPORT_JOBS_24 = "datacoord-meta/import-job/"
IMPORT_TASKS_24 = "datacoord-meta/import-task/"


class ImportPhase(enum.StrEnum):
    RUNNING = "running"  # not visible on the source yet
    COMPLETED = "completed"  # its rows are readable on the source
    FAILED = "failed"  # nothing of it is visible on the source


# common.ImportState (2.3) and internal.ImportJobState (2.4+) by number
_PHASES_23 = {6: ImportPhase.COMPLETED, 1: ImportPhase.FAILED, 7: ImportPhase.FAILED}
_PHASES_24 = {5: ImportPhase.COMPLETED, 4: ImportPhase.FAILED}


@dataclass(frozen=True)
class SourceImport:
    """One import the source ran (a 2.3 import task, or a 2.4+ import job)."""

    job_id: int
    collection_id: int
    collection_name: str
    phase: ImportPhase
    files: tuple[str, ...] = ()
    partition: str = ""
    db_name: str = ""  # "" when the record does not say (2.3: the default database)
    rows: int = 0
    reason: str = ""
    created: str = ""  # as the record gives it (2.3: unix seconds; 2.4+: text)
    segments: tuple[int, ...] = ()  # the segments it wrote (readable once the source serves them)

    @property
    def label(self) -> str:
        return f"{self.db_name or 'default'}.{self.collection_name}"


def _text(value: int | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: int | bytes) -> int:
    return to_signed64(value) if isinstance(value, int) else 0


def decode_import_task(value: bytes) -> SourceImport:
    """A 2.3 ``datapb.ImportTaskInfo``."""
    fields: dict[str, Any] = {"files": [], "state": b""}
    for number, _, v in iter_fields(value):
        if number == 9:
            fields["files"].append(_text(v))
        elif number == 11 and isinstance(v, bytes):
            fields["state"] = v
        else:
            fields[str(number)] = v
    state: dict[int, int | bytes] = {}
    segments: list[int] = []
    for n, _, x in iter_fields(fields["state"] or b""):
        if n == 2:
            segments.extend(int64s(x))
        else:
            state[n] = x
    code = _int(state.get(1, 0))
    return SourceImport(
        job_id=_int(fields.get("1", 0)),
        collection_id=_int(fields.get("4", 0)),
        collection_name=_text(fields.get("12", b"")),
        phase=_PHASES_23.get(code, ImportPhase.RUNNING),
        files=tuple(fields["files"]),
        partition=_text(fields.get("13", b"")),
        db_name=_text(fields.get("16", b"")),
        rows=_int(state.get(4, 0)),
        reason=_text(state.get(5, b"")),
        created=str(_int(fields.get("10", 0))),
        segments=tuple(segments),
    )


def decode_import_job(value: bytes, databases: dict[int, str] | None = None) -> SourceImport:
    """A 2.4+ ``datapb.ImportJob``; ``databases`` names its dbID."""
    fields: dict[int, int | bytes] = {}
    files: list[str] = []
    for number, _, v in iter_fields(value):
        if number == 14 and isinstance(v, bytes):
            for n, _, path in iter_fields(v):
                if n == 2:
                    files.append(_text(path))
        elif number != 5:  # partitionIDs (packed or not): not needed
            fields[number] = v
    db_id = _int(fields.get(2, 0))
    return SourceImport(
        job_id=_int(fields.get(1, 0)),
        collection_id=_int(fields.get(3, 0)),
        collection_name=_text(fields.get(4, b"")),
        phase=_PHASES_24.get(_int(fields.get(11, 0)), ImportPhase.RUNNING),
        files=tuple(files),
        db_name=(databases or {}).get(db_id, ""),
        reason=_text(fields.get(12, b"")),
        created=_text(fields.get(16, b"")),
    )


def decode_import_task_v2(value: bytes) -> tuple[int, tuple[int, ...]]:
    """A 2.4+ ``datapb.ImportTaskV2``: its job id and the segments it wrote."""
    job_id = 0
    segments: list[int] = []
    for number, _, v in iter_fields(value):
        if number == 1:
            job_id = _int(v)
        elif number == 4:
            segments.extend(int64s(v))
    return job_id, tuple(segments)


def read_imports(
    client: Any, meta_prefix: str, databases: dict[int, str] | None = None
) -> list[SourceImport]:
    """Every import the source's etcd still records under ``meta_prefix``
    (``<root>/<meta>/``), both layouts; undecodable records are skipped (a partial write is
    read again at the next poll). Blocking."""
    found = _decoded(client, meta_prefix + IMPORT_TASKS_23, decode_import_task)
    jobs = _decoded(client, meta_prefix + IMPORT_JOBS_24, lambda v: decode_import_job(v, databases))
    if jobs:  # a 2.4+ job's segments are those of its import tasks
        by_job: dict[int, list[int]] = {}
        for job_id, segments in _decoded(
            client, meta_prefix + IMPORT_TASKS_24, decode_import_task_v2
        ):
            by_job.setdefault(job_id, []).extend(segments)
        jobs = [replace(job, segments=tuple(by_job.get(job.job_id, ()))) for job in jobs]
    return found + jobs


def _decoded(client: Any, prefix: str, decode: Callable[[bytes], T]) -> list[T]:
    found = []
    for value, _meta in client.get_prefix(prefix):
        try:
            found.append(decode(bytes(value)))
        except (WireError, UnicodeDecodeError):
            continue
    return found
