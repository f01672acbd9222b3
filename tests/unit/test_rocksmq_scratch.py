"""RocksMQ secondary instances' scratch directories (replicator/sources/rocksmq_scratch.py): one
left by a process that ended without its finalizers (kill -9) is removed when the next instance
is opened; those of running processes, and names of other making, are kept. The primary is a
RocksDB of our own (rocksdict), opened as a secondary as the daemon opens Milvus's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rocksdict import Options, Rdict

from replicator.sources import rocksmq
from replicator.sources.rocksmq_scratch import PREFIX


def primary(tmp_path: Path) -> str:
    path = str(tmp_path / "primary")
    db = Rdict(path, Options(raw_mode=True))
    db[b"a/100"] = b"first"
    db.close()
    return path


def test_a_killed_readers_scratch_is_removed_by_the_next_open(tmp_path: Path) -> None:
    path = primary(tmp_path)
    secondary = tmp_path / "secondary"
    # a process that opens a secondary instance and is killed (-9) while it holds it
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from replicator.sources import rocksmq
                store = rocksmq._SecondaryDB({path!r}, {str(secondary)!r})
                print("open", flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        (left,) = os.listdir(secondary)
        assert left.startswith(f"{PREFIX}{reader.pid}-")
        assert (secondary / left / "LOG").is_file()
        (secondary / f"{PREFIX}keep").mkdir()  # a name without a pid (an older release's)
        alive = secondary / f"{PREFIX}1-keep"  # a process that runs (init)
        alive.mkdir()
        store = rocksmq._SecondaryDB(path, str(secondary))  # while the reader runs: kept
        assert left in os.listdir(secondary)
        store.close()
    finally:
        reader.kill()
        reader.wait()
        reader.stdout.close()
    store = rocksmq._SecondaryDB(path, str(secondary))
    try:
        names = set(os.listdir(secondary))
        assert left not in names
        assert {f"{PREFIX}keep", f"{PREFIX}1-keep"} <= names
        (mine,) = names - {f"{PREFIX}keep", f"{PREFIX}1-keep"}
        assert mine.startswith(f"{PREFIX}{os.getpid()}-")
    finally:
        store.close()
    assert set(os.listdir(secondary)) == {f"{PREFIX}keep", f"{PREFIX}1-keep"}
