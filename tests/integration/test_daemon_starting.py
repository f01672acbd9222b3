"""A daemon binds its port before anything else starts, and answers 503 "starting" until its
start is done (issue 48: a slow recover round at start left the port free, another process
took it, and the start failed "cannot listen on"). The real daemon process, its start's recover
round held (``FAULT_ENV``)."""

from __future__ import annotations

import json
import socket

import pytest
from harness.services import wait_until

from server.dr.flows import FAULT_ENV

pytestmark = pytest.mark.integration


def test_a_daemon_holds_its_port_and_answers_503_while_its_start_recover_round_runs(
    daemon_factory, tmp_path
):
    go = tmp_path / "go"
    daemon = daemon_factory()
    daemon.env[FAULT_ENV] = f"hold:start_recover:120:{go}"
    daemon.launch()
    try:
        wait_until(
            lambda: "held at start_recover" in daemon.log_text(),
            60,
            "the start's recover round held",
            process=daemon.process,
            log_paths=[daemon.log_path],
        )
        # bound: no other process takes the port meanwhile
        with pytest.raises(OSError, match="in use"):
            socket.create_server(("127.0.0.1", daemon.port)).close()
        reply = daemon.call("list")
        assert (reply.status, reply.code) == (503, 503), reply
        assert reply.message.startswith("the daemon is starting"), reply.message
        status, body = daemon.get("/readyz")
        assert (status, json.loads(body)["status"]) == (503, "starting")
        assert daemon.get("/livez")[0] == 200  # the process answers
        status, body = daemon.get("/v1/tasks")
        assert status == 503 and "starting" in json.loads(body)["detail"]
    finally:
        go.touch()
    daemon.wait_ready(60)
    reply = daemon.call("list")
    assert (reply.status, reply.code) == (200, 200), reply
    assert daemon.get("/v1/tasks")[0] == 200
