"""The supervisor's handling of task runners: start failures, runtime failures, drain and
restart. Real SQLite store and a real Milvus Lite target; the runners are scripted stand-ins for
the replication engine, which is what these tests are about."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from metastore import TaskState
from metastore.keyring import KeyRing
from metastore.sealed import MissingKeys, SealedMetaStore
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.daemon import FleetSettings
from replicator.config.settings import load_settings
from server.errors import ConflictError
from server.tasks.requests import CreateRequest, parse_model
from server.tasks.supervisor import TaskSupervisor
from server.tasks.target_check import check_target_reachable

pytestmark = pytest.mark.integration


class ScriptedRunner:
    finished = False  # a real runner's: it ended (fenced off, or its task deleted)

    def __init__(self, events: list, task, on_failure, fail_start: bool) -> None:
        self.events, self.task_id, self.on_failure = events, task.task_id, on_failure
        self.fail_start = fail_start

    async def prepare(self) -> None:
        pass  # these stand-ins have no source: nothing to fix

    async def start(self) -> None:
        self.events.append(("start", self.task_id))
        if self.fail_start:
            raise RuntimeError("source etcd unreachable")

    async def stop(self) -> None:
        self.events.append(("stop", self.task_id))

    def status(self) -> dict:
        return {"rows": 0, "bytes": 0, "lag_seconds": None, "channels": []}


@pytest.fixture
def make_supervisor(tmp_path):
    stores = []

    def make(
        events: list, fail_start: bool = False, ring: KeyRing | None = None, **overrides: object
    ) -> tuple[TaskSupervisor, list]:
        """``ring``: the secrets are sealed with this key ring (none: stored as they are)."""
        store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
        stores.append(store)
        sealed = None if ring is None else SealedMetaStore(store, lambda: ring)
        runners: list[ScriptedRunner] = []

        def factory(task, _store, on_failure):
            runner = ScriptedRunner(events, task, on_failure, fail_start)
            runners.append(runner)
            return runner

        settings = load_settings(None, {})
        if overrides:
            settings = settings.model_copy(update=overrides)
        if sealed is None:
            return TaskSupervisor(store, settings, factory, check_target_reachable), runners
        supervisor = TaskSupervisor(
            sealed, settings, factory, check_target_reachable, key_check=sealed.missing_keys
        )
        return supervisor, runners

    yield make
    for store in stores:
        store.close()


def create_request(lite, name: str, **extra) -> CreateRequest:
    return parse_model(
        CreateRequest,
        {
            "milvus_connect_param": {"host": lite.host, "port": lite.port},
            "collection_infos": [{"name": name}],
            **extra,
        },
    )


async def test_runner_that_cannot_start_fails_the_task(make_supervisor, milvus_lite_service):
    events: list = []
    supervisor, _ = make_supervisor(events, fail_start=True)
    await supervisor.start()
    task = await supervisor.create(create_request(milvus_lite_service, "a"))
    assert task.state is TaskState.FAILED
    assert task.reason == "cannot start: source etcd unreachable"
    stored = await supervisor.get(task.task_id)
    assert (stored.state, stored.reason) == (TaskState.FAILED, task.reason)
    assert supervisor.state_counts() == {TaskState.FAILED: 1}


async def test_runner_failure_while_running_fails_only_that_task(
    make_supervisor, milvus_lite_service
):
    events: list = []
    supervisor, runners = make_supervisor(events)
    await supervisor.start()
    a = await supervisor.create(create_request(milvus_lite_service, "a"))
    b = await supervisor.create(create_request(milvus_lite_service, "b"))
    await runners[0].on_failure(a.task_id, "channel dml_0 at 42: undecodable record")
    assert (await supervisor.get(a.task_id)).state is TaskState.FAILED
    assert (await supervisor.get(a.task_id)).reason == "channel dml_0 at 42: undecodable record"
    assert (await supervisor.get(b.task_id)).state is TaskState.RUNNING
    assert ("stop", a.task_id) in events
    assert ("stop", b.task_id) not in events
    # a failure reported twice, or after a pause, changes nothing
    await runners[0].on_failure(a.task_id, "again")
    assert (await supervisor.get(a.task_id)).reason == "channel dml_0 at 42: undecodable record"
    # the operator resumes it: a new runner starts
    resumed = await supervisor.resume(a.task_id)
    assert resumed.state is TaskState.RUNNING
    assert events.count(("start", a.task_id)) == 2


async def test_drain_stops_runners_and_restart_starts_only_running_tasks(
    make_supervisor, milvus_lite_service
):
    events: list = []
    supervisor, _ = make_supervisor(events)
    await supervisor.start()
    running = await supervisor.create(create_request(milvus_lite_service, "r"))
    paused = await supervisor.create(create_request(milvus_lite_service, "p"))
    await supervisor.pause(paused.task_id)
    initial = await supervisor.create(
        create_request(milvus_lite_service, "i", disable_auto_start=True)
    )
    events.clear()
    await supervisor.drain(budget=5)
    assert sorted(events) == [("stop", running.task_id)]
    # the states survive the drain, so a new daemon resumes exactly the running task
    events.clear()
    again, _ = make_supervisor(events)
    await again.start()
    assert events == [("start", running.task_id)]
    states = {t.task_id: t.state for t in await again.list()}
    assert states == {
        running.task_id: TaskState.RUNNING,
        paused.task_id: TaskState.PAUSED,
        initial.task_id: TaskState.INITIAL,
    }


async def test_drain_budget_abandons_a_stuck_runner(make_supervisor, milvus_lite_service):
    events: list = []
    supervisor, runners = make_supervisor(events)
    await supervisor.start()
    await supervisor.create(create_request(milvus_lite_service, "stuck"))

    async def never_stops() -> None:
        await asyncio.sleep(3600)

    runners[0].stop = never_stops
    loop = asyncio.get_running_loop()
    started = loop.time()
    await supervisor.drain(budget=0.5)
    assert loop.time() - started < 3


async def test_concurrent_creates_cannot_both_take_the_same_collections(
    make_supervisor, milvus_lite_service
):
    supervisor, _ = make_supervisor([])
    await supervisor.start()
    results = await asyncio.gather(
        *(supervisor.create(create_request(milvus_lite_service, "same")) for _ in range(4)),
        return_exceptions=True,
    )
    created = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(created) == 1
    assert all("overlapping" in str(e) for e in refused)
    assert len(await supervisor.list()) == 1


async def test_a_round_read_before_the_leases_lapsed_starts_no_runner_after(
    make_supervisor, milvus_lite_service
):
    """The order a CI run produced (tests/e2e/test_fleet.py, a daemon cut from its store): a
    round of member a read the store just before the cut, the answer was held back, and it
    arrived after member b had taken the task and after a's heartbeat went through again. Run
    on that read, the round started a runner under a live lease clock, which replayed a batch
    onto the target behind b's back (a target write carries no lease token). Here on a real
    store, with a's reads and heartbeat held back by hand: nothing starts on a."""
    lease = 2.0  # the smallest the settings allow
    fleet = {"leaseSeconds": lease, "checkSeconds": 0.5}
    events: list = []
    a, _ = make_supervisor(events, fleet=FleetSettings(**fleet, memberId="a"))
    b, _ = make_supervisor(events, fleet=FleetSettings(**fleet, memberId="b"))
    await a.renew()
    await b.renew()
    task = await a.create(create_request(milvus_lite_service, "lapse"))
    assert events == [("start", task.task_id)]
    held_back = a.rounds._read_fleet()  # what the store said just before the cut: a holds the task

    # the cut: a's heartbeats stop; its clock runs out and it stops its runner
    await asyncio.sleep(lease * 0.7)
    assert a.fleet.clock.remaining() <= 0
    a.rounds._writes_stopped()
    await asyncio.gather(*a.rounds._stopping)
    assert events[-1] == ("stop", task.task_id)
    await asyncio.sleep(lease * 0.4)  # past the lease as the store counts it
    await b.renew()
    await b.reconcile()
    assert (await b.owners())[task.task_id] == "b"

    # the held-back read arrives while the clock is still out: nothing starts
    events.clear()
    a.rounds._read_fleet = lambda: held_back  # type: ignore[method-assign]
    await a.reconcile()
    assert events == [] and task.task_id not in a.runs.runners

    # healed: the read is held back until a's heartbeat has been heard again
    def read_held_across_a_heartbeat() -> tuple:
        sent = time.monotonic()
        a._store.heartbeat("a", {}, lease)
        a.fleet.renewed(sent)
        return held_back

    a.rounds._read_fleet = read_held_across_a_heartbeat  # type: ignore[method-assign]
    await a.reconcile()
    assert a.fleet.clock.remaining() > 0
    assert events == [] and task.task_id not in a.runs.runners
    # the next round reads the store as it is: b holds the task, a starts nothing either
    del a.rounds._read_fleet
    await a.reconcile()
    assert events == [] and task.task_id not in a.runs.runners


async def test_a_member_without_the_key_gives_up_the_lease_and_changes_nothing(
    make_supervisor, milvus_lite_service
):
    """A daemon restarted with another key file while its lease on a task is still live: it
    gives the lease up, for a daemon that can open the task's secrets, neither failing nor
    changing the task; it takes no free task either, and is not counted in the share."""
    fleet = {"leaseSeconds": 30.0, "checkSeconds": 0.5}
    fleet_ring = KeyRing((("fleet", os.urandom(32)),))
    events: list = []
    good, _ = make_supervisor(events, ring=fleet_ring, fleet=FleetSettings(**fleet, memberId="a"))
    await good.start()
    connect = {"host": milvus_lite_service.host, "port": milvus_lite_service.port}
    request = parse_model(
        CreateRequest,
        {
            "milvus_connect_param": {**connect, "username": "root", "password": "Pa55-sealed"},
            "collection_infos": [{"name": "keys"}],
        },
    )
    task = await good.create(request)
    await good.drain(budget=5)
    before = await good.get(task.task_id)
    assert before.state is TaskState.RUNNING

    other_ring = KeyRing((("other", os.urandom(32)),))
    wrong, _ = make_supervisor(events, ring=other_ring, fleet=FleetSettings(**fleet, memberId="b"))
    store = wrong._store
    store.heartbeat("b", {}, 30.0)
    assert store.acquire_lease(task.task_id, "b", 30.0) is not None  # held from before
    events.clear()
    await wrong.start()
    assert wrong.missing_keys == MissingKeys(("fleet",), ("other",))
    assert wrong.rounds._member_info()["missing_keys"] == ["fleet"]
    assert events == [] and task.task_id not in store.leases()
    await wrong.reconcile()  # the task is free now: still not taken
    assert events == [] and task.task_id not in store.leases()
    stored = await wrong.get(task.task_id)
    assert (stored.state, stored.reason, stored.revision) == (
        TaskState.RUNNING,
        before.reason,
        before.revision,
    )

    again, _ = make_supervisor(events, ring=fleet_ring, fleet=FleetSettings(**fleet, memberId="a"))
    await again.start()  # b is not counted: a's share is the whole task
    assert events == [("start", task.task_id)]
    assert store.leases()[task.task_id].owner == "a"
    await again.drain(budget=5)
    await wrong.drain(budget=5)


async def test_a_round_racing_a_create_leaves_the_new_tasks_lease_alone(
    make_supervisor, milvus_lite_service
):
    """The order two CI runs produced (a create answered 503 "lease token ... is no longer
    held" 120 ms after it took the lease): a round listed the tasks, a create then stored its
    task and took its lease, and the round read the leases: a lease of a task it had not
    listed, which it gave up under the create. Here the round's listing is held until the
    create has its lease, and the create until the round is over: the create succeeds."""
    import inspect
    import threading

    events: list = []
    a, _ = make_supervisor(events, fleet=FleetSettings(memberId="a"))
    await a.renew()
    first = await a.create(create_request(milvus_lite_service, "first"))
    store = a._store
    leased, round_over = threading.Event(), threading.Event()
    list_tasks, acquire_lease = store.list_tasks, store.acquire_lease

    def listing_before_the_create() -> list:
        listed = list_tasks()
        if any(frame.function == "_read_fleet" for frame in inspect.stack()):
            leased.wait(10)  # the round's listing: the create takes its lease meanwhile
        return listed

    def lease_then_hold(*args: object) -> object:
        lease = acquire_lease(*args)
        if args[0] != first.task_id:  # the create's (a round renews the first task's)
            leased.set()
            round_over.wait(10)  # the round reads the leases and acts meanwhile
        return lease

    store.list_tasks = listing_before_the_create  # type: ignore[method-assign]
    store.acquire_lease = lease_then_hold  # type: ignore[method-assign]

    async def one_round() -> None:
        await a.reconcile()
        round_over.set()

    creating = asyncio.create_task(a.create(create_request(milvus_lite_service, "second")))
    await one_round()
    store.list_tasks, store.acquire_lease = list_tasks, acquire_lease  # type: ignore[method-assign]
    task = await asyncio.wait_for(creating, 20)
    # its lease was left alone (a real runner's first write under it would have failed with
    # FencedError; these stand-ins write nothing)
    held = store.leases().get(task.task_id)
    assert held is not None and held.owner == "a", store.leases()
    assert held == a.runs.fences[task.task_id].lease
    assert ("start", task.task_id) in events


async def test_a_state_change_is_made_over_a_write_that_kept_the_state(
    make_supervisor, milvus_lite_service
):
    """CI of d43bc28: a pause answered 409 "changed concurrently" because the runner it had
    abandoned (stuck on a hung source) recorded a warning between the pause's read and its
    write. A write that kept the state does not refuse a state change; one that changed the
    state, or an extra computed from the record read, still does (409: read it again)."""
    events: list = []
    supervisor, _ = make_supervisor(events)
    await supervisor.start()
    store = supervisor.runs.store
    task = await supervisor.create(create_request(milvus_lite_service, "w"))
    read = await supervisor.get(task.task_id)
    # what a runner recording a warning writes (replicator/pipeline/status.py)
    store.update_task(
        task.task_id,
        state=TaskState.RUNNING,
        reason="source etcd unreachable",
        expected_revision=read.revision,
    )
    paused = await supervisor.runs.set_state(read, TaskState.PAUSED, "paused by user")
    assert (paused.state, paused.reason) == (TaskState.PAUSED, "paused by user")
    stored = await supervisor.get(task.task_id)
    assert (stored.state, stored.reason) == (TaskState.PAUSED, "paused by user")

    # another member resumed it first: the pause read before that is refused
    store.update_task(
        task.task_id, state=TaskState.RUNNING, reason="", expected_revision=paused.revision
    )
    with pytest.raises(ConflictError, match="changed concurrently"):
        await supervisor.runs.set_state(paused, TaskState.PAUSED, "paused by user")

    # an extra made from the record read is not written over a newer record
    running = await supervisor.get(task.task_id)
    store.update_task(
        task.task_id,
        state=TaskState.RUNNING,
        reason="a warning",
        expected_revision=running.revision,
    )
    with pytest.raises(ConflictError, match="changed concurrently"):
        await supervisor.runs.set_state(running, TaskState.RUNNING, "", extra={"shown": True})
