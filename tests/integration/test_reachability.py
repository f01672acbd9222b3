"""A Running task whose source queue, source etcd or target stops answering says so within
seconds, in its reason, ``progress.warnings`` and ``cdc_endpoint_up``, and the warning goes when
the endpoint answers again. The queue is a Kafka mock of the test's own, frozen with SIGSTOP (a
broker that hangs: connections are accepted by the kernel and nothing answers) and thawed with
SIGCONT; etcd and the target (Milvus Lite) are reached through links the test cuts and heals."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cuttable_proxy import CuttableProxy
from harness.kafka_mock import KafkaMock, kafka_mock_cluster
from harness.services import wait_until
from harness.task_bodies import create_body
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SEEN_WITHIN = 10.0  # the bound: probes every 2 s, each with a 2 s timeout


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[KafkaMock]:
    with kafka_mock_cluster(tmp_path / "kafka") as mock:
        try:
            yield mock
        finally:
            os.kill(mock.pid, signal.SIGCONT)  # never leave it frozen for its own shutdown


def endpoint_up(daemon) -> dict[tuple[str, str], float]:
    text = daemon.get("/metrics")[1].decode()
    return {
        (sample.labels["role"], sample.labels["endpoint"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "cdc_endpoint_up"
        for sample in family.samples
    }


def test_unreachable_source_queue_etcd_and_target_are_shown_and_withdrawn(
    daemon_factory, etcd_service, milvus_lite_service, own_kafka
):
    etcd_port = int(etcd_service.endpoint.rpartition(":")[2])
    with (
        CuttableProxy("127.0.0.1", etcd_port) as etcd_link,
        CuttableProxy(milvus_lite_service.host, milvus_lite_service.port) as target_link,
    ):
        daemon = daemon_factory(
            sourceConfig={
                "etcd": {"address": [f"127.0.0.1:{etcd_link.port}"]},
                "etcdRootPath": "no-source",
                "kafka": {"address": own_kafka.bootstrap},
                "dmlChannelNum": 2,
            }
        ).start()
        body = create_body(milvus_lite_service)
        body["milvus_connect_param"]["port"] = target_link.port
        created = daemon.call("create", body)
        assert created.code == 200, created.body
        task_id = created.data["task_id"]

        def task() -> dict:
            return daemon.call("get", {"task_id": task_id}).data["task"]

        def shown(prefix: str) -> str | None:
            """The warning starting with ``prefix`` when both the reason and
            progress.warnings show it."""
            view = task()
            assert view["state"] == "Running", view
            for warning in (view.get("progress") or {}).get("warnings") or []:
                if warning.startswith(prefix) and warning in view["reason"]:
                    return str(warning)
            return None

        def gone(prefix: str) -> bool:
            view = task()
            warnings = (view.get("progress") or {}).get("warnings") or []
            return prefix not in view["reason"] and not any(w.startswith(prefix) for w in warnings)

        queue = f"source queue kafka://{own_kafka.bootstrap}"
        etcd = f"source etcd http://127.0.0.1:{etcd_link.port}"
        target = f"target {milvus_lite_service.host}:{target_link.port}"
        wait_until(
            lambda: endpoint_up(daemon).get(("source queue", queue.split()[-1])) == 1.0,
            SEEN_WITHIN,
            "the first probe of the source queue",
        )
        assert all(gone(prefix) for prefix in (queue, etcd, target)), task()

        # the queue hangs: accepted connections, no answer
        os.kill(own_kafka.pid, signal.SIGSTOP)
        warning = wait_until(lambda: shown(queue), SEEN_WITHIN, "the source queue's warning")
        assert warning.endswith(", retrying") and " unreachable since 20" in warning
        assert endpoint_up(daemon)[("source queue", f"kafka://{own_kafka.bootstrap}")] == 0.0
        os.kill(own_kafka.pid, signal.SIGCONT)
        wait_until(lambda: gone(queue), SEEN_WITHIN, "the source queue's warning withdrawn")
        assert endpoint_up(daemon)[("source queue", f"kafka://{own_kafka.bootstrap}")] == 1.0

        # the source's etcd: the link cut (a partition: nothing refused, nothing answers)
        etcd_link.cut()
        wait_until(lambda: shown(etcd), SEEN_WITHIN, "the source etcd's warning")
        etcd_link.heal()
        wait_until(lambda: gone(etcd), SEEN_WITHIN, "the source etcd's warning withdrawn")

        # the target
        target_link.cut()
        wait_until(lambda: shown(target), SEEN_WITHIN, "the target's warning")
        assert not any(
            up == 0.0 for (role, _), up in endpoint_up(daemon).items() if role != "target"
        )
        target_link.heal()
        wait_until(lambda: gone(target), SEEN_WITHIN, "the target's warning withdrawn")
        assert task()["state"] == "Running"
        assert "unreachable" not in task()["reason"]
