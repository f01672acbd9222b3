"""``milvus-cdc``: run the daemon, manage its tasks (``task``, server/cli/tasks.py), check what
it connects to (``check``, server/cli/check.py), or look at its configuration."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from metastore import MetaStoreError
from metastore.format import STORE_FORMAT
from replicator.config.redaction import redacted, scrub_secret_environment, secret_values
from replicator.config.release import RELEASE
from replicator.config.settings import ConfigError, load_settings
from server.cli.check import add_check_parser, run_check_command
from server.cli.client import CliError
from server.cli.events import add_events_parser, run_events_command
from server.cli.secrets import add_secrets_parser, run_secrets_command
from server.cli.tasks import add_task_parser, run_task_command
from server.logs import configure_logging


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
    if args.command in ("task", "check", "secrets", "events"):
        run = {
            "task": run_task_command,
            "check": run_check_command,
            "secrets": run_secrets_command,
            "events": run_events_command,
        }[args.command]
        try:
            return run(args, settings, sys.stdout)
        except (CliError, ConfigError) as exc:
            print(f"milvus-cdc: {exc}", file=sys.stderr)
            return 1
    redactor = configure_logging(settings.logLevel, settings.logFormat)
    redactor.add(*secret_values(settings))
    scrub_secret_environment(os.environ)  # read: children need not inherit them
    from server.daemon import serve

    try:
        asyncio.run(serve(settings, redactor))
    except ConfigError as exc:  # found at start: the key file
        logging.getLogger("milvus-cdc").error("cannot start: %s", exc)
        return 2
    except MetaStoreError as exc:
        logging.getLogger("milvus-cdc").error("cannot start: %s", exc)
        return 1
    return 0


def entrypoint() -> None:
    sys.exit(main())
