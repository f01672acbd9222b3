"""The daemon as an operator's virtualenv install runs it: the ``milvus-cdc`` script beside the
interpreter (no PYTHONPATH, the virtualenv not activated), with a ``python3`` first on PATH that
lacks the project's packages, as the system interpreter of a machine where only the virtualenv
holds them does. A process the daemon starts that escapes to PATH's ``python3`` (a Spark Python
worker, say) then fails here as it would for that operator."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def bare_python_bin() -> Path:
    """A directory holding ``python3`` and ``python`` of a virtualenv with no packages at all
    (made once per test process from the base interpreter, removed when it exits)."""
    root = Path(tempfile.mkdtemp(prefix="cdc-bare-python-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True
    )
    found = subprocess.run(
        [str(root / "bin" / "python3"), "-c", "import pymilvus"], capture_output=True, check=False
    )
    assert found.returncode != 0, "the bare python3 imports pymilvus"
    return root / "bin"


def daemon_command() -> tuple[list[str], dict[str, str]]:
    """The command that starts ``milvus-cdc`` as installed, and the environment changes it
    runs with (PATH with the bare python3 first). Falls back to ``python -m server`` with the
    checkout on PYTHONPATH when the interpreter has no ``milvus-cdc`` script (the project not
    installed into it)."""
    path = f"{bare_python_bin()}{os.pathsep}{os.environ.get('PATH', '')}"
    script = Path(sys.executable).parent / "milvus-cdc"
    if script.exists():
        return [str(script)], {"PATH": path}
    return [sys.executable, "-m", "server"], {"PATH": path, "PYTHONPATH": str(REPO_ROOT)}
