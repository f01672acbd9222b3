"""A Spark driver launched by the daemon keeps its temporary files in a directory of its own,
which is gone once the driver is, also after a ``kill -9`` (Spark's shutdown hook, which removes
its directories, never runs then; they used to stay in /tmp, with the JVM's extracted native
libraries); and its Python workers run the daemon's interpreter, not PATH's ``python3``. A real
PySpark driver in local mode, with Python workers."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.installed import bare_python_bin

from replicator.backfill.phase import driver_environment, kill_group

pytestmark = pytest.mark.integration

DRIVER = """
import sys, tempfile, time
from pyspark.sql import SparkSession
session = (
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
)
context = session.sparkContext
jvm = context._jvm
print(jvm.java.lang.System.getProperty("java.io.tmpdir"))
print(jvm.org.apache.spark.util.Utils.getLocalDir(context._jsc.sc().conf()))
print(tempfile.gettempdir())
print(context.parallelize(range(10), 2).map(lambda x: x * 2).sum())  # Python workers ran
sys.stdout.flush()
time.sleep(600)
"""


def read_lines(process: subprocess.Popen[bytes], count: int, timeout: float) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"the driver printed {lines} in {timeout} s"
        ready, _, _ = select.select([process.stdout], [], [], left)
        if ready:
            line = process.stdout.readline()
            assert line, f"the driver ended after printing {lines}"
            lines.append(line.decode().strip())
    return lines


def test_a_killed_drivers_temporary_files_are_all_in_its_scratch_directory(tmp_path: Path):
    log_dir = tmp_path / "backfill dir"  # a space in the path, quoted for Spark's launcher
    scratch = (log_dir / "scratch" / "task-1").resolve()
    with driver_environment(str(log_dir), "task-1", sys.executable, {}) as env:
        process = subprocess.Popen(
            [sys.executable, "-c", DRIVER],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            jvm_tmp, spark_local, python_tmp, total = read_lines(process, 4, 180)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            kill_group(process.pid)
            process.wait()
            assert process.stdout is not None
            process.stdout.close()
        assert total == "90"
        assert jvm_tmp == str(scratch)
        assert Path(spark_local).is_relative_to(scratch), spark_local
        assert python_tmp == str(scratch)
        assert any(p.name.startswith("spark-") for p in scratch.iterdir()), os.listdir(scratch)
    assert not scratch.exists(), "the scratch directory outlived its driver"
    assert log_dir.exists()


def test_an_operators_submit_options_are_kept(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Dcdc.test=1")
    with driver_environment(str(tmp_path), "t", sys.executable, {}) as env:
        assert env["SPARK_SUBMIT_OPTS"].startswith("-Dcdc.test=1 ")
        assert f'"-Djava.io.tmpdir={tmp_path.resolve()}/scratch/t"' in env["SPARK_SUBMIT_OPTS"]


PROBE = """
from pyspark.sql import SparkSession
session = (
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
)

def probe(_):
    import sys
    try:
        import pymilvus  # noqa: F401
    except ImportError:
        return sys.executable + " without-pymilvus"
    return sys.executable + " with-pymilvus"

print(session.sparkContext.parallelize([0], 1).map(probe).collect()[0])
"""


def worker_python(tmp_path: Path, spark_conf: dict[str, str]) -> str:
    """What a Python worker of a driver started in ``driver_environment`` runs and finds, with
    a ``python3`` lacking pymilvus first on PATH (a machine whose system interpreter does not
    hold the virtualenv's packages)."""
    with driver_environment(str(tmp_path), "probe", sys.executable, spark_conf) as env:
        env["PATH"] = f"{bare_python_bin()}{os.pathsep}{env['PATH']}"
        result = subprocess.run(
            [sys.executable, "-c", PROBE],
            capture_output=True,
            env=env,
            timeout=240,
            start_new_session=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    return result.stdout.decode().strip().splitlines()[-1]


def test_spark_python_workers_run_the_daemons_interpreter_not_paths_python3(tmp_path: Path):
    assert worker_python(tmp_path, {}) == f"{sys.executable} with-pymilvus"


def test_spark_pyspark_python_of_the_operator_wins(tmp_path: Path):
    bare = str(bare_python_bin() / "python3")
    assert worker_python(tmp_path, {"spark.pyspark.python": bare}) == f"{bare} without-pymilvus"
