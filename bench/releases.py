"""Earlier releases of milvus-cdc, run from git history, and the stream every upgrade run writes.

An earlier release is exported from its commit (``git archive``) into a directory of its own and
run as its operators ran it: ``python -m server serve --config cdc.yaml`` with that directory on
PYTHONPATH, by an interpreter that holds the project's dependencies (the releases 0.1-0.4
declare the same ones), or by the interpreter of a virtualenv the release was installed into
(``--venvs``: ``pip install <export>``, as its README says).

The source is a Milvus 2.6 stream on the librdkafka mock written by tests/harness/
streaming_writer.py (every release since 0.1.0 replicates 2.6 streams); the target Milvus Lite.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "e2e")]

from harness.daemon import Daemon  # noqa: E402
from harness.services import ServiceStartError, wait_until  # noqa: E402
from harness.upgrade_stream import CHANNELS  # noqa: E402

# release -> the last commit of its wave (CHANGELOG.md)
RELEASES = {"0.1.0": "0443b98", "0.2.0": "5a2d20a", "0.3.0": "f7eaa3b"}


def export_release(commit: str, into: Path) -> Path:
    """The tree of ``commit`` written under ``into`` (made if missing); its path."""
    into.mkdir(parents=True, exist_ok=True)
    if not (into / "server").exists():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def install_release(tree: Path, venv: Path) -> Path:
    """A virtualenv at ``venv`` with the release of ``tree`` installed (not editable); its
    python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(tree)], check=True, timeout=1800
        )
    return python


# the first release with each feature an upgrade run configures
FIRST_WITH = {"secrets": (0, 2, 0), "fleet": (0, 2, 0)}  # sealed at rest; leases and members


def supports(release: str, feature: str) -> bool:
    """Whether ``release`` has ``feature`` (a key of ``FIRST_WITH``)."""
    return tuple(int(part) for part in release.split(".")) >= FIRST_WITH[feature]


def daemon_config(
    release: str, store: dict[str, Any], source: dict[str, Any], workdir: Path
) -> dict[str, Any]:
    """A cdc.yaml ``release`` loads: its store, the stream as source, and (0.2.0 on) its key
    file under ``workdir``."""
    config: dict[str, Any] = {
        "metaStoreConfig": store,
        "sourceConfig": source,
        "drainTimeoutSeconds": 10,
    }
    if supports(release, "secrets"):
        config["secrets"] = {"keyFile": str(workdir / "cdc-secret.key")}
    return config


def release_daemon(
    workdir: Path, config: dict[str, Any], tree: Path | None, python: Path | None = None
) -> Daemon:
    """A daemon of the release exported at ``tree`` (None: this checkout's release), run by
    ``python``: a virtualenv's the release is installed into, or (None) this interpreter with
    the export on PYTHONPATH."""
    workdir.mkdir(parents=True, exist_ok=True)
    if tree is None:
        return Daemon(workdir=workdir, config=config)
    if python is not None:
        return Daemon(workdir=workdir, config=config, command=[str(python), "-m", "server"])
    return Daemon(
        workdir=workdir,
        config=config,
        command=[sys.executable, "-m", "server"],
        env={"PYTHONPATH": str(tree)},
    )


def create_task(daemon: Daemon, target_uri: str, collection: str, **secret: str) -> str:
    """A task replicating ``collection`` into ``target_uri`` with the given password or token;
    its id once it has a position on every channel."""
    connect = {"uri": target_uri, **({"username": "root"} if "password" in secret else {})}
    connect.update(secret)
    created = daemon.call(
        "create", {"milvus_connect_param": connect, "collection_infos": [{"name": collection}]}
    )
    assert created.code == 200, created.body
    task_id = str(created.data["task_id"])

    def positioned() -> bool:
        positions = daemon.call("position", {"task_id": task_id}).data.get("positions") or []
        return len(positions) >= CHANNELS

    wait_until(positioned, 60, f"task {collection} has a position on every channel")
    return task_id


def wait_rows(uri: str, collection: str, expected: dict[int, str], timeout: float = 90) -> None:
    """Wait until ``collection`` on ``uri`` holds exactly ``expected`` (key -> tag)."""
    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri, dedicated=True)
    got: dict[int, str] = {}
    try:
        wait_until(lambda: client.has_collection(collection), timeout, f"{collection} exists")
        index = client.prepare_index_params()
        index.add_index("vector", index_type="FLAT", metric_type="L2")
        if not client.list_indexes(collection):
            client.create_index(collection, index)
        client.load_collection(collection, timeout=60)

        def same() -> bool:
            nonlocal got
            found = client.query(collection, filter="id >= 0", output_fields=["tag"], limit=16384)
            got = {int(r["id"]): str(r["tag"]) for r in found}
            if got != expected:
                return False
            counted = client.query(collection, filter="", output_fields=["count(*)"])
            return int(counted[0]["count(*)"]) == len(expected)  # no key held twice

        try:
            wait_until(same, timeout, f"{collection} holds the stream's rows")
        except ServiceStartError:
            missing = sorted(set(expected) - set(got))[:10]
            wrong = [k for k in expected if k in got and got[k] != expected[k]][:10]
            extra = sorted(set(got) - set(expected))[:10]
            told = f"{collection}: missing {missing} wrong {wrong} extra {extra}"
            raise AssertionError(told) from None
    finally:
        client.close()


def settle(seconds: float = 2.0) -> None:
    """Let the daemon's checkpoint save the positions of the last ticks."""
    time.sleep(seconds)
