"""How the daemon runs its work: its jobs, the fleet it belongs to, and its memory.

The periodic jobs and the retries of stopped tasks, the backfill and verify jobs, the daemons
sharing one metastore, and malloc.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from replicator.config.section import ConfigSection

DEFAULT_TRANSIENT_REASONS = [
    "cannot start:",
    "unavailable",
    "deadline_exceeded",
    "connection refused",
    "connection reset",
    "timed out",
]


class RetrySettings(ConfigSection):
    """ours: resume tasks stopped by a transient error, with exponential backoff."""

    enabled: bool = True
    checkSeconds: float = Field(default=5.0, gt=0)
    initialBackoffSeconds: float = Field(default=10.0, gt=0)
    multiplier: float = Field(default=2.0, ge=1)
    maxBackoffSeconds: float = Field(default=600.0, gt=0)
    maxAttempts: int = Field(default=0, ge=0)
    transientReasons: list[str] = Field(default_factory=lambda: list(DEFAULT_TRANSIENT_REASONS))


class SchedulerSettings(ConfigSection):
    """ours: the daemon's periodic jobs (APScheduler)."""

    progressSampleSeconds: float = Field(default=5.0, gt=0)
    metastoreCheckSeconds: float = Field(default=10.0, gt=0)
    # how often the source's queue and etcd and each running task's target are probed; an
    # endpoint that does not answer is a warning on the tasks that use it
    # (server/tasks/reachability.py)
    reachabilitySeconds: float = Field(default=2.0, gt=0)
    # a client certificate expiring within this many days (or expired) is a warning on the
    # tasks that use it, in /readyz and in `milvus-cdc check` (server/tasks/certificates.py)
    certificateWarningDays: float = Field(default=14.0, ge=0)
    retry: RetrySettings = Field(default_factory=RetrySettings)


class BackfillSettings(ConfigSection):
    """ours: the Spark job that copies a task's existing rows (see README, "Backfill")."""

    # local[*] runs Spark inside the job's own process; spark://host:7077, yarn, k8s://...
    # send it to a cluster (the executors need pymilvus and this package).
    sparkMaster: str = "local[*]"
    # attempts of one Spark task (one key range) before the backfill stops
    taskMaxFailures: int = Field(default=4, ge=1)
    # rows per key range (one Spark task each); a collection gets ceil(rows / rangeRows) ranges
    rangeRows: int = Field(default=25000, gt=0)
    # rows per read from the source and per upsert into the target
    batchRows: int = Field(default=4000, gt=0, le=16384)
    # ranges copied at once; 0: Spark's default parallelism
    parallelism: int = Field(default=0, ge=0)
    # launches of the job's driver process per backfill; a killed driver is launched again and
    # resumes after the ranges already done
    maxJobAttempts: int = Field(default=3, ge=1)
    # the driver's output (Spark's own log lines included), one file per task
    logDir: str = "data/backfill"
    # extra Spark properties, e.g. {"spark.driver.memory": "1g"}
    sparkConf: dict[str, str] = Field(default_factory=dict)


class VerifySettings(ConfigSection):
    """ours: comparing a task's target with its source (see README, "Verifying a task")."""

    # keys per range; a range is read from both sides and compared as a count and a digest
    rangeRows: int = Field(default=10000, gt=0)
    # rows per read
    batchRows: int = Field(default=5000, gt=0, le=16384)
    # reads of a differing range after the first, each once the task applied the one before;
    # a range still changing after them is reported as unsettled, not as divergent
    tries: int = Field(default=4, ge=1)
    # seconds to wait for the task to apply what was written before a read
    settleSeconds: float = Field(default=60.0, gt=0)
    # ranges of a collection compared at once (threads of the daemon)
    parallelism: int = Field(default=2, ge=1, le=64)
    # collections of at least this many rows have their range digests computed as a Spark job
    # (backfill.sparkMaster, backfill.sparkConf), smaller ones in the daemon; 0: never Spark.
    # A Spark session takes 5-60 s to start (local[2] on a shared 2-core machine): what the
    # daemon needs to digest a few million rows
    sparkMinRows: int = Field(default=10_000_000, ge=0)
    # scheduled verification of every Running task, in hours (0: none unless a task's create
    # asks with verify.intervalHours); each run covers a random sampleFraction of the ranges
    intervalHours: float = Field(default=0.0, ge=0)
    sampleFraction: float = Field(default=0.1, gt=0, le=1)
    # how often the scheduler looks for a verify that is due
    scheduleCheckSeconds: float = Field(default=60.0, gt=0)


class FleetSettings(ConfigSection):
    """ours: daemons sharing one metastore (etcd or MySQL) share its tasks (README, "Running
    several daemons"). Each Running task is run by the daemon holding its lease."""

    # a daemon that stops renewing (killed, cut off) loses its tasks after this long; it stops
    # writing itself after two thirds of it without a renewal, before anyone else may start
    leaseSeconds: float = Field(default=10.0, ge=2)
    # how often a daemon renews its leases and looks for tasks to take, hand over or stop
    checkSeconds: float = Field(default=1.0, gt=0)
    # this daemon's name in the fleet (the `owner` get and list show); default host:port. Two
    # daemons must never share one: each would take the other's leases for its own
    memberId: str = Field(default="", max_length=128)

    @model_validator(mode="after")
    def _renewed_in_time(self) -> FleetSettings:
        if self.checkSeconds * 4 > self.leaseSeconds:
            raise ValueError(
                f"fleet.checkSeconds ({self.checkSeconds:g}) must be at most a quarter of "
                f"fleet.leaseSeconds ({self.leaseSeconds:g}): leases are renewed every check"
            )
        return self


class MemorySettings(ConfigSection):
    """ours: the daemon's malloc (server/runtime/heap.py; bench/results/backlog.md)."""

    # at most this many malloc arenas (glibc makes up to 8 per core); 0: glibc's default. An
    # operator's MALLOC_ARENA_MAX wins
    mallocArenas: int = Field(default=2, ge=0, le=64)
    # how often the freed memory malloc keeps is looked at; it is given back (malloc_trim) when
    # RSS grew more than trimAboveMB since the last trim and malloc holds as much free; 0: never
    trimSeconds: float = Field(default=1.0, ge=0)
    trimAboveMB: int = Field(default=32, ge=0)
