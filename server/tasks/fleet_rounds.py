"""The fleet's rounds: this daemon's heartbeat, and each round's share of the Running tasks.

Which daemon runs a Running task is the fleet's business (server/tasks/fleet.py plans a round):
a runner runs under the task's lease, and each round (:meth:`FleetRounds.reconcile`) this
daemon renews its leases, stops what it should no longer run, and takes its share of what
nobody runs. Heartbeats go on apart from the rounds, in a thread of their own; when the lease
clock runs out without one, every runner here stops writing before another member may take
its task.

Keys: a daemon whose key ring lacks a key the store's secrets are sealed with (``key_check``,
checked at start and every round) says so in one log line naming the key ids, tells the fleet
so in its heartbeat (the others do not count it when they share the tasks out), and takes no
task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from metastore import Lease, Member, MetaStoreError, TaskRecord
from metastore.errors import StoreFormatError
from metastore.format import STORE_FORMAT, check_readable
from metastore.sealed import MissingKeys, secrets_problem
from replicator.config.release import RELEASE
from replicator.config.settings import CdcSettings
from server.errors import ApiError
from server.logs import log_context
from server.tasks import state_history
from server.tasks.creation import CREATING
from server.tasks.fleet import plan_round
from server.tasks.local_runs import LocalRuns

log = logging.getLogger(__name__)

KeyCheck = Callable[[], MissingKeys | None]
VisibleTasks = Callable[[list[TaskRecord]], Awaitable[list[TaskRecord]]]


class FleetRounds:
    """This daemon as a fleet member: heartbeats, lease rounds, and what it knows of the others."""

    def __init__(
        self,
        runs: LocalRuns,
        settings: CdcSettings,
        visible_tasks: VisibleTasks,
        key_check: KeyCheck | None = None,
    ) -> None:
        """``visible_tasks``: the stored tasks a round may act on (not those being created);
        ``key_check``: the keys this daemon's ring lacks (``SealedMetaStore.missing_keys``)."""
        self._runs = runs
        self._store = runs.store
        self._settings = settings
        self._visible_tasks = visible_tasks
        self._key_check = key_check
        self.fleet = runs.fleet
        # what this daemon's key ring lacks of the keys the store's secrets are sealed with, as
        # of the last round: while it lacks any, it is not ready and takes no task
        self.missing_keys: MissingKeys | None = None
        # why the store's format, read again at each heartbeat, is past what this release reads
        # (another member raised it): while set, it runs and takes no task ("" : none)
        self.format_problem = ""
        self.members: list[Member] = []  # the fleet, as of the last round
        self.remote: dict[str, dict[str, Any]] = {}  # progress other members publish
        self._loops: list[asyncio.Task[None]] = []  # the heartbeat and the rounds
        self._stopping: set[asyncio.Task[None]] = set()  # runners stopped by the lease clock
        self._store_trouble = ""  # why the last round could not reach the store
        self._stopped_said = False  # the lease clock ran out and the log said so
        # heartbeats in a thread of their own: queued behind other blocking calls in asyncio's
        # default executor (a few threads; fifty runners starting use them all), a heartbeat
        # could be late enough to stop every runner of the daemon
        self._beats = ThreadPoolExecutor(1, thread_name_prefix="fleet-heartbeat")

    def start_loops(self) -> None:
        """Heartbeats and rounds every ``fleet.checkSeconds`` from now on."""
        self._loops = [
            asyncio.create_task(self._keep_renewing()),
            asyncio.create_task(self._keep_reconciling()),
        ]

    async def stop_loops(self) -> None:
        """No heartbeat nor round after this (the drain)."""
        for loop in self._loops:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    async def leave(self) -> None:
        """Leave the fleet, so that other daemons take the tasks at once."""
        try:
            await asyncio.to_thread(self._store.leave, self.fleet.member_id)
        except MetaStoreError as exc:
            log.warning("could not leave the fleet (its leases expire by themselves): %s", exc)
        self._beats.shutdown(wait=False)

    async def _keep_renewing(self) -> None:
        """A heartbeat every ``fleet.checkSeconds``, apart from the rounds (whose work, such as
        stopping a runner, must not delay it). A heartbeat stuck on a store that does not
        answer is watched: when the lease clock runs out meanwhile, that is said at once (the
        runners' fences refuse every write from then on, by the same clock)."""
        every = self._settings.fleet.checkSeconds
        due = time.monotonic()
        while True:
            # at a steady cadence whatever a heartbeat took: after a slow one, the next at once
            due = max(due + every, time.monotonic())
            await asyncio.sleep(due - time.monotonic())
            beat = asyncio.ensure_future(self.renew())
            try:
                while not beat.done():
                    remaining = self.fleet.clock.remaining()
                    if remaining > 0:
                        await asyncio.wait({beat}, timeout=remaining)
                        continue
                    self._writes_stopped()
                    await asyncio.wait({beat})
            except asyncio.CancelledError:
                beat.cancel()  # the drain: no heartbeat after it
                raise
            if not beat.cancelled() and beat.exception() is not None:
                log.error("fleet heartbeat failed", exc_info=beat.exception())

    async def _keep_reconciling(self) -> None:
        while True:
            await asyncio.sleep(self._settings.fleet.checkSeconds)
            try:
                await self.reconcile()
            except Exception:
                log.exception("fleet round failed")

    def _writes_stopped(self) -> None:
        """The lease clock ran out: every runner's fence refuses writes already; stop the
        runners too (a backfill's driver process with them), without waiting for the lock,
        which a round stuck on the store may hold. Held tasks start again once the store
        answers and the leases are still this member's."""
        if self._stopped_said:
            return
        self._stopped_said = True
        log.warning(
            "fleet member %s: leases not renewed for %.1f s; its %d runner(s) write nothing "
            "from now on, before any other member may take their tasks",
            self.fleet.member_id,
            self.fleet.safe_seconds,
            len(self._runs.runners),
        )
        for task_id in list(self._runs.runners):
            stopping = asyncio.create_task(self._runs.stop_local_runner(task_id, revoke=True))
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)

    def _member_info(self) -> dict[str, Any]:
        """What other members show of this one: its address, and a summary of each task it
        runs (get and list on another daemon show it as the task's progress)."""
        summary = {}
        for task_id, runner in self._runs.runners.items():
            status = runner.status()
            summary[task_id] = {
                "rows": status.get("rows"),
                "bytes": status.get("bytes"),
                "lag_seconds": status.get("lag_seconds"),
                "consistent_up_to": status.get("consistent_up_to"),
                "as_of": round(time.time(), 3),
            }
        info: dict[str, Any] = {
            "address": self._settings.address,
            # what it runs and writes: in a rolling upgrade, what the members can read
            "release": RELEASE,
            "store_format": STORE_FORMAT,
            "tasks": summary,
        }
        if self.missing_keys is not None:  # key ids only: the others leave it out of the share
            info["missing_keys"] = list(self.missing_keys.missing)
        if self.format_problem:  # the others leave it out of the share too
            info["store_unreadable"] = True
        return info

    def read_format_problem(self) -> str:
        """Why this release cannot read the store's format now ("": it can). A store that does
        not answer says nothing new: the heartbeat's own failure tells of it."""
        try:
            check_readable(self._store, RELEASE)
        except StoreFormatError as exc:
            return str(exc)
        except MetaStoreError:
            return self.format_problem
        return ""

    def note_format_problem(self, problem: str) -> None:
        """Remember why the store cannot be read; say it once when that changes."""
        if problem == self.format_problem:
            return
        self.format_problem = problem
        if problem:
            log.error(
                "fleet member %s is not ready: %s. It stops its runners, gives up their leases "
                "and takes no task",
                self.fleet.member_id,
                problem,
            )
        else:
            log.info("fleet member %s reads the metastore's format again", self.fleet.member_id)

    def read_missing_keys(self) -> MissingKeys | None:
        return self._key_check() if self._key_check is not None else None

    def note_missing_keys(self, missing: MissingKeys | None) -> None:
        """Remember what the key ring lacks; say it once when that changes."""
        if missing == self.missing_keys:
            return
        self.missing_keys = missing
        if missing is None:
            log.info(
                "fleet member %s: its key ring holds every key the metastore's secrets are "
                "encrypted with; it is ready and takes tasks",
                self.fleet.member_id,
            )
            return
        log.error(
            "fleet member %s is not ready: %s. It takes no task and changes none it cannot "
            "decrypt, leaving them to daemons that can, until it has them (secrets.keyFile "
            "or CDC_SECRETS__KEY)",
            self.fleet.member_id,
            missing,
        )

    def _read_fleet(
        self,
    ) -> tuple[list[TaskRecord], dict[str, Lease], list[Any], MissingKeys | None]:
        # the leases before the tasks: a task created meanwhile is then listed (hidden while
        # it is being created) with no lease read, or not at all. Read the other way, a lease
        # taken by a create just after the tasks were listed belonged to no task the round
        # knew, and the round gave it up under the create (a create answered 503 FencedError)
        leases = self._store.leases()
        return (self._store.list_tasks(), leases, self._store.members(), self.read_missing_keys())

    async def renew(self) -> None:
        """Renew this member's registration and leases; the lease clock moves on from the
        moment the heartbeat was sent."""
        fleet = self.fleet
        sent = time.monotonic()
        info = self._member_info()

        def beat() -> tuple[float, str]:
            self._store.heartbeat(fleet.member_id, info, fleet.lease_seconds)
            # when the answer came, not when this loop got to it; and the store's format read
            # again (a newer member may have raised it past what this release reads)
            return time.monotonic(), self.read_format_problem()

        try:
            acknowledged, problem = await asyncio.get_running_loop().run_in_executor(
                self._beats, beat
            )
        except MetaStoreError as exc:
            await self._store_lost(exc)
            return
        self.note_format_problem(problem)
        term = fleet.clock.term
        fleet.renewed(sent, acknowledged)
        if fleet.clock.term != term:
            log.warning(
                "fleet member %s: the metastore heard from it only after its leases may have "
                "expired; every runner it had stays stopped, and the tasks whose leases it still "
                "holds start again from their saved positions",
                fleet.member_id,
            )
        if fleet.clock.remaining() <= 0:
            return  # answered, but too late to count: the next heartbeat will
        if self._store_trouble or self._stopped_said:
            log.info("metastore answers again; fleet member %s renews", fleet.member_id)
            self._store_trouble = ""
            self._stopped_said = False

    async def reconcile(self) -> None:
        """One round: run exactly the tasks this member holds, take its share of the free
        ones, hand over the rest (see server/tasks/fleet.py). The store is read outside the lock; a
        round that raced a state change made here is skipped (the next one sees it)."""
        fleet = self.fleet
        changes, term = self._runs.changes, fleet.clock.term
        try:
            tasks, leases, members, missing_keys = await asyncio.to_thread(self._read_fleet)
        except MetaStoreError as exc:
            await self._store_lost(exc)
            return
        # tasks being created are not the round's (nor their leases): their creator shows them
        hidden = {task.task_id for task in tasks if CREATING in task.extra}
        tasks = await self._visible_tasks(tasks)
        leases = {task_id: lease for task_id, lease in leases.items() if task_id not in hidden}
        async with self._runs.lock:
            self.note_missing_keys(missing_keys)
            if changes != self._runs.changes or term != fleet.clock.term:
                return  # raced a change made here, or the leases lapsed since the read
            self.members = members
            previous = self._runs.owners  # who held each task, as of the last round
            self._runs.owners = {task_id: lease.owner for task_id, lease in leases.items()}
            self.remote = {
                task_id: {**summary, "owner": m.member_id}
                for m in members
                for task_id, summary in (m.info.get("tasks") or {}).items()
            }
            by_id = {task.task_id: task for task in tasks}
            for task in tasks:
                self._runs.remember_state(task)
            for task_id in set(self._runs.states) - set(by_id):
                self._runs.states.pop(task_id, None)
            for task_id in set(self._runs.left_alone) - set(by_id):
                self._runs.left_alone.pop(task_id, None)
            for task_id, runner in list(self._runs.runners.items()):
                if runner.finished:  # fenced off, or the task deleted: started again if held
                    self._runs.runners.pop(task_id)
                    self._runs.fences.pop(task_id, None)
                elif (fence := self._runs.fences.get(task_id)) is not None and fence.revoked:
                    await self._runs.stop_local_runner(task_id, revoke=True)  # its lease lapsed
            plan = plan_round(
                fleet.member_id,
                {task.task_id: task.state for task in tasks},
                leases,
                # the tasks are shared among the members that can open their secrets and read
                # the store's format
                sum(
                    not m.info.get("missing_keys") and not m.info.get("store_unreadable")
                    for m in members
                ),
                {
                    task_id: fence.lease
                    for task_id, fence in self._runs.fences.items()
                    if fence.lease
                },
            )
            if self.format_problem:  # a store it cannot read: nothing run, nothing held
                await self._give_up_everything(leases)
                return
            for task_id in plan.stop:
                fence = self._runs.fences.get(task_id)
                lost = fence is not None and leases.get(task_id) != fence.lease
                await self._runs.stop_local_runner(task_id, revoke=lost)
            for lease in plan.release:
                await self._run_round_action(
                    lease.task_id, asyncio.to_thread(self._store.release_lease, lease)
                )
            # a lease read as held is surely live only while the clock runs: a round that
            # read the store just before a cut starts nothing once it has run out
            for lease in plan.start if fleet.clock.remaining() > 0 else ():
                task = by_id[lease.task_id]
                await self._run_round_action(
                    task.task_id, self._runs.start_runner(task, lease=lease)
                )
            for task_id in plan.take if self.missing_keys is None else ():
                await self._run_round_action(
                    task_id, self._take_free_task(by_id[task_id], previous.get(task_id))
                )

    async def _give_up_everything(self, leases: dict[str, Lease]) -> None:
        """Stop every runner and release every lease of this member (the store's format is past
        what it reads): members that read it take the tasks."""
        for task_id in list(self._runs.runners):
            await self._runs.stop_local_runner(task_id, revoke=False)
        for lease in leases.values():
            if lease.owner == self.fleet.member_id:
                await self._run_round_action(
                    lease.task_id, asyncio.to_thread(self._store.release_lease, lease)
                )

    async def _run_round_action(self, task_id: str, action: Awaitable[Any]) -> None:
        """One action of a round; a task deleted or changed meanwhile, or a store that stops
        answering, ends that action only (the next round looks again)."""
        try:
            await action
        except (MetaStoreError, ApiError) as exc:
            with log_context(task_id=task_id):
                log.warning("fleet round: %s", exc)

    async def _take_free_task(self, task: TaskRecord, previous_owner: str | None) -> None:
        fleet = self.fleet
        if await asyncio.to_thread(secrets_problem, self._store, task) is not None:
            return  # not its lease to take: a daemon that can open the secrets takes it
        if self._runs.note_spec_problem(task):
            return  # nor one of a task this release cannot read: a newer member takes it
        taken = await asyncio.to_thread(
            self._store.acquire_lease, task.task_id, fleet.member_id, fleet.lease_seconds
        )
        if taken is None:
            return  # another member was quicker
        with log_context(task_id=task.task_id):
            log.info("task taken by fleet member %s", fleet.member_id)
        await asyncio.to_thread(
            state_history.record,
            self._store,
            task.task_id,
            kind="owner",
            to=fleet.member_id,
            reason="no daemon held the task (new, resumed, or its daemon stopped renewing or "
            "handed it over)",
            by=fleet.member_id,
            **{"from": previous_owner},
        )
        self._runs.owners[task.task_id] = fleet.member_id
        await self._runs.start_runner(task, lease=taken)

    async def _store_lost(self, exc: MetaStoreError) -> None:
        """The store did not answer the round. Runners go on while the leases are surely
        live (their writes wait and retry); past that their fences are closed, and they stop."""
        remaining = self.fleet.clock.remaining()
        if not self._store_trouble:
            log.warning(
                "metastore unavailable for the fleet round (%s); %d runner(s) stop writing in "
                "%.1f s unless it answers",
                exc,
                len(self._runs.runners),
                max(0.0, remaining),
            )
        self._store_trouble = str(exc)
        if remaining > 0 or not self._runs.runners:
            return
        async with self._runs.lock:
            log.warning(
                "leases not renewed for %.1f s: stopping %d runner(s); the tasks resume from "
                "their saved positions once the store answers",
                self.fleet.safe_seconds,
                len(self._runs.runners),
            )
            for task_id in list(self._runs.runners):
                await self._runs.stop_local_runner(task_id, revoke=True)

    def fleet_view(self) -> dict[str, Any]:
        """This daemon and the fleet as of the last round: who is in it and how many tasks
        each runs (``GET /v1/fleet``, the dashboard's header, ``cdc_fleet_*`` metrics)."""
        me = self.fleet.member_id
        runs = Counter(self._runs.owners.values())
        return {
            "member_id": me,
            "lease_seconds": self.fleet.lease_seconds,
            "renewed": self.fleet.clock.remaining() > 0,
            "lease_seconds_left": round(max(0.0, self.fleet.clock.remaining()), 3),
            "members": [
                {
                    "member_id": m.member_id,
                    "address": m.info.get("address"),
                    # None: a member of a release before 0.4.0, which did not say
                    "release": m.info.get("release"),
                    "store_format": m.info.get("store_format"),
                    "tasks": runs.get(m.member_id, 0),
                    "self": m.member_id == me,
                }
                for m in self.members
            ],
        }

    async def owners(self) -> dict[str, str]:
        """The member holding each task's lease, as the store says now (as of the last round
        when it does not answer)."""
        try:
            leases = await asyncio.to_thread(self._store.leases)
        except MetaStoreError:
            return dict(self._runs.owners)
        return {task_id: lease.owner for task_id, lease in leases.items()}
