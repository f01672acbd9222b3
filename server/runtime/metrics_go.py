"""The Go milvus-cdc's metrics, beside ours, so Grafana boards and alerts made for it keep working.

Names, label names and values as the Go tool (zilliztech/milvus-cdc, ``server/metrics``) exports
them, read from its source:

===================================  =========================================================
``milvus_cdc_task_num``              gauge, ``task_state``: Initial, Running, Paused (and our
                                     Failed, which the Go tool has not: it pauses instead)
``milvus_cdc_task_state``            gauge per ``task_id``: 0 Initial, 1 Running, 2 Paused
                                     (a Failed task shows 2, as the Go tool pauses a task that
                                     fails)
``milvus_cdc_request_total``         counter, ``request_type``, ``request_status``: total and
                                     success per request type; unknown/invalid_method,
                                     unknown/unmarshal_error; fail for other answers
``milvus_cdc_request_latency``       histogram in milliseconds of successful requests,
                                     ``request_type``, buckets 1, 2, 4 ... 128
``milvus_cdc_replicate_tt``          gauge, ``task_id``, ``vchannel_name``, ``op_type`` (read,
                                     write): the source time of the last message read and
                                     written, in ms since the epoch (the Go tool sets the
                                     message time, though its help text speaks of a difference)
``milvus_cdc_replicate_data_size``   counter, ``task_id``, ``vchannel_name``, ``op_type``,
                                     ``msg_type`` (Insert, Delete): bytes written
``milvus_cdc_replicate_data_cnt``    counter, ``task_id``, ``collection_id``,
                                     ``collection_name``, ``op_type``, ``api_type`` (insert,
                                     delete): rows written
===================================  =========================================================

``vchannel_name`` holds the pchannel a task reads (the Go tool's readers are per pchannel too).
Only ``op_type="write"`` is exported for the data counters: this daemon counts what it applies.
Not exported: ``milvus_cdc_center_tt`` and ``milvus_cdc_api_execute_total`` (the Go tool's
target-side timestamp manager and per-API counts have no counterpart here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from metastore import TaskState
from replicator.hybrid_time import physical_ms

GO_STATE_VALUES = {
    TaskState.INITIAL: 0,
    TaskState.RUNNING: 1,
    TaskState.PAUSED: 2,
    TaskState.FAILED: 2,
}
LATENCY_BUCKETS_MS = tuple(float(2**i) for i in range(8))  # 1, 2, 4 ... 128 as in Go


def _counter(name: str, text: str) -> Metric:
    """A counter family whose samples are named exactly ``name`` (the Go names have no
    ``_total``, which prometheus_client's counter families would add)."""
    return Metric(name, text, "counter")


def go_task_families(
    states: Mapping[str, TaskState], progress: Mapping[str, Mapping[str, Any]]
) -> Iterable[Metric]:
    """The task and data families, from the same progress snapshot as ours (``progress`` is
    every runner's status, read once per scrape by the daemon's task collector)."""
    number = GaugeMetricFamily("milvus_cdc_task_num", "cdc task number", labels=["task_state"])
    for state in TaskState:
        number.add_metric([state.value], sum(1 for s in states.values() if s is state))
    state_of = GaugeMetricFamily("milvus_cdc_task_state", "cdc task state", labels=["task_id"])
    for task_id, state in sorted(states.items()):
        state_of.add_metric([task_id], GO_STATE_VALUES[state])
    yield from (number, state_of)
    tt = GaugeMetricFamily(
        "milvus_cdc_replicate_tt",
        "the source time of the last message read or written (ms since the epoch)",
        labels=["task_id", "vchannel_name", "op_type"],
    )
    size = _counter("milvus_cdc_replicate_data_size", "the size of the messages written")
    count = _counter("milvus_cdc_replicate_data_cnt", "the rows written")
    for task_id, status in progress.items():
        for channel in status.get("channels", ()):
            name = channel["channel"]
            times = (("read", channel.get("read_ts")), ("write", channel.get("applied_ts")))
            for op, ts in times:
                if ts:
                    tt.add_metric([task_id, name, op], physical_ms(ts))
            for kind, value in sorted((channel.get("bytes_by_type") or {}).items()):
                labels = {"vchannel_name": name, "op_type": "write", "msg_type": kind}
                size.add_sample(size.name, {"task_id": task_id, **labels}, value)
        for collection in status.get("collections", ()):
            for api, key in (("insert", "inserted"), ("delete", "deleted")):
                labels = {
                    "collection_id": str(collection["collection_id"]),
                    "collection_name": collection["collection_name"],
                    "op_type": "write",
                    "api_type": api,
                }
                count.add_sample(count.name, {"task_id": task_id, **labels}, collection[key])
    yield from (tt, size, count)


class GoCompatMetrics:
    """The request families, in the daemon's registry; ``observe_cdc`` is called for every
    POST /cdc. (The task and data families come from ``go_task_families``.)"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "milvus_cdc_request",
            "cdc request count",
            ["request_type", "request_status"],
            registry=registry,
        )
        self.latency = Histogram(
            "milvus_cdc_request_latency",
            "cdc request latency on the client side",
            ["request_type"],
            buckets=LATENCY_BUCKETS_MS,
            registry=registry,
        )

    def observe_cdc(self, request_type: str, status: int, seconds: float, method: str) -> None:
        """One POST /cdc answer: ``request_type`` "unknown" when the body did not name one."""
        if request_type == "unknown":
            kind = "invalid_method" if method != "POST" else "unmarshal_error"
            self.requests.labels("unknown", kind).inc()
            return
        self.requests.labels(request_type, "total").inc()
        if status == 200:
            self.requests.labels(request_type, "success").inc()
            self.latency.labels(request_type).observe(seconds * 1000)
        else:
            self.requests.labels(request_type, "fail").inc()
