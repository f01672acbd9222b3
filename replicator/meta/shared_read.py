"""One read for many callers: the runners of a daemon that ask the source's catalog at the same
moment (fifty tasks starting together) share one etcd read instead of making fifty.

Every caller gets the answer of a read that *started after its call*, never an older one: a
caller that arrives while a read is under way waits for it to end and then for the next one,
which it shares with whoever arrived meanwhile. So sharing never makes an answer staler than
reading alone would (a collection created just before the call is in the answer).

A poller that can take a slightly older answer says so with ``max_age``: an answer whose read
started at most that many seconds before the call is returned as it is (fifty tasks polling
the source's aliases every 2 seconds make about one read a second, not twenty-five)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedRead(Generic[T]):
    def __init__(self, read: Callable[[], T], max_age: float = 0.0) -> None:
        self._read = read
        self._max_age = max_age
        self._answer_started = -float("inf")  # when the read of the answer kept started
        self._cond = threading.Condition()
        self._started = 0  # reads started so far
        self._finished = 0  # the number of the last read that ended
        self._running = False
        self._answer: tuple[T | None, BaseException | None] = (None, None)
        self.reads = 0  # reads made (for tests and the bench)

    def __call__(self) -> T:
        with self._cond:
            if time.monotonic() - self._answer_started <= self._max_age:
                return self._result()
            wanted = self._started + 1  # the first read to start after this call
            while self._finished < wanted:
                if not self._running:
                    self._running = True
                    self._started += 1
                    number = self._started
                    break
                self._cond.wait()
            else:
                return self._result()
        started_at = time.monotonic()
        try:
            value: T | None = self._read()
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - every caller of this read gets it
            value, error = None, exc
        with self._cond:
            self.reads += 1
            self._answer, self._answer_started = (value, error), started_at
            self._finished, self._running = number, False
            self._cond.notify_all()
            return self._result()

    def _result(self) -> T:
        value, error = self._answer
        if error is not None:
            raise error
        return value  # type: ignore[return-value]
