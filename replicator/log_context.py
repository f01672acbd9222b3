"""Task and channel of the running code, carried into every log line (contextvars)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

task_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("task_id", default=None)
channel_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("channel", default=None)


@contextlib.contextmanager
def log_context(*, task_id: str | None = None, channel: str | None = None) -> Iterator[None]:
    tokens = []
    if task_id is not None:
        tokens.append((task_id_var, task_id_var.set(task_id)))
    if channel is not None:
        tokens.append((channel_var, channel_var.set(channel)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
