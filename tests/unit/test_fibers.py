"""The fiber pool: waits hold no thread, no wake-up is lost, blocked steps get more threads,
and each fiber keeps its own log context."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import pytest

from replicator.fibers import FiberPool, Steps, pause
from replicator.log_context import log_context, task_id_var
from replicator.pipeline.stop_signal import StopSignal


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    until = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < until, "timed out"
        time.sleep(0.005)


def test_a_thousand_waiting_fibers_hold_no_thread_and_each_wakes_when_told() -> None:
    pool = FiberPool(core=2, name="t-wait")
    flags = [False] * 1000
    woken: list[int] = []
    wakes: list[Callable[[], None]] = []

    def body(i: int) -> Callable[[Callable[[], None]], Steps]:
        def steps(wake: Callable[[], None]) -> Steps:
            wakes.append(wake)
            while not flags[i]:
                yield math.inf
            woken.append(i)

        return steps

    before = threading.active_count()
    fibers = [pool.spawn(body(i), name=f"f{i}") for i in range(1000)]
    _wait(lambda: len(wakes) == 1000)
    time.sleep(0.05)
    assert threading.active_count() - before <= 3  # two pool threads and the timer
    assert woken == []
    for i in range(0, 1000, 2):
        flags[i] = True
    for wake in wakes:
        wake()
    _wait(lambda: len(woken) == 500)
    assert sorted(woken) == list(range(0, 1000, 2))
    assert not any(f.done.is_set() for f in fibers[1::2])
    for i in range(1, 1000, 2):
        flags[i] = True
        wakes[i]()
    _wait(lambda: all(f.done.is_set() for f in fibers))
    assert pool.fibers == 0


def test_a_wake_while_the_fiber_runs_is_not_lost() -> None:
    """The record comes after the fiber looked and before it yielded: it goes on anyway."""
    pool = FiberPool(core=1, name="t-race")
    looked, came = threading.Event(), threading.Event()
    box: dict[str, Callable[[], None]] = {}
    rounds: list[int] = []

    def steps(wake: Callable[[], None]) -> Steps:
        box["wake"] = wake
        looked.set()
        came.wait(5)  # the wake-up arrives while this step runs
        rounds.append(1)
        yield math.inf  # parked only if the wake-up were lost
        rounds.append(2)

    fiber = pool.spawn(steps, name="racer")
    looked.wait(5)
    box["wake"]()
    came.set()
    assert fiber.done.wait(5)
    assert rounds == [1, 2]


def test_a_timed_wait_ends_at_its_time_and_the_stop_ends_it_early() -> None:
    pool = FiberPool(core=1, name="t-time")
    stop = StopSignal()
    ends: dict[str, float] = {}

    def sleeper(name: str, seconds: float) -> Callable[[Callable[[], None]], Steps]:
        def steps(wake: Callable[[], None]) -> Steps:
            started = time.monotonic()
            yield from pause(stop if name == "stopped" else threading.Event(), seconds)
            ends[name] = time.monotonic() - started

        return steps

    timed = pool.spawn(sleeper("timed", 0.3), name="timed")
    stopped = pool.spawn(sleeper("stopped", 30.0), name="stopped", wake_on=stop)
    assert timed.done.wait(5)
    assert 0.29 <= ends["timed"] < 2.0
    assert not stopped.done.is_set()
    stop.set()
    assert stopped.done.wait(5)
    assert ends["stopped"] < 5.0


def test_steps_blocked_on_each_other_get_threads_beyond_the_core_which_then_go() -> None:
    """Eight fibers meet at a barrier on a pool of two: without more threads they would wait
    for ever; the spare threads end once idle."""
    pool = FiberPool(core=2, name="t-grow")
    barrier = threading.Barrier(8, timeout=10)
    passed: list[int] = []

    def body(i: int) -> Callable[[Callable[[], None]], Steps]:
        def steps(wake: Callable[[], None]) -> Steps:
            barrier.wait()  # a step that blocks on the other fibers
            passed.append(i)
            yield 0.0

        return steps

    fibers = [pool.spawn(body(i), name=f"b{i}") for i in range(8)]
    for fiber in fibers:
        assert fiber.done.wait(15)
        assert fiber.error is None
    assert sorted(passed) == list(range(8))
    assert pool.grown >= 6
    assert pool.threads >= 8


def test_spare_threads_end_after_their_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("replicator.fibers.SPARE_IDLE", 0.2)
    pool = FiberPool(core=1, name="t-shrink")
    barrier = threading.Barrier(4, timeout=10)

    def steps(wake: Callable[[], None]) -> Steps:
        barrier.wait()
        yield 0.0

    fibers = [pool.spawn(steps, name=f"s{i}") for i in range(4)]
    for fiber in fibers:
        assert fiber.done.wait(15)
    assert pool.threads >= 4
    _wait(lambda: pool.threads == 1)


def test_an_error_ends_the_fiber_and_is_handed_to_its_owner() -> None:
    pool = FiberPool(core=1, name="t-error")
    seen: list[BaseException | None] = []

    def steps(wake: Callable[[], None]) -> Steps:
        yield 0.0
        raise ValueError("the channel broke")

    fiber = pool.spawn(steps, name="bad", on_done=lambda f: seen.append(f.error))
    assert fiber.done.wait(5)
    assert isinstance(fiber.error, ValueError)
    assert seen == [fiber.error]


def test_each_fiber_keeps_its_log_context_across_threads_and_leaks_it_nowhere() -> None:
    pool = FiberPool(core=3, name="t-context")
    seen: dict[str, list[str | None]] = {}
    wakes: list[Callable[[], None]] = []

    def body(task: str) -> Callable[[Callable[[], None]], Steps]:
        def steps(wake: Callable[[], None]) -> Steps:
            wakes.append(wake)
            mine = seen.setdefault(task, [])
            with log_context(task_id=task):
                for _ in range(20):
                    yield time.monotonic() + 0.001
                    mine.append(task_id_var.get())
            mine.append(task_id_var.get())

        return steps

    fibers = [pool.spawn(body(f"task-{i}"), name=str(i)) for i in range(6)]
    plain = pool.spawn(lambda wake: _read_context(seen), name="plain")
    for fiber in [*fibers, plain]:
        assert fiber.done.wait(10)
    for i in range(6):
        task = f"task-{i}"
        assert seen[task][:20] == [task] * 20
        assert seen[task][20] is None  # its with-block ended
    assert set(seen["plain"]) == {None}


def _read_context(seen: dict[str, list[str | None]]) -> Steps:
    mine = seen.setdefault("plain", [])
    for _ in range(30):
        mine.append(task_id_var.get())
        yield time.monotonic() + 0.001
