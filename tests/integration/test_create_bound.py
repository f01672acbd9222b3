"""A create against a source that cannot be read answers within the task's connect_timeout (plus
a little), naming the source and its address; the task is never shown meanwhile, nothing of it
is left afterwards, and a daemon killed during the create leaves nothing behind after its
restart.

"Unreachable" is a closed port (or, for RocksMQ, a path holding no RocksDB); "hanging" is a
listener that accepts and never answers (for RocksMQ, a local path, its source etcd hangs). The
tasks' connect_timeout is 3 s; the answer must come within it plus a generous margin."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness.blackhole import BlackHole
from harness.daemon import Daemon
from harness.services import free_port, wait_until
from harness.task_bodies import lite_param
from rocksdict import Options, Rdict

from metastore import Position, TaskRecord, TaskState
from metastore.fenced import Fence, FencedStore
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.settings import load_settings
from replicator.errors import SourceUnavailableError
from replicator.pipeline.runner import ReplicationRunner
from replicator.pipeline.runner_context import RunnerContext
from server.errors import NotFoundError, UnavailableError
from server.tasks.creation import CREATING
from server.tasks.requests import CreateRequest, parse_model
from server.tasks.supervisor import TaskSupervisor

pytestmark = pytest.mark.integration

BOUND = 3  # the tasks' connect_timeout, seconds
MARGIN = 5.0  # what the answer may take beyond it (store writes, a loaded machine)
PULSAR_TOKEN = "pulsar-token-never-shown"


def body(lite: Any, task_id: str, name: str = "*") -> dict[str, Any]:
    return {
        "task_id": task_id,
        "milvus_connect_param": lite_param(lite, connect_timeout=BOUND),
        "collection_infos": [{"name": name}],
    }


def open_store(daemon: Daemon) -> SqlMetaStore:
    return SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")


def nothing_stored(daemon: Daemon, task_id: str) -> None:
    store = open_store(daemon)
    try:
        assert store.get_task(task_id) is None
        assert store.get_positions(task_id) == {}
        assert store.list_state(task_id) == {}
        assert task_id not in store.leases()
    finally:
        store.close()


@contextmanager
def watched(daemon: Daemon, task_id: str) -> Iterator[list[str]]:
    """Polls list and get (and the REST views) while the block runs; yields what showed the
    task (nothing, when it stays hidden)."""
    seen: list[str] = []
    stop = threading.Event()
    polls = [0]

    def poll() -> None:
        while not stop.is_set():
            listed = daemon.call("list")
            if task_id in {t["task_id"] for t in listed.data.get("tasks") or []}:
                seen.append("list")
            if daemon.call("get", {"task_id": task_id}).code == 200:
                seen.append("get")
            if daemon.request("GET", f"/v1/tasks/{task_id}")[0] == 200:
                seen.append("GET /v1/tasks/{id}")
            rest = daemon.request("GET", "/v1/tasks")[2] or {}
            if task_id in json.dumps(rest):
                seen.append("GET /v1/tasks")
            status, metrics = daemon.get("/metrics")
            if status == 200 and task_id.encode() in metrics:
                seen.append("/metrics")
            polls[0] += 1
            stop.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield seen
    finally:
        stop.set()
        poller.join(timeout=30)
        assert polls[0] >= 1, "the views were not polled during the create"


# --- the six sources --------------------------------------------------------------------------
def empty_rocksdb(path: Path) -> str:
    """A RocksDB holding nothing, as a RocksMQ store no Milvus has written yet."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    Rdict(str(path), options).close()
    return str(path)


def kafka_at(address: str) -> dict[str, Any]:
    return {"kafka": {"address": address}}


def pulsar_at(address: str) -> dict[str, Any]:
    return {
        "mqType": "pulsar",
        "pulsar": {
            "address": f"pulsar://{address}",
            "authPlugin": "token",
            "authParams": f"token:{PULSAR_TOKEN}",
        },
    }


def queue_label(source: dict[str, Any]) -> str:
    """How the answer names the source's queue and its address."""
    if "pulsar" in source:
        return str(source["pulsar"]["address"])
    if "rocksmq" in source:
        return f"rocksmq://{source['rocksmq']['path']}"
    return f"kafka://{source['kafka']['address']}"


# (case, its source settings from (the hanging listener, a directory), the cause the answer
# gives, when it is always the same)
CASES: list[tuple[str, Callable[[BlackHole, Path], dict[str, Any]], str]] = [
    ("kafka-unreachable", lambda hole, d: kafka_at(f"127.0.0.1:{free_port()}"), "kafka"),
    ("kafka-hanging", lambda hole, d: kafka_at(hole.endpoint), "kafka"),
    ("pulsar-unreachable", lambda hole, d: pulsar_at(f"127.0.0.1:{free_port()}"), "pulsar"),
    ("pulsar-hanging", lambda hole, d: pulsar_at(hole.endpoint), "pulsar"),
    (
        "rocksmq-unreachable",
        lambda hole, d: {"mqType": "rocksmq", "rocksmq": {"path": str(d / "no-such-store")}},
        "no RocksDB at",
    ),
    (
        # RocksMQ is a local path: what can hang is the source's etcd
        "rocksmq-etcd-hanging",
        lambda hole, d: {
            "mqType": "rocksmq",
            "rocksmq": {"path": empty_rocksdb(d / "rmq")},
            "etcd": {"address": [hole.endpoint]},
        },
        f"the source etcd did not answer within {BOUND} s",
    ),
]


@pytest.mark.parametrize(("case", "source", "cause"), CASES, ids=[c[0] for c in CASES])
def test_create_against_a_lost_source_is_bounded_and_leaves_nothing(
    daemon_factory, milvus_lite_service, etcd_service, tmp_path, case, source, cause
):
    with BlackHole() as hole:
        settings = {
            "etcd": {"address": [etcd_service.endpoint]},
            "etcdRootPath": "no-source",
            "dmlChannelNum": 2,
            **source(hole, tmp_path),
        }
        daemon = daemon_factory(case, sourceConfig=settings).start()
        task_id = f"lost-{case}"
        with watched(daemon, task_id) as seen:
            started = time.monotonic()
            reply = daemon.call("create", body(milvus_lite_service, task_id))
            took = time.monotonic() - started
        print(f"{case}: answered {reply.status} after {took:.2f} s: {reply.message}")
        assert (reply.status, reply.code) == (503, 503), reply.body
        assert took < BOUND + MARGIN, f"{case}: answered after {took:.2f} s"
        assert seen == [], f"{case}: the task was shown by {sorted(set(seen))}"
        message = reply.message
        assert f"source queue {queue_label(settings)}" in message, message
        etcd = settings["etcd"]["address"][0]
        assert f"source etcd {etcd if '://' in etcd else f'http://{etcd}'}" in message, message
        assert "could not be read" in message and "not created" in message, message
        assert cause in message, message
        assert PULSAR_TOKEN not in reply.raw.decode()
        if case.endswith("hanging"):  # the listener was reached: a hang, not a refusal
            assert hole.accepted > 0
        nothing_stored(daemon, task_id)
        assert daemon.call("list").data["tasks"] == []
        # the same create again is refused the same way (nothing left in its way)
        again = daemon.call("create", body(milvus_lite_service, task_id))
        assert again.status == 503, again.body
        daemon.stop()
    assert PULSAR_TOKEN not in daemon.log_text()


def test_kill_during_a_create_leaves_nothing_after_restart(
    daemon_factory, milvus_lite_service, etcd_service
):
    with BlackHole() as hole:
        settings = {
            "etcd": {"address": [etcd_service.endpoint]},
            "etcdRootPath": "no-source",
            "dmlChannelNum": 2,
            "kafka": {"address": hole.endpoint},
        }
        daemon = daemon_factory("killed", sourceConfig=settings).start()
        task_id = "killed-mid-create"
        answers: list[Any] = []

        def create() -> None:
            try:
                answers.append(daemon.call("create", body(milvus_lite_service, task_id)))
            except OSError as exc:  # the daemon died under the request
                answers.append(exc)

        creating = threading.Thread(target=create, daemon=True)
        creating.start()
        wait_until(lambda: hole.accepted > 0, BOUND, "the create reading the hanging source")
        # the record is stored, marked as being created, and shown nowhere
        store = open_store(daemon)
        try:
            record = store.get_task(task_id)
        finally:
            store.close()
        assert record is not None and CREATING in record.extra, record
        assert daemon.call("get", {"task_id": task_id}).code != 200
        daemon.kill()
        creating.join(timeout=10)
        assert answers and isinstance(answers[0], OSError), answers

        daemon.start()
        assert daemon.call("list").data["tasks"] == []
        assert daemon.call("get", {"task_id": task_id}).code != 200
        nothing_stored(daemon, task_id)
        assert "its create (on fleet member" in daemon.log_text()


# --- the supervisor and the runner, with stand-ins -------------------------------------------
class StuckRunner:
    """A runner whose prepare never returns (a runner that ignores its bound)."""

    def __init__(self, task: TaskRecord, store: Any) -> None:
        self.task, self.store = task, store

    async def prepare(self) -> None:
        await asyncio.Event().wait()

    async def start(self) -> None:
        raise AssertionError("never started")

    async def stop(self) -> None:
        pass

    def status(self) -> dict[str, Any]:
        return {}


def supervisor_on(tmp_path: Path, factory: Callable[..., Any], member: str = "") -> TaskSupervisor:
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    settings = load_settings(None, {})
    if member:
        fleet = settings.fleet.model_copy(update={"memberId": member})
        settings = settings.model_copy(update={"fleet": fleet})
    return TaskSupervisor(store, settings, factory, lambda _connect: "v2.4.0")


def request(task_id: str, timeout: int = 1) -> CreateRequest:
    return parse_model(
        CreateRequest,
        {
            "task_id": task_id,
            "milvus_connect_param": {"uri": "http://127.0.0.1:1", "connect_timeout": timeout},
            "collection_infos": [{"name": "*"}],
        },
    )


async def test_a_prepare_that_ignores_its_bound_is_answered_without_it(tmp_path):
    supervisor = supervisor_on(tmp_path, lambda task, store, _cb: StuckRunner(task, store))
    await supervisor.start()
    shown: list[Any] = []

    async def peek() -> None:
        while True:
            shown.extend(await supervisor.list())
            with pytest.raises(NotFoundError):
                await supervisor.get("stuck")
            await asyncio.sleep(0.05)

    peeking = asyncio.create_task(peek())
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="did not answer within 1 s"):
        await supervisor.create(request("stuck"))
    took = time.monotonic() - started
    peeking.cancel()
    assert took < 1 + MARGIN, took
    assert shown == []
    raw = supervisor.store
    assert raw.get_task("stuck") is None and "stuck" not in raw.leases()
    await supervisor.drain(1)


async def test_abandoned_creates_are_removed_by_the_rounds_and_at_restart(tmp_path):
    supervisor = supervisor_on(tmp_path, lambda *_: None, member="me:1")
    store = supervisor.store
    now = time.time()

    def abandoned(task_id: str, by: str, until: float) -> None:
        store.create_task(
            TaskRecord(
                task_id,
                TaskState.INITIAL,
                "starting",
                {"milvus_connect_param": {"uri": "http://x:1"}},
                now,
                now,
                extra={CREATING: {"by": by, "until": until}},
            )
        )
        store.save_position(task_id, Position("kafka", "dml_0", b"\x01" * 8, 0), None)
        store.put_state(task_id, "k", b"v")

    abandoned("mine-before-restart", "me:1", now + 60)  # this member died creating it
    abandoned("theirs-expired", "other:2", now - 1)  # another member died creating it
    abandoned("theirs-under-way", "other:2", now + 1.5)  # another member is creating it
    await supervisor.start()
    assert store.get_task("mine-before-restart") is None
    assert store.get_positions("mine-before-restart") == {}
    assert store.list_state("theirs-expired") == {}
    assert store.get_task("theirs-expired") is None
    assert store.get_task("theirs-under-way") is not None  # not shown, not removed
    assert await supervisor.list() == []
    await asyncio.sleep(1.6)
    await supervisor.reconcile()
    assert store.get_task("theirs-under-way") is None
    assert store.get_positions("theirs-under-way") == {}
    await supervisor.drain(1)


class ClaimedRunner(StuckRunner):
    """Its prepare finishes after another member removed the task as abandoned."""

    async def prepare(self) -> None:
        task = self.store.get_task(self.task.task_id)
        self.store.inner.update_task(
            task.task_id, state=task.state, reason="x", expected_revision=task.revision
        )


async def test_a_create_whose_record_was_taken_as_abandoned_is_not_shown(tmp_path):
    supervisor = supervisor_on(tmp_path, lambda task, store, _cb: ClaimedRunner(task, store))
    await supervisor.start()
    with pytest.raises(UnavailableError, match="was not created"):
        await supervisor.create(request("claimed"))
    assert supervisor.store.get_task("claimed") is None
    assert await supervisor.list() == []
    await supervisor.drain(1)


class EmptyQueue:
    """A queue that answers at once: every channel empty."""

    backend = "kafka"

    def __init__(self) -> None:
        self.asked: list[float | None] = []

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        self.asked.append(timeout)
        return 0, 0

    @staticmethod
    def offset_of(msg_id: bytes) -> int:
        return int.from_bytes(msg_id, "little")

    @staticmethod
    def position_before(offset: int) -> bytes | None:
        return None


async def test_a_read_returning_after_the_bound_writes_nothing(tmp_path):
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    now = time.time()
    task = store.create_task(
        TaskRecord(
            "late",
            TaskState.INITIAL,
            "starting",
            {"milvus_connect_param": {"uri": "http://x:1", "connect_timeout": 1}},
            now,
            now,
        )
    )
    source = EmptyQueue()
    release = threading.Event()

    def catalog() -> dict[int, Any]:  # the source etcd, answering only when released
        release.wait()
        return {}

    context = RunnerContext(source=lambda: source, catalog=catalog, channels=["dml_0", "dml_1"])
    fence = Fence("the runner of task late")
    runner = ReplicationRunner(task, FencedStore(store, fence), _no_failure, context)
    started = time.monotonic()
    with pytest.raises(SourceUnavailableError, match="the source etcd did not answer within 1 s"):
        await runner.prepare()
    took = time.monotonic() - started
    assert 1 <= took < 1 + MARGIN, took
    assert len(source.asked) == 2 and all(0 < (t or 0) <= 1 for t in source.asked)
    assert fence.revoked
    release.set()  # the read returns now: the start positions it would save are refused
    wait_until(
        lambda: not any(t.name == "prepare-late" for t in threading.enumerate()),
        10,
        "the late prepare thread to end",
    )
    assert store.get_positions("late") == {}
    store.close()


async def _no_failure(_task_id: str, _reason: str) -> None:
    raise AssertionError("no failure expected")
