"""``resume`` with the target's new credentials, through both APIs, against Milvus Lite (which
takes any login: the refusals here are the daemon's own checks; a real Milvus refusing a wrong
password is tests/e2e/test_milvus_tls_target.py's): what it takes, what it refuses by name, a
Running task paused for them and running again, the secret in no answer; a Go client's resume
(task_id alone) as before."""

from __future__ import annotations

import pytest
from harness.task_bodies import create_body

pytestmark = pytest.mark.integration

TOKEN = "cdc:Resume-Token-never-shown"


def test_resume_takes_credentials_and_refuses_what_it_cannot_take(
    daemon_factory, milvus_lite_service
):
    daemon = daemon_factory().start()
    status, _, created = daemon.request("POST", "/v1/tasks", create_body(milvus_lite_service))
    assert status == 201, created
    task_id = created["task"]["task_id"]
    path = f"/v1/tasks/{task_id}/resume"

    refusals = {
        "uri": ({"uri": "http://elsewhere:19530"}, "body.milvus_connect_param.uri: unknown key"),
        "half a login": (
            {"username": "cdc"},
            "milvus_connect_param: give both username and password, or neither",
        ),
        "no such file": (
            {"dial_config": {"server_pem_path": "/no/ca.pem"}},
            "milvus_connect_param.dial_config.server_pem_path: no readable file at /no/ca.pem",
        ),
    }
    for case, (given, message) in refusals.items():
        status, _, answer = daemon.request("POST", path, {"milvus_connect_param": given})
        assert status == 400, (case, answer)
        assert answer["detail"] == message, (case, answer)
    # the task was not touched by them: still Running on its first spec
    assert daemon.call("get", {"task_id": task_id}).data["task"]["state"] == "Running"

    # Running: paused for the new token, then running again
    status, _, answer = daemon.request("POST", path, {"milvus_connect_param": {"token": TOKEN}})
    assert status == 200, answer
    assert answer["task"]["state"] == "Running"
    history = daemon.request("GET", f"/v1/tasks/{task_id}/history")[2]
    assert "pausing to take new credentials for the target" in str(history)

    # the Go tool's resume: task_id alone, on a paused task
    assert daemon.call("pause", {"task_id": task_id}).code == 200
    assert daemon.call("resume", {"task_id": task_id}).code == 200
    # ours through /cdc: credentials beside task_id
    reply = daemon.call("resume", {"task_id": task_id, "milvus_connect_param": {"token": TOKEN}})
    assert reply.code == 200, reply.body
    for text in (
        str(answer),
        daemon.call("get", {"task_id": task_id}).body,
        daemon.call("list").body,
    ):
        assert TOKEN not in str(text)
    daemon.stop()
    assert TOKEN not in daemon.log_text()
