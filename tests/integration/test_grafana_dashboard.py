"""deployment/grafana/milvus-cdc.json names only metrics (and labels) the daemon exports: read
from a running daemon's /metrics with a task running, and from the collector fed a runner's
status with one channel (the channel families have no samples on an empty source)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from harness import services
from harness.task_bodies import create_body
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from server.runtime.metrics import DaemonMetrics

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "deployment" / "grafana" / "milvus-cdc.json"
SUFFIXES = {
    "counter": ["_total", "_created"],
    "histogram": ["_bucket", "_sum", "_count", "_created"],
    "gauge": [""],
}


def exported(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen (empty when the family has no samples yet)."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, [""]):
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


def labels_used(expr: str) -> set[str]:
    used = set()
    for group in re.findall(r"\bby \(([^)]*)\)", expr):
        used |= {label.strip() for label in group.split(",")}
    for selector in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    used |= set(re.findall(r"label_values\(\w+, (\w+)\)", expr))
    return used - {"le"}


def test_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"] and panel["gridPos"]["w"] > 0
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(re.search(r"\bcdc_\w+", t["expr"]) for t in panel["targets"])


def test_dashboard_names_only_exported_metrics(daemon_factory, milvus_lite_service):
    daemon = daemon_factory(scheduler={"progressSampleSeconds": 0.5}).start()
    assert daemon.request("POST", "/v1/tasks", create_body(milvus_lite_service))[0] == 201
    daemon.call("list")
    services.wait_until(
        lambda: "cdc_task_rows_per_second{" in daemon.get("/metrics")[1].decode(),
        10,
        "a sampled task rate",
    )
    names = exported(daemon.get("/metrics")[1].decode())
    # the channel families, with the labels a running channel gives them
    status = {
        "rows": 5,
        "channels": [
            {"channel": "dml_0", "rows": 5, "bytes": 9, "lag_seconds": 0.2, "position": {"ts": 1}}
        ],
    }
    metrics = DaemonMetrics(dict, lambda: {"t": status})
    for name, labels in exported(generate_latest(metrics.registry).decode()).items():
        names.setdefault(name, set()).update(labels)

    dashboard = json.loads(DASHBOARD.read_text())
    used_names = set()
    checked_labels = 0
    for expr in expressions(dashboard):
        metrics_in = set(re.findall(r"\bcdc_\w+", expr))
        assert metrics_in, expr
        unknown = metrics_in - set(names)
        assert not unknown, f"{expr}: not exported: {unknown}"
        if all(names[m] for m in metrics_in):  # label names are known from samples
            known_labels = set().union(*(names[m] for m in metrics_in))
            assert labels_used(expr) <= known_labels, expr
            checked_labels += 1
        used_names |= metrics_in
    assert checked_labels >= 8
    # and the dashboard shows the daemon's main signals
    assert {"cdc_tasks", "cdc_lag_seconds", "cdc_replicated_rows_total", "cdc_metastore_up"} <= (
        used_names
    )
