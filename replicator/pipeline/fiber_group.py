"""Running a task's fibers as one group: the first error stops them all and is raised at the end."""

from __future__ import annotations

import math
from collections.abc import Callable

from replicator.errors import TaskFailedError
from replicator.fibers import Body, Fiber, FiberPool, Steps
from replicator.log_context import log_context
from replicator.pipeline.stop_signal import StopSignal

# (fiber name, channel for the log or None, body)
NamedBody = tuple[str, str | None, Body]


def run_fiber_group(
    pool: FiberPool,
    task_id: str,
    bodies: list[NamedBody],
    stop: StopSignal,
    wake: Callable[[], None],
) -> Steps:
    """A fiber per body, logging with the task and its channel; ``wake`` (the caller's fiber)
    is called as each ends. The first error sets ``stop`` and is raised once every fiber has
    ended."""
    errors: list[BaseException] = []

    def ended(fiber: Fiber) -> None:
        if fiber.error is not None:  # any error stops the task
            errors.append(fiber.error)
            stop.set()
        wake()

    def logged(channel: str | None, body: Body) -> Body:
        def steps(wake: Callable[[], None]) -> Steps:
            with log_context(task_id=task_id, channel=channel):
                yield from body(wake)

        return steps

    fibers = [
        pool.spawn(
            logged(channel, body),
            name=f"{task_id[:8]}-{name}",
            wake_on=stop,
            on_done=ended,
        )
        for name, channel, body in bodies
    ]
    while not all(f.done.is_set() for f in fibers):
        yield math.inf
    if errors:
        error = errors[0]
        if isinstance(error, Exception):
            raise error
        raise TaskFailedError(f"a worker of the task ended on {error!r}") from error


__all__ = ["NamedBody", "run_fiber_group"]
