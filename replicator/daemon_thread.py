"""Await a blocking call made in a daemon thread of its own.

``asyncio.to_thread`` runs the call on the loop's executor, whose threads the interpreter joins
at exit: a call blocked on a source that hangs would then hold the daemon's exit, and occupy an
executor thread for as long as it hangs. Here the call has a thread of its own, which nothing
waits for once its awaiting coroutine has given up (``asyncio.wait_for``) or the loop has
closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], *args: Any, name: str = "") -> T:
    """``fn(*args)`` in a new daemon thread; its result or its exception."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # its awaiter gave up on it
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(T, result))

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again in the awaiting coroutine
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name or getattr(fn, "__name__", "call"), daemon=True).start()
    return await future
