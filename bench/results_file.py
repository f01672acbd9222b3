"""What a benchmark's table says of itself and where it goes: the code it measured
(``code_version``), appended to its results file under ``bench/results/`` (``append_result``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def code_version() -> str:
    """The commit the benchmark ran on (and whether the work tree differed from it)."""
    try:
        head = _git("log", "-1", "--format=%h %s")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"commit {head[:80]}" + (" (with uncommitted changes)" if dirty else "")


def _git(*args: str) -> str:
    argv = ["git", "-C", str(REPO), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def append_result(out: Path, title: str, text: str) -> None:
    """``text`` appended to ``out``, which is made with ``title`` as its heading when missing."""
    if not out.exists():
        out.write_text(f"# {title}\n")
    with out.open("a", encoding="utf-8") as f:
        f.write("\n" + text)
