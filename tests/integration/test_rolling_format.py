"""Rolling upgrades: a breaking step of the store's format (a test-only step 2 -> 3 of a release
"0.5.0", registered here) waits until every live fleet member reads format 3, on every backend;
the daemon keeps the store in format 2 and raises it when the older members are gone (its
scheduler's job tries again). With a real daemon of this release in the fleet: the step waits
while it runs, is taken once it stops, and this release then refuses the format-3 store by
name."""

from __future__ import annotations

import asyncio
import json

import pytest
from harness.services import wait_until

from metastore import StoreFormat
from metastore.etcd import EtcdMetaStore
from metastore.etcd_connect import connect_etcd
from metastore.format import MIGRATIONS, STORE_FORMAT, Migration, migrate_store
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.release import RELEASE
from replicator.config.settings import load_settings
from server.runtime import jobs as jobs_module
from server.runtime.store_format import StoreFormatKeeper
from server.tasks.supervisor import TaskSupervisor
from server.tasks.target_check import check_target_reachable

pytestmark = pytest.mark.integration

NEXT = STORE_FORMAT + 1
TTL = 30.0


def next_release(store, member_id: str, applied: list[str]) -> StoreFormatKeeper:
    """The keeper of a release "0.5.0" whose step to format ``NEXT`` is breaking."""
    step = Migration(NEXT, "a test step older releases cannot read", applied.append, breaking=True)
    return StoreFormatKeeper(
        store,
        member_id,
        release="0.5.0",
        latest=NEXT,
        migrations={**MIGRATIONS, STORE_FORMAT: step},
    )


def member_of_this_release(daemon_factory, etcd_service, root_path: str):  # -> Daemon
    """A started daemon of this release, "member-0.4", on the etcd store at ``root_path``."""
    return daemon_factory(
        "member-0.4",
        metaStoreConfig={
            "storeType": "etcd",
            "etcd": {"address": [etcd_service.endpoint]},
            "rootPath": root_path,
        },
        fleet={"leaseSeconds": 4.0, "checkSeconds": 0.5, "memberId": "member-0.4"},
    ).start()


async def test_a_breaking_step_waits_until_every_live_member_reads_it(
    store_opener, root_path, caplog
):
    store = store_opener(root_path)
    applied: list = []
    keeper = next_release(store, "new", applied)
    # this member's own heartbeat of its previous run (release 0.4.0) does not hold it back
    store.heartbeat("new", {"release": RELEASE, "store_format": STORE_FORMAT}, TTL)
    store.heartbeat("old", {"release": RELEASE, "store_format": STORE_FORMAT}, TTL)
    store.heartbeat("older", {"address": "h:1", "tasks": {}}, TTL)  # before 0.4.0: no release

    # the non-breaking steps are taken, the breaking one waits: the store stays in format 2
    assert keeper.migrate() == StoreFormat(STORE_FORMAT, "0.5.0")
    assert keeper.pending and applied == []
    assert store.store_format() == StoreFormat(STORE_FORMAT, "0.5.0")
    said = [r.getMessage() for r in caplog.records if "waits" in r.getMessage()]
    assert said and f"release {RELEASE}, reads formats to {STORE_FORMAT}" in said[-1]
    assert "older (release before 0.4.0, reads formats to 1)" in said[-1]

    store.leave("older")
    await keeper.retry()  # the scheduler's job: "old" still reads format 2 only
    assert keeper.pending and applied == [] and store.store_format().version == STORE_FORMAT
    await keeper.retry()  # the same members: not said again
    said = [r.getMessage() for r in caplog.records if "waits" in r.getMessage()]
    assert len(said) == 2 and "older (release" not in said[-1]

    store.leave("old")  # the last older member stopped; a member of the new release runs
    store.heartbeat("other-new", {"release": "0.5.0", "store_format": NEXT}, TTL)
    await keeper.retry()
    assert not keeper.pending and len(applied) == 1
    assert store.store_format() == StoreFormat(NEXT, "0.5.0") == keeper.current
    await keeper.retry()  # done: nothing run again
    assert len(applied) == 1


async def test_a_live_daemon_of_this_release_holds_the_step_back_then_refuses_the_new_format(
    daemon_factory, etcd_service, root_path
):
    member = member_of_this_release(daemon_factory, etcd_service, root_path)
    store = EtcdMetaStore(connect_etcd([etcd_service.endpoint]), root_path)
    try:
        applied: list = []
        keeper = next_release(store, "member-0.5", applied)
        wait_until(lambda: store.members(), 10, "the daemon's heartbeat")
        assert keeper.migrate().version == STORE_FORMAT  # the 0.4 daemon is live: it waits
        assert applied == [] and store.store_format() == StoreFormat(STORE_FORMAT, RELEASE)
        assert member.get("/readyz")[0] == 200

        assert member.stop() == 0  # it leaves the fleet as it stops
        await keeper.retry()
        assert store.store_format() == StoreFormat(NEXT, "0.5.0") and len(applied) == 1

        # started again, this release meets a store it cannot read: refused by name, untouched
        member.launch()
        assert member.process is not None
        await asyncio.to_thread(member.process.wait, 30)
        assert member.process.returncode != 0
        assert (
            f"holds data in format {NEXT}, written by release 0.5.0; release {RELEASE} reads "
            f"formats 1 to {STORE_FORMAT} only" in member.log_text()
        )
        assert store.store_format() == StoreFormat(NEXT, "0.5.0")
    finally:
        store.close()


async def test_the_scheduler_raises_the_format_once_the_older_member_is_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "RETRY_SECONDS", 0.2)
    store = SqlMetaStore(sqlite_url(str(tmp_path / "meta.db")), "cdc")
    store.heartbeat("old", {"release": RELEASE, "store_format": STORE_FORMAT}, TTL)
    applied: list = []
    keeper = next_release(store, "new", applied)
    keeper.migrate()
    assert keeper.pending
    settings = load_settings(None, {})
    supervisor = TaskSupervisor(store, settings, lambda *a: None, check_target_reachable)
    jobs = jobs_module.DaemonJobs(settings.scheduler, supervisor, store, store_format=keeper)
    jobs.start()
    try:
        assert jobs.scheduler.get_job("raise_store_format") is not None
        await asyncio.sleep(1.0)  # it ran, and waits: the older member is live
        assert keeper.pending and applied == []
        store.leave("old")
        for _ in range(50):
            if not keeper.pending:
                break
            await asyncio.sleep(0.1)
        assert store.store_format() == StoreFormat(NEXT, "0.5.0") and len(applied) == 1
    finally:
        jobs.stop()
        store.close()


async def test_a_running_member_finding_the_store_past_what_it_reads_stops_and_says_so(
    daemon_factory, etcd_service, milvus_lite_service, root_path
):
    """A member of this release runs a task; a member of "0.5.0" that did not see it (its
    heartbeat had lapsed, say) takes the breaking step. At its next heartbeat the running
    member reads the format again: it stops its runner, gives the lease up, takes nothing, and
    says why in ``/readyz`` and its log (it used to run on, on a store it cannot read)."""
    member = member_of_this_release(daemon_factory, etcd_service, root_path)
    store = EtcdMetaStore(connect_etcd([etcd_service.endpoint]), root_path)
    try:
        created = member.call(
            "create",
            {
                "milvus_connect_param": {"uri": milvus_lite_service.uri},
                "collection_infos": [{"name": "*"}],
            },
        )
        assert created.code == 200, created.body
        task_id = created.data["task_id"]

        def owner() -> str | None:
            lease = store.leases().get(task_id)
            return lease.owner if lease is not None else None

        wait_until(lambda: owner() == "member-0.4", 30, "the task run by the member")
        applied: list = []
        step = Migration(NEXT, "a test step older releases cannot read", applied.append, True)
        # the newer member sees no other (fleet None): the step is taken at once
        migrate_store(
            store, "0.5.0", latest=NEXT, migrations={**MIGRATIONS, STORE_FORMAT: step}, fleet=None
        )
        assert store.store_format() == StoreFormat(NEXT, "0.5.0") and len(applied) == 1

        refusal = (
            f"holds data in format {NEXT}, written by release 0.5.0; release {RELEASE} reads "
            f"formats 1 to {STORE_FORMAT} only"
        )

        def not_ready() -> dict | None:
            status, body = member.get("/readyz")
            answer = json.loads(body)
            return answer if status == 503 else None

        answer = wait_until(not_ready, 30, "/readyz saying the store's format")
        assert answer["status"] == "not ready", answer
        assert answer["reason"].startswith("metastore format: the metastore (rootPath "), answer
        assert refusal in answer["reason"], answer
        wait_until(lambda: owner() is None, 30, "the lease given up")
        assert "fleet member member-0.4 is not ready: " in member.log_text()
        await asyncio.sleep(2.0)  # rounds go on: it takes the free task no more
        assert owner() is None
        assert member.call("get", {"task_id": task_id}).data["task"]["state"] == "Running"
    finally:
        store.close()
