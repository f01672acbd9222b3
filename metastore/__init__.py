"""Task and position persistence: one contract (``base.MetaStore``), one module per backend."""

from metastore.base import MetaStore, Position, TaskRecord, TaskState
from metastore.errors import (
    ConcurrentUpdateError,
    MetaStoreError,
    MetaStoreUnavailableError,
    PositionConflictError,
    PositionError,
    PositionRegressionError,
    TaskExistsError,
    TaskNotFoundError,
)

__all__ = [
    "ConcurrentUpdateError",
    "MetaStore",
    "MetaStoreError",
    "MetaStoreUnavailableError",
    "Position",
    "PositionConflictError",
    "PositionError",
    "PositionRegressionError",
    "TaskExistsError",
    "TaskNotFoundError",
    "TaskRecord",
    "TaskState",
]
