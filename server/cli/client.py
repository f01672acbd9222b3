"""The HTTP client of a running daemon's /v1 resources, and the error the commands report.

The daemon is found at ``--url``, else ``$CDC_URL``, else the ``address`` of the configuration
(a wildcard host means this host; ``https`` when the configuration has ``tls.certFile``).
``--cacert`` (or ``$CDC_CACERT``) names a PEM file of the CA that signed the daemon's
certificate.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from replicator.config.settings import CdcSettings


class CliError(Exception):
    """A failure to report on stderr (exit status 1)."""


def daemon_url(settings: CdcSettings, given: str | None) -> str:
    """The daemon's base URL: ``given``, else ``$CDC_URL``, else the configured ``address``."""
    url = given or os.environ.get("CDC_URL")
    if url:
        return url.rstrip("/")
    host, port = settings.host_port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if settings.tls.enabled else 'http'}://{host}:{port}"


def client_tls(cacert: str | None) -> ssl.SSLContext | None:
    """Verification of an https daemon: the CA of ``--cacert``/``$CDC_CACERT``, else the
    system's trust store."""
    path = cacert or os.environ.get("CDC_CACERT")
    if not path:
        return None
    try:
        return ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"--cacert {path}: cannot load the CA certificate: {exc}") from None


class DaemonClient:
    """JSON requests to a daemon; a refusal or an unreachable daemon raises :class:`CliError`."""

    def __init__(
        self,
        url: str,
        timeout: float,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self._token = token
        self._tls = tls

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(  # noqa: S310 - the operator's daemon URL
            self.url + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=self.timeout, context=self._tls
            ) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise CliError(_problem_text(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(f"cannot reach the daemon at {self.url}: {reason}") from None
        return json.loads(raw) if raw else None

    def task(self, task_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/tasks/{quote_task_id(task_id)}")["task"])


def quote_task_id(task_id: str) -> str:
    """The task id as one path segment of a URL."""
    return urllib.parse.quote(task_id, safe="")


def _problem_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        detail = body.get("detail") or body.get("message") or ""
    except ValueError:
        detail = ""
    return f"{exc.code} {exc.reason}: {detail}" if detail else f"{exc.code} {exc.reason}"


def secret_from_env(variable: str) -> str:
    """The value of an environment variable that holds a password or token; unset is an error."""
    value = os.environ.get(variable)
    if not value:
        raise CliError(f"environment variable {variable} is not set")
    return value
