"""A real Milvus 2.3.5 that wants mutual TLS (``common.security.tlsMode: 2``: the client's
certificate is checked against ``tls.caPemPath``) and a login
(``common.security.authorizationEnabled``), at both ends of a task.

As the SOURCE, a named cluster (``clusters.secure.milvus`` with the CA, a client certificate
and key, and a user and password) whose rows a backfill copies on Spark and a verify compares;
as the TARGET, ``milvus_connect_param`` with ``dial_config.ca_pem_path``, ``client_pem_path``
and ``client_key_path`` and a token. The task copies a collection of the Milvus into another
database of the same Milvus (``name_mapping``), so one Milvus serves both ends. A missing or a
foreign client certificate is refused at create, word for word; the password is in no answer,
no log, and no command line or environment of the backfill's processes.

The source's WAL is the session's Kafka mock. This file runs a Spark job: it is one of
tests/conftest.py's SPARK_FILES, which run one after the other."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from harness.milvus_source import MilvusSource, milvus_source
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # Spark; its waits name what is late

USER = "cdc"
PASSWORD = "Milvus-Mutual-Pa55-never-shown"
# a secret given to the daemon in its environment (a named cluster's cannot be: CDC_CLUSTERS__*
# is refused): the daemon drops it once read, so no child (the backfill driver, its JVM) has it
SECRET_ENV, ENV_SECRET = "CDC_SOURCECONFIG__MILVUS__PASSWORD", "Env-Secret-never-inherited"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("mtls-pki"))


def mutual(pki: Pki) -> dict[str, str]:
    """The client's side of mutual TLS, as pymilvus and ``dial_config`` spell it."""
    return {
        "ca_pem_path": str(pki.ca_file),
        "client_pem_path": str(pki.client_cert),
        "client_key_path": str(pki.client_key),
    }


@pytest.fixture(scope="module")
def mtls_milvus(
    tmp_path_factory: pytest.TempPathFactory, etcd_service: Any, kafka_mock: Any, pki: Pki
) -> Iterator[MilvusSource]:
    """Milvus 2.3.5 with mutual TLS and authorization, its WAL on the Kafka mock, and a user
    ``cdc`` with admin rights."""
    with milvus_source(
        tmp_path_factory.mktemp("milvus-mtls"),
        etcd_service.endpoint,
        kafka_mock.bootstrap,
        root_path=f"mtls-{uuid.uuid4().hex[:8]}",
        settings=milvus_tls_settings(pki, 2),
        client={"token": ROOT, **mutual(pki)},
    ) as milvus:
        add_admin_user(milvus, mutual(pki), USER, PASSWORD)
        yield milvus


def root_client(milvus: MilvusSource, pki: Pki, db: str = "") -> MilvusClient:
    return admin_client(milvus, mutual(pki), db)


def target_param(milvus: MilvusSource, pki: Pki, **changes: Any) -> dict[str, Any]:
    return {
        "uri": milvus.uri,
        "token": f"{USER}:{PASSWORD}",
        "dial_config": mutual(pki),
        "connect_timeout": 10,
        **changes,
    }


def secure_cluster(milvus: MilvusSource, etcd_service: Any, kafka_mock: Any, pki: Pki) -> dict:
    """``clusters.secure``: the Milvus's etcd and Kafka, and its Milvus over mutual TLS with a
    user and password (pymilvus's spelling)."""
    return {
        "etcd": {"address": [etcd_service.endpoint]},
        "etcdRootPath": milvus.etcd_root_path,
        "channelPrefix": milvus.chan_prefix,
        "kafka": {"address": kafka_mock.bootstrap},
        "milvus": {"uri": milvus.uri, "username": USER, "password": PASSWORD, **mutual(pki)},
    }


def test_backfill_and_verify_over_mutual_tls_at_both_ends(
    daemon_factory, etcd_service, kafka_mock, mtls_milvus, pki
):
    """Rows written before the task are copied by the backfill (Spark executors reading the
    source and writing the target over mutual TLS); rows written after it stream into the
    target over mutual TLS; a verify reading both ends finds them equal."""
    cluster = secure_cluster(mtls_milvus, etcd_service, kafka_mock, pki)
    daemon = daemon_factory(clusters={"secure": cluster}, **SPARK)
    daemon.env[SECRET_ENV] = ENV_SECRET
    backfill_verify_and_keep_secrets(
        daemon,
        "secure",
        target_param(mtls_milvus, pki),
        lambda db: root_client(mtls_milvus, pki, db),
        [PASSWORD, ENV_SECRET],
    )


def test_a_missing_or_foreign_client_certificate_is_refused_at_create(
    daemon_factory, etcd_service, kafka_mock, mtls_milvus, pki
):
    """In ``milvus_connect_param``, in a ``target_cluster``'s ``milvus`` block, and in the
    block of a source cluster a backfill asked at create would read: the answer names the
    Milvus and why, nothing is stored; the cluster with a good certificate is let in (its TLS
    files reach the check at create)."""
    cluster = secure_cluster(mtls_milvus, etcd_service, kafka_mock, pki)
    one_way = {**cluster["milvus"], "client_pem_path": "", "client_key_path": ""}
    daemon = daemon_factory(
        clusters={"mutual": cluster, "one-way": {**cluster, "milvus": one_way}}
    ).start()
    foreign = {
        "ca_pem_path": str(pki.ca_file),
        "client_pem_path": str(pki.stranger_cert),
        "client_key_path": str(pki.stranger_key),
    }
    missing = (
        "the server wants a client certificate (mutual TLS) and none was given: "
        "SSLV3_ALERT_BAD_CERTIFICATE"
    )
    dial = {"server_pem_path": str(pki.ca_file)}
    cases = {
        "no client certificate": (
            {"milvus_connect_param": target_param(mtls_milvus, pki, dial_config=dial)},
            missing,
        ),
        "a certificate another CA signed": (
            {"milvus_connect_param": target_param(mtls_milvus, pki, dial_config=foreign)},
            "the server refused the client certificate: SSLV3_ALERT_BAD_CERTIFICATE",
        ),
        "a target cluster without one": ({"target_cluster": "one-way"}, missing),
    }
    for case, (target, reason) in cases.items():
        reply = daemon.call("create", {**target, "collection_infos": [{"name": "x"}]})
        expected = (
            f"milvus_connect_param: target Milvus at {mtls_milvus.uri} refused the daemon: {reason}"
        )
        assert (reply.status, reply.message) == (400, expected), case
        assert PASSWORD not in reply.raw.decode()
    backfill_from_one_way = {
        "source_cluster": "one-way",
        "target_cluster": "mutual",
        "collection_infos": [{"name": "x"}],
        "backfill": {"collections": ["*"]},
    }
    reply = daemon.call("create", backfill_from_one_way)  # its executors could not read it
    expected = (
        f"clusters.one-way.milvus: source Milvus at {mtls_milvus.uri} refused the daemon: {missing}"
    )
    assert (reply.status, reply.message) == (503, expected)
    assert daemon.call("list").data["tasks"] == []

    created = daemon.call(
        "create", {"target_cluster": "mutual", "collection_infos": [{"name": "x"}]}
    )
    assert created.code == 200, created.body
    assert PASSWORD not in created.raw.decode()
    assert daemon.call("delete", {"task_id": created.data["task_id"]}).code == 200


@pytest.mark.parametrize("ca_key", ["ca_pem_path", "server_pem_path"])
def test_a_cluster_milvus_block_with_mutual_tls_reaches_it(mtls_milvus, pki, ca_key):
    """The ``milvus`` block of a named cluster, the CA under either of pymilvus's names (given
    as ``server_pem_path``, pymilvus itself would send no client certificate), as the
    backfill's and verify's clients and disaster recovery's open it."""
    milvus = SourceMilvusSettings(
        uri=mtls_milvus.uri,
        username=USER,
        password=PASSWORD,
        client_pem_path=str(pki.client_cert),
        client_key_path=str(pki.client_key),
        **{ca_key: str(pki.ca_file)},
    )
    assert versions_through(milvus) == ["v2.3.5-lite"] * 2
