"""Tokens, roles, the listening address and HTTPS, against a running daemon (real etcd, the
Kafka mock and Milvus Lite behind it)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys

import pytest
from harness.browser import chromium
from harness.daemon import REPO_ROOT
from harness.task_bodies import create_body
from harness.tls import make_test_ca

pytestmark = pytest.mark.integration

ADMIN = "admin-token-0123456789-never-logged"
VIEWER = "viewer-token-0123456789-never-logged"
TOKENS = [
    {"name": "ops", "role": "admin", "token": ADMIN},
    {"name": "watcher", "role": "viewer", "token": VIEWER},
]


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory(auth={"tokens": TOKENS}).start()


def cdc(daemon, request_type, data=None, token=None):
    """POST /cdc with ``token`` (None: no Authorization header)."""
    payload = {"request_type": request_type, **({"request_data": data} if data else {})}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return daemon.request("POST", "/cdc", payload, headers=headers, auth=False)


def raw_request(port: int, head: bytes, host: str = "127.0.0.1") -> int:
    """Send request bytes as they are (no client library checks them); the status answered."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_no_token_wrong_token_viewer_and_admin(daemon, milvus_lite_service):
    assert daemon.get("/livez")[0] == 200
    assert daemon.get("/readyz")[0] == 200
    assert daemon.get("/metrics")[0] == 200  # auth.protectMetrics is false by default

    status, headers, body = cdc(daemon, "list")
    assert status == 401 and headers["www-authenticate"] == 'Bearer realm="milvus-cdc"'
    assert body["code"] == 401 and body["data"] == {} and "Bearer" in body["message"]

    status, headers, body = cdc(daemon, "list", token="not-a-known-token-xxxx")
    assert (status, body["code"]) == (401, 401)
    assert headers["www-authenticate"] == 'Bearer realm="milvus-cdc", error="invalid_token"'

    status, _, body = cdc(daemon, "list", token=VIEWER)
    assert (status, body) == (200, {"code": 200, "message": "", "data": {"tasks": []}})

    task = create_body(milvus_lite_service, task_id="auth-1")
    status, _, body = cdc(daemon, "create", task, token=VIEWER)
    assert (status, body["code"]) == (403, 403)
    assert body["message"] == "token 'watcher' has the role viewer; create needs admin"
    assert cdc(daemon, "list", token=ADMIN)[2]["data"]["tasks"] == []  # nothing was stored

    status, _, body = cdc(daemon, "create", task, token=ADMIN)
    assert (status, body["data"]) == (200, {"task_id": "auth-1"}), body
    assert cdc(daemon, "get", {"task_id": "auth-1"}, token=VIEWER)[0] == 200
    assert cdc(daemon, "position", {"task_id": "auth-1"}, token=VIEWER)[0] == 200
    for request_type in ("pause", "resume", "delete"):
        status, _, body = cdc(daemon, request_type, {"task_id": "auth-1"}, token=VIEWER)
        assert status == 403 and f"{request_type} needs admin" in body["message"]
    assert cdc(daemon, "pause", {"task_id": "auth-1"}, token=ADMIN)[0] == 200

    # the /v1 resources: GET for a viewer, every change for an admin
    def v1(method, path, token, body=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return daemon.request(method, path, body, headers=headers, auth=False)

    status, headers, problem = v1("GET", "/v1/tasks", None)
    assert status == 401 and headers["content-type"].startswith("application/problem+json")
    assert headers["www-authenticate"].startswith("Bearer") and problem["status"] == 401
    assert v1("GET", "/v1/tasks", VIEWER)[0] == 200
    assert v1("GET", "/v1/tasks/auth-1/positions", VIEWER)[0] == 200
    assert v1("POST", "/v1/tasks/auth-1/resume", VIEWER)[0] == 403
    assert v1("DELETE", "/v1/tasks/auth-1", VIEWER)[0] == 403
    assert v1("POST", "/v1/tasks", VIEWER, create_body(milvus_lite_service))[0] == 403
    assert v1("POST", "/v1/tasks/auth-1/resume", ADMIN)[0] == 200
    assert v1("DELETE", "/v1/tasks/auth-1", ADMIN)[0] == 204

    # the dashboard's static page is open (it holds no data); its calls are not
    assert daemon.get("/")[0] == 200
    daemon.stop()
    log = daemon.log_text()
    assert ADMIN not in log and VIEWER not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert any(m.startswith("create by ops (admin) from 127.0.0.1: 200") for m in messages)
    assert any(m.startswith("create by watcher (viewer) from 127.0.0.1: 403") for m in messages)
    assert any(m.startswith("delete by ops (admin) from 127.0.0.1: 204") for m in messages)
    assert any(m.startswith("list by unidentified caller from 127.0.0.1: 401") for m in messages)


def test_fuzzed_authorization_headers_never_fail_the_daemon(daemon):
    valid = ADMIN.encode()
    headers = [
        b"Bearer",
        b"Bearer ",
        b"Bearer      ",
        b"bearer " + b"x" * 4000,
        b"Basic dXNlcjpwYXNz",
        b"Token " + valid,
        b"Bearer " + valid + b" trailing",
        b"Bearer \xc3\xa9\xe2\x9c\x93\xf0\x9f\x94\x91",  # UTF-8 bytes
        b"Bearer \xff\xfe\x00garbage",
        b"\x00\x01\x02",
        b"Bearer " + b"\xe2\x9c\x93" * 2000,
        b"Bearer " + b"A" * 20000,  # larger than aiohttp's header limit
        b"Bearer\t" + valid,
        b"=?utf-8?b?QmVhcmVy?=",
    ]
    statuses = set()
    for value in headers:
        for target in (b"POST /cdc", b"GET /v1/tasks", b"GET /v1/tasks/x/positions"):
            body = b'{"request_type": "list"}'
            head = (
                target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + value
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
            )  # fmt: skip
            status = raw_request(daemon.port, head)
            assert status in (400, 401, 431), (value[:40], target, status)
            statuses.add(status)
    assert 401 in statuses
    # two Authorization headers: refused, not merged into something valid
    twice = (
        b"GET /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + valid
        + b"\r\nAuthorization: Bearer nope\r\nConnection: close\r\n\r\n"
    )  # fmt: skip
    assert raw_request(daemon.port, twice) in (400, 401)
    # the lowercase scheme (RFC 7235: case-insensitive) with the right token passes
    status, _, _ = daemon.request(
        "GET", "/v1/tasks", headers={"Authorization": f"bearer {ADMIN}"}, auth=False
    )
    assert status == 200
    assert daemon.get("/readyz")[0] == 200
    daemon.stop()
    assert "Traceback" not in daemon.log_text() and "internal error" not in daemon.log_text()


def test_protected_metrics(daemon_factory):
    daemon = daemon_factory(auth={"tokens": TOKENS, "protectMetrics": True}).start()
    assert daemon.get("/metrics")[0] == 401
    assert daemon.get("/readyz")[0] == 200
    daemon.token = VIEWER
    assert daemon.get("/metrics")[0] == 200


def test_anonymous_allowed_next_to_tokens(daemon_factory, milvus_lite_service):
    daemon = daemon_factory(auth={"tokens": TOKENS, "allowAnonymous": True}).start()
    # allowAnonymous: a client that sends no token (the Go tool's) acts as an admin ...
    status, _, body = cdc(daemon, "create", create_body(milvus_lite_service, task_id="anon-1"))
    assert (status, body["data"]) == (200, {"task_id": "anon-1"}), body
    # ... but a wrong token is still refused, and a viewer's token still only reads
    assert cdc(daemon, "delete", {"task_id": "anon-1"}, token="wrong-token-0123456789")[0] == 401
    assert cdc(daemon, "delete", {"task_id": "anon-1"}, token=VIEWER)[0] == 403
    assert cdc(daemon, "delete", {"task_id": "anon-1"})[0] == 200
    daemon.stop()
    log = daemon.log_text()
    assert "requests without a token are served as an admin" in log
    assert "create by anonymous (admin) from 127.0.0.1: 200" in log


def outside_address() -> str | None:
    """An address of this host that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else str(address)


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return False
    return True


def test_without_tokens_the_daemon_listens_on_loopback_only(daemon_factory):
    outside = outside_address()
    closed = daemon_factory("closed", auth={})
    closed.host = "0.0.0.0"
    closed.start()
    assert cdc(closed, "list")[0] == 200  # open, but only here
    if outside is not None:
        assert not reachable(outside, closed.port)
    closed.stop()
    assert (
        "no auth.tokens configured: the API is unauthenticated, so it listens on 127.0.0.1 "
        "only (address asks for 0.0.0.0)"
    ) in closed.log_text()

    exposed = daemon_factory("exposed", auth={"allowAnonymous": True})
    exposed.host = "0.0.0.0"
    exposed.start()
    if outside is not None:
        assert reachable(outside, exposed.port)
        assert (
            raw_request(exposed.port, b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n\r\n", outside) == 200
        )
    exposed.stop()
    assert "the API is unauthenticated on 0.0.0.0" in exposed.log_text()


def cli(*args, env=None):
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    environ.update(PYTHONPATH=str(REPO_ROOT), no_proxy="127.0.0.1,localhost", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True, text=True, env=environ, timeout=60, check=False,
    )  # fmt: skip


def test_https_with_a_test_ca_and_the_cli(daemon_factory, tmp_path):
    ca = make_test_ca(tmp_path / "ca")
    daemon = daemon_factory(
        auth={"tokens": TOKENS},
        tls={"certFile": str(ca.cert_file), "keyFile": str(ca.key_file)},
    )
    daemon.client_tls = ssl.create_default_context(cafile=str(ca.ca_file))
    daemon.token = VIEWER
    daemon.start()
    status, _, body = daemon.request("GET", "/v1/tasks")
    assert (status, body) == (200, {"tasks": []})

    # a client that does not trust the CA refuses the daemon's certificate
    untrusting = http.client.HTTPSConnection(
        "127.0.0.1", daemon.port, timeout=10, context=ssl.create_default_context()
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusting.request("GET", "/readyz")
    untrusting.close()
    # plain HTTP on the HTTPS port gets no answer
    plain = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    plain.request("GET", "/readyz")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.getresponse()
    plain.close()

    # the CLI: https from the configuration, --cacert or $CDC_CACERT, --token or $CDC_TOKEN
    config = ["--config", str(daemon.config_path)]
    trusted = cli("task", "list", *config, "--json", "--cacert", str(ca.ca_file), "--token", VIEWER)
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout) == {"tasks": []}
    from_env = cli(
        "task", "list", *config, "--json", env={"CDC_TOKEN": VIEWER, "CDC_CACERT": str(ca.ca_file)}
    )
    assert from_env.returncode == 0, from_env.stderr
    no_token = cli("task", "list", *config, "--cacert", str(ca.ca_file))
    assert no_token.returncode == 1
    assert no_token.stderr.startswith("milvus-cdc: 401 Unauthorized: this daemon needs a token")
    viewer_pause = cli(
        "task", "pause", "t", *config, env={"CDC_TOKEN": VIEWER, "CDC_CACERT": str(ca.ca_file)}
    )
    assert viewer_pause.returncode == 1 and "403 Forbidden" in viewer_pause.stderr
    untrusted = cli("task", "list", *config, "--token", VIEWER)
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    daemon.stop()
    assert VIEWER not in daemon.log_text()


def test_bad_tls_files_stop_the_start_naming_the_keys(daemon_factory, tmp_path):
    daemon = daemon_factory(
        tls={"certFile": str(tmp_path / "missing.pem"), "keyFile": str(tmp_path / "k.pem")}
    )
    daemon.config_path.write_text(
        json.dumps({**daemon.config, "address": f"127.0.0.1:{daemon.port}"})
    )
    done = cli("serve", "--config", str(daemon.config_path))
    assert done.returncode == 1
    assert "tls.certFile" in done.stderr and "cannot load the certificate" in done.stderr


async def test_dashboard_asks_for_a_token_and_sends_it(daemon, milvus_lite_service, tmp_path):
    daemon.token = ADMIN
    body = create_body(milvus_lite_service, task_id="dash-auth")
    assert daemon.request("POST", "/v1/tasks", body)[0] == 201
    async with chromium(tmp_path / "chromium") as browser:
        page = await browser.new_page()
        await page.goto(daemon.url + "/")
        await page.wait_for("!document.getElementById('login').hidden")
        assert await page.evaluate(
            "getComputedStyle(document.getElementById('login')).display !== 'none'"
        )
        assert await page.evaluate("document.querySelectorAll('#tasks tr.task').length") == 0

        async def sign_in(token: str) -> None:
            await page.evaluate(
                f"document.getElementById('token').value = {json.dumps(token)};"
                "document.getElementById('login').requestSubmit()"
            )

        await sign_in("a-wrong-token-0123456789")
        await page.wait_for("document.getElementById('message').textContent.includes('refused')")
        await sign_in(VIEWER)
        await page.wait_for("document.querySelectorAll('#tasks tr.task').length === 1")
        shown = "getComputedStyle(document.getElementById('{}')).display !== 'none'"
        assert await page.evaluate(shown.format("login")) is False
        assert await page.evaluate(shown.format("signout")) is True
        # a viewer's pause is refused and says why. The table is drawn again every 2 s: a
        # click whose target moved meanwhile (seen once in the suite under load) is made again
        refused = "document.getElementById('message').textContent.includes('needs admin')"
        for attempt in range(3):
            await page.click('#tasks tr[data-task-id="dash-auth"] button[data-action="pause"]')
            try:
                await page.wait_for(refused, within=5)
                break
            except TimeoutError:
                if attempt == 2:
                    raise
        assert daemon.request("GET", "/v1/tasks/dash-auth")[2]["task"]["state"] == "Running"

        await page.click("#signout")
        await page.wait_for("!document.getElementById('login').hidden")
        await sign_in(ADMIN)
        await page.wait_for("document.querySelectorAll('#tasks tr.task').length === 1")
        await page.click('#tasks tr[data-task-id="dash-auth"] button[data-action="pause"]')
        await page.wait_for(
            "document.querySelector('#tasks tr[data-task-id=\"dash-auth\"]').dataset.state"
            " === 'Paused'"
        )
        assert await page.evaluate("sessionStorage.getItem('milvus-cdc-token')") == ADMIN
        assert browser.exceptions == []
    assert daemon.request("GET", "/v1/tasks/dash-auth")[2]["task"]["state"] == "Paused"
