"""docs/reference/cli.md from milvus-cdc's argument parser (server/cli/main.py
``build_parser``, with the commands it adds from server/cli/tasks.py, dr.py, events.py and
arguments.py): every command, its usage, and every argument with its default and help."""

from __future__ import annotations

import argparse
import os

HEADER = """# CLI

Every command of `milvus-cdc` and every argument, read from its parser by `scripts/gen_docs.py`:
do not edit by hand. How the commands are used: [Command line](../operations/cli.md). Task
commands find the daemon at `--url`, else `$CDC_URL`, else the configuration's `address`, and
send the token of `$CDC_TOKEN` (or `--token`).
"""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = str(action.metavar or action.dest)
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
            shown = "-"
        else:
            shown = f"`{default}`"
        text = (action.help or "").replace("|", "/").replace("\n", " ")
        if action.choices:
            text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| `{name}` | {shown} | {text} |")
    return rows


def _section(path: str, help_text: str, parser: argparse.ArgumentParser, out: list[str]) -> None:
    depth = min(path.count(" ") + 1, 4)
    out.append(f"{'#' * (depth + 1)} `{path}`\n")
    if help_text:
        out.append(help_text[0].upper() + help_text[1:] + ".\n")
    usage = " ".join(parser.format_usage().split())
    out.append(f"```text\n{usage.removeprefix('usage: ')}\n```\n")
    rows = _argument_rows(parser)
    if rows:
        out.append("| argument | default | meaning |\n|---|---|---|")
        out.append("\n".join(rows) + "\n")
    for name, sub_help, sub in _subcommands(parser):
        _section(f"{path} {name}", sub_help, sub, out)


def render() -> str:
    from server.cli.main import build_parser

    os.environ["COLUMNS"] = "100"  # usage lines wrapped alike everywhere
    parser = build_parser()
    out = [HEADER]
    _section("milvus-cdc", parser.description or "", parser, out)
    return "\n".join(out).rstrip("\n") + "\n"
