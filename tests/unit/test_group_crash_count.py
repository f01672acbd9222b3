"""A Kafka task's channel groups whose process dies without a reason soon after every start
fail the task after CRASH_LIMIT such ends in a row, instead of restarting for ever behind a
task shown Running (replicator/pipeline/group_runner.py)."""

from __future__ import annotations

import pytest

from replicator.errors import SinkSessionLostError, TaskFailedError
from replicator.pipeline.group_runner import (
    CRASH_LIMIT,
    CRASH_WINDOW,
    CrashCount,
    GroupCrashedError,
)

CRASH = GroupCrashedError("the process of channel group g1 (dml_1) ended with exit code -9")


def test_quick_crashes_in_a_row_fail_the_task_naming_the_end_and_the_count():
    count = CrashCount()
    for _ in range(CRASH_LIMIT - 1):
        count.ended(CRASH, 3.0)
    with pytest.raises(TaskFailedError, match=rf"exit code -9, {CRASH_LIMIT} times in a row"):
        count.ended(CRASH, 3.0)


def test_a_run_that_lasted_or_another_retriable_end_starts_the_count_again():
    count = CrashCount()
    for _ in range(CRASH_LIMIT - 1):
        count.ended(CRASH, 3.0)
    count.ended(CRASH, CRASH_WINDOW + 1)  # ran a while: read and committed meanwhile
    for _ in range(CRASH_LIMIT - 1):
        count.ended(CRASH, 3.0)
    count.ended(SinkSessionLostError("kafka: the transaction's outcome is unknown"), 1.0)
    for _ in range(CRASH_LIMIT - 1):
        count.ended(CRASH, 3.0)
    assert count.count == CRASH_LIMIT - 1
