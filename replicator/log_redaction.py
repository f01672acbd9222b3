"""The last line of defence of every log: known secrets replaced by ``******`` in each record.

The daemon registers its configuration's secrets and each task's; a Spark driver (backfill,
verify digests) those it was handed on stdin, before it logs anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from replicator.log_context import channel_var, task_id_var


class SecretRedactor(logging.Filter):
    """Replaces known secret strings in every record's final message."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *secrets: str) -> None:
        with self._lock:
            self._secrets.update(s for s in secrets if s and len(s) >= 3)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "******")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = self.scrub(record.getMessage())
        record.msg, record.args = message, None
        if record.exc_info:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        record.task_id = task_id_var.get()
        record.channel = channel_var.get()
        return True


def connect_secrets(*connects: dict[str, Any]) -> list[str]:
    """The password and token of Milvus connection settings (a ``milvus_connect_param``)."""
    return [str(c.get(key) or "") for c in connects for key in ("password", "token")]


def redact_root_logging(secrets: Iterable[str]) -> SecretRedactor:
    """A redactor of ``secrets`` on every handler of the root logger (call after
    ``logging.basicConfig``); returns it, to scrub texts that are not log lines too."""
    redactor = SecretRedactor()
    redactor.add(*secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(redactor)
    return redactor


__all__ = ["SecretRedactor", "connect_secrets", "redact_root_logging"]
