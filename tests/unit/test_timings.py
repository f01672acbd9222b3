"""Where a task's lag goes: the histograms the channel workers fill, as /metrics shows them."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from replicator.pipeline.timings import BUCKETS, LatencyHistogram, Releases, TaskTimings
from server.runtime.metrics import DaemonMetrics


def test_histogram_counts_by_upper_bound_and_clamps_negative_values() -> None:
    histogram = LatencyHistogram()
    for seconds in (0.004, 0.2, 0.2, 0.35, 100.0, -0.01):
        histogram.observe(seconds)
    view = histogram.view()
    counts = dict(view.buckets)
    assert view.count == 6
    assert abs(view.total - (0.004 + 0.4 + 0.35 + 100.0)) < 1e-9
    assert counts[0.001] == 1  # the negative one, taken as 0
    assert counts[0.005] == 2
    assert counts[0.2] == 4  # a value on a bound counts in that bound's bucket
    assert counts[0.4] == 5
    assert counts[BUCKETS[-1]] == 5 and counts[float("inf")] == 6


def test_metrics_show_each_task_histograms() -> None:
    timings = TaskTimings()
    timings.tick_wait.observe(0.12)
    timings.target_write.observe(0.01)
    timings.target_write.observe(0.03)
    metrics = DaemonMetrics(dict, dict, timings=lambda: {"t1": timings})
    text = generate_latest(metrics.registry).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("cdc_tick_wait_seconds_count", (("task_id", "t1"),))] == 1
    assert samples[("cdc_tick_wait_seconds_bucket", (("le", "0.1"), ("task_id", "t1")))] == 0
    assert samples[("cdc_tick_wait_seconds_bucket", (("le", "0.15"), ("task_id", "t1")))] == 1
    assert samples[("cdc_target_write_seconds_count", (("task_id", "t1"),))] == 2
    assert abs(samples[("cdc_target_write_seconds_sum", (("task_id", "t1"),))] - 0.04) < 1e-9
    for name in (
        "cdc_read_delay_seconds",
        "cdc_apply_delay_seconds",
        "cdc_read_wait_seconds",
        "cdc_decode_seconds",
        "cdc_hold_seconds",
        "cdc_position_save_seconds",
        "cdc_own_delay_seconds",
    ):
        assert samples[(f"{name}_count", (("task_id", "t1"),))] == 0


def test_own_part_per_released_event_from_the_ticks_wal_time() -> None:
    """Two ticks of one read released 3 and 1 events; the first came from a WAL that stamps
    its records (Kafka), the second from one that does not: read wait and own delay count only
    the first's; hold counts every event, position save every write."""
    timings = TaskTimings()
    releases = Releases()
    releases.add(100.010, 100.000, 3, timings)  # read 10 ms after the WAL took it
    releases.add(100.020, 0.0, 1, timings)
    releases.add(100.030, 100.025, 0, timings)  # released nothing: not counted
    releases.written(timings, write_started=100.040, written_at=100.060, saved_at=100.065)
    views = timings.views()
    assert views["read_wait"].count == 3 and abs(views["read_wait"].total - 0.030) < 1e-6
    assert views["hold"].count == 4
    assert abs(views["hold"].total - (3 * 0.030 + 0.020)) < 1e-6
    assert views["position_save"].count == 1
    assert abs(views["position_save"].total - 0.005) < 1e-6
    assert views["own_delay"].count == 3 and abs(views["own_delay"].total - 3 * 0.065) < 1e-6
    releases.written(timings, 101.0, 101.0, 101.0)  # nothing released since: nothing counted
    assert timings.views()["position_save"].count == 1
