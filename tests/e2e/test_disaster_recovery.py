"""Disaster recovery end to end, on two real Milvus 2.3.5 clusters: ``a`` (WAL on the Kafka
mock) and ``b`` (WAL in RocksMQ), named in one daemon's ``clusters``.

- a switchover of a task a -> b while a writer keeps writing to a: the writer's acknowledged
  rows are all on b, the job goes checking .. done, the reverse task b -> a carries b's new
  writes to a, and a switchover of the reverse task brings the original back;
- a switchover that cannot finish rolls back (fence lifted, task running and replicating);
- a daemon killed mid-switchover finishes or rolls the job back when it starts again, and
  leaves no fence on;
- a failover answers what the target holds, and the rows the target lacks are in its export.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.daemon import Daemon
from harness.dr_clusters import (
    cluster,
    consistent_known,
    create_task,
    fence_at,
    switchover_ends,
    task,
)
from harness.dr_clusters import row as _row
from harness.dr_clusters import seconds_of as _seconds
from harness.installed import daemon_command
from harness.services import wait_until
from prometheus_client.parser import text_string_to_metric_families
from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from replicator.codec.streaming import decode_any
from replicator.config.connections import SourceSettings
from replicator.events import Insert
from replicator.sources.kafka import KafkaSource, decode_offset
from server.dr.fence import EtcdQuotaFence, wait_in_effect
from server.dr.flows import FAULT_ENV
from tests.e2e.test_replication import create_source_collection, rows, wait_equal

pytestmark = pytest.mark.e2e


class Writer(threading.Thread):
    """Inserts rows into a collection of ``uri`` one small batch at a time until stopped;
    ``acknowledged`` holds the keys whose insert returned, ``refused`` counts refusals."""

    def __init__(self, uri: str, collection: str, first: int) -> None:
        super().__init__(daemon=True)
        self.client = MilvusClient(uri=uri, dedicated=True)
        self.collection = collection
        self.next = first
        self.acknowledged: set[int] = set()
        self.refused = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            keys = list(range(self.next, self.next + 5))
            try:
                self.client.insert(self.collection, [_row(k) for k in keys])
            except MilvusException:
                self.refused += 1
                time.sleep(0.2)
                continue
            self.acknowledged.update(keys)
            self.next += 5
            time.sleep(0.05)
        self.client.close()


@pytest.fixture
def clusters(milvus_source, milvus_source_rocksmq, etcd_service):
    """Both clusters' settings; every fence a test may leave is removed afterwards (the two
    Milvus serve the rest of the session)."""
    config = {
        "a": cluster(milvus_source, etcd_service.endpoint),
        "b": cluster(milvus_source_rocksmq, etcd_service.endpoint),
    }
    yield config
    # a fence a failed test left is lifted, and any fence seen lifted (Milvus reads its etcd
    # config every few seconds, so a fence the job lifted may still hold): the next test's
    # writes must not be refused
    for label, settings in config.items():
        fence = EtcdQuotaFence(label, SourceSettings(**settings))
        if fence.is_set():
            fence.lift()
        wait_in_effect(fence, 60, lambda: False, effect=False)


def fence_value(etcd_service, root: str) -> bytes | None:
    return fence_at(etcd_service.endpoint, root)


@pytest.fixture
def dr_daemon(daemon_factory, clusters):
    return daemon_factory("dr", clusters=clusters, verify={"settleSeconds": 20}).start()


def collection_on(milvus_uri: str, name: str, keys: range) -> MilvusClient:
    client = MilvusClient(uri=milvus_uri, dedicated=True)
    create_source_collection(client, name)
    client.insert(name, [_row(k) for k in keys])
    return client


def replicated(daemon, milvus_a, milvus_b, prefix: str, keys: range) -> tuple:
    """A collection of ``keys`` on a, a task a -> b replicating it, b equal to a and the
    task's consistent-up-to known: (name, client of a, client of b, task id)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    a = collection_on(milvus_a.uri, name, keys)
    b = MilvusClient(uri=milvus_b.uri, dedicated=True)
    ab = f"ab-{uuid.uuid4().hex[:6]}"
    create_task(daemon, ab, "a", "b", name)
    wait_equal(a, b, name, "id", timeout=120)
    consistent_known(daemon, ab)
    return name, a, b, ab


FENCED = ("verifying", "reversing", "done", "failed")


def job_state(daemon, task_id: str) -> str:
    return ((task(daemon, task_id).get("progress") or {}).get("switchover") or {}).get("state", "")


def watched(daemon, task_id: str, enough) -> dict | None:
    """The task's stale-write watch once ``enough`` says so of it."""
    watch = (task(daemon, task_id).get("progress") or {}).get("stale_writes")
    return watch if watch and enough(watch) else None


def scraped(daemon) -> dict:
    """/metrics as {(family, task_id, collection): value}."""
    return {
        (family.name, sample.labels.get("task_id"), sample.labels.get("collection")): sample.value
        for family in text_string_to_metric_families(daemon.get("/metrics")[1].decode())
        for sample in family.samples
    }


async def dashboard_facts(daemon, task_id: str, showing: str, workdir: Path) -> str:
    """The facts the dashboard shows of a task once they include ``showing``."""
    from harness.browser import chromium

    async with chromium(workdir / "chromium") as browser:
        page = await browser.new_page()
        await page.open_dashboard(daemon.url, daemon.token)
        row = f'#tasks tr[data-task-id="{task_id}"] code'
        await page.wait_for(f"!!document.querySelector('{row}')")
        await page.click(row)
        facts = await page.wait_for(
            f"document.getElementById('detail-id').textContent === '{task_id}'"
            f" && document.getElementById('detail-facts').innerText.includes('{showing}')"
            " && document.getElementById('detail-facts').innerText"
        )
        assert browser.exceptions == []
        return str(facts)


def test_switchover_moves_production_to_b_and_back_with_every_acknowledged_write(
    dr_daemon, clusters, milvus_source, milvus_source_rocksmq, etcd_service, tmp_path
):
    name = f"dr_{uuid.uuid4().hex[:8]}"
    a = collection_on(milvus_source.uri, name, range(200))
    b = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    ab = f"ab-{uuid.uuid4().hex[:6]}"
    create_task(dr_daemon, ab, "a", "b", name)
    view = task(dr_daemon, ab)
    assert (view["source_cluster"], view["target_cluster"]) == ("a", "b")
    wait_equal(a, b, name, "id", timeout=120)
    up_to = consistent_known(dr_daemon, ab)
    assert abs(up_to["ts"] / 2**18 / 1000 - time.time()) < 30, up_to  # hybrid ms << 18
    metrics = scraped(dr_daemon)
    assert metrics[("cdc_consistent_up_to_seconds", ab, None)] >= _seconds(up_to) - 1
    assert 0 <= metrics[("cdc_rpo_seconds", ab, None)] < 30

    # a lag above the figure asked: refused at once, nothing changes
    refused = dr_daemon.call("switchover", {"task_id": ab, "max_lag_seconds": 1e-6})
    assert refused.code == 409 and "max_lag_seconds" in refused.message, refused.message
    assert task(dr_daemon, ab)["state"] == "Running"
    assert fence_value(etcd_service, milvus_source.etcd_root_path) is None

    writer = Writer(milvus_source.uri, name, first=10_000)
    writer.start()
    try:
        wait_until(lambda: len(writer.acknowledged) >= 50, 60, "the writer's first rows")
        # two requests at once: one job starts, the other is refused (the pair's claim)
        body = {"task_id": ab, "max_lag_seconds": 30, "stale_check_seconds": 15}
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda _: dr_daemon.call("switchover", body), range(2)))
        assert sorted(r.code for r in both) == [200, 409], [(r.code, r.message) for r in both]
        asked = next(r for r in both if r.code == 200)
        refused = next(r for r in both if r.code == 409)
        assert "under way" in refused.message, refused.message
        # the writer keeps trying through the fence; it stops (as an operator's writers move to
        # b) once the job verifies, before a's fence is lifted
        wait_until(lambda: job_state(dr_daemon, ab) in FENCED, 120, "the switchover fenced")
    finally:
        writer.stop.set()
        writer.join(30)
    job = switchover_ends(dr_daemon, ab)
    assert job["state"] == "done", json.dumps(job)
    assert job["job_id"] == asked.data["job_id"]
    assert [s["state"] for s in job["steps"]] == [
        "checking",
        "fencing",
        "draining",
        "verifying",
        "reversing",
        "done",
    ]
    assert job["fenced_at"]["ts"] <= job["consistent_up_to"]["ts"], job
    # the WAL after the paused task's positions held no change, then b's end was fixed as the
    # reverse flow's start: only then may writers move
    assert job["wal_quiet_at"]["ts"] <= job["writers_may_move_at"]["ts"], job
    assert job["reverse_start"], job
    assert job["verify"]["divergent_rows"] == 0 and job["verify"]["state"] == "done", job
    assert writer.refused > 0, "the writer was never refused: the fence did not stop it"
    # every write a acknowledged is on b, and b holds nothing else
    source_rows = rows(a, name, "id")
    assert writer.acknowledged <= set(source_rows)
    assert rows(b, name, "id") == source_rows
    # the fence on a is lifted: the reverse flow writes there
    assert fence_value(etcd_service, milvus_source.etcd_root_path) is None
    ba = job["reverse_task_id"]
    # the pair's active direction is b -> a: resuming ab would run both
    again = dr_daemon.call("resume", {"task_id": ab})
    assert again.code == 409 and "would run both directions" in again.message, again.message
    # a stale client writes to a after the switchover: five new rows, one row overwritten, one
    # deleted. The reverse task's watch of a's WAL shows them, by kind; the check after the
    # switchover (a verify) finds them too
    a.insert(name, [_row(k) for k in range(90_000, 90_005)])
    a.upsert(name, [{**_row(30), "title": "written by a stale client"}])
    a.delete(name, filter="id == 31")
    qualified = f"default.{name}"
    watch = wait_until(
        lambda: watched(dr_daemon, ba, lambda w: w["stale_rows"] >= 7),
        120,
        "the stale-write watch",
        interval=0.5,
    )
    assert watch["watching"] == "a" and watch["against"] == "b", watch
    found = watch["collections"][qualified]
    assert (found["extra"], found["different"], found["missing"]) == (5, 1, 1), watch
    assert watch["stale_rows"] == 7 and watch["unchecked"] == 0, watch
    assert {30, 31, 90_000} <= set(found["sample"]), watch
    assert found["first_seen"] >= job["steps"][-1]["at"][:19], (found, job["steps"])
    assert scraped(dr_daemon)[("cdc_stale_write_rows", ba, qualified)] == 7
    facts = asyncio.run(dashboard_facts(dr_daemon, ba, "Stale writes", tmp_path))
    assert f"7 row(s) on a not written by this task ({qualified})" in facts, facts
    assert "Consistent up to" in facts, facts

    def stale_check() -> dict | None:
        job = (task(dr_daemon, ab).get("progress") or {}).get("switchover") or {}
        return job.get("stale_check")

    check = wait_until(stale_check, 180, "the stale-write check", interval=0.5)
    assert check["state"] == "done", check
    assert check["collections"][qualified] == {"missing": 1, "extra": 5, "different": 1}, check
    assert check["divergent_rows"] == 7, check
    a.delete(name, filter="id >= 90000 and id < 90005")
    original = task(dr_daemon, ab)
    assert original["state"] == "Paused" and ba in original["reason"], original
    reverse = task(dr_daemon, ba)
    assert reverse["state"] == "Running"
    assert (reverse["source_cluster"], reverse["target_cluster"]) == ("b", "a")

    # production now writes to b: the reverse task carries it to a (and mends 30 and 31)
    b.insert(name, [_row(k) for k in range(50_000, 50_100)])
    b.delete(name, filter="id < 32")
    wait_equal(b, a, name, "id", timeout=120)
    # the reverse flow's own writes are not stale: the count stays once the watch read them
    written = time.time()
    watch = wait_until(
        lambda: watched(dr_daemon, ba, lambda w: _seconds(w["watched_up_to"]) > written + 1),
        60,
        "the watch past the reverse flow's writes",
        interval=0.5,
    )
    assert watch["stale_rows"] == 7 and watch["keys_checked"] >= 100 + 32, watch

    # and back, from the command line: the switchover of the reverse task starts the original
    # task again
    consistent_known(dr_daemon, ba)
    command, installed = daemon_command()
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    back = subprocess.run(
        [*command, "task", "switchover", ba, "--follow", *dr_daemon.cli_args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **installed, "no_proxy": "127.0.0.1"},
        check=False,
    )
    assert back.returncode == 0, back.stdout + back.stderr
    # --follow prints a line per state it sees (every second: a short step may pass unseen)
    last = back.stdout.splitlines()[-1]
    assert ": done" in last and "verify 0 divergent" in last, back.stdout
    job = switchover_ends(dr_daemon, ba)
    assert job["state"] == "done", json.dumps(job)
    assert job["reverse_task_id"] == ab and job["rearm"] is True
    assert task(dr_daemon, ab)["state"] == "Running"
    assert task(dr_daemon, ba)["state"] == "Paused"
    listed = dr_daemon.call("list").data["tasks"]
    assert sorted(t["task_id"] for t in listed if name in json.dumps(t)) == sorted([ab, ba])
    a.insert(name, [_row(k) for k in range(60_000, 60_030)])
    wait_equal(a, b, name, "id", timeout=120)
    for fenced in (milvus_source, milvus_source_rocksmq):
        assert fence_value(etcd_service, fenced.etcd_root_path) is None
    a.close()
    b.close()


def test_a_switchover_that_cannot_finish_rolls_back(
    dr_daemon, milvus_source, milvus_source_rocksmq, etcd_service
):
    """The verify cannot finish within the job's timeout: the job fails, rolled back; a is no
    longer fenced and the task goes on replicating."""
    name, a, b, ab = replicated(dr_daemon, milvus_source, milvus_source_rocksmq, "drr", range(100))
    asked = dr_daemon.call(
        "switchover", {"task_id": ab, "max_lag_seconds": 30, "timeout_seconds": 1}
    )
    assert asked.code == 200, asked.message
    job = switchover_ends(dr_daemon, ab)
    assert job["state"] == "failed" and job["rolled_back"] is True, job
    assert "timed out" in job["reason"] or "writes were still accepted" in job["reason"], job
    assert not job["reverse_task_id"]
    assert fence_value(etcd_service, milvus_source.etcd_root_path) is None
    assert task(dr_daemon, ab)["state"] == "Running"
    # a takes writes again (the fence may take a few seconds to lift in Milvus) and b gets them
    wait_until(
        lambda: a.insert(name, [_row(k) for k in range(900, 910)]), 60, "a insert after roll back"
    )
    wait_equal(a, b, name, "id", timeout=120)
    a.close()
    b.close()


def test_the_fence_counts_only_once_every_listed_proxy_refuses_writes(
    daemon_factory, clusters, milvus_source, milvus_source_rocksmq, etcd_service
):
    """Each proxy of a cluster picks up forceDeny on its own: with ``milvus.proxies`` listing an
    endpoint that never refuses (here b's, standing for a proxy that missed the quota), the
    fence is never taken as in effect, and the job rolls back leaving no fence."""
    listed = {
        **clusters["a"],
        "milvus": {**clusters["a"]["milvus"], "proxies": [milvus_source_rocksmq.uri]},
    }
    daemon = daemon_factory("dr", clusters={**clusters, "a": listed}).start()
    _, a, b, ab = replicated(daemon, milvus_source, milvus_source_rocksmq, "drp", range(50))
    asked = daemon.call("switchover", {"task_id": ab, "max_lag_seconds": 30, "timeout_seconds": 20})
    assert asked.code == 200, asked.message
    job = switchover_ends(daemon, ab)
    assert job["state"] == "failed" and job["rolled_back"] is True, job
    assert "writes were still accepted" in job["reason"], job
    assert job["fenced_at"] is None, job
    wait_until(
        lambda: fence_value(etcd_service, milvus_source.etcd_root_path) is None, 30, "no fence"
    )
    assert task(daemon, ab)["state"] == "Running"
    a.close()
    b.close()


def test_without_a_fence_the_job_waits_for_the_wal_to_be_quiet(
    dr_daemon, milvus_source, milvus_source_rocksmq, etcd_service
):
    """``fence: operator`` (a cluster whose quotas are off): the job sets no fence; it waits
    until the task's WAL shows no row change for a while, here after the writer stops."""
    name, a, b, ab = replicated(dr_daemon, milvus_source, milvus_source_rocksmq, "drq", range(100))
    writer = Writer(milvus_source.uri, name, first=30_000)
    writer.start()
    try:
        wait_until(lambda: len(writer.acknowledged) >= 50, 60, "the writer's rows")
        asked = dr_daemon.call(
            "switchover", {"task_id": ab, "max_lag_seconds": 30, "fence": "operator"}
        )
        assert asked.code == 200, asked.message
        time.sleep(8)  # longer than the quiet window: the job must still be fencing
        assert job_state(dr_daemon, ab) == "fencing"
        assert fence_value(etcd_service, milvus_source.etcd_root_path) is None
    finally:
        writer.stop.set()  # the operator stops the writers
        writer.join(30)
    stopped = time.time()
    job = switchover_ends(dr_daemon, ab)
    assert job["state"] == "done", json.dumps(job)
    assert job["fence"].startswith("none set by the job") and not job["fence_set"]
    # the quiet window began after the writer's last row
    assert job["fenced_at"]["ts"] / 2**18 / 1000 >= stopped, job
    assert writer.refused == 0
    assert rows(b, name, "id") == rows(a, name, "id")
    assert task(dr_daemon, job["reverse_task_id"])["state"] == "Running"
    a.close()
    b.close()


# the fault points from which a job only goes forward
FORWARD = ("moving", "reversed")
# every point is a case of one of the two tests below (and the suite's walk kills a daemon at
# points it draws): a failure where a roll back resumes a paused task or retries forward, a kill
# wherever the job holds a fence, a verify, or is past the point of no return
FAILED_AT = ["draining", "reversing", "moving"]
KILLED_AT = ["fencing", "verifying", "reversing", "moving", "reversed"]


def faulty_daemon(daemon_factory, clusters, fault: str):
    daemon = daemon_factory("dr", clusters=clusters, verify={"settleSeconds": 20})
    daemon.env[FAULT_ENV] = fault
    return daemon.start()


def one_direction_left(daemon, name: str, job: dict, ab: str, etcd_service, milvus_source):
    """Never both directions, never a fence left on: a rolled-back job leaves the task, a done
    one the reverse task, running alone."""
    tasks = {t["task_id"]: t for t in daemon.call("list").data["tasks"]}
    running = [t for t in tasks.values() if t["state"] == "Running" and name in json.dumps(t)]
    assert len(running) == 1, tasks
    expected = ab if job["state"] == "failed" else job["reverse_task_id"]
    assert running[0]["task_id"] == expected, (job, tasks)
    wait_until(
        lambda: fence_value(etcd_service, milvus_source.etcd_root_path) is None,
        30,
        "the fence lifted",
    )


@pytest.mark.parametrize("point", FAILED_AT)
def test_a_failure_at_each_step_rolls_back_or_goes_forward(
    point, daemon_factory, clusters, milvus_source, milvus_source_rocksmq, etcd_service
):
    daemon = faulty_daemon(daemon_factory, clusters, f"fail:{point}")
    name, a, b, ab = replicated(daemon, milvus_source, milvus_source_rocksmq, "drx", range(100))
    asked = daemon.call("switchover", {"task_id": ab, "max_lag_seconds": 30})
    assert asked.code == 200, asked.message
    job = switchover_ends(daemon, ab)
    if point in FORWARD:  # past the point of no return: forward (retried), never back
        assert job["state"] == "done", job
    else:
        assert job["state"] == "failed" and job["rolled_back"] is True, job
        assert f"injected at {point}" in job["reason"], job
        assert job["steps"][-2]["state"] == point, job["steps"]
    one_direction_left(daemon, name, job, ab, etcd_service, milvus_source)
    # the direction left carries writes (a fence takes a few seconds to lift in Milvus)
    writable, other = (a, b) if job["state"] == "failed" else (b, a)
    wait_until(lambda: writable.insert(name, [_row(k) for k in range(900, 910)]), 60, "a write")
    wait_equal(writable, other, name, "id", timeout=120)
    a.close()
    b.close()


@pytest.mark.parametrize("point", KILLED_AT)
def test_a_daemon_killed_at_each_step_ends_the_job_done_or_rolled_back(
    point, daemon_factory, clusters, milvus_source, milvus_source_rocksmq, etcd_service
):
    """``kill -9`` while the job is held at ``point``, then a restart: the job is rolled back
    when the reverse task does not exist yet, else finished; never half."""
    daemon = faulty_daemon(daemon_factory, clusters, f"hold:{point}:120")
    name, a, b, ab = replicated(daemon, milvus_source, milvus_source_rocksmq, "drk", range(100))
    asked = daemon.call("switchover", {"task_id": ab, "max_lag_seconds": 30})
    assert asked.code == 200, asked.message
    wait_until(
        lambda: f"switchover held at {point}" in daemon.log_text(), 120, f"the job at {point}"
    )
    daemon.kill()
    del daemon.env[FAULT_ENV]
    daemon.start()
    job = switchover_ends(daemon, ab)
    if point in FORWARD:
        assert job["state"] == "done", job
    else:
        assert job["state"] == "failed" and job["rolled_back"] is True, job
        assert "stopped while" in job["reason"], job
    one_direction_left(daemon, name, job, ab, etcd_service, milvus_source)
    a.close()
    b.close()


@dataclass
class FleetTask:
    """A task a -> b on a fleet of two daemons sharing one etcd metastore: the member that
    runs it, the other, and the collection's clients on both clusters."""

    owner: Daemon
    survivor: Daemon
    owner_name: str
    name: str
    a: MilvusClient
    b: MilvusClient
    task_id: str


def fleet_task(
    daemon_factory, clusters, request, tmp_path, milvus_a, milvus_b, prefix: str, **config
) -> FleetTask:
    """Two members m1 and m2 (``config``: their fleet settings and any other), a collection
    of 100 rows on a replicated to b by a task one of them runs."""
    from test_fleet import SharedStore

    store = SharedStore("etcd", request)
    key = tmp_path / "fleet.key"
    fleet = config.pop("fleet")

    def member(name: str):
        return daemon_factory(
            name,
            clusters=clusters,
            metaStoreConfig=store.config(),
            secrets={"keyFile": str(key)},
            fleet={**fleet, "memberId": name},
            **config,
        )

    first = member("m1").start()
    second = member("m2").start()
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    a = collection_on(milvus_a.uri, name, range(100))
    b = MilvusClient(uri=milvus_b.uri, dedicated=True)
    ab = f"ab-{uuid.uuid4().hex[:6]}"
    create_task(first, ab, "a", "b", name)
    owner_name = wait_until(lambda: task(first, ab)["owner"], 30, "the task's owner")
    owner, survivor = (first, second) if owner_name == "m1" else (second, first)
    wait_equal(a, b, name, "id", timeout=120)
    return FleetTask(owner, survivor, owner_name, name, a, b, ab)


def held(daemon, point: str, release: Path) -> None:
    """Wait until the job is held at ``point`` (FAULT_ENV "hold:<point>:<s>:<release>")."""
    wait_until(
        lambda: f"switchover held at {point}" in daemon.log_text(), 120, f"the job at {point}"
    )
    assert not release.exists()


def test_the_operators_verbs_wait_for_the_job_and_it_ends_with_one_direction_running(
    daemon_factory, clusters, milvus_source, milvus_source_rocksmq, etcd_service, tmp_path
):
    """While the switchover holds the flow, the operator's pause, resume and delete of its
    tasks are refused (409) naming the job and its step (issue 48, fault 1: a resume of a->b
    asked during reversing was let through, its reason naming the job, and the switchover then
    ended done with a->b and b->a both Running)."""
    verifying, reversing = tmp_path / "verifying", tmp_path / "reversing"
    fault = f"hold:verifying:120:{verifying},hold:reversing:120:{reversing}"
    daemon = faulty_daemon(daemon_factory, clusters, fault)
    name, a, b, ab = replicated(daemon, milvus_source, milvus_source_rocksmq, "dro", range(100))
    asked = daemon.call("switchover", {"task_id": ab, "max_lag_seconds": 30})
    assert asked.code == 200, asked.message
    job_id = asked.data["job_id"]
    held(daemon, "verifying", verifying)
    paused = daemon.call("pause", {"task_id": ab})
    assert paused.code == 409, paused.message
    assert f"switchover {job_id} (verifying) holds its cluster pair" in paused.message
    verifying.touch()
    held(daemon, "reversing", reversing)
    assert task(daemon, ab)["state"] == "Paused"
    for verb in ("resume", "delete"):
        refused = daemon.call(verb, {"task_id": ab})
        assert refused.code == 409, (verb, refused.message)
        assert f"switchover {job_id} (reversing) holds its cluster pair" in refused.message
    reversing.touch()
    job = switchover_ends(daemon, ab)
    assert job["state"] == "done", job
    one_direction_left(daemon, name, job, ab, etcd_service, milvus_source)
    a.close()
    b.close()


def test_a_write_that_got_past_the_fence_is_found_in_the_wal_and_the_job_rolls_back(
    daemon_factory, clusters, milvus_source, milvus_source_rocksmq, etcd_service, tmp_path
):
    """Writes reach a after the task paused (here: the fence key removed behind the job's
    back, as a proxy that missed the fence would let them through). The WAL read from the
    task's saved positions holds them: the job rolls back before the point of no return, the
    task resumed carries them to b, and no reverse task is made."""
    release = tmp_path / "release"
    daemon = faulty_daemon(daemon_factory, clusters, f"hold:reversing:120:{release}")
    name, a, b, ab = replicated(daemon, milvus_source, milvus_source_rocksmq, "drs", range(100))
    asked = daemon.call("switchover", {"task_id": ab, "max_lag_seconds": 30})
    assert asked.code == 200, asked.message
    held(daemon, "reversing", release)
    assert task(daemon, ab)["state"] == "Paused"
    EtcdQuotaFence("a", SourceSettings(**clusters["a"])).lift()
    slipped = range(5_000, 5_010)
    wait_until(lambda: a.insert(name, [_row(k) for k in slipped]), 60, "a write past the fence")
    release.touch()
    job = switchover_ends(daemon, ab)
    assert job["state"] == "failed" and job["rolled_back"] is True, job
    assert "writes got past the fence" in job["reason"], job
    assert job["wal_quiet_at"] is None and job["writers_may_move_at"] is None, job
    one_direction_left(daemon, name, job, ab, etcd_service, milvus_source)
    assert job["reverse_task_id"] not in {t["task_id"] for t in daemon.call("list").data["tasks"]}
    wait_until(lambda: set(slipped) <= set(rows(b, name, "id")), 120, "the slipped rows on b")
    wait_equal(a, b, name, "id", timeout=120)
    a.close()
    b.close()


def test_a_failover_waits_for_a_stalled_members_runner_to_lose_its_lease(
    daemon_factory, clusters, request, tmp_path, milvus_source, milvus_source_rocksmq
):
    """Two daemons on one etcd metastore; the one running the task stalls (SIGSTOP). A
    failover asked of the other answers only once the stalled member's lease is gone (it runs
    nothing then), and says so; the stalled member, going on, does not run the task again."""
    lease = 8.0  # well past the pause's former 3 s wait
    fleet = fleet_task(
        daemon_factory,
        clusters,
        request,
        tmp_path,
        milvus_source,
        milvus_source_rocksmq,
        "drl",
        fleet={"leaseSeconds": lease, "checkSeconds": 0.5},
    )
    owner, survivor, owner_name, ab = fleet.owner, fleet.survivor, fleet.owner_name, fleet.task_id
    a, b = fleet.a, fleet.b
    assert owner.process is not None
    os.kill(owner.process.pid, signal.SIGSTOP)
    try:
        status, _, answer = survivor.request("POST", f"/v1/tasks/{ab}/failover", {})
        view = task(survivor, ab)
    finally:
        os.kill(owner.process.pid, signal.SIGCONT)
    assert status == 200, answer
    assert answer["runner_stopped"] is True and not answer["problems"], answer
    assert view["state"] == "Paused" and view["owner"] != owner_name, view
    # the stalled member goes on (a few of its rounds): it finds its lease gone and the task
    # paused, and does not take it again
    time.sleep(3.0)
    view = task(survivor, ab)
    assert view["state"] == "Paused" and view["owner"] != owner_name, view
    a.close()
    b.close()


class TimedWriter(Writer):
    """A Writer that notes when each insert was acknowledged, by its own clock (this host's,
    which the source's hybrid timestamps also come from): Milvus stamps a write before it
    answers, so a write acknowledged at or before a moment has a timestamp at or before it."""

    def __init__(self, uri: str, collection: str, first: int, pause: float = 0.05) -> None:
        super().__init__(uri, collection, first)
        self.stamps: dict[int, float] = {}  # key -> seconds when its insert returned
        self.pause = pause  # seconds between inserts (0: a burst)

    def run(self) -> None:
        while not self.stop.is_set():
            keys = list(range(self.next, self.next + 5))
            try:
                self.client.insert(self.collection, [_row(k) for k in keys], timeout=5)
            except Exception:  # noqa: BLE001 - a lost cluster refuses in many ways
                self.refused += 1
                time.sleep(0.2)
                continue
            self.stamps.update(dict.fromkeys(keys, time.time()))
            self.acknowledged.update(keys)
            self.next += 5
            time.sleep(self.pause)
        self.client.close()


# the gap allowed between a failover's consistent_up_to and the last record the target applied:
# Milvus 2.3 ticks each channel in use every 200 ms (rootcoord's timeTickInterval), so the last
# tick before the kill follows the last applied record by at most one interval, plus as much
# again for a proxy's tick report delayed on a loaded 2-core machine
ONE_TICK_SECONDS = 0.5


@dataclass(frozen=True)
class WalInsert:
    """One Insert record of the lost cluster's WAL."""

    channel: str
    offset: int
    ts: int
    pks: tuple[int, ...]


def wal_inserts(bootstrap: str, prefix: str, collection_id: int) -> list[WalInsert]:
    """Every Insert of ``collection_id`` in the DML channels of a 2.3 source on Kafka, read from
    their beginning (the test's own reading, not the daemon's)."""
    source = KafkaSource(bootstrap)
    found = []
    for channel in [f"{prefix}-rootcoord-dml_{i}" for i in range(16)]:
        _, end = source.watermarks(channel)
        if not end:
            continue
        reader = source.open_channel(channel, None)
        try:
            read = 0
            while read < end:
                batch = reader.read_batch(1000, 1.0)
                assert batch, f"{channel}: read {read} of {end} records"
                read = batch[-1].offset + 1
                for record in batch:
                    event = decode_any(record, "kafka", lambda cid: cid == collection_id)
                    if isinstance(event, Insert) and event.collection_id == collection_id:
                        ids = next(f for f in event.request.fields_data if f.field_name == "id")
                        pks = tuple(ids.scalars.long_data.data)
                        found.append(WalInsert(channel, record.offset, event.ts, pks))
        finally:
            reader.close()
    return found


def saved_offsets(daemon, task_id: str) -> dict[str, tuple[int, int]]:
    """The task's saved positions as the metastore holds them: channel -> (offset, tick)."""
    positions = daemon.call("position", {"task_id": task_id}).data["positions"]
    return {
        p["channel_name"]: (
            decode_offset(base64.b64decode(p["msg_id"])) if p["msg_id"] else -1,
            int(p["tt"]),
        )
        for p in positions
    }


def test_failover_after_the_source_is_killed_keeps_every_write_up_to_what_it_answers(
    daemon_factory, milvus_source_rocksmq, etcd_service, kafka_mock, tmp_path
):
    """The source Milvus (its own, WAL on the Kafka mock) is killed with ``kill -9`` under a
    burst of two writers; the failover answers ``consistent_up_to``, within one tick of the
    last record b applied, and exports what b lacks. Read record by record from the surviving
    queue: every Insert of the collection is on b or in the file, none in both, and the file
    holds exactly the records after the task's saved positions; every acknowledged write is on
    b or in the file; b takes writes."""
    from harness.milvus_source import milvus_source as start_milvus

    root = f"lost-{uuid.uuid4().hex[:8]}"
    with start_milvus(
        tmp_path / "lost", etcd_service.endpoint, kafka_mock.bootstrap, root_path=root
    ) as lost:
        daemon = daemon_factory(
            "dr",
            clusters={
                "a": cluster(lost, etcd_service.endpoint),
                "b": cluster(milvus_source_rocksmq, etcd_service.endpoint),
            },
        ).start()
        name, a, b, ab = replicated(daemon, lost, milvus_source_rocksmq, "drf", range(100))
        collection_id = int(a.describe_collection(name)["collection_id"])
        writers = [TimedWriter(lost.uri, name, first=f, pause=0.0) for f in (20_000, 40_000)]
        for writer in writers:
            writer.start()
        try:
            wait_until(
                lambda: sum(len(w.acknowledged) for w in writers) >= 400, 60, "the burst's rows"
            )
            # the task has applied some of the burst (a loaded machine may lag seconds)
            sixtieth = sorted(writers[0].stamps.values())[59]
            wait_until(
                lambda: _seconds(consistent_known(daemon, ab)) >= sixtieth,
                60,
                "the task past the writer's 60th write",
            )
            os.kill(lost.pid, signal.SIGKILL)  # the source cluster is lost under load
            killed = time.time()
            time.sleep(1.0)
            status, _, answer = daemon.request("POST", f"/v1/tasks/{ab}/failover", {})
        finally:
            for writer in writers:
                writer.stop.set()
            for writer in writers:
                writer.join(30)
        a.close()
    assert status == 200, answer
    assert answer["task"]["state"] == "Paused", answer
    consistent = answer["consistent_up_to"]
    assert consistent and consistent["ts"] > 0, answer
    view = task(daemon, ab)
    assert view["state"] == "Paused" and "failed over at" in view["reason"], view
    assert view["progress"]["failover"]["consistent_up_to"] == consistent
    export = answer["unreplicated"]
    assert answer["complete"] is True and export["complete"] is True, json.dumps(export)
    on_b = set(rows(b, name, "id"))
    lines = [json.loads(x) for x in Path(export["file"]).read_text().splitlines()]
    inserts = [line for line in lines if line["op"] == "insert"]
    assert len(inserts) == len(lines), lines[:3]  # the burst only inserts

    # record by record: on b, or in the file, never both, never neither
    wal = wal_inserts(kafka_mock.bootstrap, lost.chan_prefix, collection_id)
    in_file = {(line["source"]["channel"], line["source"]["position"]) for line in inserts}
    both = [r for r in wal if (r.channel, r.offset) in in_file and set(r.pks) & on_b]
    neither = [r for r in wal if (r.channel, r.offset) not in in_file and set(r.pks) - on_b]
    assert not both, f"{len(both)} records both on b and in the file: {both[:3]}"
    assert not neither, f"{len(neither)} records neither on b nor in the file: {neither[:3]}"
    exported = {line["pk"] for line in inserts}
    assert not exported & on_b, sorted(exported & on_b)[:10]
    acknowledged = set(range(100)).union(*(w.acknowledged for w in writers))
    missing = acknowledged - on_b - exported
    assert not missing, f"{len(missing)} acknowledged rows neither on b nor exported"

    # the file is exactly the WAL after the task's saved positions (rows and records)
    saved = saved_offsets(daemon, ab)
    after = [r for r in wal if r.offset > saved[r.channel][0]]
    assert {(r.channel, r.offset) for r in after} == in_file
    assert len(inserts) == sum(len(r.pks) for r in after) == export["records"]
    assert export["wal_records"] == len(after)
    assert export["by_collection"].get(f"default.{name}", {}).get("insert", 0) == len(inserts)

    # the figure: every record at or below it is on b, and it is within one tick of the last
    # record b applied; the first record b lacks is after it
    applied = [r for r in wal if (r.channel, r.offset) not in in_file]
    last_applied = max(r.ts for r in applied)
    assert all(set(r.pks) <= on_b for r in wal if r.ts <= consistent["ts"])
    gap = _hybrid_seconds(consistent["ts"]) - _hybrid_seconds(last_applied)
    print(
        f"failover: consistent_up_to {gap:.3f} s after the last applied record, "
        f"{killed - _hybrid_seconds(consistent['ts']):.3f} s before the kill; "
        f"rpo {answer['rpo_seconds']} s; {len(after)} records ({len(inserts)} rows) exported "
        f"of {len(wal)}; {len(on_b)} rows on b"
    )
    assert 0 <= gap <= ONE_TICK_SECONDS, (gap, consistent, last_applied)
    if after:
        first = min(r.ts for r in after)
        assert answer["unapplied_from"]["ts"] == first
        assert consistent["ts"] < first
        ahead = _hybrid_seconds(first - consistent["ts"])
        print(f"failover: the first unapplied record {ahead:.3f} s after it")
    covered = {k for w in writers for k, at in w.stamps.items() if at <= _seconds(consistent)}
    assert len(covered) >= 50, (len(covered), consistent)
    assert not covered - on_b, sorted(covered - on_b)[:10]
    # the RPO runs from the figure to the failover, asked a second after the kill
    assert answer["rpo_seconds"] >= killed - _hybrid_seconds(consistent["ts"]) + 0.9
    # b takes writes
    b.insert(name, [_row(k) for k in range(70_000, 70_010)])
    wait_until(lambda: set(range(70_000, 70_010)) <= set(rows(b, name, "id")), 30, "b's rows")
    b.close()


def _hybrid_seconds(ts: int) -> float:
    return (ts >> 18) / 1000


def test_a_fleet_member_takes_over_the_switchover_of_a_member_killed_mid_way(
    daemon_factory, clusters, request, tmp_path, milvus_source, milvus_source_rocksmq, etcd_service
):
    """Two daemons on one etcd metastore; the one running the task is killed while its
    switchover drains or verifies: the other, once the dead one is no longer a live member,
    rolls the job back (or finishes it), lifts the fence, and runs the one direction left."""
    fleet = fleet_task(
        daemon_factory,
        clusters,
        request,
        tmp_path,
        milvus_source,
        milvus_source_rocksmq,
        "drm",
        verify={"settleSeconds": 20},
        fleet={"leaseSeconds": 3.0, "checkSeconds": 0.5},
    )
    owner, survivor, owner_name, ab = fleet.owner, fleet.survivor, fleet.owner_name, fleet.task_id
    name, a, b = fleet.name, fleet.a, fleet.b
    consistent_known(owner, ab)
    elsewhere = survivor.call("switchover", {"task_id": ab, "max_lag_seconds": 30})
    assert elsewhere.code == 409 and owner_name in elsewhere.message, elsewhere.message
    asked = owner.call("switchover", {"task_id": ab, "max_lag_seconds": 30})
    assert asked.code == 200, asked.message
    wait_until(
        lambda: job_state(owner, ab) in ("draining", "verifying"), 120, "the job past its fence"
    )
    owner.kill()
    job = switchover_ends(survivor, ab, timeout=180)
    assert job["member"] == survivor.config["fleet"]["memberId"], job
    assert job["state"] in ("failed", "done"), job
    if job["state"] == "failed":
        assert job["rolled_back"] is True and "stopped while" in job["reason"], job
    wait_until(
        lambda: fence_value(etcd_service, milvus_source.etcd_root_path) is None, 30, "no fence"
    )

    def one_direction() -> list[dict] | None:
        tasks = survivor.call("list").data["tasks"]
        mine = [t for t in tasks if name in json.dumps(t) and t["state"] == "Running"]
        alone = len(mine) == 1 and mine[0]["owner"] == survivor.config["fleet"]["memberId"]
        return mine if alone else None

    (running,) = wait_until(one_direction, 60, "one direction running on the survivor")
    if job["state"] == "failed":
        assert running["task_id"] == ab
        a.insert(name, [_row(k) for k in range(700, 720)])
        wait_equal(a, b, name, "id", timeout=120)
    else:
        assert running["task_id"] == job["reverse_task_id"]
    a.close()
    b.close()
