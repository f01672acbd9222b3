"""StopSignal: the listeners a worker registers run when the task's stop is set, once per
set, also when registered after it; a removed one does not; a failing one does not keep the
others from running."""

from __future__ import annotations

from replicator.pipeline.stop_signal import StopSignal


def test_listeners_run_when_set_and_not_once_removed() -> None:
    stop = StopSignal()
    calls: list[str] = []

    def failing() -> None:
        calls.append("failing")
        raise RuntimeError("boom")

    stop.when_set(failing)
    remove_b = stop.when_set(lambda: calls.append("b"))
    stop.when_set(lambda: calls.append("c"))
    assert calls == []
    stop.set()
    assert stop.is_set() and calls == ["failing", "b", "c"]

    stop.clear()
    remove_b()
    stop.set()
    assert calls == ["failing", "b", "c", "failing", "c"]
    # registered after the set: called at once
    stop.when_set(lambda: calls.append("late"))
    assert calls[-1] == "late"
