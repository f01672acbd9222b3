"""The Go milvus-cdc's metric names, labels and values, from a channel status as a runner keeps
it; names and labels as the Go tool's server/metrics/metrics.go declares them."""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metastore import TaskState
from replicator.pipeline.status import ChannelStatus
from server.runtime.metrics import DaemonMetrics

# name -> label names, as the Go tool declares them (zilliztech/milvus-cdc server/metrics)
GO_METRICS = {
    "milvus_cdc_task_num": {"task_state"},
    "milvus_cdc_task_state": {"task_id"},
    "milvus_cdc_request_total": {"request_type", "request_status"},
    "milvus_cdc_request_latency_bucket": {"request_type", "le"},
    "milvus_cdc_replicate_tt": {"task_id", "vchannel_name", "op_type"},
    "milvus_cdc_replicate_data_size": {"task_id", "vchannel_name", "op_type", "msg_type"},
    "milvus_cdc_replicate_data_cnt": {
        "task_id",
        "collection_id",
        "collection_name",
        "op_type",
        "api_type",
    },
}


def samples(metrics: DaemonMetrics) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_go_names_labels_and_values() -> None:
    now_ms = int(time.time() * 1000)
    channel = ChannelStatus("by-dev-rootcoord-dml_0")
    channel.rows = 15
    channel.applied_ts = (now_ms - 2000) << 18
    channel.read_ts = now_ms << 18
    channel.bytes_by_type = {"Insert": 900, "Delete": 100}
    progress = {
        "t1": {
            "channels": [channel.view()],
            "collections": [
                {"collection_id": 7, "collection_name": "c", "inserted": 12, "deleted": 3}
            ],
        }
    }
    states = {"t1": TaskState.RUNNING, "t2": TaskState.PAUSED, "t3": TaskState.FAILED}
    metrics = DaemonMetrics(dict, lambda: progress, lambda: states)
    metrics.go.observe_cdc("create", 200, 0.003, "POST")
    metrics.go.observe_cdc("pause", 404, 0.001, "POST")
    metrics.go.observe_cdc("unknown", 405, 0.001, "GET")
    metrics.go.observe_cdc("unknown", 400, 0.001, "POST")

    found = samples(metrics)
    for name, labels in GO_METRICS.items():
        assert name in found, name
        assert all(set(s.labels) == labels for s in found[name]), (name, found[name])

    def value(name: str, **labels: str) -> float:
        (match,) = [s.value for s in found[name] if s.labels.items() >= labels.items()]
        return match

    assert value("milvus_cdc_task_num", task_state="Running") == 1
    assert value("milvus_cdc_task_state", task_id="t1") == 1
    assert value("milvus_cdc_task_state", task_id="t2") == 2
    assert value("milvus_cdc_task_state", task_id="t3") == 2  # the Go tool pauses on failure
    assert value("milvus_cdc_replicate_tt", op_type="write") == now_ms - 2000
    assert value("milvus_cdc_replicate_tt", op_type="read") == now_ms
    assert value("milvus_cdc_replicate_data_size", msg_type="Insert") == 900
    assert value("milvus_cdc_replicate_data_cnt", api_type="insert", collection_name="c") == 12
    assert value("milvus_cdc_replicate_data_cnt", api_type="delete", collection_id="7") == 3
    assert value("milvus_cdc_request_total", request_type="create", request_status="success") == 1
    assert value("milvus_cdc_request_total", request_type="pause", request_status="fail") == 1
    assert value("milvus_cdc_request_total", request_status="invalid_method") == 1
    assert value("milvus_cdc_request_total", request_status="unmarshal_error") == 1
    # latency in milliseconds, Go's buckets: 3 ms falls in le=4, not in le=2
    assert value("milvus_cdc_request_latency_bucket", request_type="create", le="4.0") == 1
    assert value("milvus_cdc_request_latency_bucket", request_type="create", le="2.0") == 0
