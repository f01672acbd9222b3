"""``milvus-cdc task create|list|get|pause|resume|delete|backfill|verify`` (and
``switchover|failover``, :mod:`server.cli.dr`): a client of a running daemon's /v1
resources, printing tables (or the answers as JSON with ``--json``).

The daemon is found at ``--url``, else ``$CDC_URL``, else the ``address`` of the configuration
(a wildcard host means this host; ``https`` when the configuration has ``tls.certFile``). The
API token is ``--token``, else ``$CDC_TOKEN`` (preferred: ``ps`` shows command lines);
``--cacert`` (or ``$CDC_CACERT``) names a PEM file of the CA that signed the daemon's
certificate. Exit status: 0 done, 1 the daemon refused or is unreachable. Passwords and tokens
for ``create`` are read from environment variables, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from replicator.backfill.progress import bar
from replicator.config.settings import CdcSettings
from server.cli.verify import verify_line, verify_result

DASH = "-"


class CliError(Exception):
    """A failure to report on stderr (exit status 1)."""


# --- the HTTP client -----------------------------------------------------------------------------
def daemon_url(settings: CdcSettings, given: str | None) -> str:
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
        return dict(self.call("GET", f"/v1/tasks/{_quote(task_id)}")["task"])


def _quote(task_id: str) -> str:
    return urllib.parse.quote(task_id, safe="")


def _problem_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        detail = body.get("detail") or body.get("message") or ""
    except ValueError:
        detail = ""
    return f"{exc.code} {exc.reason}: {detail}" if detail else f"{exc.code} {exc.reason}"


# --- output --------------------------------------------------------------------------------------
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
        from server.cli.dr import switchover_line

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


# --- backfill progress ---------------------------------------------------------------------------
BACKFILL_FINISHED = ("done", "failed")


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


def follow_backfill(
    client: DaemonClient, task_id: str, out: TextIO, interval: float = 1.0, job_id: str = ""
) -> int:
    """Print the backfill's progress until it is done (0) or failed (1)."""
    return follow_job(client, task_id, "backfill", backfill_line, out, interval, job_id)


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


# --- commands ------------------------------------------------------------------------------------
def add_task_parser(commands: Any) -> None:
    task = commands.add_parser("task", help="manage the tasks of a running daemon")
    actions = task.add_subparsers(dest="task_command", metavar="ACTION", required=True)

    def action(name: str, help_text: str, with_id: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        if with_id:
            parser.add_argument("task_id", metavar="TASK_ID")
        parser.add_argument("--url", help="the daemon (default: $CDC_URL, else `address`)")
        parser.add_argument("--config", metavar="PATH", help="configuration file")
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
        parser.add_argument(
            "--token", help="the API token (default: $CDC_TOKEN, preferred: ps shows arguments)"
        )
        parser.add_argument(
            "--cacert", metavar="PEM", help="CA of an https daemon (default: $CDC_CACERT)"
        )
        return parser

    action("list", "list the tasks", with_id=False)
    action("get", "show one task: state, progress, channels, positions")
    action("pause", "pause a task")
    action("resume", "resume a task")
    action("delete", "delete a task")
    action("fleet", "the daemons sharing the metastore and the tasks each runs", with_id=False)

    def job_action(name: str, help_text: str, follow: str) -> argparse.ArgumentParser:
        parser = action(name, help_text)
        parser.add_argument(
            "--collection",
            action="append",
            metavar="[DB.]NAME",
            help=f"a collection to {name} (repeatable; default: every one the task selects)",
        )
        parser.add_argument("--follow", action="store_true", help=follow)
        return parser

    job_action(
        "backfill",
        "copy the rows the source already holds, then stream again",
        "show a progress bar until the backfill ends",
    )
    verify = job_action(
        "verify",
        "compare the target with the source; --repair fixes differences",
        "show a progress bar and the result at the end",
    )
    verify.add_argument(
        "--repair", action="store_true", help="upsert missing and different rows, delete extra"
    )
    from server.cli.dr import add_dr_parsers  # it builds on this module

    add_dr_parsers(action)
    create = action("create", "create a task", with_id=False)
    create.add_argument("--body", metavar="FILE", help="the create request as JSON ('-': stdin)")
    create.add_argument("--target", metavar="URI", help="the target Milvus, http://host:19530")
    create.add_argument(
        "--collection",
        action="append",
        metavar="[DB.]NAME",
        help="a collection to replicate ('*' for all; repeatable; default: all)",
    )
    create.add_argument(
        "--kafka-target",
        metavar="BROKERS/TOPIC",
        help="a Kafka topic instead of a Milvus: host:9092[,host2:9092]/topic (see README, "
        "'Kafka targets'); SASL with --username and --password-env",
    )
    create.add_argument("--ddl-topic", help="with --kafka-target: DDL events on their own topic")
    create.add_argument("--task-id", help="the task's id (default: generated)")
    create.add_argument("--username", help="target user (with --password-env)")
    create.add_argument("--password-env", metavar="VAR", help="environment variable with it")
    create.add_argument("--token-env", metavar="VAR", help="environment variable with a token")
    create.add_argument("--connect-timeout", type=int, help="seconds for the target to answer")
    create.add_argument("--no-start", action="store_true", help="create in state Initial")
    create.add_argument(
        "--backfill", action="store_true", help="copy the rows the source already holds first"
    )


def announce_job(answer: dict[str, Any], args: argparse.Namespace, kind: str, out: TextIO) -> int:
    """What a job's request answered, without --follow: the answer (--json) or a line."""
    if args.json:
        print(json.dumps(answer, indent=2), file=out)
    else:
        print(f"{kind} {answer['job_id']} of task {args.task_id} asked", file=out)
    return 0


def run_verify(client: DaemonClient, args: argparse.Namespace, out: TextIO) -> int:
    """Ask a verify; with ``--follow``, its progress and then its result (exit 0 only when it
    finished with nothing divergent or all of it repaired)."""
    body = {"collections": args.collection or ["*"], "repair": bool(args.repair)}
    answer = client.call("POST", f"/v1/tasks/{_quote(args.task_id)}/verify", body)
    if not args.follow:
        return announce_job(answer, args, "verify", out)
    code = follow_job(client, args.task_id, "verify", verify_line, out, job_id=answer["job_id"])
    verify = client.task(args.task_id).get("verify") or {}
    for line in verify_result(verify):
        print(line, file=out)
    clean = verify.get("divergent_rows") == 0 or verify.get("repair")
    return code if clean else 1


def secret_from_env(variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise CliError(f"environment variable {variable} is not set")
    return value


def by_database(args: argparse.Namespace) -> dict[str, list[dict[str, str]]]:
    by_db: dict[str, list[dict[str, str]]] = {}
    for name in args.collection or ["*"]:
        db, _, collection = name.rpartition(".")
        by_db.setdefault(db or "default", []).append({"name": collection})
    return by_db


def kafka_param(args: argparse.Namespace) -> dict[str, Any]:
    brokers, slash, topic = args.kafka_target.partition("/")
    if not slash or not brokers or not topic:
        raise CliError("--kafka-target: give BROKERS/TOPIC, e.g. localhost:9092/milvus-events")
    param: dict[str, Any] = {"address": brokers, "topic": topic}
    if args.ddl_topic:
        param["ddl_topic"] = args.ddl_topic
    if args.connect_timeout:
        param["connect_timeout"] = args.connect_timeout
    if args.username:
        password = secret_from_env(args.password_env) if args.password_env else ""
        param.update(enable_sasl=True, sasl={"username": args.username, "password": password})
    return param


def create_body(args: argparse.Namespace) -> dict[str, Any]:
    if args.body:
        text = sys.stdin.read() if args.body == "-" else Path(args.body).read_text()
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise CliError(f"--body: not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise CliError("--body: must hold a JSON object (the create request)")
    elif args.kafka_target:
        body = {"kafka_connect_param": kafka_param(args), "db_collections": by_database(args)}
    elif args.target:
        connect: dict[str, Any] = {"uri": args.target}
        if args.username:
            connect["username"] = args.username
        if args.password_env:
            connect["password"] = secret_from_env(args.password_env)
        if args.token_env:
            connect["token"] = secret_from_env(args.token_env)
        if args.connect_timeout:
            connect["connect_timeout"] = args.connect_timeout
        body = {"milvus_connect_param": connect, "db_collections": by_database(args)}
    else:
        raise CliError("give --target or --kafka-target (and --collection), or --body FILE")
    if args.task_id:
        body["task_id"] = args.task_id
    if args.no_start:
        body["disable_auto_start"] = True
    if args.backfill:
        body["backfill"] = {"collections": ["*"]}
    return body


def run_task_command(args: argparse.Namespace, settings: CdcSettings, out: TextIO) -> int:
    client = DaemonClient(
        daemon_url(settings, args.url),
        args.timeout,
        token=args.token or os.environ.get("CDC_TOKEN") or None,
        tls=client_tls(args.cacert),
    )
    command = args.task_command
    if command == "list":
        answer = client.call("GET", "/v1/tasks")
        if args.json:
            print(json.dumps(answer, indent=2), file=out)
        else:
            print_tasks(answer["tasks"], out)
        return 0
    if command == "fleet":
        fleet = client.call("GET", "/v1/fleet")
        if args.json:
            print(json.dumps(fleet, indent=2), file=out)
        else:
            members = fleet["members"]
            table(
                ["DAEMON", "ADDRESS", "TASKS", ""],
                [
                    [m["member_id"], m["address"], m["tasks"], "(this one)" if m["self"] else ""]
                    for m in members
                ],
                out,
            )
        return 0
    if command == "get":
        task = client.task(args.task_id)
        positions = client.call("GET", f"/v1/tasks/{_quote(args.task_id)}/positions")
        if args.json:
            print(json.dumps({"task": task, **positions}, indent=2), file=out)
        else:
            print_task(task, positions["positions"], out)
        return 0
    if command == "delete":
        client.call("DELETE", f"/v1/tasks/{_quote(args.task_id)}")
        if args.json:
            print(json.dumps({"task_id": args.task_id, "deleted": True}), file=out)
        else:
            print(f"task {args.task_id} deleted", file=out)
        return 0
    if command == "backfill":
        body = {"collections": args.collection or ["*"]}
        answer = client.call("POST", f"/v1/tasks/{_quote(args.task_id)}/backfill", body)
        if args.follow:
            return follow_backfill(client, args.task_id, out, job_id=answer["job_id"])
        if args.json:
            print(json.dumps(answer, indent=2), file=out)
        else:
            print(f"backfill of task {args.task_id} asked", file=out)
        return 0
    if command == "verify":
        return run_verify(client, args, out)
    if command in ("switchover", "failover", "failback"):
        from server.cli.dr import run_dr_command

        return run_dr_command(client, args, out)
    if command == "create":
        answer = client.call("POST", "/v1/tasks", create_body(args))
    else:  # pause, resume
        answer = client.call("POST", f"/v1/tasks/{_quote(args.task_id)}/{command}")
    if args.json:
        print(json.dumps(answer, indent=2), file=out)
    else:
        print_tasks([answer["task"]], out)
    return 0
