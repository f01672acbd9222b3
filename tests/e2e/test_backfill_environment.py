"""No secret reaches a Spark process of the daemon's: a real backfill's driver, its JVM and its
Python workers, read in ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline`` while they run. The
daemon gets secrets every way it can: whole-section ``CDC_`` variables (the key ring in
``CDC_SECRETS``, a MySQL URL with its password in ``CDC_METASTORECONFIG``, a named cluster's
password in ``CDC_CLUSTERS``, the API's tokens in ``CDC_AUTH``), a single-key variable, the
client's ``CDC_TOKEN``, a secret of another program's, and the configuration file."""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pymilvus import MilvusClient
from test_backfill import backfill_config, create_backfilled, int_rows, wait_backfill
from test_replication import create_source_collection, wait_equal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # Spark


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone meanwhile
        return b""


@dataclass(eq=False)
class SparkWatch(threading.Thread):
    """Every process of the backfill drivers ``daemon_pid`` starts (each leads a process group
    of its own: its JVM, its Python workers), its command line and environment as first seen."""

    daemon_pid: int
    seen: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            drivers = set()
            entries = [e for e in Path("/proc").iterdir() if e.name.isdigit()]
            for entry in entries:
                stat = _read(entry / "stat").rsplit(b")", 1)[-1].split()
                child = len(stat) > 2 and int(stat[1]) == self.daemon_pid
                if child and b"replicator.backfill" in _read(entry / "cmdline"):
                    drivers.add(int(entry.name))
            for entry in entries:
                pid = int(entry.name)
                try:
                    group = os.getpgid(pid)
                except ProcessLookupError:
                    continue
                if group in drivers and pid not in self.seen:
                    cmdline, environ = _read(entry / "cmdline"), _read(entry / "environ")
                    if cmdline:
                        self.seen[pid] = (cmdline, environ)

    def kinds(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {"driver": [], "jvm": [], "python worker": []}
        for pid, (cmdline, _environ) in self.seen.items():
            if b"replicator.backfill" in cmdline:
                found["driver"].append(pid)
            elif b"java" in cmdline.split(b"\0")[0]:
                found["jvm"].append(pid)
            elif b"pyspark" in cmdline:
                found["python worker"].append(pid)
        return found


def test_no_secret_reaches_the_backfill_driver_its_jvm_or_its_workers(
    daemon_factory, milvus_source, etcd_service, kafka_mock, milvus_source_rocksmq, tmp_path
):
    tag = uuid.uuid4().hex[:10]
    key = "k1:" + base64.b64encode(os.urandom(32)).decode()
    token = f"api-token-{tag}"
    secrets = {
        "key ring": key.split(":", 1)[1],
        "metastore password": f"mysql-pw-{tag}",
        "cluster password": f"cluster-pw-{tag}",
        "API token": token,
        "single-key variable": f"pulsar-{tag}",
        "client token": f"cli-token-{tag}",
        "another program's": f"aws-{tag}",
        "file secret": f"file-pw-{tag}",
    }
    config = backfill_config(milvus_source, etcd_service, kafka_mock, rangeRows=1500)
    config["clusters"] = {
        "spare": {"milvus": {"uri": "http://127.0.0.1:9", "password": secrets["file secret"]}}
    }
    daemon = daemon_factory(**config)
    daemon.token = token
    mysql = f"root:{secrets['metastore password']}@tcp(127.0.0.1:9)/cdc"
    cluster = {"milvus": {"uri": "http://127.0.0.1:9", "password": secrets["cluster password"]}}
    daemon.env = {  # JSON is YAML: each a whole section as one variable
        "CDC_SECRETS": json.dumps({"key": key}),
        "CDC_METASTORECONFIG": json.dumps(
            {**daemon.config["metaStoreConfig"], "mysqlSourceUrl": mysql}
        ),
        "CDC_CLUSTERS": json.dumps({"other": cluster}),
        "CDC_AUTH": json.dumps({"tokens": [{"name": "ops", "role": "admin", "token": token}]}),
        "CDC_SOURCECONFIG__PULSAR__AUTHPARAMS": f"token:{secrets['single-key variable']}",
        "CDC_TOKEN": secrets["client token"],
        "AWS_SECRET_ACCESS_KEY": secrets["another program's"],
    }
    name = f"bfenv_{tag}"
    source = MilvusClient(uri=milvus_source.uri, dedicated=True)
    target = MilvusClient(uri=milvus_source_rocksmq.uri, dedicated=True)
    try:
        create_source_collection(source, name, dynamic=False)
        source.insert(name, int_rows(range(6000), "s"))
        daemon.start()
        assert daemon.process is not None
        watch = SparkWatch(daemon.process.pid)
        watch.start()
        try:
            task_id = create_backfilled(daemon, milvus_source_rocksmq.uri, name)
            wait_backfill(daemon, task_id, timeout=400)
        finally:
            watch.stop.set()
            watch.join(timeout=10)
        wait_equal(source, target, name, "id", timeout=120)
    finally:
        source.close()
        target.close()

    kinds = watch.kinds()
    assert all(kinds.values()), f"not every Spark process was seen: {kinds}"
    for pid, (cmdline, environ) in watch.seen.items():
        names = [v.split(b"=", 1)[0].decode() for v in environ.split(b"\0") if v]
        assert environ, f"pid {pid}: no environment read"
        assert not [n for n in names if n.upper().startswith("CDC_")], (pid, names)
        for what, secret in secrets.items():
            for text, where in ((environ, "environment"), (cmdline, "command line")):
                assert secret.encode() not in text, f"the {what} in the {where} of pid {pid}"
