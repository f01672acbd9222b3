"""Task and position persistence: one contract (``base.MetaStore``), one module per backend."""

from metastore.base import Lease, Member, MetaStore, Position, StoreFormat, TaskRecord, TaskState
from metastore.errors import (
    ConcurrentUpdateError,
    FencedError,
    MetaStoreError,
    MetaStoreUnavailableError,
    PositionConflictError,
    PositionError,
    PositionRegressionError,
    StoreFormatError,
    TaskExistsError,
    TaskNotFoundError,
)

__all__ = [
    "ConcurrentUpdateError",
    "FencedError",
    "Lease",
    "Member",
    "MetaStore",
    "MetaStoreError",
    "MetaStoreUnavailableError",
    "Position",
    "PositionConflictError",
    "PositionError",
    "PositionRegressionError",
    "StoreFormat",
    "StoreFormatError",
    "TaskExistsError",
    "TaskNotFoundError",
    "TaskRecord",
    "TaskState",
]
