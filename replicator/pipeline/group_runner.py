"""A task whose Kafka target runs its channels in N processes (``processes`` of
``kafka_connect_param``; :mod:`replicator.sinks.kafka_groups` says how its groups, producers and
DDL are laid out). This runner is the task's control plane in the daemon:

- it prepares the task (the start positions of every channel), fences the producers of the
  earlier and the current layout, opens the task's own target (its model and DDL
  transactions), and starts one process per group (``start_group``, :mod:`group_child`);
- it answers each group's metastore calls through the task's fenced store and its metadata
  calls with the task's target; the groups share one DDL lock (their barrier sets are in the
  metastore);
- its status is the groups' channels' (each group tells its statuses twice a second);
- a group that reports a failure stops the task with the group's reason (it names the
  channel); a group that dies without one (killed, crashed) stops the others and they all start
  again after a backoff, from what Kafka committed: nothing lost, nothing doubled;
- ``stop`` stops every group (each commits and saves what it read), waiting ``STOP_WAIT``
  seconds before its fence is revoked and the groups still running are killed.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from metastore import (
    MetaStore,
    MetaStoreError,
    MetaStoreUnavailableError,
    TaskNotFoundError,
    TaskRecord,
)
from replicator.errors import CdcError, SinkSessionLostError, TaskFailedError, is_retriable
from replicator.log_context import log_context
from replicator.pipeline.channel_reads import MAX_BACKOFF
from replicator.pipeline.group_layout import fence_and_record
from replicator.pipeline.group_link import Link
from replicator.pipeline.runner import ReplicationRunner
from replicator.pipeline.runner_context import RunnerContext
from replicator.pipeline.runner_end import end_reason, report_failure
from replicator.pipeline.status import ChannelStatus
from replicator.sinks.kafka import KafkaTarget
from replicator.sinks.kafka_groups import group_name, layout, pack, unpack
from replicator.task_runner import FailureCallback

log = logging.getLogger(__name__)

# seconds stop() waits for the groups to commit and end before killing them
STOP_WAIT = 10.0
# seconds a group that was told to stop has before it is killed
KILL_WAIT = 5.0
# how a group's process is made: forked by multiprocessing's fork server, a process of one
# thread that imported what a group runs once (server/group_preload.py), so a group
# starts in milliseconds, not a second of imports per group and per start; never forked from
# the daemon itself (its threads and gRPC channels are not to be copied)
GROUP_PROCESSES = multiprocessing.get_context("forkserver")
# how often the runner looks at its groups (and reads the warnings they saved)
WATCH_SECONDS = 2.0
# a group process that dies without a reason this many times in a row, each within
# CRASH_WINDOW seconds of its groups' start, fails the task (out of memory at every start, a
# broken interpreter): restarting it for ever would hide it behind a task shown Running
CRASH_LIMIT = 5
CRASH_WINDOW = 60.0


@dataclass
class GroupStart:
    """What a group's process is started with (all of it crosses to the process)."""

    task: TaskRecord
    index: int
    name: str
    channels: list[str]
    conn: Connection
    ddl_lock: AbstractContextManager[Any]


# starts a group's process (the daemon's: server/tasks/group_process.py)
StartGroup = Callable[[GroupStart], BaseProcess]


@dataclass
class _Group:
    name: str
    channels: list[str]
    process: BaseProcess
    link: Link
    ended: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None
    finished: bool = False


class GroupCrashedError(SinkSessionLostError):
    """A group's process ended without a reason (killed, crashed): retried, the groups started
    again from what Kafka committed, up to ``CRASH_LIMIT`` times in a row."""


class CrashCount:
    """Ends of the groups' runs in a row by a crash soon after their start; the one that makes
    ``CRASH_LIMIT`` fails the task."""

    def __init__(self) -> None:
        self.count = 0

    def ended(self, error: Exception, ran_for: float) -> None:
        """A run ended by ``error`` after ``ran_for`` seconds (and is started again unless this
        raises ``TaskFailedError``)."""
        quick = isinstance(error, GroupCrashedError) and ran_for < CRASH_WINDOW
        self.count = self.count + 1 if quick else 0
        if self.count >= CRASH_LIMIT:
            raise TaskFailedError(
                f"{error}, {self.count} times in a row, each within {CRASH_WINDOW:.0f} s of "
                "the groups' start: the task stops (the daemon's log tells each end; look for "
                "the process killed for memory, or run the task in one process: "
                "kafka_connect_param.processes 1)"
            ) from error


class OwnerTarget:
    """The task's own Kafka target (its model and DDL transactions), made by ``make`` in a
    thread of its own so that the groups start meanwhile; ``get`` waits for it."""

    def __init__(self, make: Callable[[], KafkaTarget], name: str) -> None:
        self._made = threading.Event()
        self._target: KafkaTarget | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._make, args=(make,), name=name, daemon=True).start()

    def _make(self, make: Callable[[], KafkaTarget]) -> None:
        try:
            self._target = make()
        except BaseException as exc:  # noqa: BLE001 - raised again to every get()
            self._error = exc
        finally:
            self._made.set()

    def get(self) -> KafkaTarget:
        """The target once made; the error that made it fail, raised again."""
        self._made.wait()
        if self._error is not None:
            raise self._error
        assert self._target is not None
        return self._target

    def close(self) -> None:
        """Close the target once made (a make still running is waited for)."""
        self._made.wait()
        if self._target is not None:
            self._target.close()


class GroupedRunner:
    def __init__(
        self,
        task: TaskRecord,
        store: MetaStore,
        on_failure: FailureCallback,
        context: RunnerContext,
        start_group: StartGroup,
        processes: int,
    ) -> None:
        # prepares the task and keeps the statuses (as the groups tell them): never started;
        # its fenced store (the supervisor's, or one with a fence of its own), spec and state
        # are this runner's too
        self._inner = ReplicationRunner(task, store, on_failure, context)
        self.task = task
        self.store: MetaStore = self._inner.store
        self.fence = self._inner.fence
        self.on_failure = on_failure
        self.context = context
        self.spec = self._inner.spec
        self.start_group = start_group
        self.layout = layout(context.channels, processes)
        self.statuses: dict[str, ChannelStatus] = self._inner.statuses
        self.state = self._inner.state
        self._stop = threading.Event()
        self._stop_requested = False
        self._failure_reported = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._groups: list[_Group] = []
        self._changed = threading.Condition()
        self._ddl_lock: AbstractContextManager[Any] | None = None

    # --- TaskRunner ----------------------------------------------------------------------------
    async def prepare(self) -> None:
        await self._inner.prepare()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._main, name=f"groups-{self.task.task_id[:8]}", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self._stop_requested = True
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is None:
            return
        await asyncio.to_thread(self._done.wait, STOP_WAIT)
        if not self._done.is_set():
            self.fence.revoke()
            for group in list(self._groups):
                _kill(group.process)
            with log_context(task_id=self.task.task_id):
                log.warning("channel groups still running after %.0f s: killed", STOP_WAIT)

    def wait_stopped(self, timeout: float) -> bool:
        return self._thread is None or self._done.wait(timeout)

    @property
    def finished(self) -> bool:
        return self._done.is_set() and not self._failure_reported

    def status(self) -> dict[str, Any]:
        return self._inner.status()

    def applied_ticks(self) -> dict[str, int]:
        return self._inner.applied_ticks()

    def wake_idle_readers(self) -> None:
        for group in list(self._groups):
            _notify(group, ("wake",))

    def consistent_ts(self) -> int:
        return self._inner.consistent_ts()

    def read_to_end_since(self, moment: float) -> bool:
        return self._inner.read_to_end_since(moment)

    def unreachable(self, warnings: list[str]) -> None:
        self._inner.unreachable(warnings)

    # --- the control thread --------------------------------------------------------------------
    def _main(self) -> None:
        with log_context(task_id=self.task.task_id):
            try:
                self._run()
            except Exception as exc:  # noqa: BLE001 - every end is told (runner_end)
                reason = end_reason(exc, log)
                if reason is not None:
                    self._failure_reported = True
                    if not self._stop_requested:
                        report_failure(self._loop, self.on_failure, self.task.task_id, reason)
            finally:
                self._done.set()

    def _run(self) -> None:
        backoff = 1.0
        crashes = CrashCount()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self._run_groups():
                    return
                backoff = 1.0
            except (CdcError, MetaStoreError, OSError) as exc:
                if isinstance(exc, (TaskFailedError, TaskNotFoundError)) or not is_retriable(exc):
                    raise
                crashes.ended(exc, time.monotonic() - started)
                log.warning("channel groups stopped, starting again in %.0f s: %s", backoff, exc)
                self._stop.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)

    def _run_groups(self) -> bool:
        """One run of every group, until stopped (True), every group ended by itself (True:
        fenced off or deleted), or one failed (raised)."""
        names = [group_name(i) for i in range(len(self.layout))]
        # every producer of the task fenced (its own too): a group reads its positions while
        # the task's own target is still being made, and nothing an earlier one left open can
        # commit after that read
        fence_and_record(self.state, self.spec.target_param, self.task.task_id, names)
        # the task's own target (a producer, the positions topic read: about a second) is made
        # while the groups start and make theirs; a group's metadata call waits for it
        owner = OwnerTarget(self._make_owner, f"owner-{self.task.task_id[:8]}")
        try:
            self._spawn(names, owner)
            owner.get()  # made, or its error ends this run of the groups
            log.info(
                "channels in %d processes: %s",
                len(self._groups),
                "; ".join(f"{g.name}: {', '.join(g.channels)}" for g in self._groups),
            )
            return self._watch()
        finally:
            self._end_groups()
            owner.close()

    def _make_owner(self) -> KafkaTarget:
        owner = self.context.target_factory(self.task)
        if not isinstance(owner, KafkaTarget):
            owner.close()
            raise TaskFailedError("channel groups (processes > 1) need a Kafka target")
        owner.fence = self.fence
        owner.warn = self._inner.warnings.warn
        return owner

    def _spawn(self, names: list[str], owner: OwnerTarget) -> None:
        """A process per group, each in ``_groups`` once started (so that one failing to
        start leaves the others to be stopped)."""
        # kept while the groups run: the lock's semaphore goes with its last reference here
        self._ddl_lock = ddl_lock = GROUP_PROCESSES.Lock()
        self._groups = groups = []
        for index, (name, channels) in enumerate(zip(names, self.layout, strict=True)):
            parent_end, child_end = GROUP_PROCESSES.Pipe()
            start = GroupStart(self.task, index, name, channels, child_end, ddl_lock)
            process = self.start_group(start)
            child_end.close()
            group = _Group(name, channels, process, Link(parent_end, f"group {name}"))
            threading.Thread(
                target=self._serve,
                args=(group, owner),
                name=f"group-{self.task.task_id[:8]}-{name}",
                daemon=True,
            ).start()
            groups.append(group)

    def _serve(self, group: _Group, owner: OwnerTarget) -> None:
        def answer(kind: str, payload: Any) -> Any:
            if kind == "store":
                name, args, kwargs = payload
                return getattr(self.store, name)(*args, **kwargs)
            method, request, what = payload
            response, state = owner.get().answer(method, unpack(request), what)
            return pack(response), state

        def on_notice(message: tuple[Any, ...]) -> None:
            if message[0] == "status":
                for status in message[1]:
                    self.statuses[status.pchannel] = status
            elif message[0] == "failed":
                group.failure = str(message[1])
            elif message[0] == "ended":
                group.finished = bool(message[1])

        try:
            group.link.serve(answer, on_notice)
        finally:
            group.process.join(KILL_WAIT)
            group.ended.set()
            with self._changed:
                self._changed.notify_all()

    def _watch(self) -> bool:
        with self._changed:
            while True:
                if self._stop.is_set():
                    return True
                ended = [g for g in self._groups if g.ended.is_set()]
                failed = next((g for g in ended if g.failure is not None), None)
                if failed is not None:
                    raise TaskFailedError(str(failed.failure))
                crashed = next((g for g in ended if not g.finished), None)
                if crashed is not None:
                    raise GroupCrashedError(
                        f"the process of channel group {crashed.name} "
                        f"({', '.join(crashed.channels)}) ended with exit code "
                        f"{crashed.process.exitcode} and no reason"
                    )
                if len(ended) == len(self._groups):
                    return True  # every group ended by itself: fenced off or deleted
                self._changed.wait(WATCH_SECONDS)
                # the groups' warnings, as they saved them (shown with the task's status); a
                # store that does not answer now is the groups' to retry, not a reason to stop
                with suppress(MetaStoreError):
                    self._inner.warnings.load()

    def _end_groups(self) -> None:
        """Stop the groups (each commits and saves what it read); kill those that do not end
        within ``KILL_WAIT`` seconds."""
        for group in self._groups:
            _notify(group, ("stop",))
        deadline = time.monotonic() + KILL_WAIT
        for group in self._groups:
            group.ended.wait(max(0.0, deadline - time.monotonic()))
            if group.process.is_alive():
                log.warning("channel group %s did not stop: killed", group.name)
                _kill(group.process)
            group.link.close()


def _notify(group: _Group, message: tuple[Any, ...]) -> None:
    with suppress(MetaStoreUnavailableError):
        group.link.send(message)


def _kill(process: BaseProcess) -> None:
    if process.is_alive():
        process.kill()
        process.join(1.0)
