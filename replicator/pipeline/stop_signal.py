"""The event that stops a task's workers, able to wake a worker asleep elsewhere.

A channel worker reading idly waits for its shared channel to call it back (it is a fiber,
:mod:`replicator.fibers`), not on the stop event, for up to several seconds. Its fiber and its
reader register wake-ups with :meth:`StopSignal.when_set`, so a task stops (pause, delete,
hand-over, drain) as soon as it is asked, not at the end of the wait.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class StopSignal(threading.Event):
    """A :class:`threading.Event` that calls its listeners when it is set."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Callable[[], None]] = []
        self._listeners_lock = threading.Lock()

    def when_set(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when the signal is set (at once when it is already); returns the
        function that removes it."""
        with self._listeners_lock:
            self._listeners.append(listener)
        if self.is_set():
            _call(listener)
        return lambda: self._remove(listener)

    def _remove(self, listener: Callable[[], None]) -> None:
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def nudge(self) -> None:
        """Call the listeners without setting the signal: the idle readers return at once
        with what they have (the latest time tick), and go on."""
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            _call(listener)

    def set(self) -> None:
        super().set()
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            _call(listener)


def _call(listener: Callable[[], None]) -> None:
    try:
        listener()
    except Exception:  # a wake-up that fails must not keep the others from stopping
        log.exception("waking a stopping worker failed")
