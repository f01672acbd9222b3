"""The processes alive now, by parent, read from ``/proc`` (Linux): a daemon's channel groups
are the children of its fork server, itself a child of the daemon."""

from __future__ import annotations

import os
from pathlib import Path


def children_by_parent() -> dict[int, list[int]]:
    """parent pid -> the pids of its children alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):  # ended meanwhile
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """``pid`` and its descendants alive now, breadth first."""
    children = children_by_parent()
    found = [pid]
    for each in found:  # grows as it goes
        found += children.get(each, [])
    return found


__all__ = ["children_by_parent", "descendants"]
