"""A runner's store refuses its writes once the runner is let go; reads go on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metastore import Position, TaskRecord, TaskState
from metastore.errors import FencedError
from metastore.fenced import Fence, FencedStore, LeaseClock
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url


def test_writes_refused_after_revoke_reads_allowed(tmp_path: Path) -> None:
    inner = SqlMetaStore(sqlite_url(str(tmp_path / "meta.sqlite3")), "test")
    now = time.time()
    task = inner.create_task(
        TaskRecord("t1", TaskState.RUNNING, "", {"a": 1}, created_at=now, updated_at=now)
    )
    fence = Fence("the runner of task t1")
    store = FencedStore(inner, fence)
    first = Position("kafka", "ch0", b"\x01", 10)
    store.save_position("t1", first, None)
    store.put_state("t1", "k", b"v")

    fence.revoke()
    later = Position("kafka", "ch0", b"\x02", 20)
    with pytest.raises(FencedError, match="let go"):
        store.save_position("t1", later, first)
    with pytest.raises(FencedError):
        store.put_state("t1", "k", b"w")
    with pytest.raises(FencedError):
        store.update_task("t1", state=TaskState.FAILED, reason="x", expected_revision=task.revision)
    with pytest.raises(FencedError):
        store.delete_task("t1")
    with pytest.raises(FencedError):
        store.replace_spec("t1", {"a": 2}, expected_revision=task.revision)

    # nothing the let-go runner tried reached the store; reads still work
    assert store.get_positions("t1") == {"ch0": first} == inner.get_positions("t1")
    assert store.get_state("t1", "k") == b"v"
    stored = store.get_task("t1")
    assert stored is not None and stored.state is TaskState.RUNNING
    inner.close()


def test_a_fence_stays_closed_once_its_lease_lapsed() -> None:
    """A heartbeat acknowledged after the store may have let the leases go (later than the
    lease time after the previous one was sent) starts a new term; the fences of the old one
    stay closed though the clock runs again. One acknowledged in time keeps the term."""
    clock = LeaseClock()
    now = time.monotonic()
    clock.renewed(now, valid_for=2.0, held_for=3.0)
    fence = Fence("the runner of task t1", clock=clock)
    fence.check()
    clock.renewed(now + 0.5, valid_for=2.0, held_for=3.0)  # in time: the same term
    fence.check()
    assert not fence.revoked and fence.remaining() > 0

    lapsed = LeaseClock()
    lapsed.renewed(now - 10, valid_for=2.0, held_for=3.0)  # the store kept them until now - 7
    made_during_the_lapse = Fence("the runner of task t2", clock=lapsed)
    with pytest.raises(FencedError, match="not renewed in time"):
        made_during_the_lapse.check()
    lapsed.renewed(time.monotonic(), valid_for=2.0, held_for=3.0)  # heard again, too late
    assert lapsed.remaining() > 0
    with pytest.raises(FencedError, match="lapsed"):
        made_during_the_lapse.check()
    assert made_during_the_lapse.revoked and made_during_the_lapse.remaining() == 0
    Fence("the runner of task t2", clock=lapsed).check()  # a fence of the new term is open
