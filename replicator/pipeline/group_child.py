"""The body of a channel group's process (:mod:`group_runner`): a
:class:`~replicator.pipeline.runner.ReplicationRunner` of the group's channels, end to end
(read, decode, sequence, encode, produce with the group's producer), whose metastore and
target metadata calls are the parent's (:class:`~replicator.pipeline.group_link.RemoteStore`,
:class:`~replicator.sinks.kafka_groups.GroupKafkaTarget`).

It tells the parent its channels' statuses every ``STATUS_SECONDS``, and how it ended:
``("failed", reason)`` or ``("ended", finished)``. It stops when the parent says ``stop``, and
exits at once when the parent is gone (its pipe closed): what it had not committed is aborted
by the next start's fencing and read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from typing import Any, cast

from metastore import MetaStore, MetaStoreUnavailableError, TaskRecord
from replicator.daemon_thread import in_daemon_thread
from replicator.pipeline.group_link import Link, RemoteStore
from replicator.pipeline.runner import ReplicationRunner
from replicator.pipeline.runner_context import RunnerContext

log = logging.getLogger(__name__)

STATUS_SECONDS = 0.5
# seconds a stopping group waits for its runner to flush and commit
STOP_SECONDS = 30.0
# the exit code of a group whose parent is gone
ORPHANED = 3


def run_group(task: TaskRecord, context: RunnerContext, link: Link) -> None:
    asyncio.run(_run(task, context, link))


async def _run(task: TaskRecord, context: RunnerContext, link: Link) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    failures: list[str] = []
    stopping = threading.Event()

    async def on_failure(_task_id: str, reason: str) -> None:
        failures.append(reason)
        stop.set()

    runner = ReplicationRunner(task, cast(MetaStore, RemoteStore(link)), on_failure, context)

    def on_notice(message: tuple[Any, ...]) -> None:
        if message[0] == "stop":
            stopping.set()
            loop.call_soon_threadsafe(stop.set)
        elif message[0] == "wake":
            runner.wake_idle_readers()

    def receive() -> None:
        link.serve(None, on_notice)
        if not stopping.is_set():
            # the parent is gone: nothing of ours may be committed from now on
            os._exit(ORPHANED)

    threading.Thread(target=receive, name="group-link", daemon=True).start()
    await runner.start()
    while not runner.wait_stopped(0):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STATUS_SECONDS)
        _tell(link, ("status", list(runner.statuses.values())))
        if stop.is_set():
            break
    if stopping.is_set():
        await runner.stop()
        await in_daemon_thread(runner.wait_stopped, STOP_SECONDS, name="group-stop")
    else:
        await in_daemon_thread(runner.wait_stopped, STOP_SECONDS, name="group-end")
    for _ in range(40):  # a failure the runner's fiber reported arrives through the loop
        if failures or runner.finished or stopping.is_set():
            break
        await asyncio.sleep(0.05)
    _tell(link, ("status", list(runner.statuses.values())))
    if failures:
        _tell(link, ("failed", failures[0]))
    else:
        _tell(link, ("ended", runner.finished or stopping.is_set()))


def _tell(link: Link, message: tuple[Any, ...]) -> None:
    try:
        link.send(message)
    except MetaStoreUnavailableError:
        os._exit(ORPHANED)
