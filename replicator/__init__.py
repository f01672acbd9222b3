"""The replication engine: WAL readers, decoding, the per-task pipeline and sinks."""

from replicator.task_runner import FailureCallback, NoEngineRunner, RunnerFactory, TaskRunner

__all__ = ["FailureCallback", "NoEngineRunner", "RunnerFactory", "TaskRunner"]
