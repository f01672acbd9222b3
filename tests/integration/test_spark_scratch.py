"""A Spark driver launched by the daemon keeps its temporary files in a directory of its own,
which is gone once the driver is, also after a ``kill -9`` (Spark's shutdown hook, which removes
its directories, never runs then; they used to stay in /tmp, with the JVM's extracted native
libraries). A real PySpark driver in local mode, with Python workers."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    with driver_environment(str(log_dir), "task-1") as env:
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
    with driver_environment(str(tmp_path), "t") as env:
        assert env["SPARK_SUBMIT_OPTS"].startswith("-Dcdc.test=1 ")
        assert f'"-Djava.io.tmpdir={tmp_path.resolve()}/scratch/t"' in env["SPARK_SUBMIT_OPTS"]
