"""The fleet part of the metastore contract (task leases, fencing tokens, members), run against
every backend on a real server. Two daemons are two stores opened on the same root path."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import pytest

from metastore import (
    FencedError,
    Lease,
    MetaStore,
    MetaStoreUnavailableError,
    TaskNotFoundError,
    TaskState,
)
from tests.integration.test_metastore_contract import make_task, pos

pytestmark = pytest.mark.integration

# leases of 2 s, longer when tests share the machine with another worker (scripts/test.sh sets
# CDC_TEST_TIME_SCALE then): a round trip to a loaded MariaDB took longer than a lease once
TTL = 2.0 * float(os.environ.get("CDC_TEST_TIME_SCALE") or 1)


@pytest.fixture
def pair(store_opener, root_path) -> tuple[MetaStore, MetaStore]:
    """Daemons a and b, each registered in the fleet."""
    a, b = store_opener(root_path), store_opener(root_path)
    a.heartbeat("a", {"address": "127.0.0.1:1"}, TTL)
    b.heartbeat("b", {"address": "127.0.0.1:2"}, TTL)
    return a, b


def wait_until(check: Callable[[], object], seconds: float) -> object:
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def expired_and_taken(a: MetaStore, b: MetaStore, task_id: str) -> tuple[Lease, Lease]:
    """a takes the task, stops renewing, and b takes it once a's lease expired."""
    lease_a = a.acquire_lease(task_id, "a", TTL)
    assert lease_a is not None
    assert b.acquire_lease(task_id, "b", TTL) is None

    def b_takes() -> Lease | None:
        b.heartbeat("b", {}, TTL)
        return b.acquire_lease(task_id, "b", TTL)

    lease_b = wait_until(b_takes, TTL + 4)
    assert isinstance(lease_b, Lease)
    return lease_a, lease_b


def test_one_holder_at_a_time_and_the_holder_gets_its_own_lease_back(pair):
    a, b = pair
    a.create_task(make_task("t1"))
    lease = a.acquire_lease("t1", "a", TTL)
    assert lease is not None and lease.owner == "a" and lease.task_id == "t1"
    assert b.acquire_lease("t1", "b", TTL) is None
    assert a.acquire_lease("t1", "a", TTL) == lease
    assert a.leases() == {"t1": lease} == b.leases()


def test_a_stale_owner_is_refused_every_write_and_the_new_token_is_greater(pair):
    a, b = pair
    created = a.create_task(make_task("t1"))
    lease_a = a.acquire_lease("t1", "a", TTL)
    a.save_position("t1", pos(100), None, lease=lease_a)
    a.put_state("t1", "bound/ch", b"1", lease=lease_a)

    lease_a, lease_b = expired_and_taken(a, b, "t1")
    assert lease_b.token > lease_a.token
    # the new owner writes at once: its own lease is only TTL seconds long, and the refused
    # writes below may take that long on a loaded machine
    b.save_position("t1", pos(300), pos(100), lease=lease_b)
    b.put_state("t1", "bound/ch", b"3", lease=lease_b)

    with pytest.raises(FencedError):
        a.save_position("t1", pos(200), pos(300), lease=lease_a)
    with pytest.raises(FencedError):
        a.put_state("t1", "bound/ch", b"2", lease=lease_a)
    with pytest.raises(FencedError):
        a.update_task(
            "t1",
            state=TaskState.FAILED,
            reason="stale",
            expected_revision=created.revision,
            lease=lease_a,
        )
    assert a.get_positions("t1")["by-dev-rootcoord-dml_0"].ts == 300
    assert a.get_state("t1", "bound/ch") == b"3"
    assert a.get_task("t1").state is TaskState.INITIAL


def test_an_expired_lease_nobody_took_refuses_writes_and_is_taken_anew(pair):
    a, _ = pair
    a.create_task(make_task("t1"))
    lease = a.acquire_lease("t1", "a", TTL)
    assert wait_until(lambda: "t1" not in a.leases(), TTL + 4)
    with pytest.raises(FencedError):
        a.put_state("t1", "k", b"v", lease=lease)
    a.heartbeat("a", {}, TTL)  # back: the lease it lost stays lost, a new one has a new token
    again = a.acquire_lease("t1", "a", TTL)
    assert again is not None and again.token > lease.token
    a.put_state("t1", "k", b"v", lease=again)


def test_heartbeats_keep_the_leases(pair):
    a, b = pair
    a.create_task(make_task("t1"))
    lease = a.acquire_lease("t1", "a", TTL)
    ends = time.monotonic() + 2 * TTL + 1
    while time.monotonic() < ends:
        a.heartbeat("a", {}, TTL)
        assert b.acquire_lease("t1", "b", TTL) is None
        time.sleep(0.4)
    a.save_position("t1", pos(1), None, lease=lease)


def test_leaving_drops_the_leases_at_once(pair):
    a, b = pair
    a.create_task(make_task("t1"))
    a.create_task(make_task("t2"))
    a.acquire_lease("t1", "a", TTL)
    a.acquire_lease("t2", "a", TTL)
    a.leave("a")
    assert [m.member_id for m in b.members()] == ["b"]
    assert b.acquire_lease("t1", "b", TTL) is not None
    assert b.acquire_lease("t2", "b", TTL) is not None


def test_members_are_listed_until_they_stop_renewing(pair):
    a, _ = pair
    assert [(m.member_id, dict(m.info)) for m in a.members()] == [
        ("a", {"address": "127.0.0.1:1"}),
        ("b", {"address": "127.0.0.1:2"}),
    ]

    def only_a() -> bool:
        a.heartbeat("a", {"address": "127.0.0.1:1"}, TTL)
        return [m.member_id for m in a.members()] == ["a"]

    assert wait_until(only_a, TTL + 4)


def test_release_gives_up_only_the_lease_it_names(pair):
    a, b = pair
    a.create_task(make_task("t1"))
    lease_a, lease_b = expired_and_taken(a, b, "t1")
    a.release_lease(lease_a)  # stale: b's lease stays
    assert b.leases()["t1"] == lease_b
    b.release_lease(lease_b)
    assert "t1" not in b.leases()


def test_leases_need_a_stored_task_and_go_with_it(pair):
    a, _ = pair
    with pytest.raises(TaskNotFoundError):
        a.acquire_lease("missing", "a", TTL)
    a.create_task(make_task("t1"))
    first = a.acquire_lease("t1", "a", TTL)
    assert a.delete_task("t1")
    assert a.leases() == {}
    a.create_task(make_task("t1"))  # the same id again: its runner of before is still fenced
    second = a.acquire_lease("t1", "a", TTL)
    assert second is not None and second.token > first.token
    with pytest.raises(FencedError):
        a.put_state("t1", "k", b"v", lease=first)


def test_a_mysql_daemon_cut_off_inside_a_transaction_does_not_keep_its_task_locked(
    mariadb_service, root_path
):
    """Daemon a saves a position (its transaction holds the task row's lock) and is cut off
    from the server right then, the connection held open as in a partition. Its session
    timeout makes the server roll that transaction back, so b takes the task once a's lease
    expired; without it the lock would stay for the server's wait_timeout (8 hours)."""
    import threading

    from harness.cuttable_proxy import CuttableProxy
    from sqlalchemy import text

    from metastore.sql import SqlMetaStore
    from metastore.sql_urls import mysql_url_from_source

    service = mariadb_service
    direct = mysql_url_from_source(service.go_dsn)
    with CuttableProxy(service.host, service.port) as proxy:
        via_proxy = direct.replace(f":{service.port}/", f":{proxy.port}/")
        a = SqlMetaStore(via_proxy, root_path, session_timeout=TTL)
        b = SqlMetaStore(direct, root_path, session_timeout=TTL)
        try:
            a.create_task(make_task("t1"))
            a.heartbeat("a", {}, TTL)
            assert a.acquire_lease("t1", "a", TTL) is not None
            locked = threading.Event()

            def hold_the_lock() -> None:
                with contextlib.suppress(Exception), a._engine.begin() as conn:
                    conn.execute(
                        text("SELECT revision FROM cdc_tasks WHERE task_id = 't1' FOR UPDATE")
                    )
                    locked.set()
                    proxy.cut()  # the commit never reaches the server
                    conn.execute(text("SELECT 1"))

            holder = threading.Thread(target=hold_the_lock, daemon=True)
            holder.start()
            assert locked.wait(10)

            def b_takes() -> Lease | None:
                b.heartbeat("b", {}, TTL)
                try:
                    return b.acquire_lease("t1", "b", TTL)
                except MetaStoreUnavailableError:  # waited on the lock past its read timeout
                    return None

            started = time.monotonic()
            taken = wait_until(b_takes, 40)
            assert isinstance(taken, Lease), "b could not take the task: a's lock was kept"
            print(f"b took the task {time.monotonic() - started:.1f} s after the cut")
        finally:
            proxy.heal()
            a.close()
            b.close()
