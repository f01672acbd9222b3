"""Disaster-recovery jobs driven directly, without Milvus: a real task supervisor (the daemon's
own) on a real etcd metastore, with the daemon's disaster recovery wired to it as the
application wires it, two named clusters whose etcd (the fence's) is the same etcd under roots
of their own, and scripted runners standing in for the replication engine (what these tests
are about is the jobs' records, the pair's claims and the fences, not replication).

Tasks are written into the store as a daemon left them; a job's record and the pair's claim
are set as a job at some step left them (a kill, a stall), then the real code takes over.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import etcd3

from metastore import MetaStore, TaskRecord, TaskState
from metastore.etcd import EtcdMetaStore
from metastore.etcd_connect import connect_etcd
from replicator.backfill.state import BackfillJob, BackfillState
from replicator.config.settings import CdcSettings, load_settings
from server.dr.manager import DisasterRecovery
from server.dr.pair import FAILING_BACK, Flow, PairStore
from server.dr.record import FAILBACK_KEY, SWITCHOVER_KEY, SwitchoverJob, save_json
from server.dr.switchover import SwitchoverRun
from server.tasks.supervisor import TaskSupervisor


class ScriptedRunner:
    """A runner that replicates nothing and stops when told."""

    finished = False

    def __init__(self, task: TaskRecord, _store: object, _on_failure: object) -> None:
        self.task_id = task.task_id

    async def prepare(self) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def wait_stopped(self, _timeout: float) -> bool:
        return True

    def consistent_ts(self) -> int:
        return 0

    def status(self) -> dict[str, Any]:
        return {"rows": 0, "bytes": 0, "lag_seconds": None, "channels": []}


def task_record(
    task_id: str, source: str, target: str, state: TaskState, reason: str = ""
) -> TaskRecord:
    spec = {
        "source_cluster": source,
        "target_cluster": target,
        "milvus_connect_param": {"uri": "http://127.0.0.1:1"},
        "collection_infos": [{"name": "c"}],
        "rpc_channel_info": {"name": f"{source}-replicate-msg"},
    }
    return TaskRecord(task_id, state, reason, spec, 1.0, 1.0)


@dataclass
class DrWorld:
    store: EtcdMetaStore
    settings: CdcSettings
    supervisor: TaskSupervisor
    disaster: DisasterRecovery
    pairs: PairStore
    etcd: Any  # a client of the clusters' etcd, to read the fence keys
    fence_keys: dict[str, str]

    def run_of(self, job: SwitchoverJob, fenced: bool) -> SwitchoverRun:
        """A member's run of ``job`` as it last saved it (seed_job), the fence probe answering
        ``fenced``."""
        return SwitchoverRun(
            self.supervisor,
            self.settings,
            job,
            self.pairs,
            fence_probe=lambda: fenced,
            seen=job.to_bytes(),
        )

    def add_task(
        self, task_id: str, source: str, target: str, state: TaskState, reason: str = ""
    ) -> None:
        self.store.create_task(task_record(task_id, source, target, state, reason))

    def state(self, task_id: str) -> TaskState:
        task = self.store.get_task(task_id)
        assert task is not None
        return task.state

    def fence_value(self, cluster: str) -> bytes | None:
        return self.etcd.get(self.fence_keys[cluster])[0]

    def failback_left_seeding(self, reverse: TaskState, reason: str = "") -> str:
        """ab (a -> b) failed over to b; its failback seeds a through the reverse task ab-back
        (``reverse`` its state), its backfill running; the daemon that ran it is gone. The
        failback's job id."""
        self.add_task("ab", "a", "b", TaskState.PAUSED, "failed over at ...")
        self.add_task("ab-back", "b", "a", reverse, reason)
        flow = Flow("ab", {"a": "ab", "b": "ab-back"}, active="b", state=FAILING_BACK)
        self.pairs.update("a", "b", lambda p: p.with_flow(flow))
        backfill = replace(BackfillJob.new(["*"]), state="running")
        BackfillState(self.store, "ab-back").save_job(backfill)
        record = {
            "task_id": "ab",
            "job_id": "failback-0001",
            "reverse_task_id": "ab-back",
            "reused": True,
            "production_cluster": "b",
            "member": "dead-member",
            "state": "seeding",
            "steps": [],
        }
        save_json(self.store, "ab", FAILBACK_KEY, record)
        return str(record["job_id"])


def seed_job(store: MetaStore, job: SwitchoverJob) -> bytes:
    """A switchover's record as a daemon left it (written as is, whatever was there); its
    bytes, what a run of it last saw."""
    store.put_state(job.task_id, SWITCHOVER_KEY, job.to_bytes())
    return job.to_bytes()


@asynccontextmanager
async def dr_world(endpoint: str, milvus: str = "") -> AsyncIterator[DrWorld]:
    """A world of clusters ``a`` and ``b`` on the etcd at ``endpoint`` (roots of their own);
    ``milvus``: the Milvus both name (tasks between them are created there), else none."""
    tag = uuid.uuid4().hex[:8]
    roots = {name: f"drjobs-{name}-{tag}" for name in ("a", "b")}
    settings = load_settings(None, {}).model_copy(
        update={
            "clusters": CdcSettings(
                clusters={
                    name: {"etcd": {"address": [endpoint]}, "etcdRootPath": root}
                    | ({"milvus": {"uri": milvus}} if milvus else {})
                    for name, root in roots.items()
                }
            ).clusters
        }
    )
    store = EtcdMetaStore(connect_etcd([endpoint]), f"drjobs-meta-{tag}")
    supervisor = TaskSupervisor(store, settings, ScriptedRunner, lambda _connect: "v2.3.5")
    disaster = DisasterRecovery(supervisor, settings)
    supervisor.add_verb_check(disaster.pairs.check_verb)  # as server/app.py wires it
    host, port = endpoint.split("//")[-1].rsplit(":", 1)
    etcd = etcd3.client(host=host, port=int(port))
    keys = {
        name: f"{root}/config/quotaAndLimits/limitWriting/forceDeny" for name, root in roots.items()
    }
    await supervisor.start()  # a fleet member, as the daemon is
    try:
        yield DrWorld(store, settings, supervisor, disaster, PairStore(store), etcd, keys)
    finally:
        disaster.stop()
        await supervisor.drain(1.0)
        etcd.close()
        store.close()
