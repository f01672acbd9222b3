"""The /v1 REST resources and /openapi.json against a running daemon with a Milvus Lite target."""

from __future__ import annotations

import pytest
from harness.services import free_port
from harness.task_bodies import create_body

from metastore import Position
from metastore.format import STORE_FORMAT
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.release import RELEASE
from server.http.openapi import openapi_document

pytestmark = pytest.mark.integration

PASSWORD = "Rest-Pa55-never-shown"
PROBLEM = "application/problem+json"


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory().start()


def assert_problem(answer, status, *fragments):
    code, headers, body = answer
    assert code == status, body
    assert headers["content-type"].startswith(PROBLEM)
    assert body["status"] == status and body["title"] and body["type"] == "about:blank"
    for fragment in fragments:
        assert fragment in body["detail"]


def test_task_resource_lifecycle(daemon, milvus_lite_service):
    status, headers, body = daemon.request(
        "POST", "/v1/tasks", create_body(milvus_lite_service, task_id="rest-1")
    )
    assert status == 201, body
    assert headers["location"] == "/v1/tasks/rest-1"
    task = body["task"]
    assert (task["task_id"], task["state"]) == ("rest-1", "Running")
    assert task["backfill"] is None and "rows_per_second" in task

    status, _, body = daemon.request("GET", "/v1/tasks")
    assert status == 200 and [t["task_id"] for t in body["tasks"]] == ["rest-1"]
    # the same supervisor as POST /cdc: both protocols see the same task
    via_cdc = daemon.call("get", {"task_id": "rest-1"}).data["task"]
    status, _, body = daemon.request("GET", "/v1/tasks/rest-1")
    assert status == 200
    assert {k: body["task"][k] for k in via_cdc if k != "progress"} == {
        k: v for k, v in via_cdc.items() if k != "progress"
    }

    status, _, body = daemon.request("POST", "/v1/tasks/rest-1/pause")
    assert status == 200 and body["task"]["state"] == "Paused"
    assert_problem(daemon.request("POST", "/v1/tasks/rest-1/pause"), 409, "already Paused")
    status, _, body = daemon.request("POST", "/v1/tasks/rest-1/resume")
    assert status == 200 and body["task"]["state"] == "Running"
    assert_problem(daemon.request("POST", "/v1/tasks/rest-1/resume"), 409, "already Running")
    # every state change, with its reason and the daemon that made it
    status, _, body = daemon.request("GET", "/v1/tasks/rest-1/history")
    assert status == 200
    changes = [(s["kind"], s["from"], s["to"], s["reason"]) for s in body["states"]]
    assert changes == [
        ("state", None, "Initial", "starting"),
        ("state", "Initial", "Running", ""),
        ("state", "Running", "Paused", "manually paused through the http interface"),
        ("state", "Paused", "Running", ""),
    ]
    assert len({s["by"] for s in body["states"]}) == 1 and body["states"][0]["by"]
    owner = daemon.request("GET", "/v1/tasks/rest-1")[2]["task"]["owner"]
    assert owner == body["states"][0]["by"]
    # a daemon alone is a fleet of one, running the task
    status, _, fleet = daemon.request("GET", "/v1/fleet")
    assert status == 200 and fleet["member_id"] == owner and fleet["renewed"] is True
    assert fleet["members"] == [
        {
            "member_id": owner,
            "address": f"127.0.0.1:{daemon.port}",
            "release": RELEASE,
            "store_format": STORE_FORMAT,
            "tasks": 1,
            "self": True,
        }
    ]

    status, headers, body = daemon.request("DELETE", "/v1/tasks/rest-1")
    assert (status, body) == (204, None)
    assert_problem(daemon.request("GET", "/v1/tasks/rest-1"), 404, "rest-1")
    assert_problem(daemon.request("DELETE", "/v1/tasks/rest-1"), 404, "rest-1")
    assert_problem(daemon.request("POST", "/v1/tasks/rest-1/pause"), 404)
    assert daemon.request("GET", "/v1/tasks")[2] == {"tasks": []}


def test_positions_resource(daemon, milvus_lite_service):
    daemon.request("POST", "/v1/tasks", create_body(milvus_lite_service, task_id="pos-1"))
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    ts = (1_700_000_000_000 << 18) + 3
    store.save_position("pos-1", Position("kafka", "by-dev-rootcoord-dml_1", b"\x07", ts), None)
    store.close()
    status, _, body = daemon.request("GET", "/v1/tasks/pos-1/positions")
    assert status == 200
    assert body["task_id"] == "pos-1"
    # the daemon's own channels have their starts from create; the one written here is shown
    shown = [p for p in body["positions"] if p["channel_name"] == "by-dev-rootcoord-dml_1"]
    assert shown == [
        {
            "channel_name": "by-dev-rootcoord-dml_1",
            "backend": "kafka",
            "msg_id": "Bw==",
            "tt": ts,
            "time": 1_700_000_000_000,
        }
    ]
    # the same answer as POST /cdc position
    assert daemon.call("position", {"task_id": "pos-1"}).data["positions"] == body["positions"]
    assert_problem(daemon.request("GET", "/v1/tasks/nope/positions"), 404, "nope")


def test_errors_are_problems_with_the_usual_statuses(daemon_factory, milvus_lite_service):
    daemon = daemon_factory(maxRequestBytes=2048).start()
    lite = milvus_lite_service
    assert_problem(daemon.request("POST", "/v1/tasks", b"{not json"), 400, "not valid JSON")
    assert_problem(daemon.request("POST", "/v1/tasks", [1, 2]), 400, "must be a JSON object")
    assert_problem(
        daemon.request("POST", "/v1/tasks", {"collection_infos": [{"name": "*"}]}),
        400,
        "milvus_connect_param",
    )
    wrong_type = create_body(lite)
    wrong_type["milvus_connect_param"]["port"] = "19530"
    assert_problem(daemon.request("POST", "/v1/tasks", wrong_type), 400, "body.milvus_connect")
    assert_problem(daemon.request("POST", "/v1/tasks", create_body(lite, task_id="x" * 3000)), 413)
    assert_problem(daemon.request("PUT", "/v1/tasks"), 405)
    assert_problem(daemon.request("GET", "/v1/tasks/a/pause"), 405)
    assert_problem(daemon.request("GET", "/v1/nothing"), 404)
    first = daemon.request("POST", "/v1/tasks", create_body(lite, task_id="dup"))
    assert first[0] == 201
    assert_problem(
        daemon.request("POST", "/v1/tasks", create_body(lite, task_id="dup")), 409, "exists"
    )
    # the request metrics count the REST verbs with their statuses
    metrics = daemon.get("/metrics")[1].decode()
    assert 'cdc_requests_total{code="201",request_type="create"} 1.0' in metrics
    assert 'cdc_requests_total{code="409",request_type="create"} 1.0' in metrics


def test_secrets_are_never_answered(daemon, milvus_lite_service):
    body = create_body(milvus_lite_service, task_id="secret-1")
    body["milvus_connect_param"].update(username="root", password=PASSWORD)
    answers = [daemon.request("POST", "/v1/tasks", body)]
    assert answers[0][0] == 201, answers[0]
    answers += [
        daemon.request("GET", "/v1/tasks"),
        daemon.request("GET", "/v1/tasks/secret-1"),
        daemon.request("POST", "/v1/tasks/secret-1/pause"),
    ]
    unreachable = create_body(milvus_lite_service, task_id="secret-2")
    unreachable["milvus_connect_param"].update(
        port=free_port(), username="root", password=PASSWORD, connect_timeout=1
    )
    answers.append(daemon.request("POST", "/v1/tasks", unreachable))
    assert answers[-1][0] == 400
    for answer in answers:
        assert PASSWORD not in repr(answer[2])
    shown = answers[2][2]["task"]["milvus_connect_param"]
    assert shown["username"] == "root" and "password" not in shown


def test_openapi_document_is_served(daemon):
    status, headers, body = daemon.request("GET", "/openapi.json")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert body == openapi_document()


def test_cross_site_browser_requests_cannot_change_tasks(daemon, milvus_lite_service):
    """A page of another site could post a form to pause (no preflight for a form): refused."""
    daemon.request("POST", "/v1/tasks", create_body(milvus_lite_service, task_id="csrf-1"))
    evil = {"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"}
    for method, path in [
        ("POST", "/v1/tasks/csrf-1/pause"),
        ("DELETE", "/v1/tasks/csrf-1"),
        ("POST", "/v1/tasks"),
    ]:
        assert_problem(daemon.request(method, path, headers=evil), 403, "cross-site")
    assert_problem(
        daemon.request("POST", "/v1/tasks/csrf-1/pause", headers={"Origin": "null"}), 403
    )
    assert daemon.request("GET", "/v1/tasks/csrf-1", headers=evil)[0] == 200  # reading is fine
    assert daemon.request("GET", "/v1/tasks/csrf-1")[2]["task"]["state"] == "Running"
    # the daemon's own page (same origin) and clients without Origin may
    same = {"Origin": f"http://127.0.0.1:{daemon.port}"}
    assert daemon.request("POST", "/v1/tasks/csrf-1/pause", headers=same)[0] == 200
    assert daemon.request("POST", "/v1/tasks/csrf-1/resume")[0] == 200
