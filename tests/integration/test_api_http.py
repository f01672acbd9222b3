"""POST /cdc over HTTP against a running daemon, with a real Milvus Lite as the target."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from harness.services import free_port
from harness.task_bodies import create_body, lite_param
from prometheus_client.parser import text_string_to_metric_families

from metastore import Position
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url

pytestmark = pytest.mark.integration

PASSWORD = "Pa55-w0rd-never-shown"
TOKEN = "tok-abcdef-never-shown"


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory().start()


def test_task_lifecycle(daemon, milvus_lite_service):
    created = daemon.call("create", create_body(milvus_lite_service))
    assert (created.status, created.code) == (200, 200), created.body
    task_id = created.data["task_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", task_id)

    got = daemon.call("get", {"task_id": task_id})
    assert got.code == 200
    assert got.data["task"] == got.data["Task"]
    task = got.data["task"]
    assert task["state"] == "Running"
    assert task["collection_infos"] == [{"name": "*", "use_start_position": False}]
    assert task["milvus_connect_param"]["port"] == milvus_lite_service.port
    assert task["milvus_connect_param"]["connect_timeout"] == 5

    paused = daemon.call("pause", {"task_id": task_id})
    assert paused.code == 200 and paused.data == {}
    task = daemon.call("get", {"task_id": task_id}).data["task"]
    assert task["state"] == "Paused"
    assert "manually paused" in task["reason"]
    again = daemon.call("pause", {"task_id": task_id})
    assert (again.status, again.code) == (409, 409)
    assert "already Paused" in again.message

    assert daemon.call("resume", {"task_id": task_id}).code == 200
    assert daemon.call("get", {"task_id": task_id}).data["task"]["state"] == "Running"
    assert daemon.call("resume", {"task_id": task_id}).code == 409

    listed = daemon.call("list")
    assert [t["task_id"] for t in listed.data["tasks"]] == [task_id]

    assert daemon.call("delete", {"task_id": task_id}).code == 200
    missing = daemon.call("get", {"task_id": task_id})
    assert (missing.status, missing.code) == (404, 404)
    assert task_id in missing.message
    assert daemon.call("delete", {"task_id": task_id}).code == 404
    ignored = daemon.call("delete", {"task_id": task_id, "ignore_not_found": True})
    assert ignored.code == 200
    assert daemon.call("list").data["tasks"] == []


def test_disable_auto_start_and_client_task_id(daemon, milvus_lite_service):
    body = create_body(milvus_lite_service, disable_auto_start=True, task_id="my-task_1")
    assert daemon.call("create", body).data == {"task_id": "my-task_1"}
    task = daemon.call("get", {"task_id": "my-task_1"}).data["task"]
    assert task["state"] == "Initial"
    duplicate = daemon.call("create", create_body(milvus_lite_service, task_id="my-task_1"))
    assert duplicate.code == 409
    bad_id = daemon.call("create", create_body(milvus_lite_service, task_id="../etc"))
    assert bad_id.code == 400 and "task_id" in bad_id.message
    assert daemon.call("resume", {"task_id": "my-task_1"}).code == 200
    assert daemon.call("get", {"task_id": "my-task_1"}).data["task"]["state"] == "Running"


def test_unreachable_target_is_refused_and_nothing_stored(daemon):
    closed = free_port()
    body = {
        "milvus_connect_param": {
            "host": "127.0.0.1",
            "port": closed,
            "username": "root",
            "password": PASSWORD,
            "connect_timeout": 2,
        },
        "collection_infos": [{"name": "*"}],
    }
    started = time.monotonic()
    reply = daemon.call("create", body)
    assert time.monotonic() - started < 15
    assert (reply.status, reply.code) == (400, 400)
    assert f"127.0.0.1:{closed}" in reply.message and "not reachable" in reply.message
    assert PASSWORD not in reply.raw.decode()
    assert daemon.call("list").data["tasks"] == []
    # the uri spelling too
    reply = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": f"http://127.0.0.1:{closed}", "connect_timeout": 1},
            "db_collections": {"*": [{"name": "*"}]},
        },
    )
    assert reply.code == 400 and "not reachable" in reply.message
    assert daemon.call("list").data["tasks"] == []


def test_overlapping_selection_on_one_target_is_refused(daemon, milvus_lite_service):
    lite = milvus_lite_service
    first = daemon.call("create", create_body(lite, collections=("orders", "users")))
    assert first.code == 200
    # same target spelled as a uri, overlapping collection
    overlap = daemon.call(
        "create",
        {
            "milvus_connect_param": {"uri": f"http://127.0.0.1:{lite.port}"},
            "db_collections": {"default": [{"name": "users"}]},
        },
    )
    assert overlap.code == 409
    assert first.data["task_id"] in overlap.message
    wildcard = daemon.call("create", create_body(lite, collections=("*",)))
    assert wildcard.code == 409
    other_db = daemon.call(
        "create",
        {"milvus_connect_param": lite_param(lite), "db_collections": {"sales": [{"name": "*"}]}},
    )
    assert other_db.code == 200, other_db.body
    other_collection = daemon.call("create", create_body(lite, collections=("items",)))
    assert other_collection.code == 200
    assert len(daemon.call("list").data["tasks"]) == 3


def test_limits_from_configuration(daemon_factory, milvus_lite_service):
    daemon = daemon_factory(maxTaskNum=2, maxNameLength=8).start()
    lite = milvus_lite_service
    too_long = daemon.call("create", create_body(lite, collections=("abcdefghi",)))
    assert too_long.code == 400 and "longer than 8" in too_long.message
    assert daemon.call("create", create_body(lite, collections=("a",))).code == 200
    assert daemon.call("create", create_body(lite, collections=("b",))).code == 200
    third = daemon.call("create", create_body(lite, collections=("c",)))
    assert third.code == 409 and "maxTaskNum" in third.message
    assert len(daemon.call("list").data["tasks"]) == 2


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "etcd"])
def test_restart_brings_tasks_back_in_their_states(
    backend, daemon_factory, milvus_lite_service, request, root_path
):
    config: dict = {"metaStoreConfig": {"storeType": backend, "rootPath": root_path}}
    if backend == "mysql":
        config["metaStoreConfig"]["mysqlSourceUrl"] = request.getfixturevalue(
            "mariadb_service"
        ).go_dsn
    elif backend == "etcd":
        endpoint = request.getfixturevalue("etcd_service").endpoint
        config["metaStoreConfig"]["etcd"] = {"address": [endpoint]}
    daemon = daemon_factory(**config) if backend != "sqlite" else daemon_factory()
    daemon.start()
    lite = milvus_lite_service
    ids = {}
    for name, extra in [("running", {}), ("paused", {}), ("initial", {"disable_auto_start": True})]:
        reply = daemon.call("create", create_body(lite, collections=(name,), **extra))
        assert reply.code == 200, reply.body
        ids[name] = reply.data["task_id"]
    assert daemon.call("pause", {"task_id": ids["paused"]}).code == 200
    before = {t["task_id"]: t for t in daemon.call("list").data["tasks"]}

    assert daemon.stop() == 0
    assert "SIGTERM received: draining" in daemon.log_text()
    daemon.start()
    after = {t["task_id"]: t for t in daemon.call("list").data["tasks"]}

    def stored(views):  # progress is the live runner's (counters restart with it, lag moves)
        return {tid: {k: v for k, v in t.items() if k != "progress"} for tid, t in views.items()}

    assert stored(after) == stored(before)
    states = {name: after[task_id]["state"] for name, task_id in ids.items()}
    assert states == {"running": "Running", "paused": "Paused", "initial": "Initial"}
    # and it keeps working after the restart
    assert daemon.call("resume", {"task_id": ids["paused"]}).code == 200
    assert daemon.call("delete", {"task_id": ids["initial"]}).code == 200


def test_secrets_never_in_responses_or_logs(daemon, milvus_lite_service):
    lite = milvus_lite_service
    with_password = create_body(lite, collections=("a",))
    with_password["milvus_connect_param"].update(username="root", password=PASSWORD)
    with_token = create_body(lite, collections=("b",))
    with_token["milvus_connect_param"]["token"] = TOKEN
    replies = [daemon.call("create", with_password), daemon.call("create", with_token)]
    assert [r.code for r in replies] == [200, 200], [r.body for r in replies]
    ids = [r.data["task_id"] for r in replies]
    replies += [daemon.call("get", {"task_id": i}) for i in ids]
    replies.append(daemon.call("list"))
    # error paths: a wrong type and an unreachable target, both carrying the secret
    bad = create_body(lite, collections=("c",))
    bad["milvus_connect_param"].update(username="root", password=PASSWORD, port=str(lite.port))
    replies.append(daemon.call("create", bad))
    unreachable = create_body(lite, collections=("d",))
    unreachable["milvus_connect_param"].update(
        port=free_port(), username="root", password=PASSWORD, connect_timeout=1
    )
    replies.append(daemon.call("create", unreachable))
    assert [r.code for r in replies[-2:]] == [400, 400]
    for reply in replies:
        text = reply.raw.decode()
        assert PASSWORD not in text and TOKEN not in text
    shown = daemon.call("get", {"task_id": ids[0]}).data["task"]["milvus_connect_param"]
    assert shown["username"] == "root"
    assert "password" not in shown and "token" not in shown
    daemon.stop()
    log = daemon.log_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    created_lines = [e for e in lines if e["msg"].startswith("task created")]
    assert {e.get("task_id") for e in created_lines} == set(ids)  # structured, with context
    assert PASSWORD not in log and TOKEN not in log


def test_position_request(daemon, milvus_lite_service):
    """Every channel's start is saved before create answers (an empty source: each from its
    beginning, an empty message id); a saved position is shown as the Go tool shows it."""
    task_id = daemon.call("create", create_body(milvus_lite_service)).data["task_id"]
    started = daemon.call("position", {"task_id": task_id}).data["positions"]
    dml = ["no-source-rootcoord-dml_0", "no-source-rootcoord-dml_1"]
    assert [p["channel_name"] for p in started] == sorted([*dml, "by-dev-replicate-msg"])
    assert {(p["msg_id"], p["tt"]) for p in started} == {("", 0)}
    daemon.call("pause", {"task_id": task_id})
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    ts = (1_700_000_000_000 << 18) + 7
    channel = "no-source-rootcoord-dml_1"
    saved = store.get_positions(task_id)[channel]
    store.save_position(task_id, Position("kafka", channel, b"\x2a", ts), saved)
    store.close()
    positions = daemon.call("position", {"task_id": task_id}).data["positions"]
    positions = [p for p in positions if p["channel_name"] == channel]
    assert positions == [
        {
            "channel_name": channel,
            "backend": "kafka",
            "msg_id": "Kg==",
            "tt": ts,
            "time": 1_700_000_000_000,
        }
    ]
    assert daemon.call("position", {"task_id": "nope"}).code == 404


def test_health_metrics_and_http_errors(daemon, milvus_lite_service):
    assert daemon.get("/livez")[0] == 200
    status, ready = daemon.get("/readyz")
    assert (status, json.loads(ready)["status"]) == (200, "ok")
    daemon.call("create", create_body(milvus_lite_service, disable_auto_start=True))
    daemon.call("get", {"task_id": "missing"})
    status, body = daemon.get("/metrics")
    text = body.decode()
    assert status == 200
    assert 'cdc_tasks{state="Initial"} 1.0' in text
    assert 'cdc_requests_total{code="404",request_type="get"} 1.0' in text
    assert 'cdc_request_duration_seconds_count{request_type="create"} 1.0' in text
    # the daemon's memory by kind (server/runtime/heap.py): its RSS as the kernel counts it
    heap = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("cdc_heap_")
    }
    statm = (Path("/proc") / str(daemon.process.pid) / "statm").read_text().split()
    assert (
        abs(heap["cdc_heap_resident_bytes"] - int(statm[1]) * os.sysconf("SC_PAGE_SIZE"))
        < 64 * 2**20
    ), heap
    assert heap["cdc_heap_malloc_in_use_bytes"] > 0 and heap["cdc_heap_python_blocks"] > 0
    assert "cdc_heap_trims_total" in heap and "cdc_heap_malloc_mapped_bytes" in heap, heap

    for method in ("GET", "PUT", "DELETE"):
        reply = daemon.send(b"", method=method)
        assert (reply.status, reply.code) == (405, 405) and "POST" in reply.message
    big = json.dumps({"request_type": "list", "request_data": {"x": "y" * 2_000_000}}).encode()
    reply = daemon.send(big)
    assert (reply.status, reply.code) == (413, 413) and "maxRequestBytes" in reply.message
    reply = daemon.send(b"{not json")
    assert (reply.status, reply.code) == (400, 400) and "not valid JSON" in reply.message
    unknown = daemon.call("frobnicate")
    assert unknown.code == 400 and "frobnicate" in unknown.message and "create" in unknown.message
    missing_path = daemon.send(b"{}", path="/nope")
    assert missing_path.status == 404 and missing_path.code == 404


def test_metastore_outage_answers_503_and_recovers(daemon_factory, tmp_path, milvus_lite_service):
    from harness import services

    data_dir = tmp_path / "etcd-outage"
    with services.etcd_server(data_dir) as etcd:
        ports = (etcd.port, services.free_port())
    with services.etcd_server(data_dir, ports=ports) as etcd:
        daemon = daemon_factory(
            metaStoreConfig={"storeType": "etcd", "etcd": {"address": [etcd.endpoint]}}
        ).start()
        created = daemon.call("create", create_body(milvus_lite_service))
        assert created.code == 200
    # etcd is down now
    status, body = daemon.get("/readyz")
    assert status == 503
    assert b"metastore" in body
    assert daemon.get("/livez")[0] == 200  # the process itself is fine
    reply = daemon.call("list")
    assert (reply.status, reply.code) == (503, 503)
    assert "metastore unavailable" in reply.message
    with services.etcd_server(data_dir, ports=ports):
        services.wait_until(lambda: daemon.get("/readyz")[0] == 200, 20, "readyz after outage")
        tasks = daemon.call("list").data["tasks"]
        assert [t["task_id"] for t in tasks] == [created.data["task_id"]]
    assert "Traceback" not in daemon.log_text()
