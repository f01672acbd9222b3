"""Structured logs: JSON lines in production, readable lines in a terminal.

Every line carries the task id and channel of the code that wrote it (``log_context``), and a
last-line-of-defence filter replaces every registered secret with ``******``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from replicator.log_context import log_context
from replicator.log_redaction import SecretRedactor

__all__ = [
    "ConsoleFormatter",
    "JsonFormatter",
    "SecretRedactor",
    "configure_logging",
    "log_context",
]


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback that quotes the offending bytes
    (an ``Authorization`` line among them): keep one line naming the error class only."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "malformed HTTP request refused with %d: %s"
            record.args = (exc.code, type(exc).__name__)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("task_id", "channel"):
            value = getattr(record, key, None)
            if value:
                entry[key] = value
        if record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(
            f"{key}={value}"
            for key in ("task_id", "channel")
            if (value := getattr(record, key, None))
        )
        line = (
            f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.name}: "
            f"{record.getMessage()}" + (f" [{context}]" if context else "")
        )
        if record.exc_text:
            line += "\n" + record.exc_text
        return line


def configure_logging(level: str = "INFO", fmt: str = "auto") -> SecretRedactor:
    """Install one handler on the root logger; returns the redactor to register secrets with."""
    redactor = SecretRedactor()
    handler = logging.StreamHandler(sys.stderr)
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler.setFormatter(JsonFormatter() if use_json else ConsoleFormatter())
    handler.addFilter(redactor)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestFilter) for f in server_log.filters):
        server_log.addFilter(MalformedRequestFilter())
    return redactor
