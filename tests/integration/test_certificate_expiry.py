"""Client certificates that expire, against a real etcd wanting mutual TLS (Debian's etcd 3.4):
an expired one is named with its file and expiry in the metastore's error and in ``milvus-cdc
check``; one expiring within ``scheduler.certificateWarningDays`` is a warning on the tasks that
use it, in ``/readyz``, in ``check`` and in ``cdc_certificate_expiry_seconds``."""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections.abc import Iterator

import pytest
from harness.services import EtcdService, ServerTls, etcd_server, wait_until
from harness.task_bodies import lite_param
from harness.tls import Pki, issue_client_certificate, make_test_pki

from metastore import MetaStoreUnavailableError
from metastore.tls_files import certificate_expiry
from replicator.config.connections import MetaStoreSettings
from replicator.config.settings import CdcSettings
from replicator.config.stores import open_metastore
from server.cli.check import run_checks
from tests.integration.test_etcd_tls import empty_rocksdb

pytestmark = pytest.mark.integration

NOW = datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("expiry-pki"))


@pytest.fixture(scope="module")
def mutual_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EtcdService]:
    tls = ServerTls(pki.server_cert, pki.server_key, pki.ca_file)
    with etcd_server(tmp_path_factory.mktemp("etcd-mutual"), tls=tls) as service:
        yield service


def etcd_block(etcd: EtcdService, pki: Pki, cert: str, key: str) -> dict:
    return {
        "address": [etcd.endpoint],
        "enableTLS": True,
        "tlsCACertPath": str(pki.ca_file),
        "tlsCertPath": cert,
        "tlsKeyPath": key,
    }


def checks(settings: CdcSettings) -> list[dict]:
    args = argparse.Namespace(timeout=3, target="", task=[])
    return [r.__dict__ for r in run_checks(args, settings)]


def test_an_expired_client_certificate_is_named_with_its_file_and_expiry(
    pki, mutual_etcd, tmp_path, root_path
):
    cert, key = issue_client_certificate(
        pki, tmp_path, "expired-client", NOW - datetime.timedelta(hours=1)
    )
    expiry = certificate_expiry(str(cert))
    assert expiry is not None
    named = f"client certificate {cert} expired at {expiry.when}"
    etcd = etcd_block(mutual_etcd, pki, str(cert), str(key))
    with pytest.raises(MetaStoreUnavailableError) as raised:
        open_metastore(
            MetaStoreSettings.model_validate(
                {"storeType": "etcd", "etcd": etcd, "rootPath": root_path}
            )
        )
    assert str(raised.value).startswith(
        f"etcd metastore unavailable: {mutual_etcd.endpoint}: {named}: "
        "the server refused the client certificate: "
    ), raised.value

    queue = {"mqType": "rocksmq", "rocksmq": {"path": empty_rocksdb(tmp_path / "rmq")}}
    settings = CdcSettings.model_validate(
        {
            "metaStoreConfig": {"sqlitePath": str(tmp_path / "m.db")},
            "sourceConfig": {**queue, "etcd": etcd, "etcdRootPath": "x"},
        }
    )
    results = checks(settings)
    (source,) = [r for r in results if r["check"] == "source etcd"]
    assert not source["ok"] and source["detail"].startswith(f"{mutual_etcd.endpoint}: {named}: ")
    (certificate,) = [r for r in results if r["check"] == "certificate"]
    assert certificate["target"] == f"source etcd {mutual_etcd.endpoint}"
    assert not certificate["ok"]
    assert certificate["detail"] == f"source etcd {mutual_etcd.endpoint}: {named}"


def test_a_certificate_expiring_soon_is_a_warning_everywhere(
    daemon_factory, milvus_lite_service, pki, mutual_etcd, tmp_path, root_path
):
    """A daemon whose etcd metastore and source etcd take a client certificate expiring in
    three days (warned of within 14): its task, /readyz, /metrics and check say so."""
    cert, key = issue_client_certificate(
        pki, tmp_path, "soon-client", NOW + datetime.timedelta(days=3)
    )
    expiry = certificate_expiry(str(cert))
    assert expiry is not None
    etcd = etcd_block(mutual_etcd, pki, str(cert), str(key))
    queue = {"mqType": "rocksmq", "rocksmq": {"path": empty_rocksdb(tmp_path / "rmq")}}
    daemon = daemon_factory(
        metaStoreConfig={"storeType": "etcd", "etcd": etcd, "rootPath": root_path},
        sourceConfig={**queue, "etcd": etcd, "etcdRootPath": "no-source"},
        scheduler={"reachabilitySeconds": 1, "certificateWarningDays": 14},
    ).start()
    body = {
        "milvus_connect_param": lite_param(milvus_lite_service, connect_timeout=3),
        "collection_infos": [{"name": "soon"}],
    }
    reply = daemon.call("create", body)
    assert reply.code == 200, reply.body
    task_id = reply.data["task_id"]
    warned = (
        f"source etcd {mutual_etcd.endpoint}: client certificate {cert} expires at "
        f"{expiry.when} (in "
    )

    def reason() -> str:
        return str(daemon.call("get", {"task_id": task_id}).data["task"]["reason"])

    wait_until(lambda: warned in reason(), 30, "the task's reason warns of the certificate")
    assert re.search(re.escape(warned) + r"(2\.9|3\.0) days\)", reason()), reason()

    status, raw = daemon.get("/readyz")[:2]
    ready = json.loads(raw)
    assert status == 200 and ready["status"] == "ok", ready
    by_role = {n["role"]: n for n in ready["certificates"]}
    assert set(by_role) == {"metastore", "source etcd"}
    assert by_role["metastore"]["file"] == str(cert)
    assert by_role["metastore"]["expires_at"] == expiry.when
    assert by_role["metastore"]["expired"] is False

    metrics = daemon.get("/metrics")[1].decode()
    line = (
        f'cdc_certificate_expiry_seconds{{endpoint="{mutual_etcd.endpoint}",file="{cert}",'
        'role="metastore"} '
    )
    (sample,) = [row for row in metrics.splitlines() if row.startswith(line)]
    assert 2.9 * 86400 < float(sample.removeprefix(line)) <= 3 * 86400

    settings = CdcSettings.model_validate(
        {
            "metaStoreConfig": {"storeType": "etcd", "etcd": etcd, "rootPath": root_path},
            "sourceConfig": {**queue, "etcd": etcd, "etcdRootPath": "no-source"},
        }
    )
    rows = [r for r in checks(settings) if r["check"] == "certificate"]
    assert [r["target"] for r in rows] == [
        f"metastore {mutual_etcd.endpoint}",
        f"source etcd {mutual_etcd.endpoint}",
    ]
    assert all(r["ok"] and r["detail"].startswith("WARNING: ") for r in rows), rows
    assert rows[0]["detail"].startswith(
        f"WARNING: metastore {mutual_etcd.endpoint}: client certificate {cert} expires at "
        f"{expiry.when} (in "
    )
