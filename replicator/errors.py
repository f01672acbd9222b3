"""The engine's errors: one root, and a ``retriable`` attribute the retry loops read.

CdcError                          retriable = False unless said otherwise
├── SourceError
│   ├── SourceUnavailableError    the broker cannot be reached (retriable)
│   │   └── PulsarConfigError     the broker refuses the settings (sources/pulsar.py; not)
│   ├── WalTruncatedError         the resume point was lost to the queue's retention
│   └── SourceConfigError         a WAL cannot be opened with the settings given (ValueError)
├── SinkError
│   ├── TargetUnavailableError    the target cannot be reached or timed out (retriable)
│   ├── SinkSessionLostError      a target transaction failed: the runner connects again
│   └── TargetRejectedError       the target refused the request; ``rejection`` says why
└── TaskFailedError               needs an operator: the task stops with the message as reason
    └── UnfollowableSwitchError   the source moved its WAL where this daemon cannot read

The metastore has its own root (``metastore.MetaStoreError``) with the same ``retriable``
attribute; :func:`is_retriable` reads either.

A rejection is classified once, where the target answered (``MilvusTarget._call``), from the gRPC
code and the status codes of the answer; callers test ``exc.rejection``, never the text.
"""

from __future__ import annotations

import enum


class CdcError(Exception):
    retriable: bool = False


# --- source -------------------------------------------------------------------------------------
class SourceError(CdcError):
    """Reading the source's WAL failed."""


class SourceUnavailableError(SourceError):
    """The broker cannot be reached; retried with backoff."""

    retriable = True


class WalTruncatedError(SourceError):
    """The position to resume from is no longer held by the queue: records were lost to
    retention. The task fails and says so (a backfill can repair the target)."""


class SourceConfigError(SourceError, ValueError):
    """A WAL cannot be opened with the settings given; the message names what is missing."""


# --- target -------------------------------------------------------------------------------------
class Rejection(enum.Enum):
    """Why a target refused a request, as far as a caller needs to know."""

    ALREADY_EXISTS = "already exists"
    NOT_FOUND = "not found"
    UNIMPLEMENTED = "unimplemented"  # the target does not offer the call (or that use of it)
    LOADED = "loaded"  # refused while the collection is loaded (drop index)
    # the replica count cannot be had: too few query nodes, or (2.3) a loaded collection's
    # count cannot change
    REPLICAS = "replicas"
    OTHER = "other"


class SinkError(CdcError):
    """Writing to the target failed."""


class TargetUnavailableError(SinkError):
    retriable = True


class SinkSessionLostError(SinkError):
    """A transaction of a transactional target (Kafka) failed and its outcome is the target's
    to tell: the task's workers stop and the runner connects again, starting from what the
    target committed (retried with backoff, never a channel's own rewind)."""

    retriable = True


class TargetRejectedError(SinkError):
    def __init__(self, message: str, rejection: Rejection = Rejection.OTHER) -> None:
        super().__init__(message)
        self.rejection = rejection


# --- task ---------------------------------------------------------------------------------------
class TaskFailedError(CdcError):
    """Stops the task: needs an operator. The message is the task's reason."""


class UnfollowableSwitchError(TaskFailedError):
    """The source moved its WAL somewhere this daemon cannot read."""


def is_retriable(exc: BaseException) -> bool:
    """Try again later? An engine or metastore error says so itself; an OSError (a socket the
    client libraries did not wrap) is."""
    if isinstance(exc, OSError):
        return True
    return bool(getattr(exc, "retriable", False))
