"""etcd metastore (through the ``etcd3`` module of the python3-etcd3 distribution).

Layout under ``<rootPath>/``::

    tasks/<task_id>                  JSON task record; its mod_revision is the task's revision
    positions/<task_id>/<pchannel>   JSON position
    state/<task_id>/<key>            raw bytes

Every write that belongs to a task is a transaction guarded by ``version(tasks/<id>) > 0``, so
nothing is written for a task deleted meanwhile; delete removes all three ranges in one
transaction.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import etcd3
import grpc
import orjson
from etcd3 import exceptions as etcd_exceptions
from etcd3.utils import prefix_range_end

from metastore.base import Position, TaskRecord, TaskState, check_position_step
from metastore.errors import (
    ConcurrentUpdateError,
    MetaStoreUnavailableError,
    PositionConflictError,
    PositionError,
    TaskExistsError,
    TaskNotFoundError,
)

T = TypeVar("T")


class EtcdMetaStore:
    def __init__(self, client: etcd3.MultiEndpointEtcd3Client, root_path: str) -> None:
        self.root_path = root_path
        self._client = client
        self._prefix = root_path.strip("/") + "/"
        self.ping()

    # --- keys --------------------------------------------------------------------------------
    def _task_key(self, task_id: str) -> str:
        return f"{self._prefix}tasks/{task_id}"

    def _positions_prefix(self, task_id: str) -> str:
        return f"{self._prefix}positions/{task_id}/"

    def _state_prefix(self, task_id: str) -> str:
        return f"{self._prefix}state/{task_id}/"

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (etcd_exceptions.Etcd3Exception, grpc.RpcError) as exc:
            raise MetaStoreUnavailableError(
                f"etcd metastore unavailable: {type(exc).__name__}"
            ) from exc

    def _task_exists(self, task_id: str) -> Any:
        """A transaction comparison that holds while the task is stored."""
        return self._client.transactions.version(self._task_key(task_id)) > 0

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
        self, task_id: str, *, state: TaskState, reason: str, expected_revision: int
    ) -> TaskRecord:
        return self._rewrite_task(
            task_id, expected_revision, lambda t: t.with_state(state, reason, time.time())
        )

    def replace_spec(
        self, task_id: str, spec: Mapping[str, Any], *, expected_revision: int
    ) -> TaskRecord:
        return self._rewrite_task(task_id, expected_revision, lambda t: replace(t, spec=spec))

    def _rewrite_task(
        self, task_id: str, expected_revision: int, change: Callable[[TaskRecord], TaskRecord]
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
                compare=[self._client.transactions.mod(key) == expected_revision],
                success=[self._client.transactions.put(key, _encode_task(updated))],
                failure=[],
            )
        )
        if not ok:
            if self.get_task(task_id) is None:
                raise TaskNotFoundError(task_id)
            raise ConcurrentUpdateError(task_id)
        stored = self.get_task(task_id)
        if stored is None:
            raise TaskNotFoundError(task_id)
        return stored

    def delete_task(self, task_id: str) -> bool:
        t = self._client.transactions
        ranges = [self._positions_prefix(task_id), self._state_prefix(task_id)]
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[t.version(self._task_key(task_id)) > 0],
                success=[t.delete(self._task_key(task_id))]
                + [t.delete(p, range_end=prefix_range_end(p.encode())) for p in ranges],
                failure=[t.delete(p, range_end=prefix_range_end(p.encode())) for p in ranges],
            )
        )
        return bool(ok)

    # --- positions ---------------------------------------------------------------------------
    def get_positions(self, task_id: str) -> dict[str, Position]:
        prefix = self._positions_prefix(task_id)
        items = self._call(lambda: list(self._client.get_prefix(prefix)))
        positions = (Position.from_json(orjson.loads(value)) for value, _ in items)
        return {p.pchannel: p for p in positions}

    def save_position(self, task_id: str, position: Position, expected: Position | None) -> None:
        key = self._positions_prefix(task_id) + position.pchannel
        value, meta = self._call(lambda: self._client.get(key))
        stored = None if value is None else Position.from_json(orjson.loads(value))
        try:
            check_position_step(task_id, stored, expected, position)
        except PositionError:
            if self.get_task(task_id) is None:  # a missing task explains any mismatch
                raise TaskNotFoundError(task_id) from None
            raise
        t = self._client.transactions
        guard = t.version(key) == 0 if meta is None else t.mod(key) == meta.mod_revision
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[self._task_exists(task_id), guard],
                success=[t.put(key, json.dumps(position.to_json()))],
                failure=[],
            )
        )
        if not ok:
            if self.get_task(task_id) is None:
                raise TaskNotFoundError(task_id)
            raise PositionConflictError(
                f"position of task {task_id} channel {position.pchannel} changed while saving"
            )

    # --- per-task state ----------------------------------------------------------------------
    def put_state(self, task_id: str, key: str, value: bytes) -> None:
        t = self._client.transactions
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[self._task_exists(task_id)],
                success=[t.put(self._state_prefix(task_id) + key, value)],
                failure=[],
            )
        )
        if not ok:
            raise TaskNotFoundError(task_id)

    def get_state(self, task_id: str, key: str) -> bytes | None:
        value, _ = self._call(lambda: self._client.get(self._state_prefix(task_id) + key))
        return None if value is None else bytes(value)

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        base = self._state_prefix(task_id)
        items = self._call(lambda: list(self._client.get_prefix(base + prefix)))
        return {meta.key.decode()[len(base) :]: bytes(value) for value, meta in items}

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
