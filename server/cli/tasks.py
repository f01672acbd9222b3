"""``milvus-cdc task ...``: the commands that ask a running daemon's /v1 resources.

``create|list|get|pause|resume|delete|fleet|backfill|verify`` are here, ``switchover|failover|
failback`` in :mod:`server.cli.dr`; the answers are printed as tables (:mod:`server.cli.render`)
or as JSON with ``--json``. The daemon is found as :mod:`server.cli.client` says. The API token
is ``--token``, else ``$CDC_TOKEN`` (preferred: ``ps`` shows command lines). Exit status: 0 done,
1 the daemon refused or is unreachable. Passwords and tokens for ``create`` are read from
environment variables, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from replicator.config.settings import CdcSettings
from server.cli.client import (
    CliError,
    DaemonClient,
    client_tls,
    daemon_url,
    quote_task_id,
    secret_from_env,
)
from server.cli.dr import add_dr_parsers, run_dr_command
from server.cli.render import (
    announce_job,
    backfill_line,
    follow_job,
    print_task,
    print_tasks,
    table,
)
from server.cli.verify import verify_line, verify_result


# --- backfill progress ---------------------------------------------------------------------------
def follow_backfill(
    client: DaemonClient, task_id: str, out: TextIO, interval: float = 1.0, job_id: str = ""
) -> int:
    """Print the backfill's progress until it is done (0) or failed (1)."""
    return follow_job(client, task_id, "backfill", backfill_line, out, interval, job_id)


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
        help="a Kafka topic instead of a Milvus: host:9092[,host2:9092]/topic (see "
        "docs/guides/kafka-target.md); SASL with --username and --password-env",
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


def run_verify(client: DaemonClient, args: argparse.Namespace, out: TextIO) -> int:
    """Ask a verify; with ``--follow``, its progress and then its result (exit 0 only when it
    finished with nothing divergent or all of it repaired)."""
    body = {"collections": args.collection or ["*"], "repair": bool(args.repair)}
    answer = client.call("POST", f"/v1/tasks/{quote_task_id(args.task_id)}/verify", body)
    if not args.follow:
        return announce_job(answer, args, "verify", out)
    code = follow_job(client, args.task_id, "verify", verify_line, out, job_id=answer["job_id"])
    verify = client.task(args.task_id).get("verify") or {}
    for line in verify_result(verify):
        print(line, file=out)
    clean = verify.get("divergent_rows") == 0 or verify.get("repair")
    return code if clean else 1


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
        positions = client.call("GET", f"/v1/tasks/{quote_task_id(args.task_id)}/positions")
        if args.json:
            print(json.dumps({"task": task, **positions}, indent=2), file=out)
        else:
            print_task(task, positions["positions"], out)
        return 0
    if command == "delete":
        client.call("DELETE", f"/v1/tasks/{quote_task_id(args.task_id)}")
        if args.json:
            print(json.dumps({"task_id": args.task_id, "deleted": True}), file=out)
        else:
            print(f"task {args.task_id} deleted", file=out)
        return 0
    if command == "backfill":
        body = {"collections": args.collection or ["*"]}
        answer = client.call("POST", f"/v1/tasks/{quote_task_id(args.task_id)}/backfill", body)
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
        return run_dr_command(client, args, out)
    if command == "create":
        answer = client.call("POST", "/v1/tasks", create_body(args))
    else:  # pause, resume
        answer = client.call("POST", f"/v1/tasks/{quote_task_id(args.task_id)}/{command}")
    if args.json:
        print(json.dumps(answer, indent=2), file=out)
    else:
        print_tasks([answer["task"]], out)
    return 0
