"""A Kafka target's transactions, made by one thread of their own (group commit).

A channel hands its events and position to :class:`Committer` (``submit``) and goes on: while
the broker acknowledges a transaction (``commit_transaction`` waits without the interpreter
lock), the channels read, decode and build their next events. When a transaction ends, every
commit handed in meanwhile, of any channel, goes into the next one, in the order handed in:
every commit's events, then each commit's model and position record, all produced in one call.
One transaction holding several channels' commits is committed whole or not at all, as one
holding one; a channel's events and its position are always in the same transaction, so a
crash anywhere leaves both or neither (exactly once is unchanged). A failed transaction fails
every commit in it and every commit after it (the target is closed: the task connects again
and starts over from what Kafka committed).

A synchronous commit (a DDL's, one that ends a backlog, a stop's) is a submit and a wait: the
channel's earlier commits are ahead of it in the queue, so once it returns they are committed
too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metastore import Position
from replicator.errors import SinkSessionLostError
from replicator.sinks.kafka_columns import Run


@dataclass
class Commit:
    """One commit handed to the committer: its runs (or the error serializing them raised, to
    be raised in its transaction), model, position record; ``wait`` returns once the
    transaction holding it ended, and raises what failed it."""

    pchannel: str
    commit_id: str
    runs: list[Run] | BaseException
    model: Any = None  # a TargetModel of a DDL commit
    position: Position | None = None
    position_record: bytes | None = None
    _done: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


class Committer:
    """The thread that makes a target's transactions: ``transact`` is called with the commits
    gathered since the last one, in order, and raises when the transaction failed."""

    def __init__(
        self, name: str, transact: Callable[[list[Commit]], None], closed_message: str
    ) -> None:
        self._name = name
        self._closed_message = closed_message
        self._transact = transact
        self._cond = threading.Condition()
        self._queue: list[Commit] = []
        self._closed: str | None = None  # why no commit is taken any more
        self._thread: threading.Thread | None = None

    def submit(self, commit: Commit) -> Commit:
        with self._cond:
            if self._closed is not None:
                commit.finish(SinkSessionLostError(self._closed))
                return commit
            self._queue.append(commit)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return commit

    def close(self) -> None:
        """No more commits: those queued fail (the target is closed); one being committed
        ends first."""
        with self._cond:
            if self._closed is None:
                self._closed = self._closed_message
            thread, dropped, self._queue = self._thread, self._queue, []
            self._cond.notify()
        for commit in dropped:
            commit.finish(SinkSessionLostError(self._closed_message))
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and self._closed is None:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            try:
                self._transact(batch)
            except BaseException as exc:  # noqa: BLE001 - each waiter raises it
                for commit in batch:
                    commit.finish(exc)
                self.close()
                return
            for commit in batch:
                commit.finish(None)


__all__ = ["Commit", "Committer"]
