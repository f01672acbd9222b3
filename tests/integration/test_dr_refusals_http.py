"""Every 409 of a verb refused because a disaster-recovery job holds the flow names the job's
kind, id and current step, asked over HTTP (``POST /cdc``) of the daemon's own application
(server/app.py) on a real etcd metastore, its tasks' runners scripted
(tests/harness/dr_jobs.py): an operator's pause and delete (the supervisor's verb check), a
failover and a switchover asked while another job holds the flow (the pair's claim), and a
failback asked while one is under way (the failback's own record)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from harness.dr_jobs import ScriptedRunner, seed_job, task_record

from metastore import MetaStore, TaskState
from replicator.config.settings import load_settings
from server.app import create_app
from server.app_state import STORE
from server.dr.pair import PairStore
from server.dr.pair_rules import claimed
from server.dr.record import FAILBACK_KEY, SwitchoverJob, save_json

pytestmark = pytest.mark.integration


@dataclass
class Http:
    client: TestClient
    store: MetaStore

    async def call(self, request_type: str, **data: Any) -> tuple[int, str]:
        body = {"request_type": request_type, "request_data": data}
        answer = await (await self.client.post("/cdc", json=body)).json()
        return int(answer["code"]), str(answer.get("message", ""))


@pytest.fixture
async def http(etcd_service, tmp_path) -> AsyncIterator[Http]:
    tag = uuid.uuid4().hex[:8]
    config = {
        "metaStoreConfig": {
            "storeType": "etcd",
            "rootPath": f"drhttp-{tag}",
            "etcd": {"address": [etcd_service.endpoint]},
        },
        "secrets": {"keyFile": str(tmp_path / "key")},
        "clusters": {
            name: {
                "etcd": {"address": [etcd_service.endpoint]},
                "etcdRootPath": f"drhttp-{name}-{tag}",
            }
            for name in ("a", "b")
        },
    }
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(config))
    settings = load_settings(path, {})
    app = create_app(settings, runner_factory=ScriptedRunner, target_checker=lambda _c: "v2.3.5")
    async with TestClient(TestServer(app)) as client:
        yield Http(client, app[STORE])


def switchover_holding(store: MetaStore, state: str) -> str:
    """ab (a -> b, paused by the job) and ab-rev (b -> a), a switchover of ab at ``state`` on
    a member that stalled (its claim fresh); the job's id."""
    store.create_task(task_record("ab", "a", "b", TaskState.PAUSED, "switched over (job ...)"))
    store.create_task(task_record("ab-rev", "b", "a", TaskState.RUNNING))
    job = SwitchoverJob.new("ab", "d1", 30, 600, ("a", "b")).to(  # type: ignore[arg-type]
        state, reverse_task_id="ab-rev"
    )
    seed_job(store, job)
    existing = {"ab", "ab-rev"}
    PairStore(store).update(
        "a",
        "b",
        lambda p: claimed(p, "switchover", "ab", "a", job.job_id, "d1", existing=existing),
    )
    PairStore(store).update(
        "a", "b", lambda p: p.with_flow(replace(p.flow_of("ab"), tasks={"a": "ab", "b": "ab-rev"}))
    )
    return job.job_id


async def test_a_verbs_409_names_the_holding_job_and_its_step_on_every_path(http):
    job_id = switchover_holding(http.store, "reversing")
    held = f"switchover {job_id} (reversing) holds its cluster pair"
    # the supervisor's verb check: an operator's pause and delete of the flow's tasks
    for verb in ("pause", "delete"):
        code, message = await http.call(verb, task_id="ab-rev")
        assert code == 409 and held in message, message
        assert f"{verb} of the flow's tasks waits for it" in message, message
    # the pair's claim: a second DR job asked while the switchover holds the flow
    code, message = await http.call("failover", task_id="ab", export_seconds=0)
    assert code == 409 and held in message and "failover waits for it" in message, message
    assert http.store.get_task("ab-rev").state is TaskState.RUNNING  # type: ignore[union-attr]
    code, message = await http.call("failback", task_id="ab")
    assert code == 409 and held in message and "failback waits for it" in message, message
    # a switchover of the flow's other task: the holder named before the task's own checks
    # (its consistent-up-to, its runner), which a held flow's task may fail for the job's sake
    code, message = await http.call("switchover", task_id="ab-rev")
    assert code == 409 and held in message and "switchover waits for it" in message, message


async def test_a_failback_asked_while_one_is_under_way_names_it_and_its_step(http):
    http.store.create_task(task_record("cd", "a", "b", TaskState.PAUSED, "failed over at ..."))
    record = {"task_id": "cd", "job_id": "failback-0007", "state": "repairing", "member": "d1"}
    save_json(http.store, "cd", FAILBACK_KEY, record)
    code, message = await http.call("failback", task_id="cd")
    assert code == 409, message
    assert "failback failback-0007 (repairing) of it is under way" in message, message
