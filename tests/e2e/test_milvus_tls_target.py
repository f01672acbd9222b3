"""A real Milvus 2.3.5 that wants TLS (``common.security.tlsMode`` 1) and a login
(``common.security.authorizationEnabled``) as the target: replicated into through
``milvus_connect_param`` with ``enable_tls``/``dial_config`` or an ``https://`` URI, and a
token or a user and password; the password shows in no answer and no log line.

The source is a Milvus 2.6 stream on the Kafka mock (as tests/e2e/test_streaming_source.py
writes it): the only real Milvus here is the target; and, for a backfill and a verify, the TLS
Milvus itself as a named cluster (a file of tests/conftest.py's SPARK_FILES)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from harness.dr_clusters import cluster
from harness.milvus_source import MilvusSource, milvus_source_rocksmq
from harness.services import wait_until
from harness.streaming_writer import StreamingWriter
from harness.tls import Pki, make_test_pki
from pymilvus import MilvusClient
from tls_backfill import (
    ROOT,
    SPARK,
    add_admin_user,
    admin_client,
    backfill_verify_and_keep_secrets,
    milvus_tls_settings,
    versions_through,
)

from replicator.config.milvus_endpoint import SourceMilvusSettings
from tests.e2e.test_streaming_source import (
    Stream,
    start_task,
    task_view,
    wait_for_collection,
    wait_rows,
)

pytestmark = pytest.mark.e2e

USER = "cdc"
PASSWORD = "Milvus-Target-Pa55-never-shown"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("milvus-pki"))


@pytest.fixture(scope="module")
def tls_milvus(
    tmp_path_factory: pytest.TempPathFactory, etcd_service: Any, pki: Pki
) -> Iterator[MilvusSource]:
    """Milvus 2.3.5 with one-way TLS and authorization, and a user ``cdc`` with admin rights."""
    with milvus_source_rocksmq(
        tmp_path_factory.mktemp("milvus-tls"),
        etcd_service.endpoint,
        root_path=f"tls-{uuid.uuid4().hex[:8]}",
        settings=milvus_tls_settings(pki, 1),
        client={"token": ROOT, **one_way(pki)},
    ) as milvus:
        add_admin_user(milvus, one_way(pki), USER, PASSWORD)
        yield milvus


def one_way(pki: Pki) -> dict[str, str]:
    return {"server_pem_path": str(pki.ca_file)}


def root_client(milvus: MilvusSource, pki: Pki, db: str = "") -> MilvusClient:
    return admin_client(milvus, one_way(pki), db)


def _write(stream: Stream, collection_id: int, name: str, keys: range) -> None:
    (vchannel,) = stream.vchannels(collection_id, 1)
    stream.writer.create_collection(collection_id, name, [vchannel])
    stream.writer.insert(vchannel, collection_id, keys)
    stream.tick_all()


def test_replicates_into_a_milvus_with_tls_and_authorization(
    daemon_factory, etcd_service, kafka_mock, tls_milvus, pki
):
    """Two tasks into the TLS Milvus: an ``https://`` URI with a token; host and port with
    ``enable_tls``, the CA as ``dial_config.server_pem_path``, and a user and password."""
    writer = StreamingWriter(kafka_mock.bootstrap)
    stream = Stream(writer, f"tls{uuid.uuid4().hex[:6]}", channels=1)
    target = root_client(tls_milvus, pki)
    try:
        stream.tick_all()
        daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
        dial = {"server_pem_path": str(pki.ca_file)}
        by_token = {
            "uri": tls_milvus.uri,
            "token": f"{USER}:{PASSWORD}",
            "dial_config": dial,
            "connect_timeout": 10,
        }
        by_password = {
            "host": tls_milvus.host,
            "port": tls_milvus.port,
            "enable_tls": True,
            "dial_config": dial,
            "username": USER,
            "password": PASSWORD,
            "connect_timeout": 10,
        }
        names = {}
        for i, connect in enumerate((by_token, by_password)):
            names[i] = f"tls_{i}_{uuid.uuid4().hex[:6]}"
            start_task(daemon, "", stream, names[i], milvus_connect_param=connect)
        for i, name in names.items():
            _write(stream, 71000 + i, name, range(i * 100, i * 100 + 50))
        for i, name in names.items():
            wait_for_collection(target, name)
            expected = {pk: f"row-{pk}" for pk in range(i * 100, i * 100 + 50)}
            wait_rows(target, name, expected, daemon=daemon)
        answers = [daemon.call("list").body, str(daemon.request("GET", "/v1/tasks"))]
        daemon.stop()
        for text in [*map(str, answers), daemon.log_text()]:
            assert PASSWORD not in text
    finally:
        target.close()
        writer.close()


def test_a_refused_target_fails_the_create_naming_it_and_why(
    daemon_factory, etcd_service, kafka_mock, tls_milvus, pki
):
    stream = Stream(StreamingWriter(kafka_mock.bootstrap), "refused", channels=1)
    try:
        daemon = daemon_factory(**stream.config(etcd_service, kafka_mock)).start()
    finally:
        stream.writer.close()
    base = {
        "uri": tls_milvus.uri,
        "token": f"{USER}:{PASSWORD}",
        "dial_config": {"server_pem_path": str(pki.ca_file)},
        "connect_timeout": 3,
    }
    plain = tls_milvus.uri.replace("https://", "http://")
    cases = {
        "wrong password": (
            {**base, "token": f"{USER}:not-it"},
            "auth check failure, please check username and password are correct",
        ),
        "wrong CA": (
            {**base, "dial_config": {"server_pem_path": str(pki.other_ca_file)}},
            "certificate verify failed: unable to get local issuer certificate",
        ),
        "no TLS": (
            {**base, "uri": plain, "dial_config": None},
            "it speaks TLS: give an https:// uri or enable_tls",
        ),
    }
    for case, (connect, reason) in cases.items():
        body = {"milvus_connect_param": connect, "collection_infos": [{"name": "x"}]}
        reply = daemon.call("create", body)
        where = connect["uri"]
        expected = f"milvus_connect_param: target Milvus at {where} refused the daemon: {reason}"
        assert (reply.status, reply.message) == (400, expected), case
        assert PASSWORD not in reply.raw.decode()
    assert daemon.call("list").data["tasks"] == []


def test_a_cluster_milvus_block_with_one_way_tls_reaches_it(tls_milvus, pki):
    """A named cluster's ``milvus`` block for this Milvus (its CA as ``ca_pem_path``, a user
    and password) as the backfill's and verify's clients (``transfer.connect``) and disaster
    recovery's (``fence.client_args``) open it."""
    milvus = SourceMilvusSettings(
        uri=tls_milvus.uri, username=USER, password=PASSWORD, ca_pem_path=str(pki.ca_file)
    )
    assert versions_through(milvus) == ["v2.3.5-lite"] * 2


def test_backfill_and_verify_read_a_source_with_one_way_tls(
    daemon_factory, etcd_service, tls_milvus, pki
):
    """The TLS Milvus as a named cluster (its RocksMQ WAL; its ``milvus`` block with the CA as
    ``ca_pem_path`` and a token) that a backfill on Spark copies from and a verify reads, into
    another database of the same Milvus (``tls_backfill``)."""
    token = f"{USER}:{PASSWORD}"
    cluster = {
        "etcd": {"address": [etcd_service.endpoint]},
        "etcdRootPath": tls_milvus.etcd_root_path,
        "channelPrefix": tls_milvus.chan_prefix,
        "mqType": "rocksmq",
        "rocksmq": {"path": str(tls_milvus.rocksmq_path)},
        "milvus": {"uri": tls_milvus.uri, "token": token, "ca_pem_path": str(pki.ca_file)},
    }
    target = {
        "uri": tls_milvus.uri,
        "token": token,
        "dial_config": {"server_pem_path": str(pki.ca_file)},
        "connect_timeout": 10,
    }
    backfill_verify_and_keep_secrets(
        daemon_factory(clusters={"one-way": cluster}, **SPARK),
        "one-way",
        target,
        lambda db: root_client(tls_milvus, pki, db),
        [PASSWORD],
    )


AUTH_REFUSED = "auth check failure, please check username and password are correct"


def _admin_user(root: MilvusClient, prefix: str) -> tuple[str, str, str]:
    """A new user with admin rights: its name, password, and the password it will change to."""
    user = f"{prefix}_{uuid.uuid4().hex[:6]}"
    old, new = f"{prefix}-Old-Pa55-{uuid.uuid4().hex[:6]}", f"{prefix}-New-Pa55-x"
    root.create_user(user, old)
    root.grant_role(user, "admin")
    return user, old, new


def _rows_then_rotation(
    daemon: Any,
    stream: Stream,
    root: MilvusClient,
    collection_id: int,
    name: str,
    rotation: tuple[str, str, str],
) -> None:
    """Rows 0-39 of a new collection replicated; then the user's password changed on the
    target (``rotation``: user, old, new) and rows 40-89 written."""
    _write(stream, collection_id, name, range(40))
    wait_for_collection(root, name)
    wait_rows(root, name, {pk: f"row-{pk}" for pk in range(40)}, daemon=daemon)
    root.update_password(*rotation)
    (vchannel,) = stream.vchannels(collection_id, 1)
    stream.writer.insert(vchannel, collection_id, range(40, 90))
    stream.tick_all()


def _went_on_keeping_secrets(
    daemon: Any, root: MilvusClient, name: str, task_id: str, secrets: tuple[str, ...]
) -> None:
    """After a password rotation: every row of 0-89 on the target once, the probe's warning
    (kept with the task's state) withdrawn at its next round, the task Running; then the
    daemon stopped, ``secrets`` in none of its answers and no log line."""
    wait_rows(root, name, {pk: f"row-{pk}" for pk in range(90)}, daemon=daemon)
    assert root.query(name, filter="id >= 0", output_fields=["count(*)"])[0]["count(*)"] == 90
    wait_until(
        lambda: AUTH_REFUSED not in task_view(daemon, task_id)["reason"],
        30,
        "the refusal withdrawn once the target lets the daemon in",
    )
    assert task_view(daemon, task_id)["state"] == "Running"
    answers = [daemon.call("list").body, daemon.call("get", {"task_id": task_id}).body]
    daemon.stop()
    for text in [*map(str, answers), daemon.log_text()]:
        assert not any(secret in text for secret in secrets)


def test_a_password_rotated_on_the_target_is_named_then_taken_at_resume(
    daemon_factory, etcd_service, kafka_mock, tls_milvus, pki
):
    """The target's password changes under a running task: the task's reason names the
    refusal; a resume with a wrong new password is refused naming why, changing nothing; one
    with the new password goes on from the task's positions (every row once)."""
    root = root_client(tls_milvus, pki)
    user, old, new = _admin_user(root, "rot")
    writer = StreamingWriter(kafka_mock.bootstrap)
    stream = Stream(writer, f"pw{uuid.uuid4().hex[:6]}", channels=1)
    name = f"pw_{uuid.uuid4().hex[:6]}"
    try:
        stream.tick_all()
        daemon = daemon_factory(
            scheduler={"reachabilitySeconds": 1}, **stream.config(etcd_service, kafka_mock)
        ).start()
        connect = {
            "uri": tls_milvus.uri,
            "username": user,
            "password": old,
            "dial_config": {"server_pem_path": str(pki.ca_file)},
            "connect_timeout": 5,
        }
        task_id = start_task(daemon, "", stream, name, milvus_connect_param=connect)
        _rows_then_rotation(daemon, stream, root, 73000, name, (user, old, new))
        wait_until(
            lambda: AUTH_REFUSED in task_view(daemon, task_id)["reason"],
            60,
            "the task's reason names the refusal",
        )

        wrong = {"username": user, "password": "not-the-new-one"}
        refused = daemon.call("resume", {"task_id": task_id, "milvus_connect_param": wrong})
        assert (refused.status, refused.message) == (
            400,
            f"milvus_connect_param: target Milvus at {tls_milvus.uri} refused the daemon: "
            f"{AUTH_REFUSED}",
        )
        rotated = {"username": user, "password": new}
        resumed = daemon.call("resume", {"task_id": task_id, "milvus_connect_param": rotated})
        assert resumed.code == 200, resumed.body
        _went_on_keeping_secrets(daemon, root, name, task_id, (old, new))
    finally:
        root.close()
        writer.close()


def test_a_password_rotated_on_a_target_cluster_is_read_again_from_the_file(
    daemon_factory, etcd_service, kafka_mock, tls_milvus, pki
):
    """A task naming ``target_cluster`` (its credentials in the daemon's configuration): the
    user's password changes on the Milvus under the running task, whose reason names the
    refusal; the operator changes it in the configuration file and resumes the task (no body):
    the file is read again, the task goes on from its positions (every row once), the password
    in no answer and no log line."""
    root = root_client(tls_milvus, pki)
    user, old, new = _admin_user(root, "cl")
    writer = StreamingWriter(kafka_mock.bootstrap)
    stream = Stream(writer, f"cp{uuid.uuid4().hex[:6]}", channels=1)
    name = f"cp_{uuid.uuid4().hex[:6]}"
    target = cluster(tls_milvus, etcd_service.endpoint)
    target["milvus"].update(username=user, password=old, ca_pem_path=str(pki.ca_file))
    try:
        stream.tick_all()
        daemon = daemon_factory(
            scheduler={"reachabilitySeconds": 1},
            clusters={"dr": target},
            **stream.config(etcd_service, kafka_mock),
        ).start()
        task_id = start_task(
            daemon, "", stream, name, milvus_connect_param=None, target_cluster="dr"
        )
        _rows_then_rotation(daemon, stream, root, 74000, name, (user, old, new))

        def failed() -> bool:
            view = task_view(daemon, task_id)
            return view["state"] == "Failed" and AUTH_REFUSED in view["reason"]

        wait_until(failed, 60, "the task failed, its reason naming the refusal")
        given = daemon.call("resume", {"task_id": task_id, "milvus_connect_param": {}})
        assert (given.status, given.message) == (
            400,
            f"milvus_connect_param: task {task_id} writes to clusters.dr, whose credentials are "
            "the daemon's configuration: change clusters.dr.milvus in its file and resume the "
            "task without milvus_connect_param (the file is read again when the target refuses "
            "the ones in use)",
        )

        # a file that cannot be loaded (a CA that is not there): the block in use stays, the
        # task fails again naming the refusal, the log says why the file was not taken
        config = yaml.safe_load(daemon.config_path.read_text())
        milvus = config["clusters"]["dr"]["milvus"]
        milvus.update(password=new, ca_pem_path="/no/such/ca.pem")
        daemon.config_path.write_text(yaml.safe_dump(config))
        assert daemon.call("resume", {"task_id": task_id}).code == 200
        wait_until(
            lambda: "clusters.dr.milvus not read again: " in daemon.log_text(),
            60,
            "the log says the file was not taken",
        )
        wait_until(failed, 60, "the task failed again, its reason naming the refusal")

        milvus["ca_pem_path"] = str(pki.ca_file)
        daemon.config_path.write_text(yaml.safe_dump(config))
        resumed = daemon.call("resume", {"task_id": task_id})  # the Go tool's: task_id alone
        assert resumed.code == 200, resumed.body
        _went_on_keeping_secrets(daemon, root, name, task_id, (old, new))
        assert "clusters.dr.milvus read again from the configuration" in daemon.log_text()
    finally:
        root.close()
        writer.close()
