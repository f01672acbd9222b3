"""Prometheus metrics of one daemon, in a registry of its own (no module-level globals)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from metastore import TaskState


class _TaskStateCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[TaskState, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("cdc_tasks", "Replication tasks by state", labels=["state"])
        counts = self._counts()
        for state in TaskState:
            family.add_metric([state.value], counts.get(state, 0))
        yield family


class DaemonMetrics:
    def __init__(self, task_counts: Callable[[], Mapping[TaskState, int]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_TaskStateCollector(task_counts))
        self.requests = Counter(
            "cdc_requests",
            "POST /cdc requests by request type and answer code",
            ["request_type", "code"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "cdc_request_duration_seconds",
            "Time to answer a POST /cdc request",
            ["request_type"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )

    def observe_request(self, request_type: str, code: int, seconds: float) -> None:
        self.requests.labels(request_type, str(code)).inc()
        self.request_seconds.labels(request_type).observe(seconds)
