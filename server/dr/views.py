"""What the disaster-recovery jobs of each task show as its progress (``progress.switchover``,
``failover``, ``failback``, ``stale_writes``), as last known on this daemon."""

from __future__ import annotations

from typing import Any


class JobViews:
    """Task id -> progress key -> the view last saved or read."""

    def __init__(self) -> None:
        self._views: dict[str, dict[str, Any]] = {}

    def of(self, task_id: str) -> dict[str, Any]:
        return dict(self._views.get(task_id, {}))

    def task_ids(self) -> list[str]:
        return list(self._views)

    def remember(self, task_id: str, key: str, view: dict[str, Any]) -> None:
        self._views.setdefault(task_id, {})[key] = view
