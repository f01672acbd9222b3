"""``milvus-cdc``: run the daemon (``serve``), manage its tasks (``task``, server/cli/tasks.py),
check what it connects to (``check``, server/cli/check.py), or look at its configuration."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Protocol, TextIO

from metastore.format import STORE_FORMAT
from replicator.config.redaction import redacted
from replicator.config.release import RELEASE
from replicator.config.settings import CdcSettings, ConfigError, load_settings
from server.cli.arguments import add_check_parser, add_docs_parser, add_secrets_parser
from server.cli.client import CliError
from server.cli.events import add_events_parser
from server.cli.tasks import add_task_parser


class Runner(Protocol):
    def __call__(self, args: argparse.Namespace, settings: CdcSettings, out: TextIO) -> int: ...


# The module that does each command's work, imported when that command runs: a `task` command
# then loads neither the drivers that `check` and `secrets` use nor the daemon: `task list`
# starts in 0.3 s instead of 1.5 s (bench/cli_start.py, results/cli_start.md).
RUNNERS = {
    "serve": ("server.cli.serve", "run_serve_command"),
    "task": ("server.cli.tasks", "run_task_command"),
    "check": ("server.cli.check", "run_check_command"),
    "secrets": ("server.cli.secrets", "run_secrets_command"),
    "events": ("server.cli.events", "run_events_command"),
    "docs": ("server.cli.docs_site", "run_docs_command"),
}


def runner(command: str) -> Runner:
    module, function = RUNNERS[command]
    run: Runner = getattr(importlib.import_module(module), function)
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="milvus-cdc", description="Change-data-capture daemon for Milvus"
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"milvus-cdc {RELEASE} (metastore format {STORE_FORMAT})",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the daemon (POST /cdc on `address`)")
    serve.add_argument(
        "--config", metavar="PATH", help="configuration file (default: $CDC_CONFIG, else defaults)"
    )
    config = commands.add_parser("config", help="inspect the configuration")
    config_commands = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = config_commands.add_parser("show", help="print the merged configuration, redacted")
    show.add_argument("--config", metavar="PATH")
    add_task_parser(commands)
    add_check_parser(commands)
    add_secrets_parser(commands)
    add_events_parser(commands)
    add_docs_parser(commands)
    return parser


def main(argv: list[str] | None = None, default_command: str | None = None) -> int:
    parser = build_parser()
    args_list = sys.argv[1:] if argv is None else argv
    if not args_list and default_command:
        args_list = [default_command]
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"milvus-cdc: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(json.dumps(redacted(settings), indent=2))
        return 0
    try:  # (serve logs its own start errors and returns their code)
        return runner(args.command)(args, settings, sys.stdout)
    except (CliError, ConfigError) as exc:
        print(f"milvus-cdc: {exc}", file=sys.stderr)
        return 1


def entrypoint() -> None:
    sys.exit(main())
