"""One scenario for a Milvus that wants TLS at both ends of a task (tests/e2e/
test_milvus_mtls.py, test_milvus_tls_target.py): rows written before the task are copied by a
backfill on Spark, rows written after it stream in, a verify finds both ends equal, and no
secret shows in an answer, a log, or a command line or environment of the backfill's processes.

The task copies a collection of the Milvus into another database of the same Milvus
(``name_mapping``), so one Milvus serves as the source (a named cluster) and as the target.
Also the administrator's client of such a Milvus, and the user the tests give the daemon."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.daemon import Daemon
from harness.milvus_source import MilvusSource
from harness.tls import Pki
from pymilvus import MilvusClient
from test_backfill import driver_log, int_rows, task_view, wait_backfill
from test_replication import create_source_collection, wait_equal
from test_verify import run_verify

from replicator.backfill import transfer
from replicator.config.connections import SourceSettings
from replicator.config.milvus_endpoint import SourceMilvusSettings, milvus_param
from server.dr.fence import client_args

ROOT = "root:Milvus"  # the default root login of an authorizing Milvus
BEFORE, AFTER = 1200, 300  # rows written before the task (backfilled) and after it (streamed)
SPARK = {
    "backfill": {"sparkMaster": "local[2]", "taskMaxFailures": 2, "rangeRows": 500},
    "verify": {"rangeRows": 500, "batchRows": 400, "settleSeconds": 60},
}


def milvus_tls_settings(pki: Pki, mode: int) -> dict[str, str]:
    """milvus.yaml keys for TLS (``mode`` 1) or mutual TLS (2) with the test certificates, and
    authorization."""
    return {
        "common.security.tlsMode": str(mode),
        "tls.serverPemPath": str(pki.server_cert),
        "tls.serverKeyPath": str(pki.server_key),
        "tls.caPemPath": str(pki.ca_file),
        "common.security.authorizationEnabled": "true",
    }


def admin_client(milvus: MilvusSource, tls: dict[str, str], db: str = "") -> MilvusClient:
    """The Milvus's root user, with the pymilvus TLS arguments ``tls``, in database ``db``."""
    extra = {"db_name": db} if db else {}
    return MilvusClient(uri=milvus.uri, token=ROOT, timeout=30, dedicated=True, **tls, **extra)


def add_admin_user(milvus: MilvusSource, tls: dict[str, str], user: str, password: str) -> None:
    root = admin_client(milvus, tls)
    try:
        root.create_user(user, password)
        root.grant_role(user, "admin")
    finally:
        root.close()


def versions_through(block: SourceMilvusSettings) -> list[str]:
    """The server version read through a cluster's ``milvus`` block by the clients the
    backfill and verify open (``transfer.connect``) and disaster recovery's
    (``fence.client_args``)."""
    clients = [
        transfer.connect(milvus_param(block), "default"),
        MilvusClient(**client_args(SourceSettings(milvus=block)), timeout=10, dedicated=True),
    ]
    try:
        return [str(c.get_server_version()) for c in clients]
    finally:
        for client in clients:
            client.close()


class GroupWatch:
    """What the backfill driver's process group runs: every process's command line and
    environment, read while the copy runs (the driver, its JVM, the Python workers)."""

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}

    def read(self, group: int) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in self.texts:
                continue
            try:
                if os.getpgid(int(entry.name)) != group:
                    continue
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
            except (ProcessLookupError, FileNotFoundError, PermissionError):
                continue
            text = (cmdline + b"\n" + environ).decode(errors="replace")
            if b"java" in cmdline:  # the JVM is the last to start: its arguments are complete
                self.texts[int(entry.name)] = text
            else:
                self.texts.setdefault(-int(entry.name), text)

    @property
    def saw_the_jvm(self) -> bool:
        return any(pid > 0 for pid in self.texts)


def watch_backfill(daemon: Daemon, task_id: str) -> tuple[dict, GroupWatch]:
    """Wait for the task's backfill to end, reading its driver's processes meanwhile."""
    watch = GroupWatch()
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        backfill = task_view(daemon, task_id)["backfill"]
        if backfill and backfill["state"] in ("done", "failed"):
            break
        if backfill and backfill.get("driver_pid"):
            watch.read(backfill["driver_pid"])
        time.sleep(0.3)
    return wait_backfill(daemon, task_id, timeout=5), watch


def backfill_verify_and_keep_secrets(
    daemon: Daemon,
    cluster: str,
    target: dict[str, Any],
    client: Callable[[str], MilvusClient],
    secrets: Iterable[str],
) -> None:
    """Run the scenario on ``daemon`` (configured with ``SPARK`` and the named ``cluster``, not
    started): the task reads ``cluster`` and writes through ``target`` (a
    ``milvus_connect_param`` for the same Milvus); ``client(db)`` opens the Milvus as its
    administrator."""
    name, copy_db = f"tb_{uuid.uuid4().hex[:8]}", f"copy_{uuid.uuid4().hex[:6]}"
    source, copy = client(""), client(copy_db)
    try:
        create_source_collection(source, name, dynamic=False)
        for start in range(0, BEFORE, 400):
            source.insert(name, int_rows(range(start, start + 400), "old", start))
        daemon.start()
        created = daemon.call(
            "create",
            {
                "source_cluster": cluster,
                "milvus_connect_param": target,
                "collection_infos": [{"name": name}],
                "name_mapping": [
                    {"source_db": "default", "target_db": copy_db, "collection_mapping": {}}
                ],
                "backfill": {"collections": ["*"]},
            },
        )
        assert created.code == 200, created.body
        task_id = str(created.data["task_id"])
        backfill, watch = watch_backfill(daemon, task_id)
        assert backfill["ranges_done"] == backfill["ranges_total"] >= 2, backfill
        assert backfill["rows_done"] == BEFORE, backfill
        assert watch.saw_the_jvm, watch.texts.keys()

        source.insert(name, int_rows(range(5000, 5000 + AFTER), "new", 5000))  # streamed
        wait_equal(source, copy, name, "id", timeout=120)
        verify = run_verify(daemon, task_id)
        assert verify["divergent_rows"] == 0, verify
        assert verify["rows_compared"] == BEFORE + AFTER, verify

        answers = [
            daemon.call("get", {"task_id": task_id}).raw.decode(),
            daemon.call("list").raw.decode(),
            str(daemon.request("GET", f"/v1/tasks/{task_id}")),
        ]
        daemon.stop()
        texts = {
            "answers": "\n".join(answers),
            "daemon log": daemon.log_text(),
            "backfill driver log": driver_log(daemon, task_id),
            **{f"process {pid}": text for pid, text in watch.texts.items()},
        }
        for secret in secrets:
            for where, text in texts.items():
                assert secret not in text, where
    finally:
        source.close()
        copy.close()
