"""Fibers: the daemon's long-running loops (a task's runner, its channel workers, its watchers)
as generators that take turns on one small pool of threads.

A fiber is a generator that yields where its loop would wait. What it yields is the monotonic
time at which it wants to go on (``math.inf``: only when woken); until then it holds no thread.
Anything may end the wait early with :meth:`Fiber.wake` (a record arrived, the task stops). A
fiber woken while it runs goes on again right after its next yield, so no wake-up is lost, and
its code checks after every yield whether what it waits for has come (a wake-up may be for
something else).

A step (the code between two yields) may still block: a write to the target, a barrier waiting
for the task's other channels, a backfill. The pool keeps ``core`` threads and adds one whenever
a fiber has been ready for ``STARVED_AFTER`` while every thread is busy (up to ``limit``); a
thread beyond ``core`` ends after ``SPARE_IDLE`` seconds with nothing to do. A step blocked on
another fiber therefore never starves it, and the number of threads follows what runs at the
moment, not the number of tasks times channels (100 idle tasks on a 16-channel source need no
thread at all between their reads).

Each fiber runs in a ``contextvars.Context`` of its own: its log context (task, channel)
follows it from thread to thread and never leaks into another fiber's step.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from enum import Enum
from typing import Protocol

log = logging.getLogger(__name__)

# a fiber's body: generator of the monotonic times it waits until (math.inf: until woken)
Steps = Generator[float, None, None]
Body = Callable[[Callable[[], None]], Steps]

CORE_THREADS = 8
THREAD_LIMIT = 512
# a fiber ready for this long while every thread is busy: the pool adds a thread
STARVED_AFTER = 0.1
# a thread beyond the core ends after this long without a fiber to run
SPARE_IDLE = 30.0


class _State(Enum):
    READY = "ready"
    RUNNING = "running"
    PARKED = "parked"
    DONE = "done"


class WakeSource(Protocol):
    """What can wake a fiber when it is set (a task's :class:`StopSignal`)."""

    def when_set(self, listener: Callable[[], None]) -> Callable[[], None]: ...


class Fiber:
    """One loop run by a :class:`FiberPool`; ``done`` is set when it has ended, ``error`` is
    what it raised (None: it returned)."""

    def __init__(self, pool: FiberPool, name: str, on_done: Callable[[Fiber], None] | None) -> None:
        self.pool = pool
        self.name = name
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._on_done = on_done
        self._context = contextvars.copy_context()
        self._steps: Steps | None = None
        # the pool's lock guards these
        self._state = _State.READY
        self._woken = False  # woken while running: go on after the yield
        self._parked = 0  # counts parkings: a timer of an earlier one is stale
        self._ready_since = 0.0
        self._unlisten: Callable[[], None] | None = None

    def wake(self) -> None:
        """Go on now if waiting (from any thread; cheap, and never blocks)."""
        self.pool._wake(self)


class FiberPool:
    def __init__(
        self, core: int = CORE_THREADS, limit: int = THREAD_LIMIT, name: str = "fibers"
    ) -> None:
        self.core = core
        self.limit = limit
        self.name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # pool threads wait here for a fiber
        self._clock = threading.Condition(self._lock)  # the timer thread waits here
        self._ready: deque[Fiber] = deque()
        self._timers: list[tuple[float, int, int, Fiber]] = []  # (until, seq, parked, fiber)
        self._seq = itertools.count()
        self._names = itertools.count(1)
        self._threads = 0
        self._idle = 0  # threads waiting for a fiber
        self._fibers = 0  # alive
        self._timer_thread: threading.Thread | None = None
        self.grown = 0  # threads added beyond the core (for the bench and the tests)

    # -- what the pool shows ---------------------------------------------------------------
    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    @property
    def fibers(self) -> int:
        with self._lock:
            return self._fibers

    # -- fibers ----------------------------------------------------------------------------
    def spawn(
        self,
        body: Body,
        *,
        name: str,
        wake_on: WakeSource | None = None,
        on_done: Callable[[Fiber], None] | None = None,
    ) -> Fiber:
        """Run ``body(wake)`` as a fiber (``wake``: the fiber's :meth:`Fiber.wake`); ``wake_on``
        wakes it whenever it is set; ``on_done(fiber)`` is called once it has ended."""
        fiber = Fiber(self, name, on_done)
        fiber._steps = fiber._context.run(body, fiber.wake)
        if wake_on is not None:
            fiber._unlisten = wake_on.when_set(fiber.wake)
        with self._lock:
            self._fibers += 1
            self._make_ready(fiber)
            self._ensure_threads()
        return fiber

    def _wake(self, fiber: Fiber) -> None:
        with self._lock:
            if fiber._state is _State.PARKED:
                self._make_ready(fiber)
            elif fiber._state is _State.RUNNING:
                fiber._woken = True

    def _make_ready(self, fiber: Fiber) -> None:
        fiber._state = _State.READY
        fiber._ready_since = time.monotonic()
        self._ready.append(fiber)
        if self._idle:
            self._work.notify()
        else:
            self._clock.notify()  # the timer thread watches for starvation

    def _step(self, fiber: Fiber) -> None:
        steps = fiber._steps
        assert steps is not None
        try:
            until = fiber._context.run(next, steps)
        except StopIteration:
            self._end(fiber, None)
            return
        except BaseException as exc:  # noqa: BLE001 - the fiber's outcome, for its owner
            self._end(fiber, exc)
            return
        with self._lock:
            if fiber._woken or until <= time.monotonic():
                self._make_ready(fiber)
                return
            fiber._state = _State.PARKED
            fiber._parked += 1
            if until != math.inf:
                first = not self._timers or until < self._timers[0][0]
                heapq.heappush(self._timers, (until, next(self._seq), fiber._parked, fiber))
                if first:
                    self._clock.notify()

    def _end(self, fiber: Fiber, error: BaseException | None) -> None:
        with self._lock:
            fiber._state = _State.DONE
            self._fibers -= 1
        if fiber._unlisten is not None:
            fiber._unlisten()
        fiber.error = error
        fiber._steps = None
        fiber.done.set()
        if fiber._on_done is not None:
            try:
                fiber._on_done(fiber)
            except Exception:
                log.exception("fiber %s: its end could not be reported", fiber.name)

    # -- threads ---------------------------------------------------------------------------
    def _ensure_threads(self) -> None:
        """Under the lock: the core threads and the timer thread run."""
        while self._threads < self.core:
            self._add_thread()
        if self._timer_thread is None:
            self._timer_thread = threading.Thread(
                target=self._keep_time, name=f"{self.name}-timer", daemon=True
            )
            self._timer_thread.start()

    def _add_thread(self) -> None:
        self._threads += 1
        number = next(self._names)
        threading.Thread(target=self._serve, name=f"{self.name}-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._ready:
                    spare = self._threads > self.core
                    self._idle += 1
                    woken = self._work.wait(SPARE_IDLE if spare else None)
                    self._idle -= 1
                    if not woken and not self._ready and self._threads > self.core:
                        self._threads -= 1
                        return
                fiber = self._ready.popleft()
                fiber._state = _State.RUNNING
                fiber._woken = False
            self._step(fiber)

    def _keep_time(self) -> None:
        """The timer thread: wakes the fibers whose wait has ended, and adds a thread when
        ready fibers wait while every thread is busy."""
        while True:
            with self._lock:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, parked, fiber = heapq.heappop(self._timers)
                    if fiber._state is _State.PARKED and fiber._parked == parked:
                        self._make_ready(fiber)
                wait = self._timers[0][0] - now if self._timers else 1.0
                if self._ready and not self._idle:
                    starved = now - self._ready[0]._ready_since
                    if starved >= STARVED_AFTER and self._threads < self.limit:
                        self.grown += 1
                        self._add_thread()
                        if self._threads == self.limit:
                            log.warning("%s: %d threads, the limit", self.name, self.limit)
                    wait = min(wait, STARVED_AFTER / 2)
                self._clock.wait(max(wait, 0.0))


def pause(stop: threading.Event, seconds: float) -> Steps:
    """In a fiber: wait ``seconds``, or less once ``stop`` is set (the fiber is woken by it:
    spawned with ``wake_on``)."""
    until = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < until:
        yield until


_pool: FiberPool | None = None
_pool_lock = threading.Lock()


def shared_pool() -> FiberPool:
    """The process's pool: every task of the daemon runs on it."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = FiberPool()
        return _pool
