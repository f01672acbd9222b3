"""Which target a task writes to: a Milvus (``milvus_connect_param``) or a Kafka topic
(``kafka_connect_param``), opened for the task's runner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metastore import TaskRecord
from replicator.sinks.kafka import KafkaTarget
from replicator.sinks.milvus import MilvusTarget

KAFKA_PARAM = "kafka_connect_param"
MILVUS_PARAM = "milvus_connect_param"
DEFAULT_CONNECT_TIMEOUT = 10  # seconds (server/tasks/requests.py fills it into every stored task)


def is_kafka(spec: Mapping[str, Any]) -> bool:
    return bool(spec.get(KAFKA_PARAM))


def connect_timeout(spec: Mapping[str, Any]) -> float:
    """The task's ``connect_timeout`` (its target's, 10 s when left out): the daemon waits that
    long at most for anything it must reach to answer a request about the task."""
    param = spec.get(KAFKA_PARAM) or spec.get(MILVUS_PARAM) or {}
    return float(param.get("connect_timeout") or DEFAULT_CONNECT_TIMEOUT)


def incarnation(task: TaskRecord) -> str:
    """Tells a task from an earlier one of the same id (deleted, then created again): the
    positions topic keeps the earlier one's keys."""
    return f"{task.created_at:.6f}"


def open_target(task: TaskRecord) -> MilvusTarget:
    spec = task.spec
    if is_kafka(spec):
        return KafkaTarget(dict(spec[KAFKA_PARAM]), task.task_id, incarnation(task))
    return MilvusTarget(dict(spec[MILVUS_PARAM]))
