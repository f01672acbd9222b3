"""etcd metastore (through the ``etcd3`` module of the python3-etcd3 distribution).

Layout under ``<rootPath>/``::

    tasks/<task_id>                  JSON task record; its mod_revision is the task's revision
    positions/<task_id>/<pchannel>   JSON position
    state/<task_id>/<key>            raw bytes
    fleet/members/<member_id>        JSON member info, attached to the member's etcd lease
    fleet/leases/<task_id>           JSON {"owner": member_id}, attached to the owner's etcd lease
    secret-keys/<key_id>             JSON {"recorded_at": ...}: a key id the secrets are sealed
                                     with (never the key); its mod_revision is its version
    records/<key>                    raw bytes changed by compare-and-set (disaster recovery's
                                     cluster pairs); its mod_revision is its version

Every write that belongs to a task is a transaction guarded by ``version(tasks/<id>) > 0``, so
nothing is written for a task deleted meanwhile; delete removes all four ranges in one
transaction.

The fleet: each member holds one etcd lease (TTL ``fleet.leaseSeconds``) kept alive by its
heartbeat; its registration and the task leases it takes are keys attached to it, so they
vanish together when it stops renewing. A task lease's fencing token is the ``create_revision``
of its key: a key made anew (another owner, or the same after expiry) has a greater one, and a
write under a lease is guarded by ``create(fleet/leases/<id>) == token``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import etcd3
import grpc
import orjson
from etcd3 import exceptions as etcd_exceptions
from etcd3.utils import prefix_range_end

from metastore.base import (
    Lease,
    Member,
    Position,
    StoreFormat,
    TaskRecord,
    TaskState,
    check_position_step,
)
from metastore.errors import (
    ConcurrentUpdateError,
    FencedError,
    MetaStoreUnavailableError,
    PositionConflictError,
    PositionError,
    TaskExistsError,
    TaskNotFoundError,
)

T = TypeVar("T")


# how long one diagnosis of a failed call stands for the calls failing after it (each asks
# every endpoint with a TLS handshake of its own: metastore/etcd_diagnosis.py)
EXPLAIN_SECONDS = 5.0


class EtcdMetaStore:
    """``explain``: why a call failed, in words naming the endpoint and the cause (the
    diagnosis of metastore/etcd_diagnosis.py); without it, the etcd client's error's name."""

    def __init__(
        self,
        client: etcd3.MultiEndpointEtcd3Client,
        root_path: str,
        explain: Callable[[BaseException], str] | None = None,
    ) -> None:
        self.root_path = root_path
        self._client = client
        self._explain = explain
        self._explained: tuple[float, str] = (-math.inf, "")  # (when, why) of the last diagnosis
        self._prefix = root_path.strip("/") + "/"
        self._sessions: dict[str, etcd3.Lease] = {}  # member id -> its etcd lease
        self._sessions_lock = threading.Lock()
        self.ping()

    # --- keys --------------------------------------------------------------------------------
    def _task_key(self, task_id: str) -> str:
        return f"{self._prefix}tasks/{task_id}"

    def _positions_prefix(self, task_id: str) -> str:
        return f"{self._prefix}positions/{task_id}/"

    def _state_prefix(self, task_id: str) -> str:
        return f"{self._prefix}state/{task_id}/"

    def _lease_key(self, task_id: str) -> str:
        return f"{self._prefix}fleet/leases/{task_id}"

    def _member_key(self, member_id: str) -> str:
        return f"{self._prefix}fleet/members/{member_id}"

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (etcd_exceptions.Etcd3Exception, grpc.RpcError) as exc:
            why = self._why(exc)
            raise MetaStoreUnavailableError(f"etcd metastore unavailable: {why}") from exc

    def _why(self, exc: BaseException) -> str:
        if self._explain is None:
            return type(exc).__name__
        when, why = self._explained
        if time.monotonic() - when < EXPLAIN_SECONDS:
            return why
        try:
            why = self._explain(exc)
        except Exception as failure:  # noqa: BLE001 - the diagnosis must not hide the error
            why = f"{type(exc).__name__} (not diagnosed: {type(failure).__name__})"
        self._explained = (time.monotonic(), why)
        return why

    def _task_exists(self, task_id: str) -> Any:
        """A transaction comparison that holds while the task is stored."""
        return self._client.transactions.version(self._task_key(task_id)) > 0

    def _guards(self, task_id: str, lease: Lease | None) -> list[Any]:
        """The comparisons of a write for a task: it is stored, and ``lease`` (if any) is live."""
        guards = [self._task_exists(task_id)]
        if lease is not None:
            guards.append(self._client.transactions.create(self._lease_key(task_id)) == lease.token)
        return guards

    def _refused(self, task_id: str, lease: Lease | None) -> None:
        """Raise why a guarded write was refused, when the task or the lease explain it."""
        if self.get_task(task_id) is None:
            raise TaskNotFoundError(task_id)
        if lease is not None and self.leases().get(task_id) != lease:
            raise FencedError(
                f"task {task_id}: lease token {lease.token} of {lease.owner} is no longer held"
            )

    # --- tasks -------------------------------------------------------------------------------
    def create_task(self, task: TaskRecord) -> TaskRecord:
        key = self._task_key(task.task_id)
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[self._client.transactions.version(key) == 0],
                success=[self._client.transactions.put(key, _encode_task(task))],
                failure=[],
            )
        )
        if not ok:
            raise TaskExistsError(task.task_id)
        stored = self.get_task(task.task_id)
        if stored is None:  # deleted between the two calls by another daemon
            raise TaskNotFoundError(task.task_id)
        return stored

    def get_task(self, task_id: str) -> TaskRecord | None:
        value, meta = self._call(lambda: self._client.get(self._task_key(task_id)))
        if value is None:
            return None
        return _decode_task(task_id, value, meta.mod_revision)

    def list_tasks(self) -> list[TaskRecord]:
        prefix = f"{self._prefix}tasks/"
        items = self._call(lambda: list(self._client.get_prefix(prefix)))
        tasks = [
            _decode_task(meta.key.decode()[len(prefix) :], value, meta.mod_revision)
            for value, meta in items
        ]
        tasks.sort(key=lambda t: (t.created_at, t.task_id))
        return tasks

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
        def change(task: TaskRecord) -> TaskRecord:
            changed = task.with_state(state, reason, time.time())
            return changed if extra is None else replace(changed, extra=dict(extra))

        return self._rewrite_task(task_id, expected_revision, change, lease)

    def replace_spec(
        self,
        task_id: str,
        spec: Mapping[str, Any],
        *,
        expected_revision: int,
        lease: Lease | None = None,
    ) -> TaskRecord:
        return self._rewrite_task(
            task_id, expected_revision, lambda t: replace(t, spec=spec), lease
        )

    def _rewrite_task(
        self,
        task_id: str,
        expected_revision: int,
        change: Callable[[TaskRecord], TaskRecord],
        lease: Lease | None,
    ) -> TaskRecord:
        current = self.get_task(task_id)
        if current is None:
            raise TaskNotFoundError(task_id)
        if current.revision != expected_revision:
            raise ConcurrentUpdateError(task_id)
        key = self._task_key(task_id)
        updated = change(current)
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[
                    self._client.transactions.mod(key) == expected_revision,
                    *self._guards(task_id, lease)[1:],
                ],
                success=[self._client.transactions.put(key, _encode_task(updated))],
                failure=[],
            )
        )
        if not ok:
            self._refused(task_id, lease)
            raise ConcurrentUpdateError(task_id)
        stored = self.get_task(task_id)
        if stored is None:
            raise TaskNotFoundError(task_id)
        return stored

    def delete_task(self, task_id: str) -> bool:
        t = self._client.transactions
        ranges = [self._positions_prefix(task_id), self._state_prefix(task_id)]
        leftovers = [t.delete(p, range_end=prefix_range_end(p.encode())) for p in ranges]
        leftovers.append(t.delete(self._lease_key(task_id)))
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[t.version(self._task_key(task_id)) > 0],
                success=[t.delete(self._task_key(task_id)), *leftovers],
                failure=leftovers,
            )
        )
        return bool(ok)

    # --- positions ---------------------------------------------------------------------------
    def get_positions(self, task_id: str) -> dict[str, Position]:
        prefix = self._positions_prefix(task_id)
        items = self._call(lambda: list(self._client.get_prefix(prefix)))
        positions = (Position.from_json(orjson.loads(value)) for value, _ in items)
        return {p.pchannel: p for p in positions}

    def save_position(
        self,
        task_id: str,
        position: Position,
        expected: Position | None,
        *,
        lease: Lease | None = None,
    ) -> None:
        key = self._positions_prefix(task_id) + position.pchannel
        value, meta = self._call(lambda: self._client.get(key))
        stored = None if value is None else Position.from_json(orjson.loads(value))
        try:
            check_position_step(task_id, stored, expected, position)
        except PositionError:
            self._refused(task_id, lease)  # a missing task or a lost lease explain any mismatch
            raise
        t = self._client.transactions
        guard = t.version(key) == 0 if meta is None else t.mod(key) == meta.mod_revision
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[*self._guards(task_id, lease), guard],
                success=[t.put(key, json.dumps(position.to_json()))],
                failure=[],
            )
        )
        if not ok:
            self._refused(task_id, lease)
            raise PositionConflictError(
                f"position of task {task_id} channel {position.pchannel} changed while saving"
            )

    # --- per-task state ----------------------------------------------------------------------
    def put_state(
        self, task_id: str, key: str, value: bytes, *, lease: Lease | None = None
    ) -> None:
        t = self._client.transactions
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=self._guards(task_id, lease),
                success=[t.put(self._state_prefix(task_id) + key, value)],
                failure=[],
            )
        )
        if not ok:
            self._refused(task_id, lease)
            raise TaskNotFoundError(task_id)  # deleted and stored again in between

    def replace_state(self, task_id: str, key: str, value: bytes, expected: bytes | None) -> bool:
        full = self._state_prefix(task_id) + key
        t = self._client.transactions
        stored_is = t.version(full) == 0 if expected is None else t.value(full) == expected
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[*self._guards(task_id, None), stored_is],
                success=[t.put(full, value)],
                failure=[],
            )
        )
        if not ok and self.get_task(task_id) is None:
            raise TaskNotFoundError(task_id)
        return bool(ok)

    def get_state(self, task_id: str, key: str) -> bytes | None:
        value, _ = self._call(lambda: self._client.get(self._state_prefix(task_id) + key))
        return None if value is None else bytes(value)

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        base = self._state_prefix(task_id)
        items = self._call(lambda: list(self._client.get_prefix(base + prefix)))
        return {meta.key.decode()[len(base) :]: bytes(value) for value, meta in items}

    # --- the fleet ---------------------------------------------------------------------------
    def heartbeat(self, member_id: str, info: Mapping[str, Any], ttl: float) -> None:
        with self._sessions_lock:
            grant = self._sessions.get(member_id)
            if grant is not None:
                answers = self._call(grant.refresh)
                if not answers or answers[0].TTL <= 0:  # expired: its keys are gone with it
                    grant = None
            if grant is None:
                seconds = max(2, math.ceil(ttl))
                grant = self._call(lambda: self._client.lease(seconds))
                self._sessions[member_id] = grant
        value = json.dumps(dict(info), sort_keys=True)
        self._call(lambda: self._client.put(self._member_key(member_id), value, lease=grant))

    def leave(self, member_id: str) -> None:
        with self._sessions_lock:
            grant = self._sessions.pop(member_id, None)
        if grant is not None:
            self._call(grant.revoke)  # its registration and leases go with it

    def members(self) -> list[Member]:
        prefix = f"{self._prefix}fleet/members/"
        items = self._call(lambda: list(self._client.get_prefix(prefix)))
        found = [
            Member(meta.key.decode()[len(prefix) :], orjson.loads(value)) for value, meta in items
        ]
        return sorted(found, key=lambda m: m.member_id)

    def acquire_lease(self, task_id: str, member_id: str, ttl: float) -> Lease | None:
        with self._sessions_lock:
            grant = self._sessions.get(member_id)
        if grant is None:
            raise FencedError(f"member {member_id} has no heartbeat: it cannot hold a lease")
        key = self._lease_key(task_id)
        t = self._client.transactions
        owner = json.dumps({"owner": member_id})
        self._call(
            lambda: self._client.transaction(
                compare=[self._task_exists(task_id), t.version(key) == 0],
                success=[t.put(key, owner, lease=grant)],
                failure=[],
            )
        )
        value, meta = self._call(lambda: self._client.get(key))
        if value is None:
            if self.get_task(task_id) is None:
                raise TaskNotFoundError(task_id)
            return None  # taken and already expired: try again at the next round
        if orjson.loads(value).get("owner") != member_id:
            return None
        return Lease(task_id, member_id, meta.create_revision)

    def release_lease(self, lease: Lease) -> None:
        t = self._client.transactions
        key = self._lease_key(lease.task_id)
        self._call(
            lambda: self._client.transaction(
                compare=[t.create(key) == lease.token], success=[t.delete(key)], failure=[]
            )
        )

    def leases(self) -> dict[str, Lease]:
        prefix = f"{self._prefix}fleet/leases/"
        items = self._call(lambda: list(self._client.get_prefix(prefix)))
        found = {}
        for value, meta in items:
            task_id = meta.key.decode()[len(prefix) :]
            found[task_id] = Lease(task_id, orjson.loads(value)["owner"], meta.create_revision)
        return found

    # --- the ids of the keys secrets are sealed with ------------------------------------------
    def secret_key_ids(self) -> dict[str, int]:
        prefix = f"{self._prefix}secret-keys/"
        items = self._call(lambda: list(self._client.get_prefix(prefix)))
        return {meta.key.decode()[len(prefix) :]: meta.mod_revision for _, meta in items}

    def record_secret_key_id(self, key_id: str) -> None:
        value = json.dumps({"recorded_at": time.time()})
        self._call(lambda: self._client.put(f"{self._prefix}secret-keys/{key_id}", value))

    def forget_secret_key_id(self, key_id: str, version: int) -> bool:
        t = self._client.transactions
        key = f"{self._prefix}secret-keys/{key_id}"
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[t.mod(key) == version], success=[t.delete(key)], failure=[]
            )
        )
        return bool(ok)

    # --- records of the root path ------------------------------------------------------------
    # the version is the key's modification revision
    def get_record(self, key: str) -> tuple[bytes, int] | None:
        value, meta = self._call(lambda: self._client.get(f"{self._prefix}records/{key}"))
        return None if value is None else (bytes(value), int(meta.mod_revision))

    def list_records(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        base = f"{self._prefix}records/"
        items = self._call(lambda: list(self._client.get_prefix(base + prefix)))
        return {
            meta.key.decode()[len(base) :]: (bytes(value), int(meta.mod_revision))
            for value, meta in items
        }

    def put_record(self, key: str, value: bytes, expected: int | None) -> int | None:
        full = f"{self._prefix}records/{key}"
        t = self._client.transactions
        compare = [t.version(full) == 0] if expected is None else [t.mod(full) == expected]
        ok, responses = self._call(
            lambda: self._client.transaction(
                compare=compare, success=[t.put(full, value)], failure=[]
            )
        )
        return int(responses[0].response_put.header.revision) if ok else None

    def delete_record(self, key: str, expected: int) -> bool:
        full = f"{self._prefix}records/{key}"
        t = self._client.transactions
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[t.mod(full) == expected], success=[t.delete(full)], failure=[]
            )
        )
        return bool(ok)

    # --- the format of the data --------------------------------------------------------------
    def _store_format_read(self) -> tuple[StoreFormat | None, int]:
        """The recorded format and the key's modification revision (0: none recorded)."""
        value, meta = self._call(lambda: self._client.get(f"{self._prefix}store-format"))
        if value is None:
            return None, 0
        data = orjson.loads(value)
        return StoreFormat(int(data["version"]), str(data["release"])), int(meta.mod_revision)

    def store_format(self) -> StoreFormat | None:
        return self._store_format_read()[0]

    def set_store_format(self, expected: int | None, new: StoreFormat) -> bool:
        key = f"{self._prefix}store-format"
        found, revision = self._store_format_read()
        if (found.version if found is not None else None) != expected:
            return False
        t = self._client.transactions
        value = json.dumps({"version": new.version, "release": new.release})
        # unchanged since the read (absent: never created), or another daemon's write wins
        compare = [t.mod(key) == revision] if revision else [t.version(key) == 0]
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=compare, success=[t.put(key, value)], failure=[]
            )
        )
        return bool(ok)

    # --- lifecycle ---------------------------------------------------------------------------
    def ping(self) -> None:
        self._call(self._client.status)

    def close(self) -> None:
        self._client.close()


def _encode_task(task: TaskRecord) -> str:
    return json.dumps(
        {
            "state": task.state.value,
            "reason": task.reason,
            "spec": task.spec,
            "extra": dict(task.extra),
            "created_at": task.created_at,
            "updated_at": task.updated_at,
        },
        sort_keys=True,
    )


def _decode_task(task_id: str, value: bytes, revision: int) -> TaskRecord:
    data = orjson.loads(value)
    return TaskRecord(
        task_id=task_id,
        state=TaskState(data["state"]),
        reason=data["reason"],
        spec=data["spec"],
        created_at=data["created_at"],
        updated_at=data["updated_at"],
        revision=revision,
        extra=data.get("extra", {}),
    )
