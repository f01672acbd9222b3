"""The pure parts of the scheduled jobs: backoff, transient reasons, rows/s from samples."""

from __future__ import annotations

import pytest

from replicator.config.daemon import RetrySettings
from replicator.config.settings import load_settings
from server.runtime.jobs import ProgressSampler, backoff_seconds, is_transient


def test_backoff_grows_by_the_multiplier_up_to_the_cap():
    policy = RetrySettings(initialBackoffSeconds=10, multiplier=2, maxBackoffSeconds=60)
    assert [backoff_seconds(policy, n) for n in range(1, 6)] == [10, 20, 40, 60, 60]
    flat = RetrySettings(initialBackoffSeconds=3, multiplier=1)
    assert [backoff_seconds(flat, n) for n in (1, 5)] == [3, 3]


def test_default_policy_is_documented_in_the_shipped_file():
    retry = load_settings(None, {}).scheduler.retry
    assert (retry.initialBackoffSeconds, retry.multiplier, retry.maxBackoffSeconds) == (10, 2, 600)
    assert retry.maxAttempts == 0 and retry.enabled


@pytest.mark.parametrize(
    ("reason", "transient"),
    [
        ("cannot start: source etcd unreachable", True),
        ("channel x: <_InactiveRpcError StatusCode.UNAVAILABLE>", True),
        ("target: Connection refused", True),
        ("channel by-dev-rootcoord-dml_0 at offset 7: undecodable record", False),
        ("manually paused through the http interface", False),
        ("", False),
    ],
)
def test_transient_reasons_are_matched_case_insensitively(reason, transient):
    assert is_transient(RetrySettings(), reason) is transient


def test_configured_markers_replace_the_defaults():
    policy = RetrySettings(transientReasons=["Undecodable"])
    assert is_transient(policy, "offset 7: undecodable record")
    assert not is_transient(policy, "cannot start: x")


def test_rows_per_second_over_the_last_samples():
    sampler = ProgressSampler()
    assert sampler.rows_per_second("t") is None
    sampler.sample({"t": {"rows": 0, "lag_seconds": None}}, now=100.0)
    assert sampler.rows_per_second("t") is None  # one sample is no rate
    for i in range(1, 11):
        sampler.sample({"t": {"rows": 50 * i, "lag_seconds": 0.5}}, now=100.0 + 5 * i)
    assert sampler.rows_per_second("t") == 10.0
    assert sampler.view("t")["lag_samples"][-1] == 0.5
    sampler.sample({}, now=160.0)  # the task stopped: its samples go
    assert sampler.view("t") == {"rows_per_second": None, "lag_samples": []}
