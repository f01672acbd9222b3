"""The store format (metastore/format.py) on every backend on a real server (SQLite file,
MariaDB, etcd): recorded with compare-and-set, migrated forward once whoever starts first, a
newer format refused touching nothing, a failed step leaving the old format readable."""

from __future__ import annotations

import threading
import time

import pytest

from metastore import StoreFormat, StoreFormatError, TaskRecord, TaskState
from metastore.format import MIGRATIONS, STORE_FORMAT, Migration, check_readable, migrate_store

pytestmark = pytest.mark.integration


@pytest.fixture
def store(store_opener, root_path):
    return store_opener(root_path)


def a_task(task_id: str) -> TaskRecord:
    now = time.time()
    spec = {"milvus_connect_param": {"host": "h", "port": 1}, "collection_infos": [{"name": "c"}]}
    return TaskRecord(task_id, TaskState.PAUSED, "kept", spec, now, now)


def snapshot(store) -> tuple:
    """What an old release reads of a store: its tasks, positions and state."""
    tasks = store.list_tasks()
    return (
        [(t.task_id, t.state, t.reason, dict(t.spec), t.revision) for t in tasks],
        {t.task_id: store.get_positions(t.task_id) for t in tasks},
        {t.task_id: store.list_state(t.task_id) for t in tasks},
    )


def test_the_format_record_is_compare_and_set(store):
    assert store.store_format() is None  # a store of a release before formats were recorded
    assert store.set_store_format(None, StoreFormat(2, "0.4.0"))
    assert store.store_format() == StoreFormat(2, "0.4.0")
    # a second "first" record, or a raise from a version that is not the recorded one, loses
    assert not store.set_store_format(None, StoreFormat(2, "0.4.1"))
    assert not store.set_store_format(1, StoreFormat(3, "0.5.0"))
    assert store.store_format() == StoreFormat(2, "0.4.0")
    assert store.set_store_format(2, StoreFormat(3, "0.5.0"))
    assert store.store_format() == StoreFormat(3, "0.5.0")


def test_root_paths_keep_their_own_format(store_opener, root_path):
    one, other = store_opener(root_path), store_opener(root_path + "-other")
    assert one.set_store_format(None, StoreFormat(2, "0.4.0"))
    assert other.store_format() is None


def test_an_unrecorded_store_is_migrated_to_this_format_and_reads_as_before(store):
    store.create_task(a_task("t1"))
    store.put_state("t1", "k", b"v")
    before = snapshot(store)
    found = migrate_store(store, "0.4.0")
    assert found == StoreFormat(STORE_FORMAT, "0.4.0") == store.store_format()
    assert snapshot(store) == before  # format 1 -> 2 changes no record: old releases read it
    # once migrated, starting again changes nothing
    assert migrate_store(store, "0.4.1") == StoreFormat(STORE_FORMAT, "0.4.0")


def test_a_newer_format_is_refused_by_name_touching_nothing(store):
    store.create_task(a_task("t1"))
    assert store.set_store_format(None, StoreFormat(STORE_FORMAT + 1, "9.1.0"))
    before = snapshot(store)
    with pytest.raises(StoreFormatError) as refused:
        migrate_store(store, "0.4.0")
    assert str(refused.value) == (
        f"the metastore (rootPath {store.root_path}) holds data in format {STORE_FORMAT + 1}, "
        f"written by release 9.1.0; release 0.4.0 reads formats 1 to {STORE_FORMAT} only. Run "
        "a release that reads it (nothing was changed)"
    )
    with pytest.raises(StoreFormatError):
        check_readable(store, "0.4.0")
    assert snapshot(store) == before
    assert store.store_format() == StoreFormat(STORE_FORMAT + 1, "9.1.0")


def test_a_step_that_fails_half_way_leaves_the_old_format_readable(store):
    store.create_task(a_task("t1"))
    written = []

    def half_done(s) -> None:
        s.put_state("t1", "new-format-record", b"1")  # what the new format adds ...
        written.append(True)
        raise OSError("the store went away")  # ... then the step fails

    steps = {**MIGRATIONS, STORE_FORMAT: Migration(STORE_FORMAT + 1, "a test step", half_done)}
    with pytest.raises(StoreFormatError) as failed:
        migrate_store(store, "0.5.0", latest=STORE_FORMAT + 1, migrations=steps)
    assert written and "still in format" in str(failed.value)
    # the old format is recorded still: this release (and the one before) read it as before
    assert store.store_format() == StoreFormat(STORE_FORMAT, "0.5.0")
    assert check_readable(store, "0.4.0") == STORE_FORMAT
    assert [t.task_id for t in store.list_tasks()] == ["t1"]
    # run again (the step is idempotent), it completes
    steps[STORE_FORMAT] = Migration(STORE_FORMAT + 1, "a test step", lambda s: None)
    migrate_store(store, "0.5.0", latest=STORE_FORMAT + 1, migrations=steps)
    assert store.store_format() == StoreFormat(STORE_FORMAT + 1, "0.5.0")


def test_two_daemons_starting_together_raise_the_format_once(store_opener, root_path):
    stores = [store_opener(root_path) for _ in range(2)]
    raised: list[StoreFormat] = []
    both_in_step = threading.Barrier(2, timeout=10)
    recorded = []

    class Recording:
        """The store as one daemon sees it, noting each format it raises."""

        def __init__(self, inner) -> None:
            self.inner = inner
            self.root_path = inner.root_path

        def store_format(self):
            return self.inner.store_format()

        def set_store_format(self, expected, new):
            won = self.inner.set_store_format(expected, new)
            if won:
                recorded.append(new)
            return won

    def step(_store) -> None:
        both_in_step.wait()  # both daemons are in the step before either raises the version

    steps = {1: Migration(2, "a step both daemons run", step)}
    errors: list[BaseException] = []

    def start(s) -> None:
        try:
            raised.append(migrate_store(Recording(s), "0.4.0", migrations=steps))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(recorded) == 1  # one raise of the version, whoever got there first
    assert raised == [StoreFormat(2, "0.4.0")] * 2
