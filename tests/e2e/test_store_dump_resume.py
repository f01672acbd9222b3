"""A daemon of this release started on the store (SQLite, etcd) an earlier release really wrote
(tests/data/stores) resumes its task from the positions that release saved, under a writer:
nothing written before them replayed, nothing after them lost.

The source topics of the dump died with the run that made it; the test writes them again up to
each saved position with rows the target must never see (``replayed-<key>``), so a daemon that
read one record before where the old release stopped changes a row the test compares. The
target is given the rows the old release had written there when it stopped."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

import pytest
from harness.store_dumps import RELEASES, SQLITE_ROOT, Dump, retarget_sqlite
from harness.streaming_writer import VECTOR_DIM, StreamingWriter
from harness.upgrade_stream import LIVE_ID, Stream
from pymilvus import DataType, MilvusClient
from test_streaming_source import wait_rows

from metastore import MetaStore, StoreFormat, TaskState
from metastore.etcd import EtcdMetaStore
from metastore.etcd_connect import connect_etcd
from metastore.format import STORE_FORMAT
from metastore.sealed import SealedMetaStore
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.config.release import RELEASE
from replicator.config.secret_keys import KeyFile
from replicator.sources.kafka import decode_offset

pytestmark = pytest.mark.e2e


def the_target_as_left(client: MilvusClient, name: str, rows: dict[int, str]) -> None:
    """The live collection on the target holding what the old release had written."""
    schema = MilvusClient.create_schema(auto_id=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=VECTOR_DIM)
    schema.add_field("tag", DataType.VARCHAR, max_length=64)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index)
    client.insert(
        name,
        [{"id": pk, "vector": [float(pk)] * VECTOR_DIM, "tag": tag} for pk, tag in rows.items()],
    )


def rewrite_up_to(stream: Stream, saved: dict[str, int]) -> None:
    """Each channel's topic written again up to its saved offset, with rows that must not
    reach the target."""
    vchannels = stream.vchannels(LIVE_ID)
    for i, channel in enumerate(sorted(saved)):
        for n in range(saved[channel] + 1):
            written = stream.writer.insert(vchannels[i], LIVE_ID, [10 + n], tag="replayed")
            assert written.offset == n  # a fresh topic: offsets as the old run's


def place_dump(dump: Dump, daemon, target_uri: str, etcd_endpoint: str) -> Callable[[], MetaStore]:
    """The dump where ``daemon`` opens its store (its tasks pointed at ``target_uri``), and the
    key file beside it where the daemon reads its key; opens that store."""
    if dump.kind == "sqlite":
        meta = dump.copy_sqlite(daemon.workdir / "meta.db")
        retarget_sqlite(meta, target_uri)

        def opener() -> MetaStore:
            return SqlMetaStore(sqlite_url(str(meta)), SQLITE_ROOT)
    else:
        root = daemon.config["metaStoreConfig"]["rootPath"]
        client = connect_etcd([etcd_endpoint])
        dump.load_etcd(client, root, target_uri)
        client.close()

        def opener() -> MetaStore:
            return EtcdMetaStore(connect_etcd([etcd_endpoint]), root)

    key_file = Path(daemon.config["secrets"]["keyFile"])
    if dump.key_file is not None:  # 0.1.0 had no key: this release makes one and seals
        key_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dump.key_file, key_file)
        key_file.chmod(0o600)
    return opener


# every release's SQLite store, and the last one's etcd store (tests/integration/
# test_store_dumps.py reads every dump's records on every backend; this keeps the suite short)
CASES = [*((release, "sqlite") for release in RELEASES), (RELEASES[-1], "etcd")]


@pytest.mark.parametrize(("release", "kind"), CASES)
def test_a_daemon_resumes_an_earlier_releases_store_from_its_saved_positions(
    release, kind, daemon_factory, etcd_service, kafka_mock, milvus_lite_service, target_client
):
    dump = Dump(release, kind)
    live, paused = dump.tasks["live"], dump.tasks["paused"]
    prefix = dump.manifest["channel_prefix"]
    stream = Stream(StreamingWriter(kafka_mock.bootstrap), prefix, dict(dump.target_rows))
    stores = {"etcd": {"address": [etcd_service.endpoint]}, "rootPath": f"resume-{uuid4().hex}"}
    daemon = daemon_factory(
        f"on-{release}-{kind}",
        sourceConfig=stream.source_config(etcd_service.endpoint, kafka_mock.bootstrap),
        **({"metaStoreConfig": {"storeType": "etcd", **stores}} if kind == "etcd" else {}),
    )
    open_store = place_dump(dump, daemon, milvus_lite_service.uri, etcd_service.endpoint)
    key_file = Path(daemon.config["secrets"]["keyFile"])
    store = open_store()
    saved = {
        channel: decode_offset(store.get_positions(live["task_id"])[channel].msg_id)
        for channel in dump.channels
    }
    store.close()
    rewrite_up_to(stream, saved)
    the_target_as_left(target_client, live["collection"], dump.target_rows)

    daemon.start(60)
    status, ready = daemon.get("/readyz")
    assert status == 200 and "tasks_left_alone" not in json.loads(ready)
    for task in (live, paused):
        got = daemon.call("get", {"task_id": task["task_id"]}).data["task"]
        assert got["state"] == task["state"]

    stream.insert(200, 260)
    stream.upsert(range(10, 20), "after")
    stream.delete(range(180, 190))
    wait_rows(target_client, live["collection"], stream.expected, daemon=daemon)

    positions = daemon.call("position", {"task_id": live["task_id"]}).data["positions"]
    moved = {p["channel_name"] for p in positions if p["channel_name"] in saved}
    assert moved == set(saved)
    assert daemon.stop() == 0
    assert all(secret not in daemon.log_text() for secret in [*live["secret"].values()])

    store = SealedMetaStore(open_store(), KeyFile(key_file))
    try:
        assert store.store_format() == StoreFormat(STORE_FORMAT, RELEASE)
        for task in (live, paused):
            found = store.get_task(task["task_id"])
            assert found is not None and found.state == TaskState(task["state"])
            (field, secret), *_ = task["secret"].items()
            assert found.spec["milvus_connect_param"][field] == secret
        after = store.get_positions(live["task_id"])
        assert all(decode_offset(after[c].msg_id) > saved[c] for c in saved)
    finally:
        store.close()
