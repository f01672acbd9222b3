"""The daemon's side of a backfill: run the job's driver process, relaunch it when it dies,
and hand over to streaming.

Hand-over. The task's positions P are saved before the job reads anything, and no channel worker
of the task runs while the job copies (a row read by the job before a source delete could
otherwise be written after the stream applied that delete, bringing the old row back). When the
job ends, the in-flight bound of every channel is raised to the channel's end at that moment;
the workers then start from P and apply the whole overlap in WAL order with inserts written as
upserts. For every key the target ends with the source's state: a key written after P gets its
last WAL operation, a key untouched since P keeps the copied row, which is its state at P.

A driver that dies (killed, out of memory, a lost cluster) is launched again, up to
``max_attempts`` times in all, and copies only the ranges not recorded as done. A range that
fails on every Spark attempt stops the job: the task keeps streaming, with the reason (naming
the collection and range) among its warnings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicator.backfill.child_env import child_environment
from replicator.backfill.job import EXIT_OK, EXIT_RANGE_FAILED
from replicator.backfill.progress import CollectionProgress, RateMeter, summary
from replicator.backfill.state import BackfillJob, BackfillState, CollectionRef

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
RELAUNCH_BACKOFF = 2.0
STOP_GRACE = 10.0


@dataclass(frozen=True)
class DriverLauncher:
    """How to start the job's driver: this Python with the daemon's settings on stdin."""

    python: str
    settings_json: bytes
    log_dir: str
    max_attempts: int
    spark_conf: Mapping[str, str] = field(default_factory=dict)  # backfill.sparkConf

    def command(self, task_id: str) -> list[str]:
        """The driver's command line. Run under util-linux's ``setpriv --pdeathsig KILL`` when
        the host has it: a daemon killed outright (``kill -9``) takes its driver with it, so a
        driver never goes on copying for a daemon whose tasks another daemon of the fleet has
        taken (not a ``preexec_fn``: that forks a process with gRPC threads)."""
        argv = [self.python, "-m", "replicator.backfill", "--task", task_id, "--settings-stdin"]
        setpriv = shutil.which("setpriv")
        return argv if setpriv is None else [setpriv, "--pdeathsig", "KILL", "--", *argv]


class BackfillPhase:
    def __init__(
        self, task_id: str, state: BackfillState, launcher: DriverLauncher, stop: threading.Event
    ) -> None:
        self.task_id = task_id
        self.state = state
        self.launcher = launcher
        self.stop = stop
        self.rate = RateMeter()
        self.driver_pid: int | None = None
        self.view: dict[str, Any] | None = None

    # --- progress ------------------------------------------------------------------------------
    def refresh(self, job: BackfillJob | None = None) -> None:
        job = job or self.state.job()
        if job is None:
            self.view = None
            return
        plans = self.state.plans(job.job_id)
        done = self.state.done(job.job_id)
        collections = []
        for index, ref in enumerate(job.collections):
            plan = plans.get(index)
            finished = {r: rows for (c, r), rows in done.items() if c == index}
            collections.append(
                CollectionProgress(
                    ref.label,
                    rows_total=plan.rows if plan else 0,
                    ranges_total=len(plan.ranges) if plan else 0,
                    # a range counts at most its planned rows (rows written since the plan
                    # are copied too), so rows_done never passes rows_total
                    rows_done=sum(
                        min(rows, plan.ranges[r].rows) if plan and r < len(plan.ranges) else 0
                        for r, rows in finished.items()
                    ),
                    ranges_done=len(finished),
                )
            )
        rows_done = sum(c.rows_done for c in collections)
        if job.state == "running":
            self.rate.add(time.monotonic(), rows_done)
        view = summary(collections, self.rate.rate() if job.state == "running" else None)
        planning = job.state == "running" and len(plans) < len(job.collections)
        self.view = {
            "job_id": job.job_id,
            "state": "planning" if planning else job.state,
            "requested": job.requested,
            **view,
            "attempts": job.attempts,
            "driver_pid": self.driver_pid,
            "reason": job.reason,
            "started_at": job.started_at or None,
            "finished_at": job.finished_at or None,
        }

    # --- running -------------------------------------------------------------------------------
    def run(
        self, job: BackfillJob, collections: list[CollectionRef], hand_over: Callable[[], None]
    ) -> BackfillJob | None:
        """Run ``job`` to its end; the finished job (done or failed), or None when the runner
        was stopped first (the job stays running and resumes at the next start)."""
        job = job.with_(
            state="running", collections=collections, started_at=job.started_at or time.time()
        )
        self.state.save_job(job)
        self.refresh(job)
        reason = ""
        while collections:
            code = self._run_driver(job)
            if code is None:
                return None
            if code == EXIT_OK:
                break
            if code == EXIT_RANGE_FAILED:
                reason = self.state.failure(job.job_id) or "a key range failed"
                break
            job = job.with_(attempts=job.attempts + 1)
            self.state.save_job(job)
            if job.attempts >= self.launcher.max_attempts:
                error = self.state.last_error(job.job_id)
                reason = (
                    f"the backfill driver exited with code {code} {job.attempts} times"
                    f"{f' (last error: {error})' if error else ''}; see {self._log_path()}"
                )
                break
            log.warning(
                "backfill driver exited with code %s; launching it again (%d of %d)",
                code,
                job.attempts + 1,
                self.launcher.max_attempts,
            )
            if self.stop.wait(RELAUNCH_BACKOFF):
                return None
        # raised before the job is marked finished: a crash in between runs the (finished) job
        # again and raises the bounds again, before any worker starts
        hand_over()
        job = job.with_(
            state="failed" if reason else "done", reason=reason, finished_at=time.time()
        )
        self.state.save_job(job)
        self.refresh(job)
        if reason:
            log.error("backfill %s failed: %s", job.job_id, reason)
        else:
            log.info("backfill %s done: %s rows", job.job_id, (self.view or {}).get("rows_done"))
        return job

    def _log_path(self) -> Path:
        return Path(self.launcher.log_dir) / f"{self.task_id}.log"

    def _run_driver(self, job: BackfillJob) -> int | None:
        """Launch the driver and wait for it; its exit code, or None when stopped."""
        path = self._log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with driver_environment(
            self.launcher.log_dir, self.task_id, self.launcher.python, self.launcher.spark_conf
        ) as env:
            return self._drive(job, path, env)

    def _drive(self, job: BackfillJob, path: Path, env: dict[str, str]) -> int | None:
        with open(path, "ab") as output:
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self.launcher.command(self.task_id),
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its JVM and Python workers share its process group
            )
        self.driver_pid = process.pid
        log.info("backfill %s: driver started, pid %d, log %s", job.job_id, process.pid, path)
        try:
            assert process.stdin is not None
            try:
                process.stdin.write(self.launcher.settings_json)
                process.stdin.close()
            except BrokenPipeError:
                pass
            while True:
                try:
                    return process.wait(timeout=POLL_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
                if self.stop.is_set():
                    terminate_group(process)
                    return None
                self.refresh()
        finally:
            kill_group(process.pid)  # what the driver left behind (a JVM, Python workers)
            self.driver_pid = None
            self.refresh()


@contextlib.contextmanager
def driver_environment(
    log_dir: str, name: str, python: str, spark_conf: Mapping[str, str]
) -> Iterator[dict[str, str]]:
    """The environment of a Spark driver process whose temporary files go to a directory of its
    own, ``<log_dir>/scratch/<name>``, removed when the block ends (after the driver's process
    group is gone): Spark's local directories and the JVM's files (``java.io.tmpdir``, which
    ``spark.local.dir`` defaults to; a ``spark.local.dir`` of the operator's still wins), and
    Python's (``TMPDIR``, also for the Python workers). A driver killed outright so leaves
    nothing in /tmp: Spark's shutdown hook, which would remove its directories, never ran.

    Spark's Python workers run ``python``, the daemon's own interpreter (a virtualenv's, say),
    not whatever ``python3`` comes first on PATH (which need not have pymilvus): pyspark starts
    them with ``PYSPARK_PYTHON`` and reads no Spark setting for it, so the operator's
    ``spark.pyspark.python`` (needed when executors run on other hosts) is passed the same way.

    Only the variables ``child_env`` allows are inherited: never a ``CDC_`` one, nor a secret of
    any other program's."""
    scratch = (Path(log_dir) / "scratch" / name).resolve()
    shutil.rmtree(scratch, ignore_errors=True)  # a driver's whose daemon was killed meanwhile
    scratch.mkdir(parents=True)
    env = child_environment(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["TMPDIR"] = str(scratch)
    env["PYSPARK_PYTHON"] = spark_conf.get("spark.pyspark.python") or python
    env["PYSPARK_DRIVER_PYTHON"] = python
    # read by Spark's launcher for the driver's JVM; quoted: the path may hold spaces
    options = [env.get("SPARK_SUBMIT_OPTS", ""), f'"-Djava.io.tmpdir={scratch}"']
    env["SPARK_SUBMIT_OPTS"] = " ".join(o for o in options if o)
    try:
        yield env
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def terminate_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
