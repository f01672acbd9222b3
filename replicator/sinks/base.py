"""The sink contract's errors (see :mod:`replicator.errors`): an unreachable target is retried
with backoff, a request the target rejects fails the task unless its caller expected that
``rejection`` (already exists, not found, not offered by this target)."""

from __future__ import annotations

from replicator.errors import Rejection, SinkError, TargetRejectedError, TargetUnavailableError

__all__ = ["Rejection", "SinkError", "TargetRejectedError", "TargetUnavailableError"]
