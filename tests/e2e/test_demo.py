"""The embedded demo (python -m server.demo) end to end: it brings up a source Milvus with its
embedded etcd and RocksMQ, a Milvus Lite target and the daemon, replicates until the target
matches, serves POST /cdc, and on SIGTERM stops every process it started. Where Java and pyspark
are installed (as on our machines) it also runs its backfill; elsewhere it must say it skipped
it."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness.services import die_with_parent, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]
MATCH_LINE = "DEMO: target matches source"
MATCH_TIMEOUT_S = 600
HISTORY_ROWS = 3000  # server.demo.HISTORY_ROWS, rows of demo_history before its task


def can_backfill() -> bool:
    """The demo's own rule (server.demo.backfill_blocker): Java and pyspark."""
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (java_home and Path(java_home, "bin", "java").is_file())
    return bool(java) and importlib.util.find_spec("pyspark") is not None


def _descendants(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc/<pid>/task/<tid>/children."""
    found: set[int] = set()
    pending = [pid]
    while pending:
        current = pending.pop()
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                text = children.read_text()
            except OSError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.add(child)
                    pending.append(child)
    return found


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat); None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _cdc(port: int, request_type: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/cdc", body=json.dumps({"request_type": request_type}).encode())
        response = conn.getresponse()
        return json.loads(response.read())
    finally:
        conn.close()


def test_demo_replicates_serves_and_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(REPO_ROOT)
    argv = [sys.executable, "-m", "server.demo"]
    argv += ["--data-dir", str(tmp_path / "demo"), "--port", str(port)]
    demo = subprocess.Popen(
        die_with_parent(argv),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    matched = threading.Event()

    def read() -> None:
        assert demo.stdout is not None
        for raw in demo.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            lines.append(line)
            if line.startswith(MATCH_LINE):
                matched.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def output() -> str:
        return "\n".join(lines[-80:])

    try:
        started = time.monotonic()
        while not matched.wait(1):
            assert demo.poll() is None, f"the demo exited ({demo.returncode}):\n{output()}"
            assert time.monotonic() - started < MATCH_TIMEOUT_S, f"no match line:\n{output()}"

        tasks = _cdc(port, "list")["data"]["tasks"]
        progress = [line for line in lines if line.startswith("progress: ")]
        if can_backfill():
            assert [t["state"] for t in tasks] == ["Running", "Running"], tasks
            assert not any(line.startswith("backfill: skipped") for line in lines), output()
            history = next(t for t in tasks if t["collection_infos"][0]["name"] == "demo_history")
            backfill = history["progress"]["backfill"]
            assert backfill["state"] == "done", backfill
            assert backfill["rows_done"] == backfill["rows_total"] == HISTORY_ROWS, backfill
            assert backfill["ranges_done"] == backfill["ranges_total"] == 3, backfill
            # the progress lines show the copy under way, then the target holding every row
            assert any("backfill running" in line for line in progress), output()
            assert any(
                f"demo_history: target has {HISTORY_ROWS} rows, {HISTORY_ROWS} of the source's "
                f"{HISTORY_ROWS} equal"
                in line
                and "backfill done 3/3 ranges" in line
                for line in progress
            ), output()
            streamed = HISTORY_ROWS + 20
            assert f"demo_history: target has {streamed} rows, {streamed} of" in progress[-1]
            assert "demo_history" in next(li for li in lines if li.startswith(MATCH_LINE))
        else:
            assert [t["state"] for t in tasks] == ["Running"], tasks
            assert any(line.startswith("backfill: skipped") for line in lines), output()
        items = next(t for t in tasks if t["collection_infos"][0]["name"] == "demo_items")
        assert items["progress"]["rows"] > 0, tasks
        assert "demo_items: target has 570 rows, 570 of the source's 570 equal" in progress[-1]

        children = _descendants(demo.pid)
        announced = {
            int(line.split("(pid ")[1].split(")")[0])
            for line in lines
            if line.startswith("started ") and "(pid " in line
        }
        assert len(announced) == 3, output()  # source Milvus, Milvus Lite, daemon
        assert announced <= children, (announced, children)
        start_times = {pid: _start_time(pid) for pid in children}

        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=120) == 0, output()
        reader.join(timeout=10)
        left = {
            pid
            for pid, start in start_times.items()
            if start is not None and _start_time(pid) == start
        }
        assert not left, f"processes left behind: {left}\n{output()}"
        assert any("stopped milvus-cdc daemon" in line for line in lines), output()
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGTERM)
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait(timeout=30)
        reader.join(timeout=10)
        if demo.stdout is not None:
            demo.stdout.close()
