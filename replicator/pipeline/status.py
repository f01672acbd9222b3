"""What a task shows of itself while it runs: per channel status, and the task's warnings.

Warnings (history lost to retention, a failed backfill) are kept in the task's state, shown in
``progress.warnings`` and, while the task is Running, appended to its ``reason`` (a resume clears
the reason; the warnings stay).
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from metastore import ConcurrentUpdateError, MetaStore, Position, TaskState
from replicator.hybrid_time import to_seconds
from replicator.pipeline.task_state import RunnerState

log = logging.getLogger(__name__)


class ChannelState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    RETRYING = "retrying"  # the source, target or metastore failed; ``detail`` says how
    WAITING = "waiting"  # at a barrier for other channels; ``detail`` says which


@dataclass
class ChannelStatus:
    pchannel: str
    rows: int = 0
    bytes: int = 0
    position: Position | None = None
    # the source time (hybrid ts) up to which everything on the channel is on the target
    applied_ts: int = 0
    state: ChannelState = ChannelState.STARTING
    detail: str = ""
    # DML channels carry time ticks; the replicate channel does not, so the age of its last
    # record says nothing about lag and it is left out of it
    has_ticks: bool = True
    # read to the end with nothing waiting: a 2.6 pchannel with no writes has no ticks either,
    # and its last tick's age is no lag
    caught_up: bool = False
    # records dropped on purpose, by cause (repeats, rolled back, expired, orphans)
    skipped: dict[str, int] = field(default_factory=dict)
    # the source time (hybrid ts) of the last time tick read
    read_ts: int = 0
    # rows applied by (source collection id, name, "insert" | "delete"); bytes by message type
    collection_rows: dict[tuple[int, str, str], int] = field(default_factory=dict)
    bytes_by_type: dict[str, int] = field(default_factory=dict)
    # where the channel's records come from: "shared" (the daemon's shared reader of the
    # channel), "own" (a reader of the task's own), "" (not reading yet)
    reader: str = ""
    # the last time tick (hybrid ts) read by a read that found the channel's end with nothing
    # waiting and everything read on the target (see consistent_ts)
    caught_up_ts: int = 0
    # when (the daemon's seconds) the latest such read began: it says how fresh the figure
    # is (a failover or drain waits for a read begun after it asked), never what it claims
    caught_up_at: float = 0.0

    def set_state(self, state: ChannelState, detail: str = "") -> None:
        self.state, self.detail = state, detail

    def applied(self, ts: int) -> None:
        self.applied_ts = max(self.applied_ts, ts)

    @property
    def lag_seconds(self) -> float | None:
        """Source time not yet on the target; None until the channel's first time tick. It is
        computed when asked, so a stuck worker shows a growing lag."""
        if not self.applied_ts or not self.has_ticks:
            return None
        if self.caught_up:
            return 0.0
        return max(0.0, time.time() - to_seconds(self.applied_ts))

    def mark_caught_up(self, tick: int, read_started: float) -> None:
        """The read begun at ``read_started`` (seconds) found the end with nothing waiting;
        ``tick``: the last time tick the channel has read."""
        self.caught_up = True
        self.caught_up_ts = max(self.caught_up_ts, tick)
        self.caught_up_at = max(self.caught_up_at, read_started)

    @property
    def consistent_ts(self) -> int:
        """The source time up to which every write on the channel is on the target (0: not
        known yet): its applied tick, or, while it is read to its end with nothing waiting, the
        last time tick it read. Only a tick proves that no older write can follow it in the
        channel: a write's time is given before it reaches the queue (a 2.3 proxy stamps, then
        produces), so the moment of a read proves nothing (issue 41, bug 9)."""
        caught_up = self.caught_up_ts if self.caught_up else 0
        return max(self.applied_ts, caught_up)

    @property
    def holds_nothing(self) -> bool:
        """Read to its end with nothing waiting, and no time tick read since the daemon started:
        the channel carries none of the task's writes (2.3 ticks every channel a collection
        uses, about 5 times a second; a 2.6 pchannel without writes has no ticks), so it bounds
        nothing."""
        return self.caught_up and not self.consistent_ts

    def view(self) -> dict[str, Any]:
        state = f"{self.state}: {self.detail}" if self.detail else str(self.state)
        view: dict[str, Any] = {
            "channel": self.pchannel,
            "state": state,
            "rows": self.rows,
            "bytes": self.bytes,
            "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
            "position": None if self.position is None else self.position.to_json(),
            "read_ts": self.read_ts,
            "applied_ts": self.applied_ts,
            "consistent_up_to": consistent_view(self.consistent_ts) if self.has_ticks else None,
            "bytes_by_type": dict(self.bytes_by_type),
        }
        if self.reader:
            view["reader"] = self.reader
        if any(self.skipped.values()):
            view["skipped"] = {k: v for k, v in self.skipped.items() if v}
        return view


def consistent_view(ts: int) -> dict[str, Any] | None:
    """A consistent-up-to time as progress shows it: the hybrid timestamp and its ISO time."""
    if not ts:
        return None
    moment = datetime.fromtimestamp(to_seconds(ts), UTC)
    return {"ts": ts, "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")}


def task_consistent_ts(statuses: Iterable[ChannelStatus]) -> int:
    """The source time up to which every write of the task is on the target: the lowest of its
    DML channels that carry ticks (0 while one of them is not known, or none has ticked)."""
    times = [s.consistent_ts for s in statuses if s.has_ticks and not s.holds_nothing]
    return min(times) if times and all(times) else 0


UPDATE_ATTEMPTS = 3  # reads and compare-and-sets of a task's reason
_UNREACHABLE = re.compile(r".+ unreachable since \S+, retrying(: .+)?")


def skipped_totals(statuses: Iterable[ChannelStatus]) -> dict[str, int]:
    """Records skipped by cause, summed over the channels."""
    skipped: dict[str, int] = {}
    for status in statuses:
        for cause, count in status.skipped.items():
            skipped[cause] = skipped.get(cause, 0) + count
    return skipped


def collection_totals(statuses: Iterable[ChannelStatus]) -> list[dict[str, Any]]:
    """Rows inserted and deleted by collection, summed over the channels, in collection order."""
    collections: dict[tuple[int, str], dict[str, Any]] = {}
    for status in statuses:
        for (collection_id, name, api), count in status.collection_rows.items():
            entry = collections.setdefault(
                (collection_id, name),
                {
                    "collection_id": collection_id,
                    "collection_name": name,
                    "inserted": 0,
                    "deleted": 0,
                },
            )
            entry["inserted" if api == "insert" else "deleted"] += count
    return [collections[k] for k in sorted(collections)]


def unreachable_warning(role: str, label: str, since: float, refusal: str = "") -> str:
    """The warning of an endpoint a running task cannot reach (server/tasks/reachability.py);
    ``refusal``: why an endpoint that answers turns the daemon away (credentials, certificates)."""
    when = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    told = f": {refusal}" if refusal else ""
    return f"{role} {label} unreachable since {when}, retrying{told}"


class TaskWarnings:
    """The task's warnings: kept in its state, shown in progress and in a Running task's
    reason. Called from the runner's threads and the daemon's reachability job."""

    def __init__(self, store: MetaStore, state: RunnerState, task_id: str) -> None:
        self._store = store
        self._state = state
        self._task_id = task_id
        self._lock = threading.RLock()
        self.items: list[str] = []
        self._loaded = False

    def load(self) -> None:
        with self._lock:
            self.items = self._state.warnings()
            self._loaded = True

    def _ensure_loaded(self) -> None:
        """A warning given before the runner loaded the saved ones (the source down at the
        start) must not replace them."""
        if not self._loaded:
            self.load()

    def warn(self, text: str) -> None:
        log.warning("%s", text)
        with self._lock:
            self._ensure_loaded()
            if text not in self.items:
                self.items.append(text)
                self._state.save_warnings(self.items)
            self.show()

    def unreachable(self, texts: Iterable[str]) -> None:
        """The endpoints the task cannot reach now (``unreachable_warning`` texts): new ones
        are warned, those no longer in ``texts`` withdrawn."""
        wanted = list(texts)
        with self._lock:
            self._ensure_loaded()
            for text in [w for w in self.items if _UNREACHABLE.fullmatch(w)]:
                if text not in wanted:
                    self.withdraw(text)
            for text in wanted:
                if text not in self.items:
                    self.warn(text)

    def withdraw(self, text: str) -> None:
        """A warning no longer true (an import copied): gone from the warnings and from the
        Running task's reason."""
        with self._lock:
            self._ensure_loaded()
            if text not in self.items:
                return
            self.items.remove(text)
            self._state.save_warnings(self.items)

        def without(reason: str) -> str | None:
            if text not in reason:
                return None
            for joined in (f"; {text}", f"{text}; ", text):  # joined as show() joins them
                reason = reason.replace(joined, "")
            return reason

        self._rewrite_reason(without, "withdrawing a warning; its reason keeps it")

    def show(self) -> None:
        """Put the warnings into the reason of the Running task (resume clears the reason)."""
        if not self.items:
            return

        def with_all(reason: str) -> str | None:
            missing = [w for w in self.items if w not in reason]
            if not missing:
                return None
            return "; ".join([reason, *missing] if reason else missing)

        self._rewrite_reason(with_all, "recording a warning; it stays in progress.warnings")

    def _rewrite_reason(self, rewrite: Callable[[str], str | None], giving_up: str) -> None:
        """Set the Running task's reason to ``rewrite(reason)`` (None: leave it), compare-and-set
        on its revision, read again when another write came first."""
        for _attempt in range(UPDATE_ATTEMPTS):
            task = self._store.get_task(self._task_id)
            if task is None or task.state is not TaskState.RUNNING:
                return
            reason = rewrite(task.reason)
            if reason is None:
                return
            try:
                self._store.update_task(
                    task.task_id,
                    state=TaskState.RUNNING,
                    reason=reason,
                    expected_revision=task.revision,
                )
                return
            except ConcurrentUpdateError:
                continue  # read it again
        log.info("task kept changing while %s", giving_up)
