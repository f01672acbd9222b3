"""Prometheus metrics of one daemon, in a registry of its own (no module-level globals)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from metastore import TaskState
from replicator.fibers import FiberPool, shared_pool
from replicator.hybrid_time import to_seconds
from replicator.pipeline.timings import TaskTimings
from server.runtime.metrics_go import GoCompatMetrics, go_task_families

Progress = Callable[[], Mapping[str, Mapping[str, Any]]]


class _TaskCollector(Collector):
    """Read at every scrape: task counts by state, and each running task's channels; with the
    Go tool's families from the same snapshot."""

    def __init__(
        self,
        counts: Callable[[], Mapping[TaskState, int]],
        progress: Progress,
        states: Callable[[], Mapping[str, TaskState]],
    ) -> None:
        self._counts = counts
        self._progress = progress
        self._states = states

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("cdc_tasks", "Replication tasks by state", labels=["state"])
        counts = self._counts()
        for state in TaskState:
            family.add_metric([state.value], counts.get(state, 0))
        yield family
        labels = ["task_id", "channel"]
        rows = CounterMetricFamily(
            "cdc_replicated_rows", "Rows written to the target (inserted or deleted)", labels=labels
        )
        size = CounterMetricFamily(
            "cdc_replicated_bytes", "Bytes of source messages applied to the target", labels=labels
        )
        lag = GaugeMetricFamily(
            "cdc_lag_seconds", "Source time not yet applied to the target", labels=labels
        )
        position = GaugeMetricFamily(
            "cdc_position_timestamp_seconds",
            "Source time of the last saved position (physical part of the hybrid timestamp)",
            labels=labels,
        )
        progress = self._progress()  # every runner's status, once per scrape
        for task_id, status in progress.items():
            for channel in status.get("channels", []):
                key = [task_id, channel["channel"]]
                rows.add_metric(key, channel["rows"])
                size.add_metric(key, channel["bytes"])
                if channel["lag_seconds"] is not None:
                    lag.add_metric(key, channel["lag_seconds"])
                if channel["position"]:
                    position.add_metric(key, to_seconds(channel["position"]["ts"]))
        skipped = CounterMetricFamily(
            "cdc_skipped_records",
            "Records a task skipped on purpose, by cause (not_selected, unknown_collection, "
            "unknown_before_task, repeated_records, ...)",
            labels=["task_id", "cause"],
        )
        imports = GaugeMetricFamily(
            "cdc_imports_pending",
            "Bulk imports of the source whose rows are not on the target yet",
            labels=["task_id"],
        )
        consistent = GaugeMetricFamily(
            "cdc_consistent_up_to_seconds",
            "Source time up to which every write of the task is on the target (what a failover "
            "keeps)",
            labels=["task_id"],
        )
        rpo = GaugeMetricFamily(
            "cdc_rpo_seconds",
            "Seconds of source writes a failover now would lose at most (now less "
            "cdc_consistent_up_to_seconds)",
            labels=["task_id"],
        )
        stale = GaugeMetricFamily(
            "cdc_stale_write_rows",
            "Rows the old primary of a switchover holds that the reverse flow did not write "
            "(stale clients), by collection: extra, missing and different together",
            labels=["task_id", "collection"],
        )
        now = time.time()
        for task_id, status in progress.items():
            watched = (status.get("stale_writes") or {}).get("collections") or {}
            for name, found in sorted(watched.items()):
                stale.add_metric([task_id, name], found["rows"])
            if up_to := status.get("consistent_up_to"):
                seconds = to_seconds(up_to["ts"])
                consistent.add_metric([task_id], seconds)
                rpo.add_metric([task_id], max(0.0, now - seconds))
        for task_id, status in progress.items():
            for cause, count in sorted((status.get("skipped") or {}).items()):
                skipped.add_metric([task_id, cause], count)
            imports.add_metric([task_id], len(status.get("imports_pending") or ()))
        yield from (rows, size, lag, position, skipped, imports, consistent, rpo, stale)
        yield from _pool_metrics(shared_pool())
        yield from _backfill_metrics(progress)
        yield from _verify_metrics(progress)
        yield from go_task_families(self._states(), progress)


def _pool_metrics(pool: FiberPool) -> Iterable[Metric]:
    """The threads every task's loops take turns on (:mod:`replicator.fibers`)."""
    threads = GaugeMetricFamily(
        "cdc_pool_threads",
        "Threads of the daemon's pool that every task's loops (fibers) run on: 8, more while "
        "steps block",
    )
    threads.add_metric([], pool.threads)
    fibers = GaugeMetricFamily(
        "cdc_fibers",
        "Task loops alive on the daemon's pool: runners, channel workers, import watchers, "
        "alias mirrors",
    )
    fibers.add_metric([], pool.fibers)
    grown = CounterMetricFamily(
        "cdc_pool_threads_added", "Threads the pool added beyond its core while steps blocked"
    )
    grown.add_metric([], pool.grown)
    return (threads, fibers, grown)


def _backfill_metrics(progress: Mapping[str, Mapping[str, Any]]) -> Iterable[Metric]:
    labels = ["task_id", "collection"]
    families = {
        key: GaugeMetricFamily(f"cdc_backfill_{key}", text, labels=labels)
        for key, text in [
            ("rows_done", "Rows the task's backfill has copied"),
            ("rows_total", "Rows the task's backfill plans to copy (counted when planned)"),
            ("ranges_done", "Key ranges the task's backfill has copied"),
            ("ranges_total", "Key ranges of the task's backfill"),
        ]
    }
    rate = GaugeMetricFamily(
        "cdc_backfill_rows_per_second", "Backfill copy rate", labels=["task_id"]
    )
    eta = GaugeMetricFamily(
        "cdc_backfill_eta_seconds", "Backfill time left at the current rate", labels=["task_id"]
    )
    running = GaugeMetricFamily(
        "cdc_backfill_running", "1 while the task's backfill copies", labels=["task_id"]
    )
    for task_id, status in progress.items():
        backfill = status.get("backfill")
        if not backfill:
            continue
        for collection in backfill.get("collections", []):
            for key, family in families.items():
                family.add_metric([task_id, collection["collection"]], collection[key])
        if backfill.get("rows_per_second") is not None:
            rate.add_metric([task_id], backfill["rows_per_second"])
        if backfill.get("eta_seconds") is not None:
            eta.add_metric([task_id], backfill["eta_seconds"])
        active = backfill.get("state") in ("pending", "planning", "running")
        running.add_metric([task_id], 1 if active else 0)
    yield from families.values()
    yield from (rate, eta, running)


def _verify_metrics(progress: Mapping[str, Mapping[str, Any]]) -> Iterable[Metric]:
    divergent = GaugeMetricFamily(
        "cdc_verify_divergent_rows",
        "Rows the task's last verify found different (kind: missing, extra, different)",
        labels=["task_id", "collection", "kind"],
    )
    finished = GaugeMetricFamily(
        "cdc_verify_last_time_seconds",
        "When the task's last finished verify ended (Unix time)",
        labels=["task_id", "state"],
    )
    for task_id, status in progress.items():
        verify = status.get("verify")
        if not verify:
            continue
        for collection in verify.get("collections", []):
            for kind in ("missing", "extra", "different"):
                labels = [task_id, collection["collection"], kind]
                divergent.add_metric(labels, collection[kind]["count"])
        if verify.get("finished_at"):
            finished.add_metric([task_id, verify["state"]], verify["finished_at"])
    yield from (divergent, finished)


class _FleetCollector(Collector):
    """This daemon in its fleet (``TaskSupervisor.fleet_view``), read at every scrape."""

    def __init__(self, view: Callable[[], Mapping[str, Any]]) -> None:
        self._view = view

    def collect(self) -> Iterable[Metric]:
        view = self._view()
        members = GaugeMetricFamily(
            "cdc_fleet_members", "Daemons registered in the fleet (this one included)"
        )
        members.add_metric([], len(view["members"]))
        tasks = GaugeMetricFamily(
            "cdc_fleet_tasks", "Running tasks each fleet member holds", labels=["member"]
        )
        for member in view["members"]:
            tasks.add_metric([member["member_id"]], member["tasks"])
        left = GaugeMetricFamily(
            "cdc_fleet_lease_seconds_left",
            "Seconds this daemon may still write without renewing its leases (0: it writes "
            "nothing until the metastore answers)",
        )
        left.add_metric([], view["lease_seconds_left"])
        yield from (members, tasks, left)


_TIMINGS = {
    "read_delay": (
        "cdc_read_delay_seconds",
        "Per data event: its source time (hybrid timestamp) to its read by the task's channel "
        "worker (the source's write, the queue, the reader)",
    ),
    "tick_wait": (
        "cdc_tick_wait_seconds",
        "Per data event: its read to the read of the source time tick that makes it final",
    ),
    "target_write": (
        "cdc_target_write_seconds",
        "Per write to the target (the events the ticks of one read released): request to "
        "acknowledgement",
    ),
    "apply_delay": (
        "cdc_apply_delay_seconds",
        "Per data event: its source time (hybrid timestamp) to the target's acknowledgement",
    ),
    "read_wait": (
        "cdc_read_wait_seconds",
        "Per data event: the WAL's time of the tick that releases it to that tick's read by "
        "the channel worker (Kafka sources)",
    ),
    "decode": ("cdc_decode_seconds", "Per data event: decoding its record"),
    "hold": (
        "cdc_hold_seconds",
        "Per data event: the read of the tick that releases it to the start of its write",
    ),
    "position_save": (
        "cdc_position_save_seconds",
        "Per write of data: the target's acknowledgement to the channel's position saved",
    ),
    "own_delay": (
        "cdc_own_delay_seconds",
        "Per data event: the WAL's time of the tick that releases it to the position saved "
        "after its write: the daemon's own part of the lag (Kafka sources)",
    ),
}


class _TimingsCollector(Collector):
    """Where each running task's lag goes (replicator/pipeline/timings.py), read at every
    scrape."""

    def __init__(self, timings: Callable[[], Mapping[str, TaskTimings]]) -> None:
        self._timings = timings

    def collect(self) -> Iterable[Metric]:
        families = {
            key: HistogramMetricFamily(name, text, labels=["task_id"])
            for key, (name, text) in _TIMINGS.items()
        }
        for task_id, timings in sorted(self._timings().items()):
            for key, view in timings.views().items():
                buckets = [
                    ("+Inf" if bound == float("inf") else f"{bound:g}", count)
                    for bound, count in view.buckets
                ]
                families[key].add_metric([task_id], buckets, view.total)
        yield from families.values()


_HEAP_GAUGES = {
    "resident_bytes": "Resident memory of the daemon (RSS)",
    "malloc_arena_bytes": "Bytes malloc's arenas hold from the system (in use and free)",
    "malloc_in_use_bytes": "Bytes of malloc's arenas in use",
    "malloc_free_bytes": (
        "Bytes of malloc's arenas free, pages a trim gave back to the system included"
    ),
    "malloc_mapped_bytes": "Bytes of blocks malloc mapped directly (large allocations)",
    "python_blocks": "Memory blocks Python's object allocator holds (sys.getallocatedblocks)",
}
_HEAP_COUNTERS = {
    "trims": "Times the daemon gave malloc's free pages back (server/runtime/heap.py)",
    "released_bytes": "Resident bytes the trims gave back",
}


class _HeapCollector(Collector):
    """The daemon's memory by kind (``HeapKeeper.stats``), read at every scrape."""

    def __init__(self, stats: Callable[[], Mapping[str, int]]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        for key, text in _HEAP_GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(f"cdc_heap_{key}", text, value=stats[key])
        for key, text in _HEAP_COUNTERS.items():
            yield CounterMetricFamily(f"cdc_heap_{key}", text, value=stats[key])


class DaemonMetrics:
    def __init__(
        self,
        task_counts: Callable[[], Mapping[TaskState, int]],
        progress: Progress,
        task_states: Callable[[], Mapping[str, TaskState]] | None = None,
        fleet: Callable[[], Mapping[str, Any]] | None = None,
        heap: Callable[[], Mapping[str, int]] | None = None,
        timings: Callable[[], Mapping[str, TaskTimings]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_TaskCollector(task_counts, progress, task_states or dict))
        if timings is not None:
            self.registry.register(_TimingsCollector(timings))
        if fleet is not None:
            self.registry.register(_FleetCollector(fleet))
        if heap is not None:
            self.registry.register(_HeapCollector(heap))
        # the Go milvus-cdc's metric names beside ours (server/runtime/metrics_go.py)
        self.go = GoCompatMetrics(self.registry)
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
