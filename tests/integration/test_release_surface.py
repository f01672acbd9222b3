"""The release as an operator sees it, from the installed daemon: ``milvus-cdc --version``,
``/livez``, the fleet's members naming theirs, an unversioned store migrated at start, and a
store of a newer format refused at start, named, untouched."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import time

import pytest
from harness.installed import daemon_command

from metastore import StoreFormat, TaskRecord, TaskState
from metastore.format import STORE_FORMAT
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.release import RELEASE

pytestmark = pytest.mark.integration


def test_the_release_is_written_once_and_named_by_the_command():
    assert importlib.metadata.version("milvus-cdc-py") == RELEASE
    command, env = daemon_command()
    done = subprocess.run(
        [*command, "--version"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"milvus-cdc {RELEASE} (metastore format {STORE_FORMAT})"


def test_livez_and_the_fleet_name_the_release_and_the_store_is_migrated(daemon_factory):
    daemon = daemon_factory()
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    now = time.time()
    spec = {"milvus_connect_param": {"host": "h", "port": 1}, "collection_infos": [{"name": "c"}]}
    # a store as releases 0.1 - 0.3 left it: a task, and no format recorded
    store.create_task(TaskRecord("old", TaskState.PAUSED, "paused by 0.3", spec, now, now))
    assert store.store_format() is None
    daemon.start()
    status, body = daemon.get("/livez")
    assert status == 200
    assert json.loads(body) == {"status": "ok", "release": RELEASE, "store_format": STORE_FORMAT}
    assert store.store_format() == StoreFormat(STORE_FORMAT, RELEASE)
    task = daemon.call("get", {"task_id": "old"}).data["task"]
    assert (task["state"], task["reason"]) == ("Paused", "paused by 0.3")
    status, fleet = daemon.get("/v1/fleet")
    assert status == 200
    assert [(m["release"], m["store_format"]) for m in json.loads(fleet)["members"]] == [
        (RELEASE, STORE_FORMAT)
    ]


def test_a_store_of_a_newer_format_stops_the_daemon_at_start_touching_nothing(daemon_factory):
    daemon = daemon_factory()
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    now = time.time()
    spec = {"milvus_connect_param": {"host": "h", "port": 1}, "collection_infos": [{"name": "c"}]}
    store.create_task(TaskRecord("new", TaskState.RUNNING, "", spec, now, now))
    newer = StoreFormat(STORE_FORMAT + 1, "9.1.0")
    assert store.set_store_format(None, newer)
    before = store.get_task("new")
    daemon.launch()
    assert daemon.process is not None
    code = daemon.process.wait(timeout=60)
    assert code != 0
    expected = (
        f"cannot start: the metastore (rootPath cdc) holds data in format {STORE_FORMAT + 1}, "
        f"written by release 9.1.0; release {RELEASE} reads formats 1 to {STORE_FORMAT} only. "
        "Run a release that reads it (nothing was changed)"
    )
    assert expected in daemon.log_text()
    assert store.store_format() == newer
    assert store.get_task("new") == before
    assert store.members() == [] and store.leases() == {}


def test_a_task_this_release_cannot_read_is_left_alone_and_named(daemon_factory):
    """A task a newer release created (a target kind this one does not know) in a shared
    store: listed as stored, no lease taken, not Failed, named by /readyz; every other task
    is served as before."""
    daemon = daemon_factory()
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    now = time.time()
    future = {
        "elasticsearch_connect_param": {"url": "https://es:9200", "password": "es-pw-123"},
        "collection_infos": [{"name": "c"}],
    }
    store.create_task(TaskRecord("future", TaskState.RUNNING, "", future, now, now))
    store.create_task(
        TaskRecord(
            "paused",
            TaskState.PAUSED,
            "kept",
            {"milvus_connect_param": {"host": "h", "port": 1}, "collection_infos": [{"name": "d"}]},
            now,
            now,
        )
    )
    daemon.start()
    reason = (
        f"its spec names no target release {RELEASE} knows (elasticsearch_connect_param): it "
        "writes to milvus_connect_param or kafka_connect_param"
    )
    status, body = daemon.get("/readyz")
    assert status == 200
    assert json.loads(body)["tasks_left_alone"] == {"future": reason}
    tasks = {t["task_id"]: t for t in daemon.call("list").data["tasks"]}
    assert (tasks["future"]["state"], tasks["future"]["owner"]) == ("Running", None)
    assert tasks["future"]["elasticsearch_connect_param"] == {"url": "https://es:9200"}
    assert (tasks["paused"]["state"], tasks["paused"]["reason"]) == ("Paused", "kept")
    assert store.leases() == {}
    assert store.get_task("future").state is TaskState.RUNNING
    assert "es-pw-123" not in daemon.log_text() + json.dumps(tasks)
