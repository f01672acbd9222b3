"""Which producers of a Kafka target's channel groups a task may have left open, kept in its
state (``kafka-groups``), and their fencing before the task writes again (see
:mod:`replicator.sinks.kafka_groups`)."""

from __future__ import annotations

from typing import Any

from replicator.pipeline.task_state import RunnerState
from replicator.sinks.kafka_groups import TASK_PRODUCER, fence_producers

FENCE_TIMEOUT = 30.0


def fence_recorded_groups(state: RunnerState, params: dict[str, Any], task_id: str) -> None:
    """A task of one process: fence the groups' producers an earlier layout left (once)."""
    previous = state.kafka_groups()
    if previous:
        fence_producers(params, task_id, previous, FENCE_TIMEOUT)
        state.save_kafka_groups([])


def fence_and_record(
    state: RunnerState, params: dict[str, Any], task_id: str, groups: list[str]
) -> None:
    """Before a task's groups start: fence every producer of the earlier layout and of this
    one, and the task's own (a group reading the positions topic would wait on another's open
    transaction, and the task's own target is made while the groups start), then record this
    layout, so the next start, whatever its N, fences it."""
    previous = state.kafka_groups()
    fence_producers(params, task_id, [TASK_PRODUCER, *sorted({*previous, *groups})], FENCE_TIMEOUT)
    state.save_kafka_groups(groups)
