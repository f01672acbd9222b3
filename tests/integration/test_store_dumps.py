"""The stores releases 0.1.0, 0.2.0 and 0.3.0 really wrote (tests/data/stores), opened by this
release on every backend (the SQLite file; MariaDB loaded with its rows; etcd loaded with the
etcd dump): migrated to this release's format, every task kept in its state with its spec,
positions and state records, its secrets opened with the key the release made."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.store_dumps import RELEASES, SQLITE_ROOT, Dump

from metastore import MetaStore, StoreFormat, TaskState
from metastore.etcd import EtcdMetaStore
from metastore.etcd_connect import connect_etcd
from metastore.format import STORE_FORMAT, check_readable, migrate_store
from metastore.keyring import is_sealed
from metastore.sealed import SealedMetaStore
from metastore.sql import SqlMetaStore
from metastore.sql_urls import mysql_url_from_source, sqlite_url
from replicator.config.release import RELEASE
from replicator.config.task_spec import TaskSpec
from replicator.sources.kafka import decode_offset

pytestmark = pytest.mark.integration


def open_dump(dump: Dump, backend: str, request: pytest.FixtureRequest, tmp: Path) -> MetaStore:
    """The dump in a store of ``backend``, as this release opens it."""
    if backend == "sqlite":
        return SqlMetaStore(sqlite_url(str(dump.copy_sqlite(tmp / "meta.db"))), SQLITE_ROOT)
    root = request.getfixturevalue("root_path")
    if backend == "mysql":
        url = mysql_url_from_source(request.getfixturevalue("mariadb_service").go_dsn)
        store = SqlMetaStore(url, root)  # makes the tables the rows go into
        dump.load_sql_rows(url, root)
        return store
    endpoint = request.getfixturevalue("etcd_service").endpoint
    client = connect_etcd([endpoint])
    dump.load_etcd(client, root)
    return EtcdMetaStore(client, root)


def records(store: MetaStore) -> tuple[object, ...]:
    """Every task with its spec as stored, its positions and its state records."""
    tasks = store.list_tasks()
    return (
        [(t.task_id, t.state, t.reason, dict(t.spec), t.revision) for t in tasks],
        {t.task_id: store.get_positions(t.task_id) for t in tasks},
        {t.task_id: store.list_state(t.task_id) for t in tasks},
    )


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "etcd"])
@pytest.mark.parametrize("release", RELEASES)
def test_a_store_of_an_earlier_release_is_migrated_with_every_task_kept(
    release: str, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    dump = Dump(release, "etcd" if backend == "etcd" else "sqlite")
    store = open_dump(dump, backend, request, tmp_path)
    try:
        assert store.store_format() is None  # releases before 0.4.0 recorded no format
        assert check_readable(store, RELEASE) == 1
        before = records(store)
        assert migrate_store(store, RELEASE) == StoreFormat(STORE_FORMAT, RELEASE)
        assert store.store_format() == StoreFormat(STORE_FORMAT, RELEASE)
        assert records(store) == before  # no record rewritten: the old release reads it still

        sealed = SealedMetaStore(store, dump.key_ring)
        assert sealed.missing_keys() is None
        assert sorted(t.task_id for t in sealed.list_tasks()) == sorted(
            t["task_id"] for t in dump.tasks.values()
        )
        for task in dump.tasks.values():
            found = sealed.get_task(task["task_id"])
            assert found is not None
            assert found.state == TaskState(task["state"])
            spec = TaskSpec.of(found)  # this release reads the spec the old one stored
            assert spec.selection == {("default", task["collection"])}
            assert spec.unrunnable_reason() == ""
            (field, secret), *_ = task["secret"].items()
            assert found.spec["milvus_connect_param"][field] == secret
            stored = store.get_task(task["task_id"])
            assert stored is not None
            # 0.1.0 kept secrets clear (this release seals them at its first start); later
            # releases sealed them with the key beside the dump
            assert is_sealed(stored.spec["milvus_connect_param"][field]) == (release != "0.1.0")
            positions = store.get_positions(task["task_id"])
            for channel in dump.channels:  # the positions the release saved, on every channel
                assert positions[channel].backend == "kafka"
                assert decode_offset(positions[channel].msg_id) > 0
                assert positions[channel].ts > 0
            schema = store.get_state(task["task_id"], f"collection/{task['collection_id']}")
            assert schema is not None and task["collection"].encode() in schema
    finally:
        store.close()
