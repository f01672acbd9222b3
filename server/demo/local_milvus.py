"""Local Milvus processes for the embedded demo (server/demo/processes.py) and the test harness
(tests/harness/): the Milvus 2.3.5 standalone binary of the ``milvus`` wheel and Milvus Lite.

The wheel ships its binary and libraries lzma-compressed; they are unpacked once per wheel into a
cache directory and hard-linked into each instance's ``bin/``. A finished cache directory is
never written again (running instances use its files): a new wheel gets a directory of its own,
and unpacking happens in a temporary directory renamed into place under a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

LOOPBACK = "127.0.0.1"


class NotInstalledError(RuntimeError):
    """A package the local Milvus needs is missing; the message names it."""


def wheel() -> types.ModuleType:
    """The ``milvus`` wheel (Milvus 2.3.5 standalone)."""
    try:
        return importlib.import_module("milvus")
    except ImportError as exc:
        raise NotInstalledError(
            "the PyPI package milvus==2.3.5 (a Milvus standalone binary) is not installed"
        ) from exc


def default_cache_root(name: str) -> Path:
    """``$XDG_CACHE_HOME/<name>`` (else ``~/.cache/<name>``)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / name


def cached_bin(cache_root: Path, on_unpack: Callable[[], None] | None = None) -> Path:
    """The unpacked ``bin/`` of the installed wheel under ``cache_root`` (unpacked on first
    use; ``on_unpack`` is told when that happens)."""
    milvus = wheel()
    lzma_dir = Path(str(milvus.__file__)).resolve().parent / "data" / "bin"
    digest = hashlib.sha256()
    for path in sorted(lzma_dir.glob("*.lzma")):
        digest.update(f"{path.name}:{path.stat().st_size}\n".encode())
    name = f"milvus-{milvus.__version__}-{digest.hexdigest()[:12]}"
    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_root / name / "bin"
    with open(cache_root / f"{name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "milvus").is_file():
            return final
        if on_unpack is not None:
            on_unpack()
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_root))
        try:
            milvus._initialize_data_files(str(staging))
            final.parent.mkdir(exist_ok=True)
            os.rename(staging / "bin", final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def install_bin(
    base_dir: Path, cache_root: Path, on_unpack: Callable[[], None] | None = None
) -> Path:
    """Make ``base_dir/bin`` hold the Milvus binary and its libraries; returns that directory."""
    target = base_dir / "bin"
    try:
        source = cached_bin(cache_root, on_unpack)
    except OSError:  # no writable cache: unpack into the instance itself (about 5 s)
        wheel()._initialize_data_files(str(base_dir))
        return target
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        dest = target / entry.name
        if dest.exists():
            continue
        try:
            os.link(entry, dest)
        except OSError:  # another filesystem: copy
            shutil.copy2(entry, dest)
    return target


def healthz(port: int) -> bool:
    """Milvus's ``/healthz`` on its metrics port answers OK."""
    # http.client, not urllib: urllib's HTTPError (the 500 answered while components start)
    # leaves its socket to the garbage collector, a ResourceWarning under filterwarnings=error
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=1)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status == 200 and b"OK" in response.read()
    finally:
        conn.close()


def lists_collections(uri: str, timeout: float = 3) -> bool:
    """The server at ``uri`` answers ListCollections (raises while it does not)."""
    from pymilvus import MilvusClient

    # dedicated: a shared pymilvus channel outlives close() and keeps pinging the server
    client = MilvusClient(uri=uri, timeout=timeout, dedicated=True)
    try:
        client.list_collections(timeout=timeout)
    finally:
        client.close()
    return True


def remove_outside_files(pid: int) -> None:
    """Remove what Milvus wrote outside its directory, if it is this process's."""
    with contextlib.suppress(OSError):
        Path(f"/tmp/milvus/server_id_{pid}").unlink()  # noqa: S108  (Milvus's own path)
    for pid_file in (Path("/run/milvus/standalone.pid"), Path("/tmp/milvus/standalone.pid")):  # noqa: S108
        with contextlib.suppress(OSError):
            if pid_file.read_text(encoding="utf-8").strip() == str(pid):
                pid_file.unlink()


def milvus_lite_command() -> list[str]:
    """The milvus-lite console script of this interpreter's environment (else PATH's, else the
    module)."""
    beside = Path(sys.executable).parent / "milvus-lite"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("milvus-lite")
    if found:
        return [found]
    if importlib.util.find_spec("milvus_lite") is not None:
        return [sys.executable, "-m", "milvus_lite"]
    raise NotInstalledError(f"milvus-lite not found (looked next to {sys.executable} and on PATH)")
