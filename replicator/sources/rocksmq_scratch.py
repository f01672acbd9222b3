"""The scratch directories of RocksMQ secondary instances (:mod:`rocksmq`): one each, holding
the instance's info log, named after the process that made it.

A scratch directory is removed when its instance closes, or at the exit of the process that
holds it. A process that cannot run its finalizers (``kill -9``, the out-of-memory killer, a
channel group's process ending by ``os._exit`` when its daemon died) leaves its directories
behind: each new one is made after removing those whose process no longer runs, so they do not
pile up in the temporary directory over restarts.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile

log = logging.getLogger(__name__)

PREFIX = "milvus-cdc-rocksmq-"
# <PREFIX><pid>-<mkdtemp's random part>; a name without a pid (0.4.0 and before) is left alone
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-")


def make_scratch(parent: str | None) -> str:
    """A new scratch directory in ``parent`` (default: the temporary directory), once the ones
    of processes that ended are removed."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    remove_orphans(parent or tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent)


def remove_orphans(parent: str) -> list[str]:
    """Remove the scratch directories in ``parent`` whose process no longer runs; their names.
    A process id used again by another process keeps its directory until that one ends too.
    One removed under a live instance (a process of another PID namespace sharing the
    directory) costs it nothing but its info log: a secondary keeps nothing else there, and
    goes on writing to the file it has open."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        if match is None or _running(int(match.group(1))):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        removed.append(name)
    if removed:
        log.info(
            "removed %d RocksMQ scratch director%s of processes that ended: %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            ", ".join(sorted(removed)),
        )
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


__all__ = ["PREFIX", "make_scratch", "remove_orphans"]
