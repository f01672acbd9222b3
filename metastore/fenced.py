"""A store whose writes stop when its writer is let go, or when its lease may have run out.

A task's runner writes positions and state through a ``FencedStore``, and its target writes
check the same ``Fence`` (``replicator/sinks/milvus.py``). The fence closes three ways:

- **revoked**: the supervisor let the runner go (a blocking call to a source that does not
  answer outlived the stop's wait); whatever the runner does when its call returns, it can no
  longer write, so a later runner of the task never finds a position saved behind its back;
- **a lost lease** (a fleet of daemons, ``server/tasks/fleet.py``): every store write carries the
  task's lease, and the store refuses it once another daemon holds the task (the token check
  happens inside the store's transaction, so it holds even for a daemon that does not know yet);
- **a lease that may have run out**: the daemon's ``LeaseClock`` says until when its leases are
  surely live (the last heartbeat the store acknowledged, plus the lease time, less a margin,
  counted from before the heartbeat was sent). Past that, the fence refuses every write, target
  writes included, before another daemon can take the task: a daemon cut from its store stops
  writing before its lease ends;
- **a lease that lapsed**: a heartbeat acknowledged only after the store may have let the
  leases go (later than the lease time after the previous one was sent) starts a new *term* of
  the clock. A fence belongs to the term it was made in and stays closed in any later one: the
  store answering again does not reopen it, since another daemon may hold the task by then and
  a target write, unlike a store write, carries no lease token to be refused by. The task's
  runner starts again under a fence of the new term, once a round has read the lease as held.

Reads pass through. A write already inside the backend when the fence closes completes;
position writes are compare-and-set, so a runner started afterwards that read the older
position fails its own first save rather than overwrite a newer one.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from metastore.base import Lease, MetaStore, Position, TaskRecord, TaskState
from metastore.delegating import DelegatingStore
from metastore.errors import FencedError


class LeaseClock:
    """Until when (``time.monotonic``) the daemon's leases are surely live, and the term they
    have been held in without a gap. Without a fleet (a store one daemon has to itself),
    forever, in term 0."""

    def __init__(self) -> None:
        self._until = math.inf
        self._held_until = math.inf  # the store keeps the leases at least until then
        self.term = 0
        self._lock = threading.Lock()

    def renewed(
        self,
        sent_at: float,
        valid_for: float,
        held_for: float,
        acknowledged_at: float | None = None,
    ) -> None:
        """A heartbeat sent at ``sent_at`` (monotonic) was acknowledged at ``acknowledged_at``
        (default: now): the leases hold for at least ``valid_for`` seconds from when it was
        sent, and the store keeps them ``held_for`` (the lease time: the store counts it from
        when the heartbeat reached it, not earlier than it was sent). Acknowledged after the
        previous heartbeat's ``held_for`` ran out, it may have reached the store after the
        leases expired there: a new term."""
        acknowledged = time.monotonic() if acknowledged_at is None else acknowledged_at
        with self._lock:
            if acknowledged > self._held_until:
                self.term += 1
            self._until = sent_at + valid_for
            self._held_until = sent_at + held_for

    def expire(self) -> None:
        with self._lock:
            self._until = -math.inf

    def remaining(self) -> float:
        return self._until - time.monotonic()


class Fence:
    """Revoked once, never restored; closed as well while ``clock`` has run out."""

    def __init__(
        self, holder: str, lease: Lease | None = None, clock: LeaseClock | None = None
    ) -> None:
        self.holder = holder
        self.lease = lease
        self.clock = clock
        self.term = 0 if clock is None else clock.term
        self._revoked = threading.Event()

    def revoke(self) -> None:
        self._revoked.set()

    @property
    def revoked(self) -> bool:
        """Closed for good: let go, or its lease lapsed since it was made."""
        return self._revoked.is_set() or self._lapsed()

    def _lapsed(self) -> bool:
        return self.clock is not None and self.clock.term != self.term

    def remaining(self) -> float:
        """Seconds the holder may still write (inf without a lease clock; <= 0: closed)."""
        if self.revoked:
            return 0.0
        return math.inf if self.clock is None else self.clock.remaining()

    def check(self) -> None:
        if self._revoked.is_set():
            raise FencedError(f"{self.holder} was let go; its writes are refused")
        if self._lapsed():
            raise FencedError(
                f"{self.holder}: its lease lapsed (the metastore did not hear from this daemon "
                "within the lease time), so another daemon may hold the task; its writes are "
                "refused for good"
            )
        if self.clock is not None and self.clock.remaining() <= 0:
            raise FencedError(
                f"{self.holder}: its lease was not renewed in time (metastore unreachable?); "
                "its writes are refused until the daemon holds the task again"
            )


class FencedStore(DelegatingStore):
    """``store`` with every write checked against ``fence`` first, and carrying its lease."""

    def __init__(self, store: MetaStore, fence: Fence) -> None:
        super().__init__(store)
        self.fence = fence

    def create_task(self, task: TaskRecord) -> TaskRecord:
        self.fence.check()
        return self.inner.create_task(task)

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
        self.fence.check()
        return self.inner.update_task(
            task_id,
            state=state,
            reason=reason,
            expected_revision=expected_revision,
            lease=lease or self.fence.lease,
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
        self.fence.check()
        return self.inner.replace_spec(
            task_id, spec, expected_revision=expected_revision, lease=lease or self.fence.lease
        )

    def delete_task(self, task_id: str) -> bool:
        self.fence.check()
        return self.inner.delete_task(task_id)

    def save_position(
        self,
        task_id: str,
        position: Position,
        expected: Position | None,
        *,
        lease: Lease | None = None,
    ) -> None:
        self.fence.check()
        self.inner.save_position(task_id, position, expected, lease=lease or self.fence.lease)

    def put_state(
        self, task_id: str, key: str, value: bytes, *, lease: Lease | None = None
    ) -> None:
        self.fence.check()
        self.inner.put_state(task_id, key, value, lease=lease or self.fence.lease)

    def replace_state(self, task_id: str, key: str, value: bytes, expected: bytes | None) -> bool:
        self.fence.check()
        return self.inner.replace_state(task_id, key, value, expected)

    def close(self) -> None:
        """The runner does not own the store: closing is the daemon's."""
