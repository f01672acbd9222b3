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

The processes are started by :mod:`server.demo.processes`; this module writes the data, follows
the tasks until the target matches, and prints what to try next.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.demo.local_milvus import (
    NotInstalledError,
    milvus_lite_command,
    remove_outside_files,
    wheel,
)
from server.demo.processes import (
    HISTORY_RANGE_ROWS,
    LOOPBACK,
    Child,
    DemoError,
    Source,
    cdc,
    hold_daemon_port,
    log_tail,
    say,
    start_daemon,
    start_source,
    start_target,
    stop_child,
)

MARKER = ".milvus-cdc-demo"
COLLECTION = "demo_items"
HISTORY = "demo_history"  # rows written before its task: copied by a backfill
HISTORY_ROWS = 3000
DIM = 8
MATCH_LINE = "DEMO: target matches source"
INSTALL_HINT = "run scripts/run.sh, or: python3 -m pip install -e '.[demo]'"


class Stop(BaseException):
    """Ctrl-C or SIGTERM."""


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
    # the daemon's port is held until the daemon starts (start_daemon closes it), or an error
    with contextlib.closing(hold_daemon_port(args.port)) as daemon_port:
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
            data_dir / "daemon",
            daemon_port,
            source,
            args.startup_timeout,
            backfill=not blocker,
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
