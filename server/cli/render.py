"""The tables and lines the ``task`` commands print, and the following of a job's progress."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from replicator.backfill.progress import bar
from server.cli.client import DaemonClient
from server.cli.verify import verify_line

DASH = "-"
BACKFILL_FINISHED = ("done", "failed")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """Columns padded to their widest cell; the last column is not padded."""
    cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=False))
        print(f"{line}  {row[-1]}".rstrip() if len(row) > 1 else row[0], file=out)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return DASH
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _time(unix: float | None) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S") if unix else DASH


def target_text(task: dict[str, Any]) -> str:
    kafka = task.get("kafka_connect_param")
    if kafka:
        return f"kafka://{kafka.get('address')}/{kafka.get('topic')}"
    connect = task.get("milvus_connect_param") or {}
    address = str(connect.get("uri") or f"{connect.get('host')}:{connect.get('port')}")
    return f"{task['target_cluster']} ({address})" if task.get("target_cluster") else address


def collections_text(task: dict[str, Any]) -> str:
    if task.get("collection_infos"):
        return ",".join(c["name"] for c in task["collection_infos"])
    return ",".join(
        f"{db}.{c['name']}"
        for db, infos in (task.get("db_collections") or {}).items()
        for c in infos
    )


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def print_tasks(tasks: list[dict[str, Any]], out: TextIO) -> None:
    rows = []
    for task in tasks:
        progress = task.get("progress") or {}
        rows.append(
            [
                task["task_id"],
                task["state"],
                task.get("owner"),
                progress.get("lag_seconds"),
                task.get("rows_per_second"),
                progress.get("rows"),
                target_text(task),
                collections_text(task),
                _short(task.get("reason") or ""),
            ]
        )
    headers = [
        "TASK",
        "STATE",
        "OWNER",
        "LAG_S",
        "ROWS/S",
        "ROWS",
        "TARGET",
        "COLLECTIONS",
        "REASON",
    ]
    table(headers, rows, out)


def print_task(task: dict[str, Any], positions: list[dict[str, Any]], out: TextIO) -> None:
    progress = task.get("progress") or {}
    facts = [
        ("task", task["task_id"]),
        ("state", task["state"]),
        ("reason", task.get("reason") or DASH),
        ("runs on", task.get("owner") or DASH),
        ("source", task.get("source_cluster") or DASH),
        ("target", target_text(task)),
        ("collections", collections_text(task)),
        ("replicate channel", (task.get("rpc_channel_info") or {}).get("name") or DASH),
        ("created", _time(task.get("created_at"))),
        ("updated", _time(task.get("updated_at"))),
        ("rows", _cell(progress.get("rows"))),
        ("rows/s", _cell(task.get("rows_per_second"))),
        ("lag (s)", _cell(progress.get("lag_seconds"))),
    ]
    backfill = task.get("backfill") or progress.get("backfill")
    if backfill:
        facts.append(("backfill", backfill_line(backfill)))
    verify = task.get("verify") or progress.get("verify")
    if verify:
        facts.append(("verify", verify_line(verify)))
    switchover = task.get("switchover") or progress.get("switchover")
    if switchover:
        facts.append(("switchover", switchover_line(switchover)))
    for mapping in task.get("name_mapping") or []:
        facts.append((f"database {mapping['source_db']}", f"-> {mapping['target_db']}"))
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        print(f"{key.ljust(width)}  {value}", file=out)
    channels = progress.get("channels") or []
    if channels:
        print(file=out)
        table(
            ["CHANNEL", "STATE", "ROWS", "BYTES", "LAG_S"],
            [[c["channel"], c["state"], c["rows"], c["bytes"], c["lag_seconds"]] for c in channels],
            out,
        )
    if positions:
        print(file=out)
        table(
            ["CHANNEL", "BACKEND", "MSG_ID", "SOURCE_TIME"],
            [
                [p["channel_name"], p["backend"], p["msg_id"], _time(p["time"] / 1000)]
                for p in positions
            ],
            out,
        )


# --- job lines and progress ---------------------------------------------------------------------
def backfill_line(backfill: dict[str, Any]) -> str:
    """``[#####.....]  42.0%  84,000/200,000 rows  4/10 ranges  21,000 rows/s  ETA 6s  running``"""
    percent = float(backfill.get("percent") or 0)
    parts = [
        bar(percent / 100),
        f"{percent:5.1f}%",
        f"{backfill.get('rows_done', 0):,}/{backfill.get('rows_total', 0):,} rows",
        f"{backfill.get('ranges_done', 0)}/{backfill.get('ranges_total', 0)} ranges",
    ]
    if backfill.get("rows_per_second") is not None:
        parts.append(f"{backfill['rows_per_second']:,.0f} rows/s")
    if backfill.get("eta_seconds") is not None and backfill.get("state") not in BACKFILL_FINISHED:
        parts.append(f"ETA {backfill['eta_seconds']:.0f}s")
    parts.append(str(backfill.get("state", DASH)))
    if backfill.get("reason"):
        parts.append(f"({backfill['reason']})")
    return "  ".join(parts)


def switchover_line(job: dict[str, Any]) -> str:
    """``switchover 3f2a...: verifying (fenced at 2026-...; consistent up to 2026-...)``"""
    facts = []
    if job.get("fenced_at"):
        facts.append(f"fenced at {job['fenced_at']['time']}")
    if job.get("consistent_up_to"):
        facts.append(f"consistent up to {job['consistent_up_to']['time']}")
    if job.get("verify"):
        facts.append(f"verify {job['verify']['divergent_rows']} divergent")
    if job.get("reverse_task_id"):
        facts.append(f"reverse task {job['reverse_task_id']}")
    if job.get("writers_may_move_at"):
        moved = job["writers_may_move_at"]["time"]
        facts.append(
            f"writers may move to {job.get('target_cluster') or 'the target'} since {moved}"
        )
    if job.get("reason"):
        facts.append(job["reason"])
    if job.get("rolled_back"):
        facts.append("rolled back")
    detail = f" ({'; '.join(facts)})" if facts else ""
    return f"switchover {job.get('job_id', '-')}: {job.get('state', '-')}{detail}"


def follow_job(
    client: DaemonClient,
    task_id: str,
    kind: str,
    render: Callable[[dict[str, Any]], str],
    out: TextIO,
    interval: float = 1.0,
    job_id: str = "",
    finished: tuple[str, ...] = BACKFILL_FINISHED,
) -> int:
    """Print the progress of the task's ``kind`` job (backfill, verify) until it is in a
    ``finished`` state: 0 for the first of them (done), else 1; a bar redrawn in place on a
    terminal, a line per change otherwise."""
    terminal = out.isatty()
    last = ""
    while True:
        job = client.task(task_id).get(kind)
        ended = bool(
            job and job.get("state") in finished and (not job_id or job.get("job_id") == job_id)
        )
        line = render(job) if job else f"{kind}: waiting for the task to run"
        if line != last:
            print(("\r" + line) if terminal else line, end="" if terminal else "\n", file=out)
            out.flush()
            last = line
        if ended:
            if terminal:
                print(file=out)
            return 0 if job and job["state"] == finished[0] else 1
        time.sleep(interval)


def announce_job(answer: dict[str, Any], args: argparse.Namespace, kind: str, out: TextIO) -> int:
    """What a job's request answered, without --follow: the answer (--json) or a line."""
    if args.json:
        print(json.dumps(answer, indent=2), file=out)
    else:
        print(f"{kind} {answer['job_id']} of task {args.task_id} asked", file=out)
    return 0
