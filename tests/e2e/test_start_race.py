"""Where a task starts is fixed before ``create`` answers: a collection created and written the
moment the answer arrives (no sleep) is replicated, on a Milvus 2.6 stream and on the real Milvus
2.3.5 source, again and again; ``position`` shows every channel's start at once."""

from __future__ import annotations

import uuid

import pytest
from harness.services import wait_until

from tests.e2e.test_replication import (
    create_source_collection,
    make_rows,
    source_config,
    wait_equal,
)
from tests.e2e.test_streaming_source import task_view, wait_for_collection, wait_rows

pytestmark = pytest.mark.e2e

ROUNDS = 5


def create(daemon, target_uri: str, name: str) -> str:
    created = daemon.call(
        "create",
        {"milvus_connect_param": {"uri": target_uri}, "collection_infos": [{"name": name}]},
    )
    assert created.code == 200, created.body
    return str(created.data["task_id"])


def positions(daemon, task_id: str) -> list[dict]:
    return list(daemon.call("position", {"task_id": task_id}).data.get("positions") or [])


def test_a_2_6_collection_written_right_after_create_is_replicated(
    daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client, stream
):
    w = stream.writer
    daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[str, str, dict[int, str]]] = []
    for i in range(ROUNDS):
        name, collection_id = f"race26_{tag}_{i}", 52000 + i
        task_id = create(daemon, milvus_lite_service.uri, name)
        # no wait: the answer means the task's start is decided on every channel
        dml = {p["channel_name"] for p in positions(daemon, task_id)} & {
            stream.pchannel(i) for i in range(stream.channels)
        }
        assert len(dml) == stream.channels
        vchannels = stream.vchannels(collection_id, 3)
        w.create_collection(collection_id, name, [*vchannels, f"{stream.pchannel(0)}_vcchan"])
        expected: dict[int, str] = {}
        for n, vchannel in enumerate(vchannels):
            keys = range(n * 100, n * 100 + 22)
            w.insert(vchannel, collection_id, keys)
            expected.update({pk: f"row-{pk}" for pk in keys})
        stream.tick_all()
        made.append((task_id, name, expected))
    for task_id, name, expected in made:
        wait_for_collection(target_client, name)
        wait_rows(target_client, name, expected)
        task = task_view(daemon, task_id)
        assert task["state"] == "Running", task
        assert task["reason"] == "", task


def test_a_2_3_collection_written_right_after_create_is_replicated(
    daemon_factory, milvus_source, etcd_service, kafka_mock, source_client, milvus_lite_service
):
    from pymilvus import MilvusClient

    daemon = daemon_factory(**source_config(milvus_source, etcd_service, kafka_mock)).start()
    target = MilvusClient(uri=milvus_lite_service.uri, dedicated=True)
    tag = uuid.uuid4().hex[:6]
    names = []
    try:
        for i in range(ROUNDS):
            name = f"race23_{tag}_{i}"
            task_id = create(daemon, milvus_lite_service.uri, name)
            started = positions(daemon, task_id)
            assert started, "no start position saved before create answered"
            assert {p["channel_name"] for p in started} >= set(milvus_source.dml_channels), started
            create_source_collection(source_client, name)
            source_client.insert(name, make_rows(0, 40, name))
            names.append(name)
        for name in names:
            wait_until(lambda name=name: target.has_collection(name), 60, f"{name} on target")
            wait_equal(source_client, target, name, "id")
    finally:
        target.close()
