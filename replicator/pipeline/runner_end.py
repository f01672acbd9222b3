"""How a task's runner ended, told the same way by the runner in the daemon
(:mod:`runner`) and by the runner of channel groups (:mod:`group_runner`)."""

from __future__ import annotations

import asyncio
import logging

from metastore import FencedError, MetaStoreError, TaskNotFoundError
from replicator.errors import CdcError
from replicator.task_runner import FailureCallback


def fenced_cause(exc: BaseException) -> FencedError | None:
    """The ``FencedError`` behind an error (a worker wraps what stops it), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, FencedError):
            return seen
        seen = seen.__cause__
    return None


def end_reason(exc: Exception, log: logging.Logger) -> str | None:
    """Log the end of a runner on ``exc``; the failure to report, or None when it is not the
    task's failure (the task deleted, or this daemon fenced off: the supervisor sees the runner
    finished and starts it again if the daemon still holds it)."""
    if isinstance(exc, TaskNotFoundError):
        log.info("task deleted; runner stops")
        return None
    if isinstance(exc, (CdcError, MetaStoreError)):
        fenced = fenced_cause(exc)
        if fenced is not None:
            log.warning("runner stops: %s", fenced)
            return None
        log.error("task failed: %s", exc)
        return str(exc)
    log.error("task runner crashed", exc_info=exc)
    return f"internal error: {type(exc).__name__}: {exc}"


def report_failure(
    loop: asyncio.AbstractEventLoop | None, on_failure: FailureCallback, task_id: str, reason: str
) -> None:
    """Hand a runner's failure to the supervisor's loop (none: the runner never started)."""
    if loop is not None:
        asyncio.run_coroutine_threadsafe(on_failure(task_id, reason), loop)
