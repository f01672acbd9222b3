"""The task supervisor: task lifecycle (create, pause, resume, delete) over the metastore, and
one runner per Running task.

State transitions (anything else is a 409 naming the current state)::

    create   -> Running, or Initial with disable_auto_start
    pause    Initial | Running | Failed -> Paused
    resume   Initial | Paused | Failed  -> Running
    delete   any state -> gone (the runner is stopped first)
    runner error        -> Failed, with the runner's reason

State changes are serialised by one lock; every write is compare-and-set on the task's
revision, so a daemon sharing the store with another never overwrites a newer state.

Which daemon runs a Running task is the fleet's business (server/tasks/fleet.py): a runner runs
under the task's lease, and each round (:meth:`TaskSupervisor.reconcile`) this daemon renews its
leases, stops what it should no longer run, and takes its share of what nobody runs. A request
may reach any daemon: pause and delete change the store, and the task's owner stops its runner
at its next round (pause waits for that, a few seconds at most).

Keys: a daemon whose key ring lacks a key the store's secrets are sealed with (``key_check``,
checked at start and every round) says so in one log line naming the key ids, is not ready
(``missing_keys``, shown by ``/readyz``), tells the fleet so in its heartbeat (the others do
not count it when they share the tasks out), and takes no task. It never takes the lease of a
task whose secrets it cannot open, nor changes such a task: it leaves it to a daemon that can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from metastore import (
    ConcurrentUpdateError,
    FencedError,
    Lease,
    Member,
    MetaStore,
    MetaStoreError,
    Position,
    TaskNotFoundError,
    TaskRecord,
    TaskState,
)
from metastore.fenced import Fence, FencedStore
from metastore.sealed import MissingKeys, secrets_problem
from replicator import RunnerFactory, TaskRunner
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.compare.state import VerifyJob
from replicator.pipeline.selection import selection_of
from replicator.pipeline.timings import TaskTimings
from replicator.sinks.targets import is_kafka
from server.tasks import state_history
from server.tasks.requests import (
    BackfillRequest,
    VerifyRequest,
    public_view,
    validate_backfill,
    validate_verify,
)

if TYPE_CHECKING:
    from server.dr.manager import DisasterRecovery
from replicator.config.settings import DEFAULT_SOURCE, CdcSettings
from server.errors import (
    ApiError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    UnavailableError,
)
from server.logs import SecretRedactor, log_context
from server.tasks.creation import CREATING, TaskCreation, secrets_of
from server.tasks.fleet import Membership, plan_round
from server.tasks.verify import VerifyManager

log = logging.getLogger(__name__)
T = TypeVar("T")

PAUSED_BY_USER = "manually paused through the http interface"
TargetChecker = Callable[[dict[str, Any]], str]
KeyCheck = Callable[[], MissingKeys | None]
# seconds a pause waits for the task's owner (another daemon) to stop its runner
OWNER_STOP_WAIT = 3.0


class TaskSupervisor(TaskCreation):
    def __init__(
        self,
        store: MetaStore,
        settings: CdcSettings,
        runner_factory: RunnerFactory,
        target_checker: TargetChecker,
        redactor: SecretRedactor | None = None,
        key_check: KeyCheck | None = None,
    ) -> None:
        """``key_check``: the keys this daemon's ring lacks (``SealedMetaStore.missing_keys``)."""
        self._store = store
        self._key_check = key_check
        # what this daemon's key ring lacks of the keys the store's secrets are sealed with, as
        # of the last round: while it lacks any, it is not ready and takes no task
        self.missing_keys: MissingKeys | None = None
        self._settings = settings
        self._runner_factory = runner_factory
        self._target_checker = target_checker
        self._redactor = redactor or SecretRedactor()
        self._runners: dict[str, TaskRunner] = {}
        self._runner_specs: dict[str, Mapping[str, Any]] = {}  # the spec each runner runs
        self._fences: dict[str, Fence] = {}  # the fence (and lease) of each runner
        self._states: dict[str, TaskState] = {}
        self._creating: set[str] = set()  # tasks whose create is under way here
        self._owners: dict[str, str] = {}  # task -> the member holding its lease
        self._members: list[Member] = []  # the fleet, as of the last round
        self._remote: dict[str, dict[str, Any]] = {}  # progress other members publish
        self._lock = asyncio.Lock()
        self._changes = 0  # state changes made here: a round read before one is stale
        self._verify = VerifyManager(store, settings, self._live_applied)
        self.fleet = Membership(settings.fleet, settings.host_port[1])
        self._rounds: list[asyncio.Task[None]] = []  # the heartbeat and the rounds
        self._stopping: set[asyncio.Task[None]] = set()  # runners stopped by the lease clock
        self._store_trouble = ""  # why the last round could not reach the store
        self._stopped_said = False  # the lease clock ran out and the log said so
        # heartbeats in a thread of their own: queued behind other blocking calls in asyncio's
        # default executor (a few threads; fifty runners starting use them all), a heartbeat
        # could be late enough to stop every runner of the daemon
        self._beats = ThreadPoolExecutor(1, thread_name_prefix="fleet-heartbeat")
        # switchover, failover, failback (server/dr): set by the application
        self.disaster: DisasterRecovery | None = None

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the fleet and take this daemon's share of the Running tasks (all of them when
        it is alone), then keep doing so every ``fleet.checkSeconds``."""
        tasks = await self._visible(await self._io(self._store.list_tasks), at_start=True)
        await self._io(self._verify.load, [t.task_id for t in tasks])
        for task in tasks:
            self._remember(task)
        self._note_keys(await self._io(self._missing_keys))  # before the fleet hears of it
        await self.renew()
        await self.reconcile()
        self._rounds = [
            asyncio.create_task(self._keep_renewing()),
            asyncio.create_task(self._keep_reconciling()),
        ]
        log.info(
            "supervisor started with %d task(s); fleet member %s runs %d",
            len(tasks),
            self.fleet.member_id,
            len(self._runners),
        )

    async def drain(self, budget: float) -> None:
        """Stop every runner (each saves its positions) and leave the fleet, so that other
        daemons take the tasks at once; states stay as stored, so a restart resumes them.
        Runners still busy after ``budget`` seconds are abandoned."""
        for loop in self._rounds:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        async with self._lock:
            runners = list(self._runners.items())
            self._runners.clear()
        await self._io(self._verify.stop_all)
        if runners:
            results = await asyncio.wait(
                [asyncio.create_task(self._stop_runner(tid, r)) for tid, r in runners],
                timeout=budget,
            )
            if results[1]:
                log.warning(
                    "drain budget of %.1f s spent; %d runner(s) abandoned", budget, len(results[1])
                )
        for fence in self._fences.values():
            fence.revoke()  # an abandoned runner writes nothing after the leases are dropped
        self._fences.clear()
        try:
            await self._io(self._store.leave, self.fleet.member_id)
        except MetaStoreError as exc:
            log.warning("could not leave the fleet (its leases expire by themselves): %s", exc)
        self._beats.shutdown(wait=False)

    # --- the fleet ---------------------------------------------------------------------------
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
            len(self._runners),
        )
        for task_id in list(self._runners):
            stopping = asyncio.create_task(self._stop_local(task_id, revoke=True))
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)

    def _member_info(self) -> dict[str, Any]:
        """What other members show of this one: its address, and a summary of each task it
        runs (get and list on another daemon show it as the task's progress)."""
        summary = {}
        for task_id, runner in self._runners.items():
            status = runner.status()
            summary[task_id] = {
                "rows": status.get("rows"),
                "bytes": status.get("bytes"),
                "lag_seconds": status.get("lag_seconds"),
                "consistent_up_to": status.get("consistent_up_to"),
                "as_of": round(time.time(), 3),
            }
        info: dict[str, Any] = {"address": self._settings.address, "tasks": summary}
        if self.missing_keys is not None:  # key ids only: the others leave it out of the share
            info["missing_keys"] = list(self.missing_keys.missing)
        return info

    def _missing_keys(self) -> MissingKeys | None:
        return self._key_check() if self._key_check is not None else None

    def _note_keys(self, missing: MissingKeys | None) -> None:
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
        return (self._store.list_tasks(), leases, self._store.members(), self._missing_keys())

    async def renew(self) -> None:
        """Renew this member's registration and leases; the lease clock moves on from the
        moment the heartbeat was sent."""
        fleet = self.fleet
        sent = time.monotonic()
        info = self._member_info()

        def beat() -> float:
            self._store.heartbeat(fleet.member_id, info, fleet.lease_seconds)
            return time.monotonic()  # when the answer came, not when this loop got to it

        try:
            acknowledged = await asyncio.get_running_loop().run_in_executor(self._beats, beat)
        except MetaStoreError as exc:
            await self._store_lost(exc)
            return
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
        changes, term = self._changes, fleet.clock.term
        try:
            tasks, leases, members, missing_keys = await self._io(self._read_fleet)
        except MetaStoreError as exc:
            await self._store_lost(exc)
            return
        # tasks being created are not the round's (nor their leases): their creator shows them
        hidden = {task.task_id for task in tasks if CREATING in task.extra}
        tasks = await self._visible(tasks)
        leases = {task_id: lease for task_id, lease in leases.items() if task_id not in hidden}
        async with self._lock:
            self._note_keys(missing_keys)
            if changes != self._changes or term != fleet.clock.term:
                return  # raced a change made here, or the leases lapsed since the read
            self._members = members
            previous = self._owners  # who held each task, as of the last round
            self._owners = {task_id: lease.owner for task_id, lease in leases.items()}
            self._remote = {
                task_id: {**summary, "owner": m.member_id}
                for m in members
                for task_id, summary in (m.info.get("tasks") or {}).items()
            }
            by_id = {task.task_id: task for task in tasks}
            for task in tasks:
                self._remember(task)
            for task_id in set(self._states) - set(by_id):
                self._states.pop(task_id, None)
            for task_id, runner in list(self._runners.items()):
                if runner.finished:  # fenced off, or the task deleted: started again if held
                    self._runners.pop(task_id)
                    self._fences.pop(task_id, None)
                elif (fence := self._fences.get(task_id)) is not None and fence.revoked:
                    await self._stop_local(task_id, revoke=True)  # its lease lapsed
            plan = plan_round(
                fleet.member_id,
                {task.task_id: task.state for task in tasks},
                leases,
                # the tasks are shared among the members that can open their secrets
                sum(not m.info.get("missing_keys") for m in members),
                {task_id: fence.lease for task_id, fence in self._fences.items() if fence.lease},
            )
            for task_id in plan.stop:
                fence = self._fences.get(task_id)
                lost = fence is not None and leases.get(task_id) != fence.lease
                await self._stop_local(task_id, revoke=lost)
            for lease in plan.release:
                await self._act(lease.task_id, self._io(self._store.release_lease, lease))
            # a lease read as held is surely live only while the clock runs: a round that
            # read the store just before a cut starts nothing once it has run out
            for lease in plan.start if fleet.clock.remaining() > 0 else ():
                task = by_id[lease.task_id]
                await self._act(task.task_id, self._start_runner(task, lease=lease))
            for task_id in plan.take if self.missing_keys is None else ():
                await self._act(task_id, self._take(by_id[task_id], previous.get(task_id)))

    async def _act(self, task_id: str, action: Awaitable[Any]) -> None:
        """One action of a round; a task deleted or changed meanwhile, or a store that stops
        answering, ends that action only (the next round looks again)."""
        try:
            await action
        except (MetaStoreError, ApiError) as exc:
            with log_context(task_id=task_id):
                log.warning("fleet round: %s", exc)

    async def _take(self, task: TaskRecord, previous_owner: str | None) -> None:
        fleet = self.fleet
        if await self._io(secrets_problem, self._store, task) is not None:
            return  # not its lease to take: a daemon that can open the secrets takes it
        taken = await self._io(
            self._store.acquire_lease, task.task_id, fleet.member_id, fleet.lease_seconds
        )
        if taken is None:
            return  # another member was quicker
        with log_context(task_id=task.task_id):
            log.info("task taken by fleet member %s", fleet.member_id)
        await self._io(
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
        self._owners[task.task_id] = fleet.member_id
        await self._start_runner(task, lease=taken)

    async def _store_lost(self, exc: MetaStoreError) -> None:
        """The store did not answer the round. Runners go on while the leases are surely
        live (their writes wait and retry); past that their fences are closed, and they stop."""
        remaining = self.fleet.clock.remaining()
        if not self._store_trouble:
            log.warning(
                "metastore unavailable for the fleet round (%s); %d runner(s) stop writing in "
                "%.1f s unless it answers",
                exc,
                len(self._runners),
                max(0.0, remaining),
            )
        self._store_trouble = str(exc)
        if remaining > 0 or not self._runners:
            return
        async with self._lock:
            log.warning(
                "leases not renewed for %.1f s: stopping %d runner(s); the tasks resume from "
                "their saved positions once the store answers",
                self.fleet.safe_seconds,
                len(self._runners),
            )
            for task_id in list(self._runners):
                await self._stop_local(task_id, revoke=True)

    async def _stop_local(self, task_id: str, *, revoke: bool) -> None:
        """Stop this daemon's runner of a task; ``revoke``: its lease is lost, so it may not
        write even what it is finishing."""
        runner = self._runners.pop(task_id, None)
        fence = self._fences.pop(task_id, None)
        if revoke and fence is not None:
            fence.revoke()
        if runner is not None:
            with log_context(task_id=task_id):
                log.info(
                    "runner stops on fleet member %s%s",
                    self.fleet.member_id,
                    " (lease lost)" if revoke else "",
                )
            await self._stop_runner(task_id, runner)

    async def _release(self, task_id: str) -> None:
        """Give up the lease of a task this daemon no longer runs (its runner stopped)."""
        fence = self._fences.pop(task_id, None)
        if fence is not None and fence.lease is not None:
            try:
                await self._io(self._store.release_lease, fence.lease)
            except MetaStoreError as exc:
                log.warning("lease of task %s not released (it expires): %s", task_id, exc)

    def fleet_view(self) -> dict[str, Any]:
        """This daemon and the fleet as of the last round: who is in it and how many tasks
        each runs (``GET /v1/fleet``, the dashboard's header, ``cdc_fleet_*`` metrics)."""
        me = self.fleet.member_id
        runs = Counter(self._owners.values())
        return {
            "member_id": me,
            "lease_seconds": self.fleet.lease_seconds,
            "renewed": self.fleet.clock.remaining() > 0,
            "lease_seconds_left": round(max(0.0, self.fleet.clock.remaining()), 3),
            "members": [
                {
                    "member_id": m.member_id,
                    "address": m.info.get("address"),
                    "tasks": runs.get(m.member_id, 0),
                    "self": m.member_id == me,
                }
                for m in self._members
            ],
        }

    async def owners(self) -> dict[str, str]:
        """The member holding each task's lease, as the store says now (as of the last round
        when it does not answer)."""
        try:
            leases = await self._io(self._store.leases)
        except MetaStoreError:
            return dict(self._owners)
        return {task_id: lease.owner for task_id, lease in leases.items()}

    def runners_here(self) -> list[tuple[str, Mapping[str, Any], TaskRunner]]:
        """(task id, spec, runner) of every task running on this daemon now."""
        for task_id in set(self._runner_specs) - set(self._runners):
            self._runner_specs.pop(task_id, None)
        return [
            (task_id, self._runner_specs[task_id], runner)
            for task_id, runner in list(self._runners.items())
            if task_id in self._runner_specs
        ]

    def _live_applied(self, task_id: str) -> dict[str, int] | None:
        """The source time each pchannel of a task running here has applied (its runner's
        figures, fresher than the saved positions); None when it runs elsewhere or not at
        all."""
        runner = self._runners.get(task_id)
        if runner is None:
            return None
        return runner.applied_ticks()

    def state_counts(self) -> dict[TaskState, int]:
        return dict(Counter(self._states.values()))

    def task_states(self) -> dict[str, TaskState]:
        return dict(self._states)

    def progress(self, task_id: str, *, fleet: bool = True) -> dict[str, Any] | None:
        """The runner's status while it runs, with the task's last verify under ``verify``
        (shown whatever the task's state). ``fleet``: a task another member runs shows the
        summary that member published with its last heartbeat."""
        runner = self._runners.get(task_id)
        status: dict[str, Any] | None
        if runner is not None:
            status = runner.status()
        else:
            status = self._remote.get(task_id) if fleet else None
        verify = self._verify.view(task_id)
        jobs = self.disaster.views(task_id) if self.disaster is not None else {}
        if verify is None and not jobs:
            return status
        if verify is not None:
            jobs["verify"] = verify
        return {**(status or {}), **jobs}

    def all_progress(self, *, fleet: bool = False) -> dict[str, dict[str, Any]]:
        """The progress of the tasks this daemon runs or verifies (its metrics and samples);
        ``fleet``: also the summaries other members publish of theirs (get and list)."""
        jobs = self.disaster.task_ids() if self.disaster is not None else []
        task_ids = {
            *self._runners,
            *self._verify.task_ids(),
            *jobs,
            *(self._remote if fleet else ()),
        }
        return {
            task_id: progress
            for task_id in task_ids
            if (progress := self.progress(task_id, fleet=fleet)) is not None
        }

    # --- requests ----------------------------------------------------------------------------
    async def get(self, task_id: str) -> TaskRecord:
        task = await self._io(self._store.get_task, task_id)
        if task is None or CREATING in task.extra:
            raise NotFoundError(f"task {task_id} not found")
        return task

    async def list(self) -> list[TaskRecord]:
        return [t for t in await self._io(self._store.list_tasks) if CREATING not in t.extra]

    async def positions(self, task_id: str) -> dict[str, Position]:
        await self.get(task_id)
        return await self._io(self._store.get_positions, task_id)

    @property
    def store(self) -> MetaStore:
        return self._store

    def disaster_recovery(self) -> DisasterRecovery:
        """Switchover, failover and failback (a 503 when the application set none up)."""
        if self.disaster is None:
            raise UnavailableError("disaster recovery is not set up in this daemon")
        return self.disaster

    def runner_of(self, task_id: str) -> TaskRunner | None:
        """The runner of a task running here."""
        return self._runners.get(task_id)

    def timings(self) -> dict[str, TaskTimings]:
        """Where the lag of each task running here goes (replicator/pipeline/timings.py);
        runners that keep none (test doubles) are left out."""
        found = {}
        for task_id, runner in list(self._runners.items()):
            timings = getattr(runner, "timings", None)
            if isinstance(timings, TaskTimings):
                found[task_id] = timings
        return found

    async def live_members(self) -> set[str]:
        """The fleet members alive now (this daemon included)."""
        members = await self._io(self._store.members)
        return {m.member_id for m in members} | {self.fleet.member_id}

    async def set_reason(self, task_id: str, reason: str) -> TaskRecord:
        """Change a task's reason, its state kept (a failover says what the target holds)."""
        async with self._lock:
            task = await self.get(task_id)
            return await self._set_state(task, task.state, reason)

    async def pause(self, task_id: str, reason: str = PAUSED_BY_USER) -> TaskRecord:
        """Pause a task wherever it runs: here, its runner stops first; on another member, the
        state is stored and the call waits (``OWNER_STOP_WAIT`` at most) for that member's next
        round to stop its runner and give up the lease. ``reason``: why (a switchover names
        the reverse task)."""
        async with self._lock:
            self._changes += 1
            task = await self.get(task_id)
            if task.state is TaskState.PAUSED:
                raise ConflictError(f"task {task_id} is already Paused")
            runner = self._runners.pop(task_id, None)
            if runner is not None:
                await self._stop_runner(task_id, runner)
                task = await self.get(task_id)  # a runner may record a warning until it stops
            paused = await self._set_state(task, TaskState.PAUSED, reason)
            await self._release(task_id)
        if runner is None:
            await self._wait_owner_stops(task_id)
        return paused

    async def _wait_owner_stops(self, task_id: str) -> None:
        """Until no member holds the task's lease (its runner stopped), ``OWNER_STOP_WAIT`` at
        most: a member that died holds it until it expires, and runs nothing meanwhile."""
        deadline = time.monotonic() + OWNER_STOP_WAIT
        while True:
            try:
                holder = (await self._io(self._store.leases)).get(task_id)
            except MetaStoreError:
                return
            if holder is None:
                self._owners.pop(task_id, None)
                return
            if time.monotonic() >= deadline:
                log.warning(
                    "task %s paused; fleet member %s has not stopped its runner yet",
                    task_id,
                    holder.owner,
                )
                return
            await asyncio.sleep(0.1)

    async def resume(self, task_id: str) -> TaskRecord:
        async with self._lock:
            self._changes += 1
            task = await self.get(task_id)
            if task.state is TaskState.RUNNING:
                raise ConflictError(f"task {task_id} is already Running")
            return await self._launch(task)

    async def _launch(self, task: TaskRecord) -> TaskRecord:
        """Take the task's lease, fix where a task without positions starts (a 503, and no
        change, when the source cannot be read), then set it Running and start its runner
        here. A task whose secrets this daemon cannot decrypt is refused (409) and stays as
        it is. When another member still holds the lease (it has not yet stopped after a
        pause), the task is set Running and that member runs it."""
        self._changes += 1
        lease = await self._take_lease(task)
        if lease is None:
            return await self._set_state(task, TaskState.RUNNING, "")
        fence = self._fence(task.task_id, lease)
        try:
            runner = await self._prepared_runner(task, fence, "started")
        except BaseException:
            await self._release(task.task_id)
            raise
        task = await self._set_state(task, TaskState.RUNNING, "")
        started = await self._start_runner(task, runner, lease=lease)
        # a round that read the leases while this one was being taken is stale too (its
        # count was read after the one above): without this it stopped the new runner as
        # "lease lost" (seen right after a create)
        self._changes += 1
        return started

    def _fence(self, task_id: str, lease: Lease) -> Fence:
        fence = Fence(f"the runner of task {task_id}", lease, self.fleet.clock)
        self._fences[task_id] = fence
        self._owners[task_id] = lease.owner
        return fence

    async def backfill(self, request: BackfillRequest) -> tuple[TaskRecord, str]:
        """Ask for a backfill of a task's collections: a Running task stops its workers (their
        positions are saved), copies, then streams again from those positions; any other
        state runs it at the next resume. 409 while another backfill of the task is under
        way. Returns the task and the backfill's job id."""
        async with self._lock:
            task = await self.get(request.task_id)
            owner = self._owners.get(task.task_id)
            if task.task_id not in self._runners and owner not in (None, self.fleet.member_id):
                raise ConflictError(
                    f"task {task.task_id} runs on fleet member {owner}: ask that daemon for "
                    "the backfill (or pause the task, ask here, and resume it)"
                )
            if is_kafka(task.spec):
                raise BadRequestError(f"task {task.task_id}: a Kafka target takes no backfill")
            names = validate_backfill(
                request.collections,
                selection_of(dict(task.spec)),
                self._settings,
                "collections",
                task.spec.get("source_cluster"),
            )
            state = BackfillState(self._store, task.task_id)
            current = await self._io(state.job)
            if current is not None and current.active:
                raise ConflictError(
                    f"task {task.task_id}: backfill {current.job_id} is {current.state}; wait for "
                    "it to finish"
                )
            job = BackfillJob.new(names)
            await self._io(state.save_job, job)
            with log_context(task_id=task.task_id):
                log.info("backfill %s of %s asked", job.job_id, job.requested)
            self._changes += 1
            runner = self._runners.pop(task.task_id, None)
            if runner is not None:
                await self._stop_runner(task.task_id, runner)
                task = await self.get(task.task_id)
                fence = self._fences.get(task.task_id)
                # a lapsed lease is left to the next round, which reads whether it is held
                if task.state is TaskState.RUNNING and fence and fence.lease and not fence.revoked:
                    task = await self._start_runner(task, lease=fence.lease)
            return task, job.job_id

    def verify_job(self, task_id: str) -> VerifyJob | None:
        """The task's last verify job, as the daemon knows it."""
        return self._verify.job(task_id)

    async def verify(
        self, request: VerifyRequest, sample: float = 1.0, scheduled: bool = False
    ) -> tuple[TaskRecord, str]:
        """Start a verify job of a task's collections (in any state: a task that does not run
        applies nothing, so its differences cannot settle and ranges end unsettled). 409 while
        another verify of the task runs. Returns the task and the job id."""
        async with self._lock:
            task = await self.get(request.task_id)
            if is_kafka(task.spec):
                raise BadRequestError(
                    f"task {task.task_id}: a Kafka target cannot be verified against the source"
                )
            names = validate_verify(
                request.collections,
                selection_of(dict(task.spec)),
                self._settings,
                task.spec.get("source_cluster"),
            )
            if self._verify.running(task.task_id):
                current = self._verify.job(task.task_id)
                raise ConflictError(
                    f"task {task.task_id}: verify {current.job_id if current else ''} is "
                    "running; wait for it to finish"
                )
            job = VerifyJob.new(names, request.repair, sample, scheduled)
            await self._io(self._verify.start, task, job)
            with log_context(task_id=task.task_id):
                log.info(
                    "verify %s of %s asked%s%s",
                    job.job_id,
                    job.requested,
                    " with repair" if job.repair else "",
                    f" (scheduled, {sample:.0%} of the ranges)" if scheduled else "",
                )
            return task, job.job_id

    async def delete(self, task_id: str, ignore_not_found: bool = False) -> None:
        async with self._lock:
            self._changes += 1
            await self._io(self._verify.forget, task_id)
            runner = self._runners.pop(task_id, None)
            if runner is not None:
                await self._stop_runner(task_id, runner)
            # its lease goes with it: a runner on another member is refused its next write
            # (the task is gone) and stopped at that member's next round
            removed = await self._io(self._store.delete_task, task_id)
            self._states.pop(task_id, None)
            self._fences.pop(task_id, None)
            self._owners.pop(task_id, None)
        if not removed and not ignore_not_found:
            raise NotFoundError(f"task {task_id} not found")
        if removed:
            with log_context(task_id=task_id):
                log.info("task deleted")

    # --- internals ---------------------------------------------------------------------------
    def _remember(self, task: TaskRecord) -> None:
        self._states[task.task_id] = task.state
        self._redactor.add(*secrets_of(dict(task.spec)))

    async def _set_state(
        self,
        task: TaskRecord,
        state: TaskState,
        reason: str,
        lease: Lease | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        """Store a state change; ``lease``: only while this daemon holds the task (a runner's
        failure), a 409 once another member does; ``extra``: the record's new extra."""
        try:
            updated = await self._io(
                self._store.update_task,
                task.task_id,
                state=state,
                reason=reason,
                expected_revision=task.revision,
                lease=lease,
                extra=extra,
            )
        except TaskNotFoundError as exc:
            raise NotFoundError(f"task {task.task_id} not found") from exc
        except ConcurrentUpdateError as exc:
            raise ConflictError(str(exc)) from exc
        except FencedError as exc:
            raise ConflictError(f"task {task.task_id} runs on another fleet member") from exc
        self._remember(updated)
        with log_context(task_id=task.task_id):
            log.info(
                "task %s -> %s%s", task.state.value, state.value, f": {reason}" if reason else ""
            )
        await self._io(
            state_history.record,
            self._store,
            task.task_id,
            kind="state",
            to=state.value,
            reason=reason,
            by=self.fleet.member_id,
            **{"from": task.state.value},
        )
        return updated

    async def _start_runner(
        self, task: TaskRecord, runner: TaskRunner | None = None, *, lease: Lease
    ) -> TaskRecord:
        """Start the runner of a task stored as Running, under ``lease``; a runner that cannot
        start fails it with the reason. A task whose secrets this daemon cannot decrypt stays
        as it is: its lease is given up, for a daemon that can."""
        fence = self._fences.get(task.task_id)
        if fence is None or fence.lease != lease or fence.revoked:
            fence = self._fence(task.task_id, lease)
        with log_context(task_id=task.task_id):
            problem = await self._io(secrets_problem, self._store, task)
            if problem is not None:
                log.warning("task not started here, its lease given up: %s", problem)
                await self._release(task.task_id)
                self._owners.pop(task.task_id, None)
                return task
        if runner is None:
            store = FencedStore(self._store, fence)
            runner = self._runner_factory(task, store, self._on_runner_failure)
        with log_context(task_id=task.task_id):
            try:
                await runner.start()
            except Exception as exc:
                log.exception("task runner did not start")
                return await self._fail(task, f"cannot start: {exc}")
        self._runners[task.task_id] = runner
        self._runner_specs[task.task_id] = task.spec
        return task

    async def _fail(self, task: TaskRecord, reason: str) -> TaskRecord:
        """Set a task this daemon holds Failed and give its lease up."""
        fence = self._fences.get(task.task_id)
        try:
            failed = await self._set_state(
                task, TaskState.FAILED, reason, None if fence is None else fence.lease
            )
        finally:
            await self._release(task.task_id)
        return failed

    async def _stop_runner(self, task_id: str, runner: TaskRunner) -> None:
        with log_context(task_id=task_id):
            try:
                await runner.stop()
            except Exception:
                log.exception("task runner did not stop cleanly")

    async def _on_runner_failure(self, task_id: str, reason: str) -> None:
        async with self._lock:
            self._changes += 1
            runner = self._runners.pop(task_id, None)
            if runner is None:
                return  # already paused, deleted or drained
            task = await self._io(self._store.get_task, task_id)
            if task is not None:
                try:
                    await self._fail(task, reason)
                except (ConflictError, NotFoundError) as exc:
                    with log_context(task_id=task_id):
                        log.warning("runner failure not recorded (%s): %s", exc, reason)
        await self._stop_runner(task_id, runner)


def task_view(
    task: TaskRecord, progress: dict[str, Any] | None = None, owner: str | None = None
) -> dict[str, Any]:
    """A task as get and list show it (the Go tool's fields first; never a secret).
    ``progress`` is the runner's status while it runs (rows, bytes, lag, channels); ``owner``
    the fleet member running it (None when no daemon holds it)."""
    view = public_view(dict(task.spec))
    return {
        "task_id": task.task_id,
        **view,
        # both ends by name (README "Disaster recovery"); target_cluster null: an address
        "source_cluster": view.get("source_cluster") or DEFAULT_SOURCE,
        "target_cluster": view.get("target_cluster"),
        "state": task.state.value,
        "reason": task.reason,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "owner": owner,
        "progress": progress,
    }
