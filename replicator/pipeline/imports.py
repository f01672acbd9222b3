"""Bulk imports into the replicated collections: their rows never pass through the WAL, so a task
follows them on the side and copies them with a backfill.

Where a task learns of an import: from the source's etcd (:mod:`replicator.meta.imports`; every
generation, polled by :class:`ImportWatcher`), and on 2.6 also from the WAL's ``Import`` message.
Each one is kept in the task's state (``import/<job id>``, see :mod:`task_state`) and shown in
``progress.imports`` (all) and ``progress.imports_pending`` (not on the target yet), with a
warning until it is copied.

Its life on the task::

    pending  (running on the source, or completed there and waiting for a copy)
      -> copying  a backfill of its collection started after the import had completed and the
                  source's query nodes served its segments
      -> copied   that backfill is done; the warning is withdrawn
    pending -> failed_on_source   the source's import failed: it loaded nothing
    pending -> collection_dropped the collection was dropped before the copy

Finished imports are forgotten once the source no longer records them.

"Completed" on the source is not "readable" there: the query nodes load an import's segments
later (seconds, or not before the collection is loaded again), and a backfill reads what they
serve. So a completed import waits, with a ``detail`` saying so, until the source serves every
one of its segments (:mod:`import_serving`, :mod:`replicator.meta.segments`); only then does a
backfill count as copying it.

Completed imports are copied by a backfill the runner asks by itself (``TaskImports.ready``):
the task's workers stop, the job copies the collection with upserts, and streaming hands over
from the saved positions (:mod:`handover`), so nothing is lost or doubled. A backfill an
operator asked covers the imports that had completed before it started. When the daemon cannot
backfill (no ``sourceConfig.milvus.uri`` or no pyspark), or an import's backfill failed, the
import stays pending with a ``detail`` saying what the operator has to do.

An import the source's etcd no longer records (2.3 keeps them ``importTaskRetention``, 24 h by
default) and whose Import message is not in the WAL is not seen: copy such history with a
backfill.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from metastore import MetaStoreError
from replicator.backfill.state import BackfillJob
from replicator.codec.streaming_ddl_ops import ImportJob
from replicator.fibers import Steps, pause
from replicator.hybrid_time import from_seconds
from replicator.meta.imports import ImportPhase, SourceImport
from replicator.pipeline.status import TaskWarnings
from replicator.pipeline.task_state import RunnerState
from replicator.sources.base import SourceUnavailableError

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
UNKNOWN = "unknown"  # the phase of an import known only from the WAL
PENDING, COPYING, COPIED = "pending", "copying", "copied"
FAILED_ON_SOURCE, COLLECTION_DROPPED = "failed_on_source", "collection_dropped"
FINISHED = (COPIED, FAILED_ON_SOURCE, COLLECTION_DROPPED)

# (source "db.name", target "db.name") of a selected collection; None: not replicated
Resolve = Callable[[int], tuple[str, str] | None]


@dataclass(frozen=True)
class _Seen:
    """An import as the source's etcd or the WAL shows it now."""

    job_id: int
    collection_id: int
    source: str  # "db.name" on the source
    target: str  # "db.name" on the target
    files: list[list[str]]
    ts: int  # hybrid timestamp of its creation (0: unknown)
    phase: str  # an ImportPhase, or UNKNOWN (from the WAL only)
    rows: int = 0
    reason: str = ""  # why it failed on the source
    segments: tuple[int, ...] = ()  # the segments it wrote (from the source's etcd)


def covers(job: BackfillJob, source_label: str) -> bool:
    """Does a backfill job copy this source collection (``db.name``)?"""
    if job.collections:
        return any(c.label == source_label for c in job.collections)
    db, _, name = source_label.partition(".")
    return (
        job.covers_all
        or source_label in job.requested
        or (db == "default" and name in job.requested)
    )


class TaskImports:
    """The imports of one task (see the module docstring); used by the runner's fiber, the
    watcher's fiber and a 2.6 worker (on the pool's threads), so every change holds a lock
    (the metastore is written after it is released: ``progress`` reads the items from the
    event loop)."""

    def __init__(
        self, state: RunnerState, warnings: TaskWarnings, task_id: str, blocker: str = ""
    ) -> None:
        self._state = state
        self._warnings = warnings
        self._task_id = task_id
        # why the daemon cannot backfill ("" when it can)
        self.blocker = blocker
        self._items: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        items = {int(item["job_id"]): _upgraded(item) for item in self._state.imports()}
        with self._lock:
            self._items = items

    def _save(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self._state.record_import(int(item["job_id"]), item)

    # --- views ---------------------------------------------------------------------------------
    @property
    def items(self) -> list[dict[str, Any]]:
        """Every import the task knows of (copied and failed ones too)."""
        with self._lock:
            return [dict(item) for _, item in sorted(self._items.items())]

    @property
    def pending(self) -> list[dict[str, Any]]:
        """Imports whose rows are not on the target yet."""
        return [item for item in self.items if item["state"] in (PENDING, COPYING)]

    def ready(self) -> list[str]:
        """Source collections (``db.name``) with a completed import that a backfill the runner
        asks by itself should copy now ([] when the daemon cannot backfill)."""
        if self.blocker:
            return []
        with self._lock:
            return sorted(
                {
                    item["source_collection"]
                    for item in self._items.values()
                    if item["state"] == PENDING
                    and item["phase"] == ImportPhase.COMPLETED
                    and item.get("served", True)
                    and not item.get("manual")
                }
            )

    # --- what the task learns ------------------------------------------------------------------
    def add(self, job: ImportJob, target_collection: str) -> None:
        """A 2.6 Import message of a replicated collection."""
        source = f"{job.db_name or 'default'}.{job.collection_name}"
        files = [list(paths) for paths in job.files]
        self._learn(
            _Seen(job.job_id, job.collection_id, source, target_collection, files, job.ts, UNKNOWN)
        )

    def observe(self, found: list[SourceImport], resolve: Resolve) -> bool:
        """The imports the source's etcd records now; True when one of the task's imports is
        ready to copy (see :meth:`ready`). Copied and failed imports the source no longer
        records are forgotten (the source keeps them for its retention time)."""
        for imported in found:
            names = resolve(imported.collection_id)
            if names is None:
                continue  # not replicated, or not known to the task yet (next poll)
            created = int(imported.created) if imported.created.isdigit() else 0
            self._learn(
                _Seen(
                    imported.job_id,
                    imported.collection_id,
                    *names,
                    [list(imported.files)],
                    from_seconds(created),
                    imported.phase,
                    imported.rows,
                    imported.reason,
                    imported.segments,
                )
            )
        recorded = {imported.job_id for imported in found}
        with self._lock:
            gone = [
                job_id
                for job_id, item in self._items.items()
                if item["state"] in FINISHED and item["phase"] != UNKNOWN and job_id not in recorded
            ]
            for job_id in gone:
                del self._items[job_id]
        for job_id in gone:
            self._state.forget_import(job_id)
        return bool(self.ready())

    def collections_left(self, replicated: Callable[[int], bool]) -> None:
        """Imports into collections the task no longer replicates (dropped on the source since)
        have nothing left to copy."""
        changed, withdrawn = [], []
        with self._lock:
            for item in self._items.values():
                collection_id = item.get("collection_id")
                if item["state"] not in (PENDING, COPYING) or collection_id is None:
                    continue
                if not replicated(int(collection_id)):
                    item.update(state=COLLECTION_DROPPED, detail="its collection was dropped")
                    changed.append(dict(item))
                    withdrawn.append(item["warning"])
        self._save(changed)
        for warning in withdrawn:
            self._warnings.withdraw(warning)

    def _learn(self, seen: _Seen) -> None:
        warn = withdraw = ""
        with self._lock:
            item = self._items.get(seen.job_id)
            if item is None:
                item = {
                    "job_id": seen.job_id,
                    "collection_id": seen.collection_id,
                    "collection": seen.target,
                    "source_collection": seen.source,
                    "files": seen.files,
                    "ts": seen.ts,
                    "phase": UNKNOWN,
                    "rows": 0,
                    "state": PENDING,
                    "detail": "",
                    "backfill_job": "",
                }
                item["warning"] = self._warning(item)
                self._items[seen.job_id] = item
                if seen.phase != ImportPhase.FAILED:
                    warn = item["warning"]
            elif seen.phase == UNKNOWN or (
                item["phase"] == seen.phase
                and item["rows"] == seen.rows
                and item.get("segments") == list(seen.segments)
            ):
                return  # nothing new
            item.update(phase=seen.phase, rows=seen.rows or item["rows"], ts=item["ts"] or seen.ts)
            if seen.phase != UNKNOWN:
                item["segments"] = list(seen.segments)
            if seen.phase == ImportPhase.COMPLETED and "served" not in item:
                item["served"] = False  # until the source is seen to serve its segments
            if item["state"] == PENDING:
                item["detail"] = self._phase_detail(item, seen.reason)
                if seen.phase == ImportPhase.FAILED:
                    item["state"] = FAILED_ON_SOURCE
                    withdraw = item["warning"]
                    log.info(
                        "bulk import %s into %s failed on the source", seen.job_id, seen.source
                    )
            saved = dict(item)
        self._save([saved])
        if warn:
            self._warnings.warn(warn)
        if withdraw:
            self._warnings.withdraw(withdraw)

    def _phase_detail(self, item: dict[str, Any], source_reason: str) -> str:
        phase = item["phase"]
        if phase == ImportPhase.FAILED:
            return f"the import failed on the source: {source_reason}"
        if phase == ImportPhase.COMPLETED and not item.get("served", True) and not self.blocker:
            return self._serving_detail(item, "its segments")
        if phase == ImportPhase.COMPLETED:
            return self._waiting_detail(item)
        if phase == ImportPhase.RUNNING:
            return "running on the source"
        return "seen in the WAL; waiting for the source to complete it"

    def _warning(self, item: dict[str, Any]) -> str:
        name = item["source_collection"]
        head = (
            f"the source bulk-imported into {name} (job {item['job_id']}); imported rows do "
            "not pass through the WAL and are not on the target yet"
        )
        if self.blocker:
            return f"{head}: {self._manual(name)}"
        return f"{head}: a backfill of {name.partition('.')[2]} copies them once it completes"

    def _manual(self, source: str) -> str:
        db, _, name = source.partition(".")
        collection = name if db == "default" else source
        when = f" once the daemon can backfill ({self.blocker})" if self.blocker else ""
        return (
            f"ask a backfill of {name} (milvus-cdc task backfill {self._task_id} --collection "
            f"{collection}){when}"
        )

    def _serving_detail(self, item: dict[str, Any], what: str, why: str = "") -> str:
        detail = (
            f"completed on the source; waiting for the source's query nodes to serve {what}: "
            "a copy reads only what they serve"
        )
        if why:
            detail += f" (the source says: {why})"
        if self.blocker or item.get("manual"):
            detail += f"; then {self._manual(item['source_collection'])}"
        return detail

    def _waiting_detail(self, item: dict[str, Any]) -> str:
        if self.blocker or item.get("manual"):
            return f"completed on the source; {self._manual(item['source_collection'])}"
        return "completed on the source; a backfill copies it"

    # --- is it readable on the source ---------------------------------------------------------
    def unserved(self) -> list[dict[str, Any]]:
        """Completed imports not yet seen served by the source's query nodes."""
        return [
            item
            for item in self.pending
            if item["phase"] == ImportPhase.COMPLETED and not item.get("served", True)
        ]

    def serving_seen(self, job_id: int, missing: list[int], why: str = "") -> None:
        """What the source serves of an import's segments now: ``missing`` are those whose
        rows it does not serve yet (``why``: what it said, when that is all it said)."""
        with self._lock:
            item = self._items.get(job_id)
            if item is None or item["state"] != PENDING or item.get("served", True):
                return
            if missing:
                shown = ", ".join(str(s) for s in missing[:5]) + (
                    " ..." if len(missing) > 5 else ""
                )
                total = len(item.get("segments") or [])
                detail = self._serving_detail(
                    item, f"{len(missing)} of its {total} segments ({shown})", why
                )
                if detail == item["detail"]:
                    return
                item["detail"] = detail
            else:
                item["served"] = True
                item["detail"] = self._waiting_detail(item)
                log.info(
                    "bulk import %s into %s: the source serves its %d segments",
                    job_id,
                    item["source_collection"],
                    len(item.get("segments") or []),
                )
            saved = dict(item)
        self._save([saved])

    # --- backfills -------------------------------------------------------------------------------
    def backfill_starts(self, job: BackfillJob) -> None:
        """A job is about to copy (pending: it reads nothing yet): the completed imports of the
        collections it copies are on the target once it is done."""
        changed = []
        with self._lock:
            for item in self._items.values():
                if (
                    item["state"] == PENDING
                    and item["phase"] == ImportPhase.COMPLETED
                    and item.get("served", True)
                    and covers(job, item["source_collection"])
                ):
                    item.update(state=COPYING, backfill_job=job.job_id)
                    item["detail"] = f"being copied by backfill {job.job_id}"
                    changed.append(dict(item))
        self._save(changed)

    def backfill_ended(self, job: BackfillJob, copied: Mapping[str, int] | None = None) -> None:
        """A job ended: done, its imports are copied; failed, they wait for an operator. (Called
        again for the same job at every start: it changes nothing the second time.)

        ``copied``: the rows the job copied by source collection (``db.name``). A done job that
        copied fewer rows of a collection than its imports loaded did not read them all (or
        most were deleted since): they are not taken as copied but left to an operator, with
        the numbers."""
        if job.active:
            return
        done = job.state == "done"
        before = from_seconds(job.created_at)
        withdrawn, changed = [], []
        with self._lock:
            ended = []
            for item in self._items.values():
                legacy = (  # known only from the WAL: a backfill asked after it copies it
                    done
                    and item["state"] == PENDING
                    and item["phase"] == UNKNOWN
                    and item["ts"] < before
                    and covers(job, item["source_collection"])
                )
                if not legacy and item["backfill_job"] != job.job_id:
                    continue
                if item["state"] in (PENDING, COPYING):
                    ended.append(item)
            loaded: dict[str, int] = {}
            for item in ended:
                label = item["source_collection"]
                loaded[label] = loaded.get(label, 0) + int(item.get("rows") or 0)
            for item in ended:
                label = item["source_collection"]
                got = (copied or {}).get(label)
                short = done and got is not None and got < loaded[label]
                if done and not short:
                    item.update(state=COPIED, backfill_job=job.job_id)
                    item["detail"] = f"copied by backfill {job.job_id}"
                    withdrawn.append(item["warning"])
                    log.info(
                        "bulk import %s into %s copied by backfill %s",
                        item["job_id"],
                        label,
                        job.job_id,
                    )
                elif done:
                    item.update(state=PENDING, manual=True, backfill_job=job.job_id)
                    item["detail"] = (
                        f"backfill {job.job_id} copied {got} rows of {label}, fewer than the "
                        f"{loaded[label]} its imports loaded: the source did not serve them all "
                        f"(or they were deleted since); {self._manual(label)}"
                    )
                    log.warning("bulk import %s into %s: %s", item["job_id"], label, item["detail"])
                else:
                    item.update(state=PENDING, manual=True)
                    item["detail"] = (
                        f"backfill {job.job_id} failed ({job.reason}); {self._manual(label)}"
                    )
                changed.append(dict(item))
        self._save(changed)
        for warning in withdrawn:
            self._warnings.withdraw(warning)


def _upgraded(item: dict[str, Any]) -> dict[str, Any]:
    """A record written before imports were followed to their copy (a 2.6 Import message
    only), with the fields of today and the warning it was shown with."""
    if "state" in item:
        return item
    name = str(item["source_collection"]).partition(".")[2]
    warning = (
        f"the source bulk-imported into {item['source_collection']} (job {item['job_id']}); "
        "imported rows do not pass through the WAL and are not on the target yet: ask a "
        f"backfill of {name} to copy them"
    )
    return {
        **item,
        "phase": UNKNOWN,
        "rows": 0,
        "state": PENDING,
        "detail": "",
        "backfill_job": "",
        "warning": warning,
    }


class ImportWatcher:
    """Polls the source's imports for a running task; calls ``on_ready`` when one of them is
    ready to copy (the runner then stops its workers and runs the backfill)."""

    def __init__(
        self,
        read: Callable[[], list[SourceImport]],
        imports: TaskImports,
        resolve: Resolve,
        stop: threading.Event,
        on_ready: Callable[[], None],
        interval: float = POLL_SECONDS,
        serving: Callable[[TaskImports], None] | None = None,
    ) -> None:
        self._read = read
        self._serving = serving
        self._imports = imports
        self._resolve = resolve
        self._stop = stop
        self._on_ready = on_ready
        self._interval = interval
        self._reported: set[str] = set()

    def poll(self) -> bool:
        """One look at the source (its imports, and whether it serves the segments of those
        completed); True when an import is ready to copy. Without ``serving`` (the daemon
        cannot ask the source Milvus) a completed import is never taken as readable."""
        self._imports.observe(self._read(), self._resolve)
        if self._serving is not None and self._imports.unserved():
            self._serving(self._imports)
        return bool(self._imports.ready())

    def steps(self) -> Steps:
        """The watcher as a fiber (:mod:`replicator.fibers`), woken by the task's stop."""
        while not self._stop.is_set():
            try:
                if self.poll():
                    ready = self._imports.ready()
                    log.info("bulk imports readable on the source: backfill of %s", ready)
                    self._on_ready()
                    return
            except (SourceUnavailableError, MetaStoreError) as exc:
                message = str(exc)
                if message not in self._reported:  # once per cause, not every round
                    self._reported.add(message)
                    log.warning("bulk imports not followed this round, retrying: %s", message)
            yield from pause(self._stop, self._interval)
