"""The metastore contract, run against every backend on a real server (SQLite file, MariaDB,
etcd). Each test has its own root path."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from metastore import (
    ConcurrentUpdateError,
    MetaStoreUnavailableError,
    Position,
    PositionConflictError,
    PositionRegressionError,
    TaskExistsError,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)

pytestmark = pytest.mark.integration


def make_task(task_id: str, created_at: float | None = None, **spec: object) -> TaskRecord:
    now = time.time() if created_at is None else created_at
    return TaskRecord(
        task_id=task_id,
        state=TaskState.INITIAL,
        reason="",
        spec={"milvus_connect_param": {"host": "h", "port": 1, "password": "pw"}, **spec},
        created_at=now,
        updated_at=now,
    )


def pos(ts: int, msg: bytes = b"\x01", channel: str = "by-dev-rootcoord-dml_0") -> Position:
    return Position(backend="kafka", pchannel=channel, msg_id=msg, ts=ts)


@pytest.fixture
def store(store_opener, root_path):
    return store_opener(root_path)


def test_task_round_trip(store):
    created = store.create_task(make_task("t1", note="ünïcode ✓"))
    fetched = store.get_task("t1")
    assert fetched == created
    assert fetched.spec["note"] == "ünïcode ✓"
    assert fetched.spec["milvus_connect_param"]["password"] == "pw"
    assert fetched.state is TaskState.INITIAL
    assert store.get_task("missing") is None


def test_create_twice_is_refused(store):
    store.create_task(make_task("t1"))
    with pytest.raises(TaskExistsError):
        store.create_task(make_task("t1"))
    assert len(store.list_tasks()) == 1


def test_list_is_oldest_first(store):
    for i, task_id in enumerate(["c", "a", "b"]):
        store.create_task(make_task(task_id, created_at=1000.0 + i))
    assert [t.task_id for t in store.list_tasks()] == ["c", "a", "b"]


def test_update_is_compare_and_set(store):
    created = store.create_task(make_task("t1"))
    running = store.update_task(
        "t1", state=TaskState.RUNNING, reason="", expected_revision=created.revision
    )
    assert running.state is TaskState.RUNNING
    assert running.revision != created.revision
    with pytest.raises(ConcurrentUpdateError):
        store.update_task(
            "t1", state=TaskState.PAUSED, reason="stale", expected_revision=created.revision
        )
    assert store.get_task("t1").state is TaskState.RUNNING
    paused = store.update_task(
        "t1", state=TaskState.PAUSED, reason="by hand", expected_revision=running.revision
    )
    assert (paused.state, paused.reason) == (TaskState.PAUSED, "by hand")
    assert store.get_task("t1") == paused


def test_replace_spec_is_compare_and_set_and_keeps_the_state(store):
    created = store.create_task(make_task("t1"))
    running = store.update_task(
        "t1", state=TaskState.RUNNING, reason="ok", expected_revision=created.revision
    )
    spec = {"milvus_connect_param": {"host": "h", "port": 1, "password": {"sealed": "x"}}}
    replaced = store.replace_spec("t1", spec, expected_revision=running.revision)
    assert replaced.spec == spec and replaced.revision != running.revision
    assert (replaced.state, replaced.reason, replaced.created_at) == (
        TaskState.RUNNING,
        "ok",
        running.created_at,
    )
    assert store.get_task("t1") == replaced
    with pytest.raises(ConcurrentUpdateError):
        store.replace_spec("t1", created.spec, expected_revision=running.revision)
    with pytest.raises(TaskNotFoundError):
        store.replace_spec("missing", spec, expected_revision=1)


def test_update_replaces_extra_only_when_given(store):
    mark = {"creating": {"by": "host:8444", "until": 1700000000.5}}
    created = store.create_task(replace(make_task("t1"), extra=mark))
    assert store.get_task("t1").extra == mark
    kept = store.update_task(
        "t1", state=TaskState.INITIAL, reason="x", expected_revision=created.revision
    )
    assert kept.extra == mark and store.get_task("t1").extra == mark
    shown = store.update_task(
        "t1", state=TaskState.RUNNING, reason="", expected_revision=kept.revision, extra={}
    )
    assert shown.extra == {} and store.get_task("t1") == shown
    assert [t.extra for t in store.list_tasks()] == [{}]
    with pytest.raises(ConcurrentUpdateError):
        store.update_task(
            "t1", state=TaskState.RUNNING, reason="", expected_revision=kept.revision, extra=mark
        )


def test_update_unknown_task(store):
    with pytest.raises(TaskNotFoundError):
        store.update_task("nope", state=TaskState.RUNNING, reason="", expected_revision=1)


def test_delete_removes_positions_and_state(store):
    store.create_task(make_task("t1"))
    store.create_task(make_task("t2"))
    store.save_position("t1", pos(10), None)
    store.save_position("t2", pos(20), None)
    store.put_state("t1", "coll/1", b"x")
    assert store.delete_task("t1") is True
    assert store.get_task("t1") is None
    assert store.get_positions("t1") == {}
    assert store.list_state("t1") == {}
    assert store.delete_task("t1") is False
    # the other task is untouched
    assert store.get_positions("t2") == {"by-dev-rootcoord-dml_0": pos(20)}


def test_positions_compare_and_set(store):
    store.create_task(make_task("t1"))
    first = pos(100, b"\x00\x01")
    store.save_position("t1", first, None)
    with pytest.raises(PositionConflictError):
        store.save_position("t1", pos(200), None)  # something is stored already
    second = pos(200, b"\x00\x02")
    store.save_position("t1", second, first)
    with pytest.raises(PositionConflictError):
        store.save_position("t1", pos(300), first)  # stale expectation
    with pytest.raises(PositionRegressionError):
        store.save_position("t1", pos(150), second)  # backwards
    same_tick = pos(200, b"\x00\x03")
    store.save_position("t1", same_tick, second)  # the same tick is not backwards
    assert store.get_positions("t1") == {"by-dev-rootcoord-dml_0": same_tick}


def test_positions_per_channel_and_binary_ids(store):
    store.create_task(make_task("t1"))
    every_byte = bytes(range(256))
    big_ts = (1 << 62) + 12345
    a = Position("rocksmq", "ch_a", every_byte, big_ts)
    b = Position("pulsar", "ch_b", b"", 0)
    store.save_position("t1", a, None)
    store.save_position("t1", b, None)
    assert store.get_positions("t1") == {"ch_a": a, "ch_b": b}


def test_position_of_unknown_or_deleted_task_is_refused(store):
    with pytest.raises(TaskNotFoundError):
        store.save_position("ghost", pos(1), None)
    store.create_task(make_task("t1"))
    store.save_position("t1", pos(1), None)
    store.delete_task("t1")
    with pytest.raises(TaskNotFoundError):
        store.save_position("t1", pos(2), pos(1))
    with pytest.raises(TaskNotFoundError):
        store.save_position("t1", pos(2), None)
    assert store.get_positions("t1") == {}


def test_racing_position_writers_one_wins(store):
    """Two writers that read the same position race to save; exactly one succeeds each round."""
    store.create_task(make_task("t1"))
    current = pos(0)
    store.save_position("t1", current, None)
    for round_no in range(1, 21):
        outcomes: list[str] = []
        barrier = threading.Barrier(2)

        def write(
            ts: int,
            expected: Position = current,
            barrier: threading.Barrier = barrier,
            outcomes: list[str] = outcomes,
        ) -> None:
            barrier.wait()
            try:
                store.save_position("t1", pos(ts, bytes([ts % 256])), expected)
                outcomes.append("won")
            except PositionConflictError:
                outcomes.append("lost")

        threads = [threading.Thread(target=write, args=(round_no * 10 + k,)) for k in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["lost", "won"], f"round {round_no}: {outcomes}"
        current = store.get_positions("t1")["by-dev-rootcoord-dml_0"]
        assert current.ts in (round_no * 10 + 1, round_no * 10 + 2)


def test_task_state_values(store):
    store.create_task(make_task("t1"))
    store.put_state("t1", "collections/100", b"created")
    store.put_state("t1", "collections/101", b"\x00\xff")
    store.put_state("t1", "backfill/range-1", b"done")
    store.put_state("t1", "collections/100", b"dropped")  # overwrite
    assert store.get_state("t1", "collections/100") == b"dropped"
    assert store.get_state("t1", "nothing") is None
    assert store.list_state("t1", "collections/") == {
        "collections/100": b"dropped",
        "collections/101": b"\x00\xff",
    }
    assert set(store.list_state("t1")) == {"collections/100", "collections/101", "backfill/range-1"}
    with pytest.raises(TaskNotFoundError):
        store.put_state("ghost", "k", b"v")


def test_secret_key_ids_are_forgotten_only_unless_recorded_again(store_opener, root_path):
    store = store_opener(root_path)
    assert store.secret_key_ids() == {}
    store.record_secret_key_id("k1")
    store.record_secret_key_id("k2.b_c-1")
    first = store.secret_key_ids()
    assert set(first) == {"k1", "k2.b_c-1"}
    store.record_secret_key_id("k1")  # again: a new version
    again = store.secret_key_ids()
    assert again["k1"] != first["k1"] and again["k2.b_c-1"] == first["k2.b_c-1"]
    assert store.forget_secret_key_id("k1", first["k1"]) is False  # recorded since
    assert store.forget_secret_key_id("k2.b_c-1", first["k2.b_c-1"]) is True
    assert store.forget_secret_key_id("k2.b_c-1", first["k2.b_c-1"]) is False
    assert store.forget_secret_key_id("never", 1) is False
    assert set(store.secret_key_ids()) == {"k1"}
    assert store_opener(root_path + "-other").secret_key_ids() == {}  # per root path
    store.create_task(make_task("t1"))
    assert store.delete_task("t1") and set(store.secret_key_ids()) == {"k1"}  # not a task's


def test_records_change_by_compare_and_set_only(store_opener, root_path):
    store = store_opener(root_path)
    assert store.get_record("pairs/a+b") is None
    first = store.put_record("pairs/a+b", b"one", None)
    assert first is not None
    assert store.put_record("pairs/a+b", b"again", None) is None  # it exists: refused
    assert store.get_record("pairs/a+b") == (b"one", first)
    second = store.put_record("pairs/a+b", b"\x00two", first)
    assert second is not None and second != first
    assert store.put_record("pairs/a+b", b"stale", first) is None  # an old version: refused
    assert store.get_record("pairs/a+b") == (b"\x00two", second)
    store.put_record("pairs/c+d", b"other", None)
    store.put_record("pairs_not/x", b"x", None)
    store.put_record("pairs%/y", b"y", None)  # a LIKE wildcard in a key is a plain character
    assert {k: v for k, (v, _) in store.list_records("pairs/").items()} == {
        "pairs/a+b": b"\x00two",
        "pairs/c+d": b"other",
    }
    assert set(store.list_records("pairs%")) == {"pairs%/y"}
    assert store.delete_record("pairs/a+b", first) is False  # changed since
    assert store.delete_record("pairs/a+b", second) is True
    assert store.get_record("pairs/a+b") is None
    assert store.put_record("pairs/a+b", b"new", None) is not None  # absent again: created
    assert store_opener(root_path + "-other").list_records("") == {}  # per root path
    store.create_task(make_task("t1"))
    assert store.delete_task("t1") and store.get_record("pairs/c+d") is not None  # not a task's


def test_racing_record_writers_one_wins(store_opener, root_path):
    stores = [store_opener(root_path) for _ in range(4)]
    version = stores[0].put_record("pairs/race", b"0", None)
    results = [s.put_record("pairs/race", f"{i}".encode(), version) for i, s in enumerate(stores)]
    assert sum(r is not None for r in results) == 1, results


def test_a_tasks_state_is_replaced_by_compare_and_set(store):
    """A job's record (issue 48): replaced only while it holds what the writer last saw."""
    store.create_task(make_task("t1"))
    assert store.replace_state("t1", "dr/switchover", b"one", None) is True
    assert store.replace_state("t1", "dr/switchover", b"again", None) is False  # it exists
    assert store.replace_state("t1", "dr/switchover", b"\x00two", b"one") is True
    assert store.replace_state("t1", "dr/switchover", b"stale", b"one") is False  # changed since
    assert store.get_state("t1", "dr/switchover") == b"\x00two"
    # a value written unconditionally (an earlier release's record) is replaced like any other
    old = b'{"state": "draining",  "job_id": "x"}'
    store.put_state("t1", "dr/failover", old)
    assert store.replace_state("t1", "dr/failover", b"{}", old + b" ") is False
    assert store.replace_state("t1", "dr/failover", b"{}", old) is True
    assert store.list_state("t1", "dr/") == {"dr/switchover": b"\x00two", "dr/failover": b"{}"}
    with pytest.raises(TaskNotFoundError):
        store.replace_state("gone", "dr/switchover", b"x", None)
    with pytest.raises(TaskNotFoundError):
        store.replace_state("gone", "dr/switchover", b"x", b"one")
    assert store.get_state("gone", "dr/switchover") is None


def test_racing_state_replacers_one_wins(store_opener, root_path):
    stores = [store_opener(root_path) for _ in range(4)]
    stores[0].create_task(make_task("t1"))
    stores[0].put_state("t1", "dr/failback", b"0")
    results = [
        s.replace_state("t1", "dr/failback", b"%d" % (i + 1), b"0") for i, s in enumerate(stores)
    ]
    assert results.count(True) == 1, results
    assert stores[1].get_state("t1", "dr/failback") == b"%d" % (results.index(True) + 1)


def test_root_paths_keep_daemons_apart(store_opener, root_path):
    one = store_opener(root_path + "-one")
    two = store_opener(root_path + "-two")
    one.create_task(make_task("shared-id"))
    two.create_task(make_task("shared-id", marker="two"))
    one.save_position("shared-id", pos(5), None)
    assert [t.task_id for t in one.list_tasks()] == ["shared-id"]
    assert two.get_task("shared-id").spec.get("marker") == "two"
    assert two.get_positions("shared-id") == {}
    assert two.delete_task("shared-id") is True
    assert one.get_task("shared-id") is not None


def test_data_survives_reopening(store_opener, root_path):
    first = store_opener(root_path)
    first.create_task(make_task("t1"))
    first.save_position("t1", pos(42), None)
    first.close()
    again = store_opener(root_path)
    assert again.get_task("t1").task_id == "t1"
    assert again.get_positions("t1") == {"by-dev-rootcoord-dml_0": pos(42)}
    again.ping()


def test_unreachable_servers_raise_retriable_errors(tmp_path):
    from harness.services import free_port

    from metastore.etcd import EtcdMetaStore
    from metastore.etcd_connect import connect_etcd
    from metastore.sql import SqlMetaStore

    closed = free_port()
    with pytest.raises(MetaStoreUnavailableError) as etcd_error:
        EtcdMetaStore(connect_etcd([f"http://127.0.0.1:{closed}"], timeout=1), "cdc")
    assert etcd_error.value.retriable
    with pytest.raises(MetaStoreUnavailableError) as mysql_error:
        SqlMetaStore(f"mysql+pymysql://root:secret-pw@127.0.0.1:{closed}/x", "cdc")
    assert mysql_error.value.retriable
    assert "secret-pw" not in str(mysql_error.value)


def test_daemons_starting_together_on_a_new_mysql_database_all_open_it(mariadb_service):
    """A fleet started at once on an empty database: every daemon makes the tables it finds
    missing; one that loses the race to another finds them made (seen in CI: "Table
    'cdc_task_state' already exists" stopped a daemon of three started side by side)."""
    import subprocess
    import sys
    import uuid

    import pymysql
    from harness.daemon import REPO_ROOT

    service = mariadb_service
    admin = pymysql.connect(
        host=service.host, port=service.port, user=service.user, password=service.password
    )
    base = service.sqlalchemy_url.rsplit("/", 1)[0]
    opener = (
        "import sys, time; from metastore.sql import SqlMetaStore; "
        "time.sleep(max(0, float(sys.argv[2]) - time.time())); "
        "SqlMetaStore(sys.argv[1], 'cdc').close()"
    )
    try:
        for _ in range(3):  # three new databases, eight daemons at once on each
            database = f"race_{uuid.uuid4().hex[:8]}"
            with admin.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE `{database}`")
            at = str(time.time() + 2.0)  # all start at this moment, imports done
            processes = [
                subprocess.Popen(
                    [sys.executable, "-c", opener, f"{base}/{database}", at],
                    env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(8)
            ]
            errors = [p.communicate(timeout=60)[1] for p in processes]
            assert [p.returncode for p in processes] == [0] * 8, errors
    finally:
        admin.close()
