"""What runs beside the requests while the daemon runs: scheduled jobs, metrics, memory.

- :mod:`jobs`: the APScheduler jobs (progress samples, metastore health, reachability,
  retries of transient failures, scheduled verifies, recovery of disaster-recovery jobs).
- :mod:`verify_schedule`: when a task's scheduled verify is due.
- :mod:`metrics`: the Prometheus collectors; :mod:`metrics_go`: the Go milvus-cdc's families.
- :mod:`heap`: the daemon's memory by kind, and giving freed memory back.
- :mod:`store_format`: the metastore's format, migrated at start as far as every live fleet
  member reads, a breaking step that waits tried again by the scheduler.


The jobs module reads the application state (:mod:`server.app_state`), which names the metrics'
type: it is imported from :mod:`server.runtime.jobs` itself, not re-exported here.
"""

from server.runtime.heap import HeapKeeper
from server.runtime.metrics import DaemonMetrics
from server.runtime.store_format import StoreFormatKeeper

__all__ = ["DaemonMetrics", "HeapKeeper", "StoreFormatKeeper"]
