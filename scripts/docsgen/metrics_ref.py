"""docs/reference/metrics.md from the daemon's registry: every family the registry's collectors
yield (ours and the Go milvus-cdc's), with its type, labels and help text. The collectors are
given empty inputs: a family is declared whether or not it has samples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.metrics_core import Metric

HEADER = """# Metrics

Every metric `GET /metrics` can export, read from the daemon's Prometheus registry
(`server/runtime/metrics.py`, `metrics_go.py`, `jobs.py`) by `scripts/gen_docs.py`: do not edit
by hand. A metric with a `task_id` label has samples only for the tasks this daemon runs: sum
over a fleet. How to use them (Grafana, alerts): [Monitoring](../operations/monitoring.md).

| metric | type | labels | meaning |
|---|---|---|---|
"""


# one task with one channel and one collection: the families whose labels are given per sample
# (the Go tool's data counters) show them
SAMPLE_PROGRESS = {
    "t": {
        "channels": [
            {"channel": "c", "rows": 0, "bytes": 0, "lag_seconds": None, "position": None,
             "read_ts": 1 << 18, "applied_ts": 1 << 18, "bytes_by_type": {"insert": 1}}
        ],
        "collections": [
            {"collection_id": 1, "collection_name": "c", "inserted": 1, "deleted": 1}
        ],
    }
}  # fmt: skip


def _families() -> list[tuple[str, str, tuple[str, ...], str]]:
    from server.runtime import metrics as daemon_metrics
    from server.runtime.jobs import _JobsCollector

    heap = dict.fromkeys((*daemon_metrics._HEAP_GAUGES, *daemon_metrics._HEAP_COUNTERS), 0)
    registry = daemon_metrics.DaemonMetrics(
        task_counts=dict, progress=lambda: SAMPLE_PROGRESS, task_states=dict,
        fleet=lambda: {"members": [], "lease_seconds_left": 0},
        heap=lambda: heap, timings=dict,
    )  # fmt: skip
    # the scheduler's collector (install_jobs registers it on a running daemon), on empty state
    jobs: Any = SimpleNamespace(
        health=SimpleNamespace(healthy=True),
        supervisor=SimpleNamespace(all_progress=dict),
        sampler=None,
        retrier=SimpleNamespace(retries={}),
        reachability=SimpleNamespace(probed={}),
    )
    registry.registry.register(_JobsCollector(jobs))
    found: dict[str, tuple[str, str, tuple[str, ...], str]] = {}
    collectors = list(registry.registry._collector_to_names)
    for collector in collectors:
        labels_of = getattr(collector, "_labelnames", None)
        family: Metric
        for family in collector.collect():
            labels = tuple(getattr(family, "_labelnames", ()) or labels_of or ())
            if not labels and family.samples:
                seen = [k for s in family.samples for k in s.labels if k not in ("le", "quantile")]
                labels = tuple(dict.fromkeys(seen))
            name = family.name + ("_total" if family.type == "counter" else "")
            if family.type == "counter" and family.samples:
                name = family.samples[0].name.removesuffix("_created")
            found[name] = (name, family.type, labels, family.documentation)
    return sorted(found.values())


def render() -> str:
    rows = [
        f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels) or '-'} | "
        f"{text.replace('|', '/')} |"
        for name, kind, labels, text in _families()
    ]
    return HEADER + "\n".join(rows) + "\n"
