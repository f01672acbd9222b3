"""Where a benchmark's table goes: appended to its results file under ``bench/results/``."""

from __future__ import annotations

from pathlib import Path


def append_result(out: Path, title: str, text: str) -> None:
    """``text`` appended to ``out``, which is made with ``title`` as its heading when missing."""
    if not out.exists():
        out.write_text(f"# {title}\n")
    with out.open("a", encoding="utf-8") as f:
        f.write("\n" + text)
