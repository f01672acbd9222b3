"""Two named Milvus 2.3.5 clusters under one daemon (README "Disaster recovery"), as the
disaster-recovery tests and the walk (:mod:`harness.dr_walk`) use them: the daemon's
``clusters`` settings of a running Milvus, the test collection and its rows, the fence key,
and the few requests every DR test makes of a daemon."""

from __future__ import annotations

from typing import Any

import etcd3
from pymilvus import DataType, MilvusClient

from harness.daemon import Daemon
from harness.milvus_source import MilvusSource
from harness.services import wait_until

DIM = 8
# the key a switchover writes into a cluster's etcd (under its root path) to stop its writes
FENCE = "config/quotaAndLimits/limitWriting/forceDeny"
# where a switchover job can be held or made to fail (server/dr/flows.py FAULT_ENV); the
# reverse flow's start is fixed (writers may move) from "moving" on, the reverse task exists from
# "reversed" on, and from "moving" the job only goes forward ("moving" is not in this list: the
# tests of a failure at each step ask it apart)
POINTS = ("fencing", "draining", "verifying", "reversing", "reversed")


def cluster(milvus: MilvusSource, etcd_endpoint: str) -> dict[str, Any]:
    """The daemon's ``clusters.<name>`` settings of a running Milvus."""
    config: dict[str, Any] = {
        "etcd": {"address": [etcd_endpoint]},
        "etcdRootPath": milvus.etcd_root_path,
        "channelPrefix": milvus.chan_prefix,
        "milvus": {"uri": milvus.uri},
        "mqType": milvus.mq_type,
    }
    if milvus.mq_type == "kafka":
        config["kafka"] = {"address": milvus.kafka_bootstrap}
    else:
        config["rocksmq"] = {"path": str(milvus.rocksmq_path)}
    return config


def create_source_collection(client: MilvusClient, name: str, *, dynamic: bool = True) -> None:
    """id (int64 key), vec, title, score, with a FLAT index: the collection most tests use."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=dynamic)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("title", DataType.VARCHAR, max_length=64)
    schema.add_field("score", DataType.DOUBLE)
    index = client.prepare_index_params()
    index.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index)


def row(key: int) -> dict[str, Any]:
    """The row of ``key`` in a collection of create_source_collection."""
    vec = [float(key % 7)] + [0.5] * (DIM - 1)
    return {"id": key, "vec": vec, "title": f"t{key}", "score": 0.5}


def fence_at(etcd_endpoint: str, root: str) -> bytes | None:
    """The fence key's value in the etcd at ``etcd_endpoint`` under ``root`` (None: no key)."""
    host, port = etcd_endpoint.rsplit(":", 1)
    client = etcd3.client(host=host.split("//")[-1], port=int(port))
    try:
        value: bytes | None = client.get(f"{root}/{FENCE}")[0]
        return value
    finally:
        client.close()


def create_task(daemon: Daemon, task_id: str, source: str, target: str, collection: str) -> None:
    reply = daemon.call(
        "create",
        {
            "task_id": task_id,
            "source_cluster": source,
            "target_cluster": target,
            "collection_infos": [{"name": collection}],
        },
    )
    assert reply.code == 200, reply.message


def task(daemon: Daemon, task_id: str) -> dict[str, Any]:
    reply = daemon.call("get", {"task_id": task_id})
    assert reply.code == 200, reply.message
    view: dict[str, Any] = reply.data["task"]
    return view


def job_of(daemon: Daemon, task_id: str, kind: str = "switchover") -> dict[str, Any]:
    """``progress.<kind>`` of the task ({} when it has none)."""
    job: dict[str, Any] = (task(daemon, task_id).get("progress") or {}).get(kind) or {}
    return job


def switchover_ends(daemon: Daemon, task_id: str, timeout: float = 240) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job = job_of(daemon, task_id)
        return job if job.get("state") in ("done", "failed") else None

    job = wait_until(finished, timeout, f"switchover of {task_id}", interval=0.5)
    assert job is not None
    return job


def consistent_known(daemon: Daemon, task_id: str, timeout: float = 60) -> dict[str, Any]:
    def known() -> dict[str, Any] | None:
        moment: dict[str, Any] | None = (task(daemon, task_id).get("progress") or {}).get(
            "consistent_up_to"
        )
        return moment

    moment = wait_until(known, timeout, f"consistent_up_to of {task_id}")
    assert moment is not None
    return moment


def seconds_of(moment: dict[str, Any] | None) -> float:
    """A hybrid timestamp view ({"ts": ...}) as Unix seconds (0 for none)."""
    return float(moment["ts"]) / 2**18 / 1000 if moment else 0.0
