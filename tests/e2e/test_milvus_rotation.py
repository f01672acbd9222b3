"""A certificate rotation at a running task's target and at the daemon's metastore: a real
Milvus 2.3.5 with mutual TLS (``tlsMode: 2``) and authorization, its certificates swapped for
ones of a new CA and the server restarted on its ports (as cert-manager and a rolling restart
do); the etcd metastore (mutual TLS) likewise, with the daemon's files for it. Meanwhile the
task says why the target turns it away, word for word (stored in the rotated metastore); then
the daemon's files for the target are swapped (its ``dial_config`` paths, as a mounted secret
is) and the rows written meanwhile reach the target, the same task running in the same daemon:
no restart, nothing lost, no row twice.

The source is a Milvus 2.6 stream on the Kafka mock (as tests/e2e/test_streaming_source.py
writes it)."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness.milvus_source import restartable_milvus
from harness.services import etcd_server, wait_until
from harness.streaming_writer import StreamingWriter
from harness.tls import Pki, make_test_pki
from pymilvus import MilvusClient
from tls_backfill import ROOT, milvus_tls_settings

from replicator.pipeline.import_serving import LoadedOnSource
from tests.e2e.test_streaming_source import (
    Stream,
    start_task,
    task_view,
    wait_for_collection,
    wait_rows,
)
from tests.integration.test_etcd_rotation import install_client as install_etcd_client
from tests.integration.test_etcd_rotation import install_server as install_etcd_server

pytestmark = pytest.mark.e2e

UNTRUSTED = "certificate verify failed: unable to get local issuer certificate"
# what a source Milvus that answers says of a collection (loaded, or not)
SERVING_ANSWERS = ("", "it serves no segment of the collection: is it loaded?")


def install(pki: Pki, where: Path) -> dict[str, str]:
    """``pki``'s CA and client pair at fixed paths under ``where``; pymilvus's names for them."""
    where.mkdir(parents=True, exist_ok=True)
    for source, name in (
        (pki.ca_file, "ca.pem"),
        (pki.client_cert, "client.pem"),
        (pki.client_key, "client.key"),
    ):
        shutil.copyfile(source, where / f"{name}.new")
        (where / f"{name}.new").replace(where / name)  # each file whole, as a secret mount
    return {
        "ca_pem_path": str(where / "ca.pem"),
        "client_pem_path": str(where / "client.pem"),
        "client_key_path": str(where / "client.key"),
    }


def install_server(pki: Pki, where: Path) -> dict[str, str]:
    """The server's files of ``pki`` at fixed paths: milvus.yaml's TLS keys (mutual TLS)."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.server_cert, where / "server.pem")
    shutil.copyfile(pki.server_key, where / "server.key")
    shutil.copyfile(pki.ca_file, where / "ca.pem")
    live = dataclasses.replace(
        pki,
        ca_file=where / "ca.pem",
        server_cert=where / "server.pem",
        server_key=where / "server.key",
    )
    return milvus_tls_settings(live, 2)


def test_a_target_rotating_its_certificates_is_followed_without_a_restart(
    daemon_factory, etcd_service, kafka_mock, tmp_path
):
    old, new = make_test_pki(tmp_path / "old"), make_test_pki(tmp_path / "new")
    server_dir, daemon_dir, admin_dir = tmp_path / "server", tmp_path / "daemon", tmp_path / "admin"
    settings = install_server(old, server_dir)
    admin_files = install(old, admin_dir)  # the test's own client (and the harness's probe)
    dial = install(old, daemon_dir)
    writer = StreamingWriter(kafka_mock.bootstrap)
    stream = Stream(writer, f"rot{uuid.uuid4().hex[:6]}", channels=1)
    name = f"rotated_{uuid.uuid4().hex[:6]}"
    # the daemon's metastore: an etcd of mutual TLS, rotating with the target
    store_tls = install_etcd_server(old, tmp_path / "store-server")
    store_files = install_etcd_client(old, tmp_path / "store-client")
    stack = contextlib.ExitStack()
    store_etcd = stack.enter_context(etcd_server(tmp_path / "store", tls=store_tls))
    metastore = {
        "storeType": "etcd",
        "etcd": {"address": [store_etcd.endpoint], **store_files},
        "rootPath": f"rot-{uuid.uuid4().hex[:8]}",
    }
    with (
        stack,
        restartable_milvus(
            tmp_path / "milvus",
            etcd_service.endpoint,
            root_path=f"rot-{uuid.uuid4().hex[:8]}",
            settings=settings,
            client={"token": ROOT, **admin_files},
        ) as milvus,
    ):
        target = milvus.source

        def admin() -> MilvusClient:
            return MilvusClient(
                uri=target.uri, token=ROOT, timeout=30, dedicated=True, **admin_files
            )

        stream.tick_all()
        daemon = daemon_factory(
            scheduler={"reachabilitySeconds": 1},
            metaStoreConfig=metastore,
            **stream.config(etcd_service, kafka_mock),
        ).start()
        connect: dict[str, Any] = {
            "uri": target.uri,
            "token": ROOT,
            "dial_config": dial,
            "connect_timeout": 5,
        }
        task_id = start_task(daemon, "", stream, name, milvus_connect_param=connect)
        (vchannel,) = stream.vchannels(72000, 1)
        stream.writer.create_collection(72000, name, [vchannel])
        stream.writer.insert(vchannel, 72000, range(50))
        stream.tick_all()
        client = admin()
        try:
            wait_for_collection(client, name)
            wait_rows(client, name, {pk: f"row-{pk}" for pk in range(50)}, daemon=daemon)
        finally:
            client.close()
        # a backfill's check of a source Milvus's loaded segments (pymilvus clients that live
        # as long as the daemon) reaches this one with the same files, before and after
        loaded = LoadedOnSource(connect)
        assert loaded("default", name)[1] in SERVING_ANSWERS

        # the target rotates: a new CA, a new pair; restarted on its ports
        install_server(new, server_dir)
        install(new, admin_dir)
        milvus.close()
        milvus.start()
        # so does the metastore's etcd, the daemon's files for it with it
        stack.close()
        install_etcd_server(new, tmp_path / "store-server")
        install_etcd_client(new, tmp_path / "store-client")
        ports = (store_etcd.port, store_etcd.peer_port)
        stack.enter_context(etcd_server(tmp_path / "store", tls=store_tls, ports=ports))
        stream.writer.insert(vchannel, 72000, range(50, 120))
        stream.tick_all()

        # the task says why the target turns it away (the daemon still has the old CA)
        def refused() -> bool:
            return UNTRUSTED in task_view(daemon, task_id)["reason"]

        wait_until(refused, 60, "the task's reason names the refusal")
        reason = task_view(daemon, task_id)["reason"]
        assert f"target {target.uri} unreachable since " in reason, reason
        assert reason.endswith(f", retrying: {UNTRUSTED}"), reason

        # the daemon's files rotate too: the same task goes on, nothing lost, nothing twice
        install(new, daemon_dir)
        client = admin()
        try:
            wait_rows(client, name, {pk: f"row-{pk}" for pk in range(120)}, daemon=daemon)
            assert (
                client.query(name, filter="id >= 0", output_fields=["count(*)"])[0]["count(*)"]
                == 120
            )
        finally:
            client.close()
        assert loaded("default", name)[1] in SERVING_ANSWERS  # pymilvus reads them again
        wait_until(
            lambda: UNTRUSTED not in task_view(daemon, task_id)["reason"],
            30,
            "the refusal withdrawn once the target answers",
        )
        assert task_view(daemon, task_id)["state"] == "Running"
        daemon.stop()
    writer.close()
