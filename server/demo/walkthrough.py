"""``python -m server.demo``: the whole pipeline on one machine, from a fresh clone.

Starts, on free loopback ports under ``--data-dir`` (default ``./demo-data``):

- the source: Milvus 2.3.5 standalone from the PyPI ``milvus`` wheel, with its embedded etcd
  and its RocksMQ WAL (no other service needed);
- the target: Milvus Lite (``milvus-lite server``);
- this daemon (``python -m server serve``) on a SQLite metastore, ``POST /cdc`` on
  ``127.0.0.1:--port`` (default 8444), reading the source's etcd and RocksMQ.

Then it creates a collection on the source, a task over HTTP, writes inserts, upserts and
deletes, prints the task's progress until the target holds the same rows as the source
(compared by primary key, counted on the target), prints what to try next, and serves until
Ctrl-C or SIGTERM; then it stops every process it started, by PID. Each run starts from empty
data.

The backfill, when this machine can run its Spark job (Java: ``java`` on PATH or JAVA_HOME; the
``pyspark`` package): a second collection gets rows before any task exists, and a second task
is created with a backfill of it, so its channels start at the WAL's end and those rows reach
the target only through the backfill, whose progress (ranges, rows) is printed beside the rows
the target holds; 20 rows written after it are then streamed. Without Java or pyspark the
demo says the backfill is skipped and why.

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

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import random
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
    NotInstalledError,
    default_cache_root,
    healthz,
    install_bin,
    lists_collections,
    milvus_lite_command,
    remove_outside_files,
    wheel,
)

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = ".milvus-cdc-demo"
ROOT_PATH = "by-dev"  # the source's etcd.rootPath and channel prefix (Milvus's defaults)
COLLECTION = "demo_items"
HISTORY = "demo_history"  # rows written before its task: copied by a backfill
HISTORY_ROWS = 3000
HISTORY_RANGE_ROWS = 1000  # backfill.rangeRows: three key ranges, three Spark tasks
DIM = 8
MATCH_LINE = "DEMO: target matches source"
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
INSTALL_HINT = "run scripts/run.sh, or: python3 -m pip install -e '.[demo]'"


class DemoError(RuntimeError):
    """Something the user can fix (a busy port, a missing package) or a service that failed."""


class Stop(BaseException):
    """Ctrl-C or SIGTERM."""


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


def free_ports(count: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
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
    base_dir: Path, port: int, source: Source, timeout: float, *, backfill: bool
) -> Child:
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


# ---------------------------------------------------------------------------------------------
# The workload


def backfill_blocker() -> str:
    """Why this machine cannot run the demo's backfill (a Spark job: Java and pyspark); ""
    when it can."""
    java_home = os.environ.get("JAVA_HOME")
    has_java = shutil.which("java") is not None or bool(
        java_home and (Path(java_home) / "bin" / "java").is_file()
    )
    missing = []
    if not has_java:
        missing.append(
            "no Java runtime (no `java` on PATH, JAVA_HOME unset): "
            "apt-get install openjdk-17-jre-headless"
        )
    if importlib.util.find_spec("pyspark") is None:
        missing.append("no Python package pyspark: python3 -m pip install -e '.[backfill]'")
    return "; ".join(missing)


def make_rows(start: int, count: int, tag: str) -> list[dict[str, Any]]:
    rnd = random.Random(start)  # noqa: S311  (sample vectors)
    return [
        {"id": i, "vec": [rnd.random() for _ in range(DIM)], "title": f"{tag}-{i}"}
        for i in range(start, start + count)
    ]


def rows_by_key(client: Any, collection: str) -> dict[int, tuple[str, tuple[float, ...]]]:
    """Every row of a demo collection by primary key (each stays under one query)."""
    client.load_collection(collection)
    found = client.query(
        collection,
        filter="id >= 0",
        output_fields=["id", "title", "vec"],
        limit=16384,
        consistency_level="Strong",
    )
    return {
        int(row["id"]): (str(row["title"]), tuple(float(x) for x in row["vec"])) for row in found
    }


def create_collection(client: Any, collection: str) -> None:
    from pymilvus import DataType, MilvusClient

    if client.has_collection(collection):
        client.drop_collection(collection)
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("title", DataType.VARCHAR, max_length=64)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(collection, schema=schema, index_params=index)
    say(f"source: created collection {collection!r} (id int64 pk, vec {DIM}-dim, title varchar)")


def write_history(client: Any) -> None:
    """Rows written before any task exists: only a backfill brings them to the target."""
    create_collection(client, HISTORY)
    for start in range(0, HISTORY_ROWS, 1000):
        client.insert(HISTORY, make_rows(start, min(1000, HISTORY_ROWS - start), "history"))
    client.flush(HISTORY)
    say(f"source: inserted {HISTORY_ROWS} rows into {HISTORY!r} (ids 0-{HISTORY_ROWS - 1})")


def write_changes(client: Any) -> None:
    client.insert(COLLECTION, make_rows(0, 500, "inserted"))
    say("source: inserted 500 rows (ids 0-499)")
    client.upsert(COLLECTION, [dict(r, title="upserted") for r in make_rows(400, 200, "u")])
    say("source: upserted 200 rows (ids 400-599: 100 updated, 100 new)")
    client.delete(COLLECTION, ids=list(range(50)))
    say("source: deleted 50 rows (ids 0-49)")
    client.insert(COLLECTION, make_rows(1000, 20, "late"))
    say("source: inserted 20 more rows (ids 1000-1019)")


@dataclass
class Watched:
    """A collection the demo follows and the task that replicates it."""

    collection: str
    task_id: str
    backfill: bool = False  # the task was created with a backfill of the collection


def backfill_text(backfill: dict[str, Any] | None) -> str:
    if not backfill:
        return "backfill -"
    rows, ranges = backfill.get("rows_done", 0), backfill.get("ranges_done", 0)
    return (
        f"backfill {backfill.get('state')} {ranges}/{backfill.get('ranges_total', 0)} ranges, "
        f"{rows}/{backfill.get('rows_total', 0)} rows ({backfill.get('percent', 0)}%)"
    )


def follow(port: int, watched: list[Watched], source: Any, target: Any, timeout: float) -> int:
    """Print progress until the target's rows equal the source's in every watched collection
    (and each backfill is done); returns the number of rows compared."""
    expected = {w.collection: rows_by_key(source, w.collection) for w in watched}
    deadline = time.monotonic() + timeout
    last_key, last_said = "", 0.0
    while True:
        parts, keys, done = [], [], True
        for item in watched:
            task = cdc(port, "get", {"task_id": item.task_id})["task"]
            progress = task.get("progress") or {}
            if task["state"] == "Failed":
                raise DemoError(f"the task failed: {json.dumps(task)}")
            want = expected[item.collection]
            have: dict[int, tuple[str, tuple[float, ...]]] = {}
            with contextlib.suppress(Exception):
                if target.has_collection(item.collection):
                    have = rows_by_key(target, item.collection)
            same = sum(1 for k, v in have.items() if want.get(k) == v)
            lag = progress.get("lag_seconds")
            # what the target holds, counted on the target; the task's own counter is of row
            # writes (inserts and deletes) applied since its runner started, not of rows
            rows = (
                f"{item.collection}: target has {len(have)} rows, {same} of the source's "
                f"{len(want)} equal; task {task['state']}"
            )
            writes = f"{progress.get('rows', 0)} row writes applied since it started"
            key = f"{rows}, {writes}"
            text = f"{rows}, lag {'-' if lag is None else f'{lag:.2f} s'}, {writes}"
            if item.backfill:
                backfill = progress.get("backfill")
                key += f"; {backfill_text(backfill)}"
                text += f"; {backfill_text(backfill)}"
                state = (backfill or {}).get("state")
                if state == "failed":
                    raise DemoError(f"the backfill failed: {json.dumps(backfill)}")
                done = done and state == "done"
            parts.append(text)
            keys.append(key)
            done = done and have == want
        # a line when something other than the lag changed, else every 10 s
        now = time.monotonic()
        if "|".join(keys) != last_key or now - last_said >= 10:
            say("progress: " + " | ".join(parts))
            last_key, last_said = "|".join(keys), now
        if done:
            return sum(len(rows) for rows in expected.values())
        if time.monotonic() >= deadline:
            raise DemoError(f"the target did not match the source within {timeout:g} s")
        time.sleep(1)


# ---------------------------------------------------------------------------------------------
# main


def prepare_data_dir(data_dir: Path) -> None:
    """Each run starts from empty data; only a directory the demo made is ever emptied."""
    if data_dir.exists() and any(data_dir.iterdir()) and not (data_dir / MARKER).exists():
        raise DemoError(
            f"{data_dir} exists, is not empty and was not made by the demo; pass another --data-dir"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / MARKER).write_text("made by python -m server.demo; emptied on each run\n")
    for name in ("source", "target", "daemon"):
        shutil.rmtree(data_dir / name, ignore_errors=True)


def summary(
    port: int, watched: list[Watched], source: Source, target_uri: str, data_dir: Path
) -> str:
    base = f"http://{LOOPBACK}:{port}"
    task_id = watched[0].task_id
    tasks = ", ".join(f"task {w.task_id} ({w.collection})" for w in watched)
    return f"""
The demo is running (logs and data under {data_dir}):
  source  Milvus 2.3.5   {source.uri}   (embedded etcd {source.etcd_endpoint}, RocksMQ {source.rocksmq_path})
  target  Milvus Lite    {target_uri}
  daemon  milvus-cdc     {base}   (SQLite metastore), {tasks}

Try:
  curl -s {base}/cdc -d '{{"request_type": "list"}}'
  curl -s {base}/cdc -d '{{"request_type": "get", "request_data": {{"task_id": "{task_id}"}}}}'
  curl -s {base}/cdc -d '{{"request_type": "position", "request_data": {{"task_id": "{task_id}"}}}}'
  curl -s {base}/cdc -d '{{"request_type": "pause", "request_data": {{"task_id": "{task_id}"}}}}'
  curl -s {base}/cdc -d '{{"request_type": "resume", "request_data": {{"task_id": "{task_id}"}}}}'
  curl -s {base}/metrics | grep ^cdc_
Write to the source (pymilvus: MilvusClient(uri="{source.uri}")) and watch the target follow.
Press Ctrl-C to stop everything."""  # noqa: E501


def create_task(port: int, target_uri: str, collection: str, *, backfill: bool) -> Watched:
    request: dict[str, Any] = {
        "milvus_connect_param": {"uri": target_uri, "connect_timeout": 10},
        "collection_infos": [{"name": collection}],
    }
    if backfill:
        request["backfill"] = {"collections": ["*"]}
    task_id = str(cdc(port, "create", request)["task_id"])
    say(f"daemon: created task {task_id} (POST /cdc create) replicating {collection!r}")
    return Watched(collection, task_id, backfill)


def run(args: argparse.Namespace, children: list[Child]) -> None:
    from pymilvus import MilvusClient

    data_dir = Path(args.data_dir).resolve()
    check_port_free(args.port)
    wheel()
    milvus_lite_command()
    prepare_data_dir(data_dir)
    started = time.monotonic()
    blocker = backfill_blocker()

    source = start_source(data_dir / "source", args.startup_timeout)
    children.append(source.child)
    target_child, target_uri = start_target(data_dir / "target", args.startup_timeout)
    children.append(target_child)
    daemon = start_daemon(
        data_dir / "daemon", args.port, source, args.startup_timeout, backfill=not blocker
    )
    children.append(daemon)

    source_client = MilvusClient(uri=source.uri, dedicated=True)
    target_client = MilvusClient(uri=target_uri, dedicated=True)
    try:
        create_collection(source_client, COLLECTION)
        if blocker:
            say(f"backfill: skipped, this machine cannot run its Spark job: {blocker}")
        else:
            write_history(source_client)
        watched = [create_task(args.port, target_uri, COLLECTION, backfill=False)]
        if not blocker:
            watched.append(create_task(args.port, target_uri, HISTORY, backfill=True))
            say(
                f"backfill: asked at create; the task's channels start at the WAL's end, so the "
                f"{HISTORY_ROWS} rows of {HISTORY!r} reach the target only through the backfill "
                f"(a Spark job, local[2], {HISTORY_ROWS // HISTORY_RANGE_ROWS} key ranges; "
                f"log under {data_dir / 'daemon'})"
            )
        write_changes(source_client)
        count = follow(args.port, watched, source_client, target_client, args.match_timeout)
        if not blocker:
            source_client.insert(HISTORY, make_rows(HISTORY_ROWS, 20, "after-backfill"))
            say(
                f"backfill: done; source: inserted 20 rows into {HISTORY!r} (ids "
                f"{HISTORY_ROWS}-{HISTORY_ROWS + 19}), which the task now streams"
            )
            count = follow(args.port, watched, source_client, target_client, args.match_timeout)
    finally:
        source_client.close()
        target_client.close()
    collections = " and ".join(repr(w.collection) for w in watched)
    say(
        f"{MATCH_LINE}: {count} rows equal by primary key in {collections} "
        f"({time.monotonic() - started:.1f} s after start)"
    )
    say(summary(args.port, watched, source, target_uri, data_dir))
    while True:
        for child in children:
            if child.process.poll() is not None:
                raise DemoError(
                    f"{child.name} (pid {child.pid}) exited with code "
                    f"{child.process.returncode}; last lines of {child.log_path}:\n"
                    + log_tail(child.log_path)
                )
        time.sleep(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server.demo",
        description="Run a source Milvus, a Milvus Lite target and milvus-cdc on this machine, "
        "replicate sample writes, then keep serving until Ctrl-C.",
    )
    parser.add_argument(
        "--data-dir", default="demo-data", help="where data and logs go (default ./demo-data)"
    )
    parser.add_argument(
        "--port", type=int, default=8444, help="the daemon's port on 127.0.0.1 (default 8444)"
    )
    parser.add_argument("--startup-timeout", type=float, default=180, help=argparse.SUPPRESS)
    parser.add_argument("--match-timeout", type=float, default=180, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        if stopping:
            return  # already stopping everything
        stopping = True
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    children: list[Child] = []
    code = 0
    try:
        run(args, children)
    except Stop as stop:
        say(f"\n{stop.args[0]}: stopping everything the demo started")
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr, flush=True)
        code = 1
    except NotInstalledError as exc:
        print(f"demo: {exc}; {INSTALL_HINT}", file=sys.stderr, flush=True)
        code = 1
    finally:
        stopping = True  # a signal now changes nothing: the children are being stopped
        for child in reversed(children):  # daemon, target, source
            stop_child(child)
            if child.name.startswith("source"):
                remove_outside_files(child.pid)
    return code
