"""Which target a task writes to: a Milvus (``milvus_connect_param``) or a Kafka topic
(``kafka_connect_param``), opened for the task's runner."""

from __future__ import annotations

from metastore import TaskRecord
from replicator.config.task_spec import TaskSpec
from replicator.sinks.kafka import KafkaTarget
from replicator.sinks.milvus import MilvusTarget


def incarnation(task: TaskRecord) -> str:
    """Tells a task from an earlier one of the same id (deleted, then created again): the
    positions topic keeps the earlier one's keys."""
    return f"{task.created_at:.6f}"


def open_target(task: TaskRecord) -> MilvusTarget:
    """The target of a task, as its spec names it."""
    spec = TaskSpec.of(task)
    if spec.is_kafka:
        return KafkaTarget(spec.target_param, task.task_id, incarnation(task))
    return MilvusTarget(spec.target_param)
