"""Errors raised by metastore backends.

MetaStoreError                 root; ``retriable`` tells the caller whether to try again
├── MetaStoreUnavailableError       the backing store cannot be reached (retriable)
├── TaskExistsError            create with a task id that is already stored
├── TaskNotFoundError          the task id is not stored
├── ConcurrentUpdateError      a task changed since the revision the caller read
├── PositionError
│   ├── PositionConflictError  the stored position is not the one the caller expected
│   └── PositionRegressionError the new position is older than the stored one
├── FencedError                a writer that was let go (an abandoned runner), or whose task
│                              lease is no longer held (a stale owner), wrote
└── StoreFormatError           the store holds a format this release cannot read or migrate
"""

from __future__ import annotations


class MetaStoreError(Exception):
    retriable: bool = False


class MetaStoreUnavailableError(MetaStoreError):
    retriable = True


class TaskExistsError(MetaStoreError):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} already exists")
        self.task_id = task_id


class TaskNotFoundError(MetaStoreError):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} not found")
        self.task_id = task_id


class ConcurrentUpdateError(MetaStoreError):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} was changed concurrently; read it again")
        self.task_id = task_id


class PositionError(MetaStoreError):
    pass


class PositionConflictError(PositionError):
    """Another writer saved a position for this channel since the caller last read it."""


class PositionRegressionError(PositionError):
    """Positions never move backwards."""


class FencedError(MetaStoreError):
    """A write by a writer whose right to write was withdrawn: a runner let go
    (``metastore.fenced``) or a lease no longer held (``metastore.base.Lease``)."""


class StoreFormatError(MetaStoreError):
    """The store's data is in a format this release does not read (a newer release wrote it),
    or a migration to the current format failed; nothing was changed by the refusal."""
