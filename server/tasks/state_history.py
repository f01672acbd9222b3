"""A task's state history with reasons: every state change and every change of the daemon that
runs it, newest last, kept in the task's state in the metastore (so every daemon of a fleet
shows the same), bounded to the last ``KEPT`` entries. Shown by ``GET /v1/tasks/{id}/history``
and the dashboard's task page.

Best effort by design: an entry that cannot be written (the store is down) is logged and
dropped, never the change it describes; two daemons appending at the same instant may lose one
entry of the two (a read, then a write; the state change itself is compare-and-set)."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from metastore import MetaStore, MetaStoreError

log = logging.getLogger(__name__)

KEY = "history/states"
KEPT = 50


def read(store: MetaStore, task_id: str) -> list[dict[str, Any]]:
    raw = store.get_state(task_id, KEY)
    entries = [] if raw is None else orjson.loads(raw)
    return entries if isinstance(entries, list) else []


def record(store: MetaStore, task_id: str, **entry: Any) -> None:
    """Append ``entry`` (with ``at``, the time now) to the task's history."""
    try:
        entries = read(store, task_id)
        entries.append({"at": round(time.time(), 3), **entry})
        store.put_state(task_id, KEY, orjson.dumps(entries[-KEPT:]))
    except MetaStoreError as exc:
        log.warning("state history of task %s not written: %s", task_id, exc)
