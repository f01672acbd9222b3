"""Write the documentation pages generated from the code (docs/reference/*.md, the message
catalogue of docs/troubleshooting.md, the target-version table); ``--check`` writes nothing and
exits 1 naming each page that differs from what the code renders now (tests/unit/
test_docs_reference.py runs it). Run from anywhere: python scripts/gen_docs.py [--check]."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.docsgen import cli_ref, config_ref, http_ref, messages, metrics_ref  # noqa: E402

DOCS = REPO / "docs"


def _between(begin: str, end: str, block: Callable[[], str]) -> Callable[[str], str]:
    """A page whose part between two markers is generated (the rest is written by hand)."""

    def render(current: str) -> str:
        if begin not in current:
            raise SystemExit(f"no {begin!r} marker in the page")
        head, rest = current.split(begin, 1)
        tail = rest.split(end, 1)[1]
        return head + block() + tail

    return render


def _matrix_block() -> str:
    from replicator.sinks.target_capabilities import render_matrix

    return render_matrix()


def _messages_page(current: str) -> str:
    if messages.BEGIN not in current:
        current = current.replace("MESSAGES", messages.BEGIN + messages.END)
    return _between(messages.BEGIN, messages.END + "\n", lambda: messages.render_block() + "\n")(
        current
    )


PAGES: dict[str, Callable[[str], str]] = {
    "reference/configuration.md": lambda _: config_ref.render(),
    "reference/http-api.md": lambda _: http_ref.render(),
    "reference/cli.md": lambda _: cli_ref.render(),
    "reference/metrics.md": lambda _: metrics_ref.render(),
    "troubleshooting.md": _messages_page,
}


def pages() -> dict[str, Callable[[str], str]]:
    from replicator.sinks.target_capabilities import MATRIX_BEGIN, MATRIX_END

    def matrix(current: str) -> str:
        start = current.index(MATRIX_BEGIN)
        stop = current.index(MATRIX_END, start) + len(MATRIX_END)
        return current[:start] + _matrix_block() + current[stop:]

    return {**PAGES, "reference/target-versions.md": matrix}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args()
    stale = []
    for name, render in pages().items():
        path = DOCS / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        wanted = render(current)
        if wanted != current:
            stale.append(name)
            if not args.check:
                path.write_text(wanted, encoding="utf-8")
    verb = "stale" if args.check else "written"
    for name in stale:
        print(f"docs/{name}: {verb}")
    if args.check and stale:
        print("regenerate them: python scripts/gen_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
