"""A switchover job as the metastore keeps it: under the original task's state
(``dr/switchover``), written at every step, so that a daemon that stops mid-way (a ``kill -9``)
leaves enough for itself at restart, or another member of the fleet, to finish or roll back:
the fence it set, whether it paused the original task, the reverse task it meant to create.

A job's record (switchover, failover, failback) is written by compare-and-set against the
bytes its holder last read or wrote (``MetaStore.replace_state``): a member that renewed its
claim, then stalled past it while another member took the job over and saved, finds the record
changed and stops (``ClaimLostError``) instead of writing its stale step over the new holder's.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from metastore import MetaStore, MetaStoreError
from replicator.hybrid_time import from_seconds
from replicator.pipeline.status import consistent_view
from server.dr.claims import ClaimLostError

DR_PREFIX = "dr/"  # every record below is under it
SWITCHOVER_KEY = "dr/switchover"
# a task created by a switchover (the reverse flow) says which task it reverses
LINK_KEY = "dr/link"
FAILOVER_KEY = "dr/failover"
FAILBACK_KEY = "dr/failback"

State = Literal["checking", "fencing", "draining", "verifying", "reversing", "done", "failed"]
FINISHED = ("done", "failed")


def moment(seconds: float) -> dict[str, Any] | None:
    """A moment as jobs show it: hybrid timestamp and ISO time."""
    return consistent_view(from_seconds(seconds))


def iso(seconds: float) -> str:
    when = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return when.replace("+00:00", "Z")


@dataclass(frozen=True)
class SwitchoverJob:
    job_id: str
    task_id: str
    member: str  # the fleet member running the job
    max_lag_seconds: float
    timeout_seconds: float
    state: State = "checking"
    # "etcd": the job fences the source (server/dr/fence.py); "operator": the operator stopped
    # the writers and the job proves the source quiet from its WAL
    fence_mode: str = "etcd"
    source_cluster: str = ""  # the task's source: the cluster fenced
    target_cluster: str = ""  # where production moves
    fence_set: bool = False  # the job wrote the fence (it must lift it, whatever happens)
    fence: str = ""  # what the fence is
    fenced_at: dict[str, Any] | None = None
    lifted_at: dict[str, Any] | None = None  # the source cluster seen taking writes again
    consistent_up_to: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None  # the verify job's id, state and differences
    reverse_task_id: str = ""
    rearm: bool = False  # the reverse flow is the task this one reverses, started again
    original_paused: bool = False  # the job paused the task (a roll back resumes it)
    # where the reverse flow starts on the target's channels (Position JSON by channel), read
    # once the task stopped writing there; saved with ``writers_may_move_at``, the point of no
    # return: from then on the job only goes forward (writers may be on the target)
    # the source's WAL read from the paused task's positions to its end, no change found
    wal_quiet_at: dict[str, Any] | None = None
    reverse_start: dict[str, Any] | None = None
    writers_may_move_at: dict[str, Any] | None = None
    reason: str = ""
    rolled_back: bool = False
    # seconds after done when a verify of the reverse task looks for writes the reverse flow
    # did not make on the old primary (0: never); its result
    stale_check_seconds: float = 0.0
    stale_check: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)  # state, at
    started_at: float = 0.0
    finished_at: float = 0.0

    @classmethod
    def new(
        cls,
        task_id: str,
        member: str,
        max_lag: float,
        timeout: float,
        ends: tuple[str, str],
        fence_mode: str = "etcd",
        stale_check_seconds: float = 0.0,
    ) -> SwitchoverJob:
        now = time.time()
        return cls(
            fence_mode=fence_mode,
            stale_check_seconds=stale_check_seconds,
            job_id=uuid.uuid4().hex[:12],
            task_id=task_id,
            member=member,
            max_lag_seconds=max_lag,
            timeout_seconds=timeout,
            source_cluster=ends[0],
            target_cluster=ends[1],
            started_at=now,
            steps=[{"state": "checking", "at": iso(now)}],
        )

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def to(self, state: State, **changes: Any) -> SwitchoverJob:
        now = time.time()
        steps = [*self.steps, {"state": state, "at": iso(now)}]
        ended = now if state in FINISHED else self.finished_at
        return replace(self, state=state, steps=steps, finished_at=ended, **changes)

    def with_(self, **changes: Any) -> SwitchoverJob:
        return replace(self, **changes)

    def view(self) -> dict[str, Any]:
        view = asdict(self)
        view["started_at"] = iso(self.started_at)
        view["finished_at"] = iso(self.finished_at) if self.finished_at else None
        return view

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> SwitchoverJob:
        return cls(**json.loads(raw))


def load_job(store: MetaStore, task_id: str) -> SwitchoverJob | None:
    raw = store.get_state(task_id, SWITCHOVER_KEY)
    return None if raw is None else SwitchoverJob.from_bytes(raw)


def replace_record(
    store: MetaStore, task_id: str, key: str, value: bytes, seen: bytes | None, job_id: str
) -> bytes:
    """Store the record ``key`` of a job (``job_id``) if it still holds ``seen``, what this
    holder last read or wrote (None: nothing); ``value`` (what it holds now) when stored,
    ClaimLostError when another daemon wrote it since (it holds the job now).

    A write whose answer was lost (the store's error after the write landed, or this same save
    asked again after such an error) is told by reading the record back: holding ``value``, it
    was stored; so the job's next save compares with what is there, not with ``seen``."""
    try:
        stored = store.replace_state(task_id, key, value, seen)
    except MetaStoreError:
        if _holds(store, task_id, key, value):
            return value
        raise
    if not stored and not _holds(store, task_id, key, value):
        raise ClaimLostError(
            f"job {job_id}: its record {key} of task {task_id} was written by another daemon "
            "since this one last saved it (that daemon holds the job now)"
        )
    return value


def _holds(store: MetaStore, task_id: str, key: str, value: bytes) -> bool:
    """Whether the record ``key`` holds ``value`` now; False when it cannot be read."""
    try:
        return store.get_state(task_id, key) == value
    except MetaStoreError:
        return False


def save_job(store: MetaStore, job: SwitchoverJob, seen: bytes | None) -> bytes:
    """Save the job's record over ``seen`` (:func:`replace_record`); what it holds now."""
    return replace_record(store, job.task_id, SWITCHOVER_KEY, job.to_bytes(), seen, job.job_id)


def json_bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def load_json(store: MetaStore, task_id: str, key: str) -> dict[str, Any] | None:
    raw = store.get_state(task_id, key)
    return None if raw is None else dict(json.loads(raw))


def save_json(store: MetaStore, task_id: str, key: str, value: dict[str, Any]) -> None:
    store.put_state(task_id, key, json_bytes(value))
