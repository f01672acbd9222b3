"""Disaster-recovery records a daemon cannot take up never stop it (issue 41, item 10): a
switchover job record that does not parse (another release wrote it) and a job between clusters
no longer in the configuration are each shown as ``unreadable`` on their task, and the daemon
starts and answers; a fence a job left with no owner is lifted by the first round."""

from __future__ import annotations

import uuid

import etcd3
import pytest
from harness.dr_jobs import task_record
from harness.services import wait_until

from metastore import TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.connections import SourceSettings
from server.dr.fence import EtcdQuotaFence
from server.dr.pair import FenceHold, PairStore
from server.dr.record import SWITCHOVER_KEY, SwitchoverJob

pytestmark = pytest.mark.integration


def paused_task(task_id: str, source: str, target: str) -> TaskRecord:
    return task_record(task_id, source, target, TaskState.PAUSED, "paused by the user")


def test_records_that_cannot_be_taken_up_are_shown_and_the_daemon_runs(
    daemon_factory, etcd_service
):
    roots = {name: f"drrec-{name}-{uuid.uuid4().hex[:6]}" for name in ("a", "b")}
    clusters = {
        name: {"etcd": {"address": [etcd_service.endpoint]}, "etcdRootPath": root}
        for name, root in roots.items()
    }
    daemon = daemon_factory("dr", clusters=clusters).start()  # the store made, then stopped
    daemon.stop()
    store = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    store.create_task(paused_task("t-bad", "a", "b"))
    store.put_state("t-bad", SWITCHOVER_KEY, b'{"job_id": "x", "future_field": ')
    store.create_task(paused_task("t-gone", "a", "b"))
    job = SwitchoverJob.new("t-gone", "old-member", 30, 600, ("gone", "b")).to("draining")
    store.put_state("t-gone", SWITCHOVER_KEY, job.to_bytes())
    # a fence on a whose job is gone (its task deleted): no owner runs
    host, port = etcd_service.endpoint.split("//")[-1].rsplit(":", 1)
    etcd = etcd3.client(host=host, port=int(port))
    key = f"{roots['a']}/config/quotaAndLimits/limitWriting/forceDeny"
    revision = EtcdQuotaFence("a", SourceSettings(**clusters["a"])).create()
    assert revision and etcd.get(key)[0] == b"true"
    orphan = FenceHold(("job-of-deleted",), revision)
    PairStore(store).update("a", "b", lambda p: p.with_fence("a", orphan))
    store.close()

    daemon.start()
    status, body = daemon.get("/readyz")
    assert status == 200, body
    for task_id, reason in (("t-bad", "JSONDecodeError"), ("t-gone", "no cluster named 'gone'")):
        view = daemon.call("get", {"task_id": task_id}).data["task"]
        shown = view["progress"]["switchover"]
        assert shown["state"] == "unreadable" and reason in shown["reason"], shown
        assert view["state"] == "Paused", view
    wait_until(lambda: etcd.get(key)[0] is None, 30, "the ownerless fence lifted")
    reopened = SqlMetaStore(sqlite_url(daemon.config["metaStoreConfig"]["sqlitePath"]), "cdc")
    assert PairStore(reopened).get("a", "b").fences == {}
    reopened.close()
    assert {t["task_id"] for t in daemon.call("list").data["tasks"]} == {"t-bad", "t-gone"}
    etcd.close()
