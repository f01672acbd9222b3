"""The pipe between a task's runner and the process of one of its channel groups
(:mod:`group_runner`): calls answered by the other end (the group's metastore calls and target
metadata calls, made by the runner) and notices (status, failure, stop, wake).

Messages are tuples: ``("call", id, kind, payload)`` answered by ``("reply", id, ok, value)``;
anything else is a notice, handed to ``on_notice``. What crosses is small and rare (a position
save a second per channel, a DDL): rows never do.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from metastore import MetaStoreUnavailableError

log = logging.getLogger(__name__)

Serve = Callable[[str, Any], Any]
Notice = Callable[[tuple[Any, ...]], None]


class _Slot:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


class Link:
    def __init__(self, conn: Connection, name: str) -> None:
        self._conn = conn
        self._name = name
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._slots_lock = threading.Lock()
        self.closed = threading.Event()

    def send(self, message: tuple[Any, ...]) -> None:
        """Raises ``MetaStoreUnavailableError`` when the pipe is closed (the other end gone:
        a group's store calls are the parent's)."""
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, EOFError, ValueError) as exc:
                raise MetaStoreUnavailableError(self._gone(exc)) from None

    def call(self, kind: str, payload: Any) -> Any:
        """Ask the other end; its answer, or raise what it raised."""
        slot = _Slot()
        call_id = next(self._ids)
        with self._slots_lock:
            if self.closed.is_set():
                raise MetaStoreUnavailableError(self._gone())
            self._slots[call_id] = slot
        self.send(("call", call_id, kind, payload))
        slot.done.wait()
        if not slot.ok:
            raise slot.value
        return slot.value

    def serve(self, serve: Serve | None, on_notice: Notice) -> None:
        """Receive until the pipe closes: answer calls with ``serve`` (in this thread), hand
        notices to ``on_notice``."""
        try:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    return
                if message[0] == "reply":
                    _, call_id, ok, value = message
                    with self._slots_lock:
                        slot = self._slots.pop(call_id, None)
                    if slot is not None:
                        slot.ok, slot.value = ok, value
                        slot.done.set()
                elif message[0] == "call" and serve is not None:
                    self._answer(serve, message[1], message[2], message[3])
                else:
                    on_notice(message)
        finally:
            self._close_slots()

    def _answer(self, serve: Serve, call_id: int, kind: str, payload: Any) -> None:
        try:
            reply: tuple[Any, ...] = ("reply", call_id, True, serve(kind, payload))
        except Exception as exc:  # noqa: BLE001 - raised again by the caller
            reply = ("reply", call_id, False, exc)
        try:
            pickle.dumps(reply)
        except Exception as exc:  # noqa: BLE001 - what cannot cross is told as text
            reply = ("reply", call_id, False, RuntimeError(f"{type(exc).__name__}: {exc}"))
        try:
            self.send(reply)
        except MetaStoreUnavailableError:
            log.debug("%s: reply not sent, the pipe is closed", self._name)

    def _close_slots(self) -> None:
        with self._slots_lock:
            self.closed.set()
            slots, self._slots = self._slots, {}
        for slot in slots.values():
            slot.ok, slot.value = False, MetaStoreUnavailableError(self._gone())
            slot.done.set()

    def _gone(self, cause: BaseException | None = None) -> str:
        return f"{self._name}: the process at the other end is gone" + (
            f" ({cause})" if cause else ""
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()


class RemoteStore:
    """A metastore whose every call is made by the runner at the other end of a link (through
    its fenced store: a group writes nothing the task's lease does not allow)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._link.call("store", (name, args, kwargs))

        return call


__all__ = ["Link", "RemoteStore"]
