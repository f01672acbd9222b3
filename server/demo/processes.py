"""The demo's processes: the source Milvus, the target Milvus Lite and the daemon, on loopback.

Child processes with their logs and stops, free ports, waiting until a service answers, and the
daemon's ``POST /cdc`` calls.

How the source is wired (the daemon needs its etcd and its RocksMQ directory):

- Embedded etcd: Milvus starts it in-process with ``embed.ConfigFromFile(etcd.config.path)``
  (else etcd's built-in defaults: client port 2379, peer port 2380 on localhost). The wheel's
  ``{{ etcd_port }}`` placeholder only fills ``etcd.endpoints``, which the embedded mode does not
  listen on. So we write ``configs/embedEtcd.yaml`` with free client and peer ports, name it in
  ``ETCD_CONFIG_PATH`` (= ``etcd.config.path``), and point ``etcd.endpoints`` at the same client
  port. The daemon reads ``http://127.0.0.1:<that port>``.
- RocksMQ: the wheel's ``resolve_storage()`` sets ``rocksmq.path`` to ``<base>/data/rocksmq``;
  we also pass it as ``ROCKSMQ_PATH`` (Milvus prefers the environment to the yaml).

Pitfalls handled here: Milvus registers each component under the host's first unicast address
unless ``<component>.ip`` is set (we set 127.0.0.1); its graceful stop can take up to
``common.gracefulStopTimeout`` (1800 s by default; 5 s here, then SIGKILL after a grace); it
writes ``/tmp/milvus/server_id_<pid>`` outside its directory (removed after the stop); children
run in sessions of their own with a parent-death signal (``setpriv --pdeathsig``), so a killed
demo does not leave them behind.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from server.demo.local_milvus import (
    default_cache_root,
    healthz,
    install_bin,
    lists_collections,
    milvus_lite_command,
    wheel,
)
from server.demo.ports import free_ports, hold_port

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
ROOT_PATH = "by-dev"  # the source's etcd.rootPath and channel prefix (Milvus's defaults)
HISTORY_RANGE_ROWS = 1000  # backfill.rangeRows: three key ranges, three Spark tasks
GRACEFUL_STOP_TIMEOUT_S = 5  # the source's common.gracefulStopTimeout
COMPONENTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexNode", "dataCoord", "dataNode")
# Inherited environment variables Milvus would read as settings (lower-cased, "_" ignored).
MILVUS_ENV_PREFIXES = (
    "ETCD_",
    "METASTORE_",
    "TIKV_",
    "LOCALSTORAGE_",
    "MINIO_",
    "MQ_",
    "PULSAR_",
    "KAFKA_",
    "ROCKSMQ_",
    "NATSMQ_",
    "ROOTCOORD_",
    "PROXY_",
    "QUERYCOORD_",
    "QUERYNODE_",
    "INDEXCOORD_",
    "INDEXNODE_",
    "DATACOORD_",
    "DATANODE_",
    "COMMON_",
    "LOG_",
    "GRPC_",
    "TLS_",
    "QUOTAANDLIMITS_",
    "TRACE_",
    "MILVUS",
    "DEPLOY_MODE",
    "METRICS_PORT",
)


class DemoError(RuntimeError):
    """Something the user can fix (a busy port, a missing package) or a service that failed."""


def say(message: str) -> None:
    print(message, flush=True)


# ---------------------------------------------------------------------------------------------
# Processes


_SETPRIV = shutil.which("setpriv")


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    grace: float

    @property
    def pid(self) -> int:
        return self.process.pid


def start_child(
    name: str,
    argv: list[str],
    *,
    log_path: Path,
    env: dict[str, str],
    cwd: Path,
    grace: float,
) -> Child:
    """`argv` in a session of its own (terminal signals stay with us), output to `log_path`.
    setpriv makes the kernel SIGTERM it if we die without stopping it; it execs `argv` under the
    same PID. No preexec_fn: that forces a real fork(), which gRPC's threads do not survive."""
    command = [_SETPRIV, "--pdeathsig", "TERM", "--", *argv] if _SETPRIV else argv
    with open(log_path, "ab") as log:
        process = subprocess.Popen(  # noqa: S603  (our own argv)
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    return Child(name, process, log_path, grace)


def stop_child(child: Child) -> None:
    """SIGTERM, `grace` seconds, SIGKILL; through the Popen object, so never a reused PID."""
    process = child.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=child.grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=30)
    say(f"stopped {child.name} (pid {child.pid}, exit code {process.returncode})")


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return "(no log)"
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def wait_until(predicate: Callable[[], T], timeout: float, what: str, child: Child) -> T:
    """Call `predicate` until it returns something truthy; exceptions count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if child.process.poll() is not None:
            raise DemoError(
                f"{what}: {child.name} (pid {child.pid}) exited with code "
                f"{child.process.returncode}; last lines of {child.log_path}:\n"
                + log_tail(child.log_path)
            )
        try:
            result = predicate()
        except Exception as exc:  # noqa: BLE001  (a failed probe means "not yet")
            last = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            raise DemoError(
                f"{what}: not ready after {timeout:g} s (last error: {last!r}); last lines of "
                f"{child.log_path}:\n" + log_tail(child.log_path)
            )
        time.sleep(0.3)


def hold_daemon_port(port: int) -> socket.socket:
    """The daemon's port on loopback, held from the demo's start until the daemon is started
    (``close()`` then): the source and the target take a dozen ports meanwhile, none of them
    this one."""
    try:
        return hold_port(LOOPBACK, port)
    except OSError as exc:
        raise DemoError(
            f"port {port} on {LOOPBACK} is busy ({exc.strerror}): another milvus-cdc "
            "daemon or demo may be running; stop it or pass --port"
        ) from exc


def http_call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", errors="replace")


def cdc(port: int, request_type: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"request_type": request_type}
    if data is not None:
        body["request_data"] = data
    status, answer = http_call(port, "POST", "/cdc", body)
    if status != 200 or not isinstance(answer, dict):
        raise DemoError(f"POST /cdc {request_type} answered {status}: {answer}")
    result: dict[str, Any] = answer.get("data") or {}
    return result


# ---------------------------------------------------------------------------------------------
# The source: Milvus 2.3.5 from the `milvus` wheel, embedded etcd, RocksMQ


@dataclass
class Source:
    child: Child
    uri: str
    etcd_endpoint: str  # "http://127.0.0.1:PORT", the embedded etcd's client URL
    rocksmq_path: Path
    base_dir: Path


def start_source(base_dir: Path, timeout: float) -> Source:
    milvus = wheel()
    base_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = install_bin(
        base_dir,
        default_cache_root("milvus-cdc-demo"),
        lambda: say("unpacking the Milvus binary from the wheel (once)..."),
    )

    config = milvus.MilvusServerConfig(data_dir=str(base_dir))
    port_keys = sorted(k for k in config.configurable_items if k.endswith("_port"))
    *chosen, metrics_port, etcd_peer_port = free_ports(len(port_keys) + 2)
    ports = dict(zip(port_keys, chosen, strict=True))
    config.update(**ports)
    etcd_port = ports["etcd_port"]
    etcd_client_url = f"http://{LOOPBACK}:{etcd_port}"
    etcd_peer_url = f"http://{LOOPBACK}:{etcd_peer_port}"
    # Milvus's embedded etcd listens where this file says (etcd's defaults 2379/2380 without it)
    etcd_config = base_dir / "configs" / "embedEtcd.yaml"
    etcd_config.parent.mkdir(parents=True, exist_ok=True)
    etcd_config.write_text(
        yaml.safe_dump(
            {
                "name": "demo",
                "listen-client-urls": etcd_client_url,
                "advertise-client-urls": etcd_client_url,
                "listen-peer-urls": etcd_peer_url,
                "initial-advertise-peer-urls": etcd_peer_url,
                "initial-cluster": f"demo={etcd_peer_url}",
                "initial-cluster-state": "new",
            }
        )
    )
    settings = {
        "etcd.endpoints": f"{LOOPBACK}:{etcd_port}",
        "etcd.use.embed": "true",
        "etcd.rootPath": ROOT_PATH,
        "mq.type": "rocksmq",
        "common.chanNamePrefix.cluster": ROOT_PATH,
        "common.gracefulStopTimeout": str(GRACEFUL_STOP_TIMEOUT_S),
    }
    settings.update({f"{component}.ip": LOOPBACK for component in COMPONENTS})
    for key, value in settings.items():
        config.set(key, value)
    try:
        config.resolve()  # binds each port once to check it, then writes configs/milvus.yaml
    except RuntimeError as exc:
        raise DemoError(f"cannot configure the source Milvus: {exc}") from exc
    rocksmq_path = base_dir / "data" / "rocksmq"  # resolve_storage()'s rocksmq.path

    env = {
        k: v
        for k, v in os.environ.items()
        if not any(k.upper().startswith(p) for p in MILVUS_ENV_PREFIXES)
    }
    library_path = os.environ.get("LD_LIBRARY_PATH")
    env.update(
        {
            "DEPLOY_MODE": "STANDALONE",
            "METRICS_PORT": str(metrics_port),
            "MILVUS_RUN_DIR": str(base_dir / "run"),
            "LD_LIBRARY_PATH": f"{bin_dir}:{library_path}" if library_path else str(bin_dir),
            "ETCD_USE_EMBED": "true",
            "ETCD_CONFIG_PATH": str(etcd_config),
            "ETCD_DATA_DIR": str(base_dir / "data" / "etcd.data"),
            "ETCD_ENDPOINTS": f"{LOOPBACK}:{etcd_port}",
            "ETCD_ROOTPATH": ROOT_PATH,
            "MQ_TYPE": "rocksmq",
            "ROCKSMQ_PATH": str(rocksmq_path),
            "COMMON_CHANNAMEPREFIX_CLUSTER": ROOT_PATH,
            "COMMON_GRACEFULSTOPTIMEOUT": str(GRACEFUL_STOP_TIMEOUT_S),
        }
    )
    env.update({f"{component.upper()}_IP": LOOPBACK for component in COMPONENTS})
    uri = f"http://{LOOPBACK}:{ports['proxy_port']}"
    child = start_child(
        "source Milvus 2.3.5",
        [str(bin_dir / "milvus"), "run", "standalone"],
        log_path=base_dir / "milvus.log",
        env=env,
        cwd=base_dir,
        grace=GRACEFUL_STOP_TIMEOUT_S + 5,
    )
    say(f"started the source Milvus 2.3.5 (pid {child.pid}) on {uri}; log {child.log_path}")
    source = Source(child, uri, etcd_client_url, rocksmq_path, base_dir)
    wait_until(lambda: healthz(metrics_port), timeout, "source Milvus /healthz", child)
    wait_until(lambda: lists_collections(uri), timeout, "source Milvus list_collections", child)
    return source


# ---------------------------------------------------------------------------------------------
# The target (Milvus Lite) and the daemon


def start_target(base_dir: Path, timeout: float) -> tuple[Child, str]:
    command = milvus_lite_command()
    base_dir.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    uri = f"http://{LOOPBACK}:{port}"
    argv = [*command, "server", "--data-dir", str(base_dir / "data")]
    argv += ["--host", LOOPBACK, "--port", str(port)]
    child = start_child(
        "target Milvus Lite",
        argv,
        log_path=base_dir / "milvus-lite.log",
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        cwd=base_dir,
        grace=5,
    )
    say(f"started the target Milvus Lite (pid {child.pid}) on {uri}; log {child.log_path}")
    wait_until(lambda: lists_collections(uri), timeout, "target Milvus Lite", child)
    return child, uri


def start_daemon(
    base_dir: Path, held_port: socket.socket, source: Source, timeout: float, *, backfill: bool
) -> Child:
    """The daemon on the port ``held_port`` holds (see ``hold_daemon_port``), closed just
    before the daemon is started."""
    port = held_port.getsockname()[1]
    base_dir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "address": f"{LOOPBACK}:{port}",
        "logFormat": "json",
        "drainTimeoutSeconds": 10,
        "metaStoreConfig": {
            "storeType": "sqlite",
            "sqlitePath": str(base_dir / "cdc-meta.sqlite3"),
        },
        "sourceConfig": {
            "etcd": {"address": [source.etcd_endpoint]},
            "etcdRootPath": ROOT_PATH,
            "channelPrefix": ROOT_PATH,
            "mqType": "rocksmq",
            "rocksmq": {"path": str(source.rocksmq_path)},
        },
    }
    if backfill:
        # a backfill reads the source through its gRPC address, in a Spark job of its own
        config["sourceConfig"]["milvus"] = {"uri": source.uri}
        config["backfill"] = {
            "sparkMaster": "local[2]",
            "rangeRows": HISTORY_RANGE_ROWS,
            "batchRows": 500,
            "sparkConf": {"spark.ui.enabled": "false"},
        }
    config_path = base_dir / "cdc.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    python_path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO_ROOT}:{python_path}" if python_path else str(REPO_ROOT)
    env["no_proxy"] = f"{LOOPBACK},localhost"
    held_port.close()
    child = start_child(
        "milvus-cdc daemon",
        [sys.executable, "-m", "server", "serve", "--config", str(config_path)],
        log_path=base_dir / "daemon.log",
        env=env,
        cwd=base_dir,
        grace=20,
    )
    say(
        f"started the milvus-cdc daemon (pid {child.pid}) on http://{LOOPBACK}:{port}; "
        f"config {config_path}; log {child.log_path}"
    )
    wait_until(
        lambda: http_call(port, "GET", "/readyz")[0] == 200, timeout, "daemon /readyz", child
    )
    return child
