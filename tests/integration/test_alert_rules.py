"""deployment/prometheus/alerts.yml: well formed, loaded by the Prometheus configuration (and the
compose stack), and naming only metrics and labels the daemon exports, read from a running
daemon's /metrics with a task running (and from the collectors fed a running channel's status,
for the families that have no samples on an empty source). ``promtool check rules`` checks
them and ``promtool test rules`` evaluates the verify alert (scripts/install-test-deps.sh
installs promtool)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from harness import services
from harness.task_bodies import create_body
from harness.tls import make_test_ca
from prometheus_client import generate_latest
from test_grafana_dashboard import exported, labels_used

from replicator.pipeline.status import ChannelStatus
from server.runtime.metrics import DaemonMetrics
from server.tasks.certificates import CertificateCollector, CertificateWatch, ClientCertificate

pytestmark = pytest.mark.integration

DEPLOYMENT = Path(__file__).resolve().parents[2] / "deployment"
RULES = DEPLOYMENT / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\b((?:milvus_)?cdc_\w+|up)\b(?=\s*[{\[)=<>!]|\s*$)")


def rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_rules_are_well_formed_and_loaded():
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)) >= 6
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule
    prometheus = yaml.safe_load((DEPLOYMENT / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["rule_files"] == ["alerts.yml"]
    compose = yaml.safe_load((DEPLOYMENT / "compose" / "docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "../prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    # the main signals have a rule
    exprs = " ".join(rule["expr"] for rule in rules())
    for signal in ("cdc_lag_seconds", 'cdc_tasks{state="Failed"}', "cdc_metastore_up"):
        assert signal in exprs


def test_rules_name_only_exported_metrics_and_labels(daemon_factory, milvus_lite_service, tmp_path):
    daemon = daemon_factory().start()
    assert daemon.request("POST", "/v1/tasks", create_body(milvus_lite_service))[0] == 201
    services.wait_until(
        lambda: "cdc_metastore_up 1.0" in daemon.get("/metrics")[1].decode(),
        30,
        "the metastore health check",
    )
    services.wait_until(
        lambda: 'cdc_endpoint_up{endpoint="' in daemon.get("/metrics")[1].decode(),
        30,
        "the first probe of the task's endpoints",
    )
    names = exported(daemon.get("/metrics")[1].decode())
    channel = ChannelStatus("dml_0")
    channel.rows, channel.applied_ts = 5, 1 << 18
    channel.skipped = {"unknown_collection": 1}
    status = {
        "rows": 5,
        "channels": [channel.view()],
        "skipped": {"unknown_collection": 1},
        "imports_pending": [],
        "stale_writes": {"collections": {"default.c": {"rows": 0}}},
        "verify": {
            "state": "done",
            "finished_at": 1.0,
            "collections": [
                {
                    "collection": "default.c",
                    **{k: {"count": 0} for k in ("missing", "extra", "different")},
                }
            ],
        },
    }
    metrics = DaemonMetrics(dict, lambda: {"t": status})
    # a client certificate's expiry (the daemon here presents none)
    watch = CertificateWatch(14)
    watch.look(
        [ClientCertificate("target", "https://t:19530", str(make_test_ca(tmp_path).cert_file))]
    )
    metrics.registry.register(CertificateCollector(watch))
    for name, labels in exported(generate_latest(metrics.registry).decode()).items():
        names.setdefault(name, set()).update(labels)
    names["up"] = {"job", "instance"}  # Prometheus's own, for every scrape target

    for rule in rules():
        used = set(METRIC.findall(rule["expr"]))
        assert used, rule
        unknown = used - set(names)
        assert not unknown, f"{rule['alert']}: not exported: {unknown}"
        known = set().union(*(names[m] for m in used))
        assert labels_used(rule["expr"]) <= known, rule
        for label in re.findall(r"\$labels\.(\w+)", str(rule["annotations"])):
            assert label in known | {"instance"}, (rule["alert"], label)


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, (
        "promtool is not installed (scripts/install-test-deps.sh installs Debian's prometheus)"
    )
    return path


def test_promtool_accepts_the_rules():
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_fires_the_verify_divergence_alert_only_on_divergent_rows(tmp_path):
    """Prometheus's own rule evaluator (promtool test rules) on series shaped as the daemon
    exports them: no alert while the last verify found nothing, one per divergent kind once it
    found rows, and none after a repaired verify reports zero again."""
    (rule,) = [r for r in rules() if r["alert"] == "MilvusCdcVerifyDivergence"]
    labels = 'task_id="t1",collection="default.items",job="milvus-cdc",instance="d:8444"'
    fired = {
        "severity": "critical",
        "task_id": "t1",
        "collection": "default.items",
        "kind": "missing",
    }
    series = {
        f'cdc_verify_divergent_rows{{{labels},kind="missing"}}': "0 0 3 3 0",
        f'cdc_verify_divergent_rows{{{labels},kind="extra"}}': "0 0 0 0 0",
    }
    annotations = {
        "summary": "task t1: the last verify found 3 missing row(s) in default.items",
        "description": rule["annotations"]["description"],
    }
    alert = rule["alert"]
    cases = [
        ("1m", alert, []),
        ("3m", alert, [{"exp_labels": fired, "exp_annotations": annotations}]),
        ("4m", alert, []),
    ]
    promtool_test(tmp_path, series, cases)


def test_promtool_warns_of_a_certificate_expiring_then_expired(tmp_path):
    """The two certificate alerts on a series shaped as the daemon exports it: none while 30
    days are left, the warning within 14 days, the critical one (and no warning) once past."""
    labels = (
        'role="target",endpoint="https://t:19530",file="/etc/cdc/client.pem",'
        'job="milvus-cdc",instance="d:8444"'
    )
    where = {
        "role": "target",
        "endpoint": "https://t:19530",
        "file": "/etc/cdc/client.pem",
        "job": "milvus-cdc",
        "instance": "d:8444",
    }
    soon, expired = "MilvusCdcCertificateExpiringSoon", "MilvusCdcCertificateExpired"
    summaries = {
        soon: "target https://t:19530: client certificate /etc/cdc/client.pem expires in "
        "10d 0h 0m 0s on d:8444",
        expired: "target https://t:19530: client certificate /etc/cdc/client.pem has expired "
        "on d:8444",
    }
    described = {r["alert"]: r["annotations"]["description"] for r in rules()}

    def fired(alert: str, severity: str) -> list[dict]:
        annotations = {"summary": summaries[alert], "description": described[alert]}
        return [{"exp_labels": {**where, "severity": severity}, "exp_annotations": annotations}]

    series = {f"cdc_certificate_expiry_seconds{{{labels}}}": "2592000 864000 -60"}
    cases = [
        ("0m", soon, []),
        ("0m", expired, []),
        ("1m", soon, fired(soon, "warning")),
        ("1m", expired, []),
        ("2m", soon, []),
        ("2m", expired, fired(expired, "critical")),
    ]
    promtool_test(tmp_path, series, cases)


def promtool_test(tmp_path: Path, series: dict[str, str], cases: list[tuple]) -> None:
    """``promtool test rules`` of the rules on ``series`` (name{labels} -> values, one a
    minute): each case (eval time, alert, expected alerts) must hold."""
    spec = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": at, "alertname": alert, "exp_alerts": alerts}
                    for at, alert, alerts in cases
                ],
            }
        ],
    }
    tests = tmp_path / "alert_tests.yml"
    tests.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool(), "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
