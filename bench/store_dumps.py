"""Make the metastore dumps of tests/data/stores/: each earlier release, really run, writes a
SQLite store and an etcd store that the migration tests (tests/integration/test_store_dumps.py,
tests/e2e/test_store_dump_resume.py) open with the current release, with no old install.

Per release (0.1.0, 0.2.0, 0.3.0, exported from its commit) and per store (sqlite, etcd): the
release's daemon (``python -m server serve``) on a fresh store, a Milvus 2.6 stream on the
librdkafka mock as source (bench/releases.py), Milvus Lite as target; two tasks, one with a
target password and one with a target token; rows inserted, upserted and deleted through the
stream and replicated; the second task paused; the daemon stopped with SIGTERM. Then:

- ``<release>/sqlite.db``: the SQLite file as the release left it;
- ``<release>/etcd.json``: every key under the etcd store's root path (relative to it) -> its
  value (``{"text": ...}``, or ``{"base64": ...}`` for bytes that are not UTF-8);
- ``<release>/secret.key``: the key file the release made (0.2.0 on; test data);
- ``<release>/manifest.json``: the tasks (id, collection, state, secret), the stream's channel
  prefix, and the rows the target held at the stop.

    python bench/store_dumps.py [--releases 0.1.0,0.2.0,0.3.0] [--out tests/data/stores]
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from harness.kafka_mock import kafka_mock_cluster  # noqa: E402
from harness.services import etcd_server, milvus_lite_server  # noqa: E402
from harness.streaming_writer import StreamingWriter  # noqa: E402
from harness.upgrade_stream import LIVE_ID, PASSWORD, PAUSED_ID, TOKEN, Stream  # noqa: E402
from releases import (  # noqa: E402
    RELEASES,
    create_task,
    daemon_config,
    export_release,
    release_daemon,
    settle,
    wait_rows,
)

from metastore.etcd_connect import connect_etcd  # noqa: E402

COMMAND = "python bench/store_dumps.py"


def dump_etcd(endpoint: str, root: str) -> dict[str, dict[str, str]]:
    """Every key under ``root`` (relative to it) -> its value as text or base64."""
    client = connect_etcd([endpoint])
    try:
        dumped: dict[str, dict[str, str]] = {}
        for value, meta in client.get_prefix(root + "/"):
            key = meta.key.decode()[len(root) + 1 :]
            try:
                dumped[key] = {"text": value.decode()}
            except UnicodeDecodeError:
                dumped[key] = {"base64": base64.b64encode(value).decode()}
        return dict(sorted(dumped.items()))
    finally:
        client.close()


def run_release(
    release: str, tree: Path, kind: str, services: dict[str, Any], workdir: Path
) -> dict[str, Any]:
    """Run ``release`` on a fresh ``kind`` store under a writer; what it left (manifest)."""
    prefix = f"d{release.replace('.', '')}{kind}"
    etcd_root = f"dump-{prefix}"
    if kind == "sqlite":
        store: dict[str, Any] = {"storeType": "sqlite", "sqlitePath": str(workdir / "meta.db")}
    else:
        store = {
            "storeType": "etcd",
            "etcd": {"address": [services["etcd"]]},
            "rootPath": etcd_root,
        }
    writer = StreamingWriter(services["kafka"])
    stream = Stream(writer, prefix)
    stream.tick_all()  # the topics exist before the tasks read their ends
    config = daemon_config(
        release, store, stream.source_config(services["etcd"], services["kafka"]), workdir
    )
    daemon = release_daemon(workdir, config, tree).start(90)
    try:
        live_name, paused_name = f"books_{prefix}", f"paused_{prefix}"
        live = create_task(daemon, services["lite"], live_name, password=PASSWORD)
        paused = create_task(daemon, services["lite"], paused_name, token=TOKEN)
        writer.create_collection(LIVE_ID, live_name, stream.vchannels(LIVE_ID), partition_ids=[1])
        writer.create_collection(
            PAUSED_ID, paused_name, stream.vchannels(PAUSED_ID), partition_ids=[1]
        )
        stream.tick_all()
        stream.insert(0, 200)
        stream.upsert(range(10), "up")
        stream.delete(range(190, 200))
        writer.insert(stream.vchannels(PAUSED_ID)[0], PAUSED_ID, range(20))
        stream.tick_all()
        wait_rows(services["lite"], live_name, stream.expected)
        wait_rows(services["lite"], paused_name, {pk: f"row-{pk}" for pk in range(20)})
        assert daemon.call("pause", {"task_id": paused}).code == 200
        settle()
        states = {
            task_id: daemon.call("get", {"task_id": task_id}).data["task"]["state"]
            for task_id in (live, paused)
        }
    finally:
        code = daemon.stop(grace=30)
    assert code == 0, f"{release} exited with {code}; log {daemon.log_path}"
    return {
        "release": release,
        "commit": RELEASES[release],
        "store": kind,
        "etcd_root": etcd_root if kind == "etcd" else None,
        "channel_prefix": prefix,
        "channels": [stream.pchannel(i) for i in range(2)],
        "tasks": {
            "live": {
                "task_id": live,
                "collection": live_name,
                "collection_id": LIVE_ID,
                "state": states[live],
                "secret": {"password": PASSWORD},
            },
            "paused": {
                "task_id": paused,
                "collection": paused_name,
                "collection_id": PAUSED_ID,
                "state": states[paused],
                "secret": {"token": TOKEN},
            },
        },
        "target_rows": {str(pk): tag for pk, tag in sorted(stream.expected.items())},
    }


def make_dumps(release: str, out: Path, services: dict[str, Any], scratch: Path) -> None:
    tree = export_release(RELEASES[release], scratch / f"release-{release}")
    target = out / release
    target.mkdir(parents=True, exist_ok=True)
    manifests = {}
    for kind in ("sqlite", "etcd"):
        workdir = scratch / f"{release}-{kind}"
        started = time.monotonic()
        manifests[kind] = run_release(release, tree, kind, services, workdir)
        if kind == "sqlite":
            shutil.copyfile(workdir / "meta.db", target / "sqlite.db")
            with sqlite3.connect(target / "sqlite.db") as db:
                db.execute("VACUUM")
        else:
            dumped = dump_etcd(services["etcd"], manifests[kind]["etcd_root"])
            (target / "etcd.json").write_text(json.dumps(dumped, indent=1) + "\n")
        key = workdir / "cdc-secret.key"
        if key.exists():
            shutil.copyfile(key, target / f"{kind}-secret.key")
        print(f"{release} {kind}: {time.monotonic() - started:.1f} s", flush=True)
    manifest = {"made_by": COMMAND, **manifests}
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "stores")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdc-dumps-")))
        etcd = stack.enter_context(etcd_server(scratch / "etcd"))
        kafka = stack.enter_context(kafka_mock_cluster(scratch / "kafka"))
        lite = stack.enter_context(milvus_lite_server(scratch / "lite"))
        services = {"etcd": etcd.endpoint, "kafka": kafka.bootstrap, "lite": lite.uri}
        for release in args.releases.split(","):
            make_dumps(release, args.out, services, scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
