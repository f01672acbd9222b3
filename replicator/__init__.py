"""The replication engine: WAL readers, decoding, the per-task pipeline and sinks."""

from replicator.task_runner import FailureCallback, RunnerFactory, TaskRunner

__all__ = ["FailureCallback", "RunnerFactory", "TaskRunner"]
