"""``milvus-cdc docs``: the documentation site (docs/, mkdocs.yml of a checkout), built with
MkDocs and served on a loopback port, or written to a directory with ``--build``. It needs no
network: the material theme and its search index are local files, and the search works once the
pages are served over HTTP (a browser runs it in a worker that a ``file://`` page cannot
start)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from replicator.config.settings import CdcSettings
from server.cli.client import CliError

CHECKOUT = Path(__file__).resolve().parents[2]


def build_site(site: Path, checkout: Path = CHECKOUT) -> None:
    """``mkdocs build --strict`` of the checkout's docs/ into ``site``."""
    config = checkout / "mkdocs.yml"
    if not config.is_file():
        raise CliError(
            f"no documentation here: {config} is missing (the site is built from a checkout "
            "of the repository, with the docs extra: pip install -e '.[docs]')"
        )
    built = subprocess.run(  # noqa: S603 - this interpreter's mkdocs on the checkout's files
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        capture_output=True, text=True, check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if built.returncode != 0:
        lines = (built.stderr or built.stdout).strip().splitlines()[-5:]
        hint = " (pip install -e '.[docs]')" if "No module named mkdocs" in built.stderr else ""
        raise CliError("the documentation did not build" + hint + ": " + " / ".join(lines))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a page's every file: not logged
        return


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def serve_site(site: Path, host: str, port: int, out: TextIO) -> None:
    """Serve ``site`` until Ctrl-C or SIGTERM (either ends it the same way: the caller's
    scratch copy of the site is removed)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    with http.server.ThreadingHTTPServer((host, port), handler) as server:
        print(f"documentation on http://{host}:{server.server_port}/ (Ctrl-C stops)", file=out)
        out.flush()
        previous = signal.signal(signal.SIGTERM, _interrupted)
        try:
            with contextlib.suppress(KeyboardInterrupt):
                server.serve_forever()
        finally:
            signal.signal(signal.SIGTERM, previous)


def run_docs_command(args: argparse.Namespace, settings: CdcSettings, out: TextIO) -> int:
    if args.build:
        site = Path(args.build)
        build_site(site)
        print(f"documentation written to {site}/index.html", file=out)
        return 0
    with tempfile.TemporaryDirectory(prefix="milvus-cdc-docs-") as scratch:
        build_site(Path(scratch))
        serve_site(Path(scratch), args.host, args.port, out)
    return 0
