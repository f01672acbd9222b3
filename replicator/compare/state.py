"""A verify job as kept in the metastore (task state key ``verify/job``) and shown under
``progress.verify``: what was asked, how far it got, and the result per collection.

The job is one small record (samples are capped), written by the job's thread after each range,
so ``get`` shows the last verify after a restart too.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from metastore import MetaStore
from replicator.backfill.ranges import Key
from replicator.compare.classify import KINDS, Divergence, Kind, sample

JOB_KEY = "verify/job"
JobState = Literal["pending", "running", "done", "failed"]
SAMPLE_KEYS = 100


@dataclass(frozen=True)
class KindResult:
    count: int = 0
    keys: list[Key] = field(default_factory=list)  # up to SAMPLE_KEYS, lowest first

    def plus(self, found: frozenset[Key], limit: int = SAMPLE_KEYS) -> KindResult:
        return KindResult(self.count + len(found), sample([*self.keys, *found], limit))


@dataclass(frozen=True)
class CollectionResult:
    collection: str  # db.name on the source
    target: str  # db.name on the target
    missing: KindResult = KindResult()
    extra: KindResult = KindResult()
    different: KindResult = KindResult()
    repaired: int = 0
    ranges_total: int = 0
    ranges_done: int = 0
    rows_compared: int = 0
    # ranges given up on: still changing after every read (lag, not a proven difference)
    unsettled: list[str] = field(default_factory=list)

    def of(self, kind: Kind) -> KindResult:
        found: KindResult = getattr(self, kind)
        return found

    def add(self, divergence: Divergence) -> CollectionResult:
        return replace(
            self,
            missing=self.missing.plus(divergence.missing),
            extra=self.extra.plus(divergence.extra),
            different=self.different.plus(divergence.different),
        )

    @property
    def divergent(self) -> int:
        return sum(self.of(kind).count for kind in KINDS)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CollectionResult:
        data = dict(data)
        missing, extra, different = (KindResult(**data.pop(kind)) for kind in KINDS)
        return cls(**data, missing=missing, extra=extra, different=different)


@dataclass(frozen=True)
class VerifyJob:
    job_id: str
    requested: list[str]  # ["*"] or names ("coll" in the default database, or "db.coll")
    repair: bool = False
    # the fraction of each collection's ranges compared (scheduled verifies sample them)
    sample: float = 1.0
    scheduled: bool = False
    state: JobState = "pending"
    collections: list[CollectionResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a collection the verify loaded
    reason: str = ""
    created_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0

    @classmethod
    def new(
        cls, requested: list[str], repair: bool, sample: float = 1.0, scheduled: bool = False
    ) -> VerifyJob:
        return cls(
            uuid.uuid4().hex[:12],
            list(requested),
            repair,
            sample,
            scheduled,
            created_at=time.time(),
        )

    @property
    def active(self) -> bool:
        return self.state in ("pending", "running")

    def with_(self, **changes: Any) -> VerifyJob:
        return replace(self, **changes)

    def with_collection(self, result: CollectionResult) -> VerifyJob:
        others = [c for c in self.collections if c.collection != result.collection]
        return replace(self, collections=[*others, result])

    def view(self) -> dict[str, Any]:
        """``progress.verify``: totals first, then each collection."""
        return {
            "job_id": self.job_id,
            "state": self.state,
            "requested": self.requested,
            "repair": self.repair,
            "sample": self.sample,
            "scheduled": self.scheduled,
            "ranges_done": sum(c.ranges_done for c in self.collections),
            "ranges_total": sum(c.ranges_total for c in self.collections),
            "rows_compared": sum(c.rows_compared for c in self.collections),
            "divergent_rows": sum(c.divergent for c in self.collections),
            "repaired": sum(c.repaired for c in self.collections) if self.repair else None,
            "collections": [asdict(c) for c in self.collections],
            "notes": self.notes,
            "reason": self.reason,
            "created_at": self.created_at,
            "started_at": self.started_at or None,
            "finished_at": self.finished_at or None,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> VerifyJob:
        data = json.loads(raw)
        data["collections"] = [CollectionResult.from_json(c) for c in data.get("collections", [])]
        return cls(**data)


class VerifyState:
    """Reads and writes a task's verify job."""

    def __init__(self, store: MetaStore, task_id: str) -> None:
        self.store = store
        self.task_id = task_id

    def job(self) -> VerifyJob | None:
        raw = self.store.get_state(self.task_id, JOB_KEY)
        return None if raw is None else VerifyJob.from_bytes(raw)

    def save_job(self, job: VerifyJob) -> None:
        self.store.put_state(self.task_id, JOB_KEY, job.to_bytes())
