"""The arguments of the commands whose work needs the drivers (``check``, ``secrets``) or more
(``docs``: MkDocs and a web server): kept apart from that work, so building the parser of
``milvus-cdc`` loads none of them (server/cli/main.py)."""

from __future__ import annotations

from typing import Any


def add_check_parser(commands: Any) -> None:
    check = commands.add_parser(
        "check", help="check that the source etcd, the source queue and targets answer"
    )
    check.add_argument("--config", metavar="PATH", help="configuration file")
    check.add_argument("--target", metavar="URI", help="a target Milvus, http://host:19530")
    check.add_argument("--username", help="user for --target (with --password-env)")
    check.add_argument("--password-env", metavar="VAR", help="environment variable with it")
    check.add_argument("--token-env", metavar="VAR", help="environment variable with a token")
    check.add_argument(
        "--task", action="append", metavar="TASK_ID", help="check this stored task's target"
    )
    check.add_argument("--timeout", type=float, default=5.0, help="seconds per check (default 5)")
    check.add_argument("--json", action="store_true", help="print the results as JSON")


def add_secrets_parser(commands: Any) -> None:
    secrets = commands.add_parser("secrets", help="the key that encrypts stored secrets")
    actions = secrets.add_subparsers(dest="secrets_command", metavar="ACTION", required=True)
    rotate = actions.add_parser("rotate", help="encrypt every stored secret with a new key")
    rotate.add_argument("--config", metavar="PATH", help="configuration file")
    rotate.add_argument(
        "--keep-old", action="store_true", help="keep the old keys in the key file afterwards"
    )


def add_docs_parser(commands: Any) -> None:
    docs = commands.add_parser(
        "docs", help="serve the documentation site on this host (offline), or build it"
    )
    docs.add_argument("--build", metavar="DIR", help="write the static site to DIR and exit")
    docs.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
    docs.add_argument("--host", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    docs.set_defaults(config=None)
