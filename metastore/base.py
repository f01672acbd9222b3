"""The metastore contract: tasks and per-channel positions, the same for every backend.

Backends are synchronous (their client libraries block); the server calls them from worker
threads. Every backend keeps the data of one ``root_path`` apart from every other, so several
daemons can share one store.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from metastore.errors import PositionConflictError, PositionRegressionError


class TaskState(enum.StrEnum):
    INITIAL = "Initial"
    RUNNING = "Running"
    PAUSED = "Paused"
    FAILED = "Failed"


@dataclass(frozen=True)
class Position:
    """Where a reader stands on one source pchannel.

    ``msg_id`` is the backend's opaque message id; ``ts`` the hybrid time tick of that message.
    "Start at a position" means the first record *after* it. Positions of one pchannel are
    ordered by ``ts``; the metastore refuses to store an older one.
    """

    backend: str
    pchannel: str
    msg_id: bytes
    ts: int

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "pchannel": self.pchannel,
            "msg_id": self.msg_id.hex(),
            "ts": self.ts,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Position:
        return cls(
            backend=str(data["backend"]),
            pchannel=str(data["pchannel"]),
            msg_id=bytes.fromhex(str(data["msg_id"])),
            ts=int(data["ts"]),
        )


@dataclass(frozen=True)
class TaskRecord:
    """A stored task. ``spec`` is the validated create request (JSON-able, secrets included:
    the daemon needs them to reconnect after a restart; they are removed from every view)."""

    task_id: str
    state: TaskState
    reason: str
    spec: Mapping[str, Any]
    created_at: float
    updated_at: float
    # Opaque token that changes on every update; pass it back to update_task for compare-and-set.
    revision: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_state(self, state: TaskState, reason: str, now: float) -> TaskRecord:
        return replace(self, state=state, reason=reason, updated_at=now)

    def spec_json(self) -> str:
        return encode_spec(self.spec)


@dataclass(frozen=True)
class Lease:
    """The right of one daemon (``owner``, a fleet member id) to run one task.

    ``token`` is the fencing token: it grows every time the lease changes hands (or is taken
    again after it expired), and every write made for the task under the lease carries it; the
    store refuses a write whose token is not the task's live lease's. See ``metastore/leases.py``.
    """

    task_id: str
    owner: str
    token: int


@dataclass(frozen=True)
class Member:
    """A daemon of the fleet: registered while it renews its heartbeat."""

    member_id: str
    info: Mapping[str, Any]


@dataclass(frozen=True)
class StoreFormat:
    """The format of the data a root path holds (numbers in ``metastore/format.py``), and the
    release of the daemon that recorded it."""

    version: int
    release: str


def encode_spec(spec: Mapping[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


@runtime_checkable
class MetaStore(Protocol):
    """What the daemon needs from a store. Every method may raise ``MetaStoreUnavailableError``."""

    root_path: str

    # --- tasks -------------------------------------------------------------------------------
    def create_task(self, task: TaskRecord) -> TaskRecord:
        """Store a new task; ``TaskExistsError`` if the id is taken. Returns it with a revision."""

    def get_task(self, task_id: str) -> TaskRecord | None: ...

    def list_tasks(self) -> list[TaskRecord]:
        """All tasks of this root path, oldest first."""

    def update_task(
        self,
        task_id: str,
        *,
        state: TaskState,
        reason: str,
        expected_revision: int,
        lease: Lease | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        """Set state and reason (and ``extra``, when given) if the task still has
        ``expected_revision``.

        ``TaskNotFoundError`` or ``ConcurrentUpdateError`` otherwise; with ``lease``,
        ``FencedError`` when it is no longer the task's live lease (every write taking a
        ``lease`` checks it in the same transaction as the write).
        """

    def replace_spec(
        self,
        task_id: str,
        spec: Mapping[str, Any],
        *,
        expected_revision: int,
        lease: Lease | None = None,
    ) -> TaskRecord:
        """Store a new spec (the same task, its secrets sealed anew) if the task still has
        ``expected_revision``; state, reason and times stay. Errors as ``update_task``."""

    def delete_task(self, task_id: str) -> bool:
        """Remove the task with its positions and state; False if it was not stored."""

    # --- positions ---------------------------------------------------------------------------
    def get_positions(self, task_id: str) -> dict[str, Position]:
        """The saved position of every pchannel of the task, by pchannel."""

    def save_position(
        self,
        task_id: str,
        position: Position,
        expected: Position | None,
        *,
        lease: Lease | None = None,
    ) -> None:
        """Compare-and-set the position of ``position.pchannel``.

        ``expected`` is what the caller believes is stored (None: nothing yet). Raises
        ``PositionConflictError`` when it is not, ``PositionRegressionError`` when the new
        position is older than the stored one, ``TaskNotFoundError`` when the task is gone,
        ``FencedError`` when ``lease`` is given and no longer held.
        """

    # --- per-task state (collection progress, backfill ranges, ...) ---------------------------
    def put_state(
        self, task_id: str, key: str, value: bytes, *, lease: Lease | None = None
    ) -> None:
        """Store a value under the task; ``TaskNotFoundError`` when the task is gone,
        ``FencedError`` when ``lease`` is given and no longer held."""

    def get_state(self, task_id: str, key: str) -> bytes | None: ...

    def replace_state(self, task_id: str, key: str, value: bytes, expected: bytes | None) -> bool:
        """Store ``value`` under the task if what is stored there is still ``expected`` (None:
        nothing), in one compare-and-set (the stored bytes compared, so a value an earlier
        release wrote is replaced like any other); False when another write came first,
        ``TaskNotFoundError`` when the task is gone. For a value changed by one holder at a
        time (a disaster-recovery job's record): a holder that lost it cannot overwrite the
        next one's."""

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]: ...

    # --- the fleet: daemons sharing the store, and who runs which task -------------------------
    def heartbeat(self, member_id: str, info: Mapping[str, Any], ttl: float) -> None:
        """Register ``member_id`` (or keep it registered) for ``ttl`` seconds from now, and
        extend every live lease it holds by as much. A lease that expired stays lost."""

    def leave(self, member_id: str) -> None:
        """Unregister ``member_id`` and drop every lease it holds."""

    def members(self) -> list[Member]:
        """The registered (not expired) members, by id."""

    def acquire_lease(self, task_id: str, member_id: str, ttl: float) -> Lease | None:
        """The task's lease for ``member_id``: the one it holds, else a new one (with a greater
        token) when nobody holds a live one; None when another member does.
        ``TaskNotFoundError`` when the task is not stored."""

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up (nothing happens when it is no longer held)."""

    def leases(self) -> dict[str, Lease]:
        """Every live lease, by task id."""

    # --- the ids of the keys stored secrets are sealed with (never the keys) ------------------
    def secret_key_ids(self) -> dict[str, int]:
        """The key ids recorded under this root path, each with a version that changes every
        time the id is recorded again (``metastore/sealed.py`` keeps the record)."""

    def record_secret_key_id(self, key_id: str) -> None:
        """Record that secrets are sealed with ``key_id`` (again: a new version)."""

    def forget_secret_key_id(self, key_id: str, version: int) -> bool:
        """Remove ``key_id`` from the record unless it was recorded again since ``version``;
        True when it was removed."""

    # --- records of the root path, each changed by compare-and-set (disaster recovery's pairs) -
    def get_record(self, key: str) -> tuple[bytes, int] | None:
        """The value stored under ``key`` with its version (it changes at every write); None
        when nothing is stored."""

    def list_records(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """Every record whose key starts with ``prefix``, each with its version."""

    def put_record(self, key: str, value: bytes, expected: int | None) -> int | None:
        """Store ``value`` under ``key`` if its version is still ``expected`` (None: nothing is
        stored), in one compare-and-set; the new version, or None when another write came
        first."""

    def delete_record(self, key: str, expected: int) -> bool:
        """Remove the record if its version is still ``expected``; False otherwise."""

    # --- the format of the data --------------------------------------------------------------
    def store_format(self) -> StoreFormat | None:
        """The format this root path's data is in; None where none is recorded (a store of a
        release from before formats were recorded: format 1)."""

    def set_store_format(self, expected: int | None, new: StoreFormat) -> bool:
        """Record ``new`` if the recorded format's version is ``expected`` (None: none is
        recorded), in one compare-and-set; False when another daemon changed it first."""

    # --- lifecycle ---------------------------------------------------------------------------
    def ping(self) -> None:
        """Raise ``MetaStoreUnavailableError`` unless the store answers."""

    def close(self) -> None: ...


def check_position_step(
    task_id: str, stored: Position | None, expected: Position | None, new: Position
) -> None:
    """The compare-and-set rule every backend applies (inside its own transaction)."""
    if stored != expected:
        raise PositionConflictError(
            f"position of task {task_id} channel {new.pchannel} changed: expected "
            f"{_describe(expected)}, found {_describe(stored)}"
        )
    if stored is not None and new.ts < stored.ts:
        raise PositionRegressionError(
            f"position of task {task_id} channel {new.pchannel} would move backwards from "
            f"ts {stored.ts} to ts {new.ts}"
        )


def _describe(p: Position | None) -> str:
    return "nothing" if p is None else f"{p.backend}:{p.msg_id.hex()}@{p.ts}"
