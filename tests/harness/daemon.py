"""Run the real daemon (``python -m server serve``) as a subprocess and talk to it over HTTP."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.installed import daemon_command
from harness.services import (
    ServiceStartError,
    die_with_parent,
    free_port,
    stop_process,
    wait_until,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    raw: bytes

    @property
    def code(self) -> int:
        return int(self.body["code"])

    @property
    def data(self) -> dict[str, Any]:
        return self.body.get("data") or {}

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


@dataclass
class Daemon:
    """One daemon configuration; ``start``/``stop`` may be called repeatedly (restarts)."""

    workdir: Path
    config: dict[str, Any]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # sent as "Authorization: Bearer <token>" by every request of this object
    token: str | None = None
    # set: the daemon serves HTTPS and requests verify it with this context
    client_tls: ssl.SSLContext | None = None
    # the host of the configured address (requests always go to 127.0.0.1)
    host: str = "127.0.0.1"
    # set in the process's environment over the test's own (fault injection, for one)
    env: dict[str, str] = field(default_factory=dict)
    # set: the command that starts this daemon instead of the installed one (another release's
    # ``python -m server``, its checkout named by ``env["PYTHONPATH"]``)
    command: list[str] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "daemon.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "cdc.yaml"

    def start(self, timeout: float = 30) -> Daemon:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Daemon:
        """Start the process without waiting for it: several daemons start side by side."""
        assert self.process is None or self.process.poll() is not None, "already running"
        config = {**self.config, "address": f"{self.host}:{self.port}", "logFormat": "json"}
        self.config_path.write_text(yaml.safe_dump(config))
        command, installed = daemon_command()
        if self.command is not None:
            command = self.command
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.upper().startswith("CDC_") and k != "PYTHONPATH"
        }
        env.update(installed)
        env["no_proxy"] = "127.0.0.1,localhost"
        env.update(self.env)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                die_with_parent([*command, "serve", "--config", str(self.config_path)]),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.starts += 1
        return self

    def wait_ready(self, timeout: float = 30) -> Daemon:
        assert self.process is not None, "not launched"
        wait_until(
            lambda: self.get("/readyz")[0] == 200,
            timeout,
            "milvus-cdc daemon",
            process=self.process,
            log_paths=[self.log_path],
        )
        return self

    def stop(self, grace: float = 15) -> int:
        """SIGTERM, wait for the drain; returns the exit code."""
        assert self.process is not None
        stop_process(self.process, grace=grace)
        return int(self.process.returncode)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        if self.client_tls is not None:
            return http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=timeout, context=self.client_tls
            )
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        conn = self._conn(timeout)
        try:
            conn.request("GET", path, headers=self._auth())
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def send(
        self, body: bytes, method: str = "POST", path: str = "/cdc", timeout: float = 60
    ) -> Reply:
        conn = self._conn(timeout)
        try:
            conn.request(
                method,
                path,
                body=body,
                headers={"Content-Type": "application/json", **self._auth()},
            )
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return Reply(response.status, json.loads(raw), raw)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 60,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> tuple[int, dict[str, str], Any]:
        """Any HTTP request; a JSON ``body`` is sent as JSON; ``auth=False`` sends no token.
        Returns (status, headers, the answer parsed as JSON, or None when it is empty)."""
        conn = self._conn(timeout)
        try:
            payload = body if isinstance(body, bytes) or body is None else json.dumps(body)
            sent = {"Content-Type": "application/json", **(self._auth() if auth else {})}
            sent.update(headers or {})
            conn.request(method, path, body=payload, headers=sent)
            response = conn.getresponse()
            raw = response.read()
            headers = {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()
        return response.status, headers, json.loads(raw) if raw else None

    @property
    def cli_args(self) -> list[str]:
        """``milvus-cdc task`` arguments that reach this daemon."""
        return ["--url", self.url, *(["--token", self.token] if self.token else [])]

    @property
    def url(self) -> str:
        return f"{'https' if self.client_tls else 'http'}://127.0.0.1:{self.port}"

    def call(self, request_type: str, data: dict[str, Any] | None = None) -> Reply:
        payload: dict[str, Any] = {"request_type": request_type}
        if data is not None:
            payload["request_data"] = data
        return self.send(json.dumps(payload).encode())

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


__all__ = ["Daemon", "Reply", "ServiceStartError"]
