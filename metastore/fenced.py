"""A store whose writes stop when its writer is let go.

A task's runner writes positions and state through a ``FencedStore``. When the runner cannot be
stopped in time (a blocking call to a source that does not answer), the supervisor lets it go
and revokes its fence: whatever the runner does when its call returns, it can no longer write,
so a later runner of the task (a resume) never finds a position saved behind its back. Reads
pass through. A write already inside the backend when the fence is revoked completes; position
writes are compare-and-set, so a runner started afterwards that read the older position fails
its own first save rather than overwrite a newer one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from metastore.base import MetaStore, Position, TaskRecord, TaskState
from metastore.errors import FencedError


class Fence:
    """Revoked once, never restored."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self._revoked = threading.Event()

    def revoke(self) -> None:
        self._revoked.set()

    @property
    def revoked(self) -> bool:
        return self._revoked.is_set()

    def check(self) -> None:
        if self._revoked.is_set():
            raise FencedError(f"{self.holder} was let go; its writes are refused")


class FencedStore:
    """``store`` with every write checked against ``fence`` first."""

    def __init__(self, store: MetaStore, fence: Fence) -> None:
        self._store = store
        self.fence = fence
        self.root_path = store.root_path

    def create_task(self, task: TaskRecord) -> TaskRecord:
        self.fence.check()
        return self._store.create_task(task)

    def get_task(self, task_id: str) -> TaskRecord | None:
        return self._store.get_task(task_id)

    def list_tasks(self) -> list[TaskRecord]:
        return self._store.list_tasks()

    def update_task(
        self, task_id: str, *, state: TaskState, reason: str, expected_revision: int
    ) -> TaskRecord:
        self.fence.check()
        return self._store.update_task(
            task_id, state=state, reason=reason, expected_revision=expected_revision
        )

    def replace_spec(
        self, task_id: str, spec: Mapping[str, Any], *, expected_revision: int
    ) -> TaskRecord:
        self.fence.check()
        return self._store.replace_spec(task_id, spec, expected_revision=expected_revision)

    def delete_task(self, task_id: str) -> bool:
        self.fence.check()
        return self._store.delete_task(task_id)

    def get_positions(self, task_id: str) -> dict[str, Position]:
        return self._store.get_positions(task_id)

    def save_position(self, task_id: str, position: Position, expected: Position | None) -> None:
        self.fence.check()
        self._store.save_position(task_id, position, expected)

    def put_state(self, task_id: str, key: str, value: bytes) -> None:
        self.fence.check()
        self._store.put_state(task_id, key, value)

    def get_state(self, task_id: str, key: str) -> bytes | None:
        return self._store.get_state(task_id, key)

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        return self._store.list_state(task_id, prefix)

    def ping(self) -> None:
        self._store.ping()

    def close(self) -> None:
        """The runner does not own the store: closing is the daemon's."""
