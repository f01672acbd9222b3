"""A store that hands every call to another: the base of the wrappers that change a few
(``sealed``: secrets at rest; ``fenced``: writes of a runner that may be let go). A method added
to the ``MetaStore`` contract is added here once, and every wrapper passes it on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metastore.base import Lease, Member, MetaStore, Position, StoreFormat, TaskRecord, TaskState


class DelegatingStore:
    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.root_path = inner.root_path

    # --- tasks ---------------------------------------------------------------------------------
    def create_task(self, task: TaskRecord) -> TaskRecord:
        return self.inner.create_task(task)

    def get_task(self, task_id: str) -> TaskRecord | None:
        return self.inner.get_task(task_id)

    def list_tasks(self) -> list[TaskRecord]:
        return self.inner.list_tasks()

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
        return self.inner.update_task(
            task_id,
            state=state,
            reason=reason,
            expected_revision=expected_revision,
            lease=lease,
            extra=extra,
        )

    def replace_spec(
        self,
        task_id: str,
        spec: Mapping[str, Any],
        *,
        expected_revision: int,
        lease: Lease | None = None,
    ) -> TaskRecord:
        return self.inner.replace_spec(
            task_id, spec, expected_revision=expected_revision, lease=lease
        )

    def delete_task(self, task_id: str) -> bool:
        return self.inner.delete_task(task_id)

    # --- positions -----------------------------------------------------------------------------
    def get_positions(self, task_id: str) -> dict[str, Position]:
        return self.inner.get_positions(task_id)

    def save_position(
        self,
        task_id: str,
        position: Position,
        expected: Position | None,
        *,
        lease: Lease | None = None,
    ) -> None:
        self.inner.save_position(task_id, position, expected, lease=lease)

    # --- per-task state ------------------------------------------------------------------------
    def put_state(
        self, task_id: str, key: str, value: bytes, *, lease: Lease | None = None
    ) -> None:
        self.inner.put_state(task_id, key, value, lease=lease)

    def get_state(self, task_id: str, key: str) -> bytes | None:
        return self.inner.get_state(task_id, key)

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        return self.inner.list_state(task_id, prefix)

    def replace_state(self, task_id: str, key: str, value: bytes, expected: bytes | None) -> bool:
        return self.inner.replace_state(task_id, key, value, expected)

    # --- the fleet -----------------------------------------------------------------------------
    def heartbeat(self, member_id: str, info: Mapping[str, Any], ttl: float) -> None:
        self.inner.heartbeat(member_id, info, ttl)

    def leave(self, member_id: str) -> None:
        self.inner.leave(member_id)

    def members(self) -> list[Member]:
        return self.inner.members()

    def acquire_lease(self, task_id: str, member_id: str, ttl: float) -> Lease | None:
        return self.inner.acquire_lease(task_id, member_id, ttl)

    def release_lease(self, lease: Lease) -> None:
        self.inner.release_lease(lease)

    def leases(self) -> dict[str, Lease]:
        return self.inner.leases()

    # --- the ids of the keys secrets are sealed with ------------------------------------------
    def secret_key_ids(self) -> dict[str, int]:
        return self.inner.secret_key_ids()

    def record_secret_key_id(self, key_id: str) -> None:
        self.inner.record_secret_key_id(key_id)

    def forget_secret_key_id(self, key_id: str, version: int) -> bool:
        return self.inner.forget_secret_key_id(key_id, version)

    # --- records of the root path ---------------------------------------------------------------
    def get_record(self, key: str) -> tuple[bytes, int] | None:
        return self.inner.get_record(key)

    def list_records(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        return self.inner.list_records(prefix)

    def put_record(self, key: str, value: bytes, expected: int | None) -> int | None:
        return self.inner.put_record(key, value, expected)

    def delete_record(self, key: str, expected: int) -> bool:
        return self.inner.delete_record(key, expected)

    # --- lifecycle -----------------------------------------------------------------------------
    def store_format(self) -> StoreFormat | None:
        return self.inner.store_format()

    def set_store_format(self, expected: int | None, new: StoreFormat) -> bool:
        return self.inner.set_store_format(expected, new)

    def ping(self) -> None:
        self.inner.ping()

    def close(self) -> None:
        self.inner.close()
