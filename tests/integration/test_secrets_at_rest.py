"""Secrets at rest on every metastore (SQLite file, MariaDB, etcd): what is stored, older clear
rows, rotation (the ``milvus-cdc secrets rotate`` command included), and a daemon without the
key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.daemon import REPO_ROOT
from harness.services import free_port, wait_until
from harness.task_bodies import create_body

from metastore import TaskRecord, TaskState
from metastore.keyring import KeyRing, is_sealed
from metastore.sealed import (
    KeysMissingError,
    MissingKeys,
    SealedMetaStore,
    key_ids_in_use,
    secrets_problem,
)
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url

pytestmark = pytest.mark.integration

PASSWORD = "Target-Pa55-never-stored-in-clear"
TOKEN = "target-token-never-stored-in-clear"
WAL_SECRET = "sasl-Pa55-of-a-wal-switch"
WAL_KEY = "wal/by-dev-rootcoord-dml_0/1"


def keys(*ids: str) -> KeyRing:
    return KeyRing(tuple((key_id, os.urandom(32)) for key_id in ids))


def task(task_id: str) -> TaskRecord:
    now = time.time()
    return TaskRecord(
        task_id=task_id,
        state=TaskState.RUNNING,
        reason="",
        spec={
            "milvus_connect_param": {"host": "h", "port": 1, "password": PASSWORD, "token": TOKEN},
            "collection_infos": [{"name": "*"}],
        },
        created_at=now,
        updated_at=now,
    )


def wal_record() -> bytes:
    return json.dumps({"kind": "kafka", "config": {"sasl.password": WAL_SECRET}}).encode()


def raw_text(store: SealedMetaStore, task_id: str) -> str:
    """What the backend holds for the task, as it serialised it."""
    raw = store.inner.get_task(task_id)
    assert raw is not None
    state = store.inner.list_state(task_id)
    return json.dumps(raw.spec) + raw.reason + repr(state)


def test_stored_values_hold_no_secret_and_reads_open_them(store_opener, root_path, tmp_path):
    ring = keys("k1")
    store = SealedMetaStore(store_opener(root_path), lambda: ring)
    created = store.create_task(task("t1"))
    assert created.spec["milvus_connect_param"]["password"] == PASSWORD
    store.put_state("t1", WAL_KEY, wal_record())
    store.put_state("t1", "warnings", b'["not a secret"]')

    stored = raw_text(store, "t1")
    for secret in (PASSWORD, TOKEN, WAL_SECRET):
        assert secret not in stored
    assert '"$sealed": "aes-256-gcm"' in stored and "not a secret" in stored
    for path in tmp_path.glob("meta.sqlite3*"):  # the SQLite backend: the files themselves
        assert PASSWORD.encode() not in path.read_bytes()
        assert WAL_SECRET.encode() not in path.read_bytes()

    (listed,) = store.list_tasks()
    assert listed.spec == task("t1").spec == store.get_task("t1").spec
    assert store.get_state("t1", WAL_KEY) == wal_record()
    assert store.list_state("t1", "wal/") == {WAL_KEY: wal_record()}
    assert secrets_problem(store, listed) is None
    paused = store.update_task(
        "t1", state=TaskState.PAUSED, reason="", expected_revision=listed.revision
    )
    assert paused.spec == task("t1").spec and PASSWORD not in raw_text(store, "t1")


def test_clear_rows_of_older_versions_load_and_are_sealed(store_opener, root_path):
    ring = keys("k1")
    plain = store_opener(root_path)
    plain.create_task(task("old"))  # as a version without encryption stored it
    plain.put_state("old", WAL_KEY, wal_record())
    store = SealedMetaStore(plain, lambda: ring)
    assert store.get_task("old").spec == task("old").spec
    assert store.get_state("old", WAL_KEY) == wal_record()

    report = store.reseal()
    assert (report.sealed, report.tasks, report.unreadable) == (3, {"old"}, [])
    assert PASSWORD not in raw_text(store, "old") and WAL_SECRET not in raw_text(store, "old")
    assert store.get_task("old").spec == task("old").spec
    assert store.get_state("old", WAL_KEY) == wal_record()
    assert store.reseal().sealed == 0  # nothing left to do


def test_rotation_and_a_daemon_without_the_key(store_opener, root_path):
    old, new = keys("old"), keys("new")
    backend = store_opener(root_path)
    SealedMetaStore(backend, lambda: old).create_task(task("t1"))
    SealedMetaStore(backend, lambda: old).put_state("t1", WAL_KEY, wal_record())

    # during the rotation the ring holds both; afterwards the old key can go
    rotating = SealedMetaStore(backend, lambda: KeyRing((*new.keys, *old.keys)))
    assert rotating.reseal().sealed == 3
    raw = backend.get_task("t1")
    assert {raw.spec["milvus_connect_param"][k]["kid"] for k in ("password", "token")} == {"new"}
    after = SealedMetaStore(backend, lambda: new)
    assert after.get_task("t1").spec == task("t1").spec
    assert after.get_state("t1", WAL_KEY) == wal_record()

    # a daemon with only the old key still lists the task, and says why it cannot start it
    stale = SealedMetaStore(backend, lambda: old)
    (listed,) = stale.list_tasks()
    assert is_sealed(listed.spec["milvus_connect_param"]["password"])
    problem = secrets_problem(stale, listed)
    assert problem is not None
    assert "encrypted with key 'new', which is not in this daemon's key ring" in problem
    assert PASSWORD not in problem


def test_a_sealed_value_moved_to_another_task_does_not_open(store_opener, root_path):
    ring = keys("k1")
    store = SealedMetaStore(store_opener(root_path), lambda: ring)
    store.create_task(task("a"))
    other = store.create_task(
        TaskRecord("b", TaskState.PAUSED, "", {"milvus_connect_param": {"host": "h"}}, 1.0, 1.0)
    )
    stolen = store.inner.get_task("a").spec["milvus_connect_param"]["password"]
    store.inner.replace_spec(
        "b",
        {"milvus_connect_param": {"host": "h", "password": stolen}},
        expected_revision=other.revision,
    )
    problem = secrets_problem(store, store.get_task("b"))
    assert problem is not None and "does not decrypt with key 'k1'" in problem


# --- the record of the key ids in use --------------------------------------------------------
def test_the_store_records_the_ids_of_the_keys_in_use_never_the_keys(
    store_opener, root_path, tmp_path
):
    ring = keys("k1")
    store = SealedMetaStore(store_opener(root_path), lambda: ring)
    plain = TaskRecord("plain", TaskState.PAUSED, "", {"milvus_connect_param": {"host": "h"}}, 1, 1)
    store.create_task(plain)
    assert store.secret_key_ids() == {}  # no secret stored, no key in use
    store.create_task(task("t1"))
    assert set(store.secret_key_ids()) == {"k1"}
    store.put_state("t1", WAL_KEY, wal_record())
    assert set(store.secret_key_ids()) == {"k1"}
    assert store.missing_keys() is None
    for path in tmp_path.glob("meta.sqlite3*"):  # the SQLite backend: the files themselves
        assert ring.encoded_keys()[0].encode() not in path.read_bytes()
    assert set(store_opener(root_path + "-other").secret_key_ids()) == set()  # per root path


def test_rotation_forgets_the_ids_no_secret_uses(store_opener, root_path):
    old, new = keys("old"), keys("new")
    backend = store_opener(root_path)
    SealedMetaStore(backend, lambda: old).create_task(task("t1"))
    SealedMetaStore(backend, lambda: old).put_state("t1", WAL_KEY, wal_record())
    assert set(backend.secret_key_ids()) == {"old"}
    report = SealedMetaStore(backend, lambda: KeyRing((*new.keys, *old.keys))).reseal()
    assert (report.sealed, report.forgotten, report.skipped) == (3, ["old"], "")
    assert set(backend.secret_key_ids()) == {"new"}
    assert SealedMetaStore(backend, lambda: new).missing_keys() is None
    assert backend.delete_task("t1")
    assert SealedMetaStore(backend, lambda: new).reseal().forgotten == ["new"]
    assert backend.secret_key_ids() == {}


def test_a_ring_that_lacks_a_recorded_key_seals_and_changes_nothing(store_opener, root_path):
    fleet = keys("fleet")
    backend = store_opener(root_path)
    SealedMetaStore(backend, lambda: fleet).create_task(task("t1"))
    backend.create_task(task("clear"))  # a row from before encryption
    stored = {t.task_id: t for t in backend.list_tasks()}

    for ring, held in ((keys("other"), ("other",)), (KeyRing(()), ())):
        wrong = SealedMetaStore(backend, lambda ring=ring: ring)
        assert wrong.missing_keys() == MissingKeys(("fleet",), held)
        with pytest.raises(KeysMissingError) as refused:
            wrong.create_task(task("t2"))
        assert "encrypted with key(s) fleet, which this daemon's key ring lacks" in str(
            refused.value
        )
        assert fleet.encoded_keys()[0] not in str(refused.value)
        with pytest.raises(KeysMissingError):
            wrong.put_state("clear", WAL_KEY, wal_record())
        report = wrong.reseal()
        assert report.sealed == 0 and "key(s) fleet" in report.skipped
        assert {t.task_id: t for t in backend.list_tasks()} == stored  # not even the clear row
        assert set(backend.secret_key_ids()) == {"fleet"}
        # a task with no secret is stored as it is: nothing to seal
        wrong.create_task(TaskRecord("plain", TaskState.PAUSED, "", {}, 1.0, 1.0))
        assert backend.delete_task("plain")
    assert str(MissingKeys(("fleet",), ())).endswith("(it holds no key)")


def test_a_store_from_before_the_record_gets_one(store_opener, root_path):
    fleet = keys("fleet")
    backend = store_opener(root_path)
    SealedMetaStore(backend, lambda: fleet).create_task(task("t1"))
    SealedMetaStore(backend, lambda: fleet).put_state("t1", WAL_KEY, wal_record())
    for key_id, version in backend.secret_key_ids().items():  # as an older version left it
        assert backend.forget_secret_key_id(key_id, version)
    assert key_ids_in_use(backend) == {"fleet"}
    assert set(backend.secret_key_ids()) == {"fleet"}

    for key_id, version in backend.secret_key_ids().items():
        backend.forget_secret_key_id(key_id, version)
    report = SealedMetaStore(backend, lambda: keys("other")).reseal()  # a daemon that joins
    assert report.sealed == 0 and "key(s) fleet" in report.skipped
    assert set(backend.secret_key_ids()) == {"fleet"}


# --- the command ---------------------------------------------------------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    environ["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True, text=True, env=environ, cwd=cwd, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture(params=["sqlite", "mysql", "etcd"])
def store_config(request, tmp_path, root_path):
    if request.param == "sqlite":
        config = {"storeType": "sqlite", "sqlitePath": str(tmp_path / "meta.db")}
    elif request.param == "mysql":
        dsn = request.getfixturevalue("mariadb_service").go_dsn
        config = {"storeType": "mysql", "mysqlSourceUrl": dsn}
    else:
        endpoint = request.getfixturevalue("etcd_service").endpoint
        config = {"storeType": "etcd", "etcd": {"address": [endpoint]}}
    return {**config, "rootPath": root_path}


def test_secrets_rotate_command(store_config, tmp_path):
    from replicator.config.secret_keys import key_source, open_task_store
    from replicator.config.settings import load_settings

    key_file = tmp_path / "cdc-secret.key"
    config_path = tmp_path / "cdc.yaml"
    config_path.write_text(
        yaml.safe_dump({"metaStoreConfig": store_config, "secrets": {"keyFile": str(key_file)}})
    )
    settings = load_settings(config_path, {})
    first = key_source(settings.secrets, create=True)()
    store = open_task_store(settings)
    store.create_task(task("t1"))
    store.put_state("t1", WAL_KEY, wal_record())
    store.inner.create_task(task("clear"))  # a row from before encryption
    store.close()

    done = cli("secrets", "rotate", "--config", str(config_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "5 secret(s) of 2 task(s) encrypted" in done.stdout
    assert f"old keys removed from {key_file}: {first.primary}" in done.stdout
    rotated = KeyRing.parse(key_file.read_text(), "f")
    assert rotated.ids != first.ids and len(rotated.ids) == 1
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"

    store = open_task_store(settings)  # the file now holds only the new key
    try:
        for task_id in ("t1", "clear"):
            assert store.get_task(task_id).spec == task(task_id).spec
            raw = store.inner.get_task(task_id).spec["milvus_connect_param"]
            assert raw["password"]["kid"] == rotated.primary
        assert store.get_state("t1", WAL_KEY) == wal_record()
    finally:
        store.close()
    kept = cli("secrets", "rotate", "--keep-old", "--config", str(config_path), cwd=tmp_path)
    assert kept.returncode == 0 and "old keys kept" in kept.stdout
    assert len(KeyRing.parse(key_file.read_text(), "f").ids) == 2
    for output in (done.stdout, done.stderr, kept.stdout, kept.stderr):
        assert PASSWORD not in output and key_file.read_text().splitlines()[1] not in output


def test_a_daemon_makes_no_key_of_its_own_when_the_store_holds_secrets(store_config, tmp_path):
    from replicator.config.secret_keys import open_task_store
    from replicator.config.settings import load_settings

    def configured(key_file: Path) -> tuple[Any, Path]:
        config_path = tmp_path / f"{key_file.stem}.yaml"
        config_path.write_text(
            yaml.safe_dump({"metaStoreConfig": store_config, "secrets": {"keyFile": str(key_file)}})
        )
        return load_settings(config_path, {}), config_path

    first = tmp_path / "first.key"
    store = open_task_store(configured(first)[0], create_key=True)
    try:  # a store without secrets: the daemon makes its key, as on its first start
        (fleet_key,) = KeyRing.parse(first.read_text(), "f").ids
        assert store.missing_keys() is None
        store.create_task(task("t1"))
    finally:
        store.close()

    lost = tmp_path / "lost.key"
    store = open_task_store(configured(lost)[0], create_key=True)
    try:  # it holds secrets sealed with a key: none is made, and the ring lacks that key
        assert not lost.exists()
        assert store.missing_keys() == MissingKeys((fleet_key,), ())
        assert store.reseal().skipped
    finally:
        store.close()

    other = tmp_path / "other.key"
    other.write_text(keys("other").text())
    settings, config_path = configured(other)
    store = open_task_store(settings, create_key=True)
    try:
        assert store.missing_keys() == MissingKeys((fleet_key,), ("other",))
    finally:
        store.close()
    before = other.read_text()
    refused = cli("secrets", "rotate", "--config", str(config_path), cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout
    assert f"encrypted with key(s) {fleet_key}" in refused.stderr
    assert "nothing rotated" in refused.stderr and other.read_text() == before
    assert before.splitlines()[1] not in refused.stderr + refused.stdout


def test_rotate_refuses_a_key_from_the_environment(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    environ.update(PYTHONPATH=str(REPO_ROOT), CDC_SECRETS__KEY=KeyRing.parse(
        keys("e1").text(), "t").text().splitlines()[1])  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "server", "secrets", "rotate"],
        capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "secrets.key (CDC_SECRETS__KEY)" in done.stderr


# --- the daemon ----------------------------------------------------------------------------------
def test_a_daemon_without_the_key_changes_nothing_says_why_and_recovers_with_it(
    daemon_factory, milvus_lite_service
):
    daemon = daemon_factory(scheduler={"retry": {"enabled": False}}).start()
    key_file = daemon.workdir / "data" / "cdc-secret.key"
    assert "did not exist: made it with a new key" in daemon.log_text()
    body = create_body(milvus_lite_service, task_id="sealed-1")
    body["milvus_connect_param"].update(username="root", password=PASSWORD)
    assert daemon.call("create", body).code == 200
    daemon.stop()
    meta = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    assert PASSWORD not in json.dumps(meta.get_task("sealed-1").spec)
    before = meta.get_task("sealed-1")
    meta.close()
    for path in daemon.workdir.glob("meta.db*"):
        assert PASSWORD.encode() not in path.read_bytes()

    original = key_file.read_text()
    (lost,) = KeyRing.parse(original, "f").ids
    key_file.write_text(keys("other").text())  # the daemon's key is lost
    daemon.launch()
    wait_until(  # started (503 "starting" until then), not ready
        lambda: json.loads(daemon.get("/readyz")[1])["status"] == "not ready",
        30,
        "not ready without the key",
    )
    ready = json.loads(daemon.get("/readyz")[1])
    assert ready["missing_keys"] == [lost]
    assert f"encrypted with key(s) {lost}, which this daemon's key ring lacks" in ready["reason"]
    assert "(it holds other)" in ready["reason"]
    said = [line for line in daemon.log_text().splitlines() if "is not ready:" in line]
    assert len(said) == 1 and lost in said[0]
    time.sleep(1.5)  # a round or more: the task is neither taken nor failed
    view = daemon.call("get", {"task_id": "sealed-1"}).data["task"]
    assert (view["state"], view["reason"], view["owner"]) == ("Running", before.reason, None)
    assert "password" not in view["milvus_connect_param"]
    meta = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    try:
        assert meta.get_task("sealed-1").revision == before.revision  # not changed at all
    finally:
        meta.close()
    # asked to run it, it refuses and says why (pause first: a Running task is not resumed)
    assert daemon.call("pause", {"task_id": "sealed-1"}).code == 200
    refused = daemon.call("resume", {"task_id": "sealed-1"})
    assert refused.code == 409 and "not in this daemon's key ring" in refused.message

    key_file.write_text(original)  # the key comes back: read again without a restart
    wait_until(lambda: daemon.get("/readyz")[0] == 200, 30, "ready once the key is back")
    assert daemon.call("resume", {"task_id": "sealed-1"}).code == 200
    assert daemon.call("get", {"task_id": "sealed-1"}).data["task"]["state"] == "Running"
    listed = daemon.call("list").raw.decode()
    daemon.stop()
    assert PASSWORD not in listed and PASSWORD not in daemon.log_text()
    assert original.splitlines()[1] not in daemon.log_text()


def test_rotation_while_the_daemon_runs(daemon_factory, milvus_lite_service):
    daemon = daemon_factory().start()
    key_file = daemon.workdir / "data" / "cdc-secret.key"
    first = KeyRing.parse(key_file.read_text(), "f")
    for task_id, collection in (("rot-1", "a"), ("rot-2", "b")):
        body = create_body(milvus_lite_service, collections=(collection,), task_id=task_id)
        body["milvus_connect_param"].update(username="root", password=PASSWORD)
        if task_id == "rot-2":
            rotated = cli(
                "secrets", "rotate", "--config", str(daemon.config_path), cwd=daemon.workdir
            )
            assert rotated.returncode == 0, rotated.stderr
            assert "1 secret(s) of 1 task(s) encrypted" in rotated.stdout
        assert daemon.call("create", body).code == 200  # rot-2: sealed with the new key
    second = KeyRing.parse(key_file.read_text(), "f")
    assert second.ids != first.ids and len(second.ids) == 1
    # the running daemon read the new file: it opens rot-1 (re-encrypted) without a restart
    assert daemon.call("pause", {"task_id": "rot-1"}).code == 200
    assert daemon.call("resume", {"task_id": "rot-1"}).code == 200
    meta = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    try:
        kids = {t.spec["milvus_connect_param"]["password"]["kid"] for t in meta.list_tasks()}
    finally:
        meta.close()
    assert kids == {second.primary}
    daemon.stop()
    daemon.start()
    states = {t["task_id"]: t["state"] for t in daemon.call("list").data["tasks"]}
    assert states == {"rot-1": "Running", "rot-2": "Running"}
    daemon.stop()
    assert "read again: keys " in daemon.log_text()
    assert PASSWORD not in daemon.log_text()


def test_a_bad_key_file_stops_the_start_naming_the_key(tmp_path):
    key_file = tmp_path / "cdc-secret.key"
    key_file.write_text("k1:not-a-key\n")
    config_path = tmp_path / "cdc.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "address": f"127.0.0.1:{free_port()}",
                "metaStoreConfig": {"sqlitePath": str(tmp_path / "meta.db")},
                "secrets": {"keyFile": str(key_file)},
            }
        )
    )
    done = cli("serve", "--config", str(config_path), cwd=tmp_path)
    assert done.returncode == 2
    assert f"secrets.keyFile {key_file}: key 'k1' is not base64" in done.stderr
    assert "Traceback" not in done.stderr
