"""The sink contract: ``write`` buffers, ``flush`` returns when the target acknowledged.

Errors carry ``retriable``: an unreachable target is retried with backoff, a request the target
rejects fails the task.
"""

from __future__ import annotations


class SinkError(Exception):
    retriable = False


class TargetUnavailableError(SinkError):
    retriable = True


class TargetRejectedError(SinkError):
    retriable = False
