"""What a backfill keeps in the metastore, under the task's state keys.

    backfill/job                          the current job: collections, state, reason (daemon)
    backfill/plan/<job>/<i>               collection i of the job: key field, ranges (driver)
    backfill/done/<job>/<i>/<range>       a range copied: rows written (driver)
    backfill/failed/<job>                 why the job stopped: collection and range (driver)
    backfill/error/<job>                  the error that ended the driver's last run (driver)

The daemon writes the job; the job's driver (a process of its own, possibly on a Spark cluster's
edge node) writes plans and finished ranges, so a killed driver is launched again and copies only
the ranges not done. Ranges are recorded by the driver, never by executors: a cluster's executors
need not reach the store.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from metastore import MetaStore
from replicator.backfill.ranges import KeyRange

JOB_KEY = "backfill/job"
JobState = Literal["pending", "running", "done", "failed"]


@dataclass(frozen=True)
class CollectionRef:
    """A source collection and its name on the target."""

    db: str
    name: str
    target_db: str
    target_name: str

    @property
    def label(self) -> str:
        return f"{self.db}.{self.name}"


@dataclass(frozen=True)
class BackfillJob:
    job_id: str
    # what was asked: ["*"] or names ("coll" in the default database, or "db.coll")
    requested: list[str]
    state: JobState = "pending"
    # resolved by the daemon when the job starts
    collections: list[CollectionRef] = field(default_factory=list)
    reason: str = ""
    created_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    attempts: int = 0

    @classmethod
    def new(cls, requested: list[str]) -> BackfillJob:
        return cls(uuid.uuid4().hex[:12], list(requested), created_at=time.time())

    @property
    def active(self) -> bool:
        return self.state in ("pending", "running")

    @property
    def covers_all(self) -> bool:
        return self.requested == ["*"]

    def with_(self, **changes: Any) -> BackfillJob:
        return replace(self, **changes)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> BackfillJob:
        data = json.loads(raw)
        data["collections"] = [CollectionRef(**c) for c in data.get("collections", [])]
        return cls(**data)


@dataclass(frozen=True)
class CollectionPlan:
    collection: CollectionRef
    pk: str
    ranges: list[KeyRange]
    partitions: list[str]  # [] when the collection has a partition key (one pass, no names)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.ranges)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "collection": asdict(self.collection),
                "pk": self.pk,
                "ranges": [r.to_json() for r in self.ranges],
                "partitions": self.partitions,
            }
        ).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> CollectionPlan:
        data = json.loads(raw)
        return cls(
            CollectionRef(**data["collection"]),
            str(data["pk"]),
            [KeyRange.from_json(r) for r in data["ranges"]],
            list(data["partitions"]),
        )


def plan_key(job_id: str, index: int) -> str:
    return f"backfill/plan/{job_id}/{index}"


def done_prefix(job_id: str) -> str:
    return f"backfill/done/{job_id}/"


def done_key(job_id: str, index: int, range_index: int) -> str:
    return f"{done_prefix(job_id)}{index}/{range_index}"


def failed_key(job_id: str) -> str:
    return f"backfill/failed/{job_id}"


def error_key(job_id: str) -> str:
    return f"backfill/error/{job_id}"


class BackfillState:
    """Reads and writes a task's backfill keys."""

    def __init__(self, store: MetaStore, task_id: str) -> None:
        self.store = store
        self.task_id = task_id

    def job(self) -> BackfillJob | None:
        raw = self.store.get_state(self.task_id, JOB_KEY)
        return None if raw is None else BackfillJob.from_bytes(raw)

    def save_job(self, job: BackfillJob) -> None:
        self.store.put_state(self.task_id, JOB_KEY, job.to_bytes())

    def plan(self, job_id: str, index: int) -> CollectionPlan | None:
        raw = self.store.get_state(self.task_id, plan_key(job_id, index))
        return None if raw is None else CollectionPlan.from_bytes(raw)

    def save_plan(self, job_id: str, index: int, plan: CollectionPlan) -> None:
        self.store.put_state(self.task_id, plan_key(job_id, index), plan.to_bytes())

    def plans(self, job_id: str) -> dict[int, CollectionPlan]:
        raw = self.store.list_state(self.task_id, f"backfill/plan/{job_id}/")
        return {int(k.rsplit("/", 1)[1]): CollectionPlan.from_bytes(v) for k, v in raw.items()}

    def done(self, job_id: str) -> dict[tuple[int, int], int]:
        """Rows written, by (collection index, range index)."""
        raw = self.store.list_state(self.task_id, done_prefix(job_id))
        result = {}
        for key, value in raw.items():
            collection, range_index = key[len(done_prefix(job_id)) :].split("/")
            result[int(collection), int(range_index)] = int(json.loads(value)["rows"])
        return result

    def mark_done(self, job_id: str, index: int, range_index: int, rows: int) -> None:
        payload = json.dumps({"rows": rows, "at": time.time()}).encode()
        self.store.put_state(self.task_id, done_key(job_id, index, range_index), payload)

    def failure(self, job_id: str) -> str | None:
        raw = self.store.get_state(self.task_id, failed_key(job_id))
        return None if raw is None else raw.decode()

    def record_failure(self, job_id: str, reason: str) -> None:
        self.store.put_state(self.task_id, failed_key(job_id), reason.encode())

    def last_error(self, job_id: str) -> str | None:
        """The error that ended the driver's last run (not a range failure: a crash)."""
        raw = self.store.get_state(self.task_id, error_key(job_id))
        return None if raw is None else raw.decode()

    def record_error(self, job_id: str, error: str) -> None:
        self.store.put_state(self.task_id, error_key(job_id), error.encode())
