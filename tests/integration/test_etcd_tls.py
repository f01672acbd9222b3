"""etcd over TLS, mutual TLS and with a password, as the etcd metastore and as the source's
etcd, against real etcd servers (Debian's etcd 3.4) started with the certificates of
tests/harness/tls.py; every refusal (wrong CA, expired certificate, wrong host, wrong password,
no client certificate) named with its endpoint and reason, word for word, and nothing stored by
a create that failed."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.secure_stores import ETCD_USER, SecureEtcd, secure_etcd
from harness.task_bodies import lite_param
from harness.tls import Pki, make_test_pki
from rocksdict import Options, Rdict

from metastore import MetaStoreUnavailableError, TaskRecord, TaskState
from replicator.config.connections import MetaStoreSettings, SourceSettings
from replicator.config.settings import CdcSettings
from replicator.config.stores import describe_metastore, open_metastore
from server.cli.check import CheckFailedError, check_source_etcd
from server.tasks.reachability import ReachabilityWatch, source_endpoints

pytestmark = pytest.mark.integration

PASSWORD = "Etcd-Pa55-never-shown"
TOKEN_TTL = 1  # seconds an unused login token lives on the etcd with a password
UNTRUSTED = "certificate verify failed: unable to get local issuer certificate"
EXPIRED = "certificate verify failed: certificate has expired"
WRONG_HOST = (
    "certificate verify failed: IP address mismatch, certificate is not valid for '127.0.0.1'."
)
BAD_PASSWORD = "etcdserver: authentication failed, invalid user ID or password"
NO_CLIENT_CERT = (
    "the server wants a client certificate (mutual TLS) and none was given: "
    "SSLV3_ALERT_BAD_CERTIFICATE"
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("etcd-pki"))


@pytest.fixture(scope="module")
def etcds(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[dict[str, SecureEtcd]]:
    """One etcd per kind of server: one-way TLS; mutual TLS; mutual TLS and a password (with a
    plain listener: the password alone); an expired certificate; a certificate for another
    host."""
    base = tmp_path_factory.mktemp("etcds")
    kinds: dict[str, dict[str, Any]] = {
        "one-way": {},
        "mutual": {"mutual": True},
        "locked": {"mutual": True, "password": PASSWORD, "token_ttl": TOKEN_TTL},
        "expired": {"cert": (pki.expired_cert, pki.expired_key)},
        "wrong-host": {"cert": (pki.wrong_host_cert, pki.wrong_host_key)},
    }
    with contextlib.ExitStack() as stack:
        yield {
            kind: stack.enter_context(secure_etcd(base / kind, pki, **options))
            for kind, options in kinds.items()
        }


def etcd_settings(pki: Pki, etcds: dict[str, SecureEtcd], case: str) -> dict[str, Any]:
    """cdc.yaml's ``etcd`` block of each case (as milvus.yaml spells Milvus's own)."""
    tls = {"enableTLS": True, "tlsCACertPath": str(pki.ca_file)}
    client = {"tlsCertPath": str(pki.client_cert), "tlsKeyPath": str(pki.client_key)}
    login = {"enableAuth": True, "username": ETCD_USER, "password": PASSWORD}
    return {
        "one-way TLS": {"address": [etcds["one-way"].https], **tls},
        "mutual TLS": {"address": [etcds["mutual"].https], **tls, **client},
        "password": {"address": [etcds["locked"].plain], **login},
        "mutual TLS and password": {"address": [etcds["locked"].https], **tls, **client, **login},
        # the same, as milvus.yaml spells its etcd block (an address without a scheme)
        "milvus.yaml spelling": {
            "endpoints": etcds["locked"].https.removeprefix("https://"),
            "ssl": {
                "enabled": True,
                "tlsCert": str(pki.client_cert),
                "tlsKey": str(pki.client_key),
                "tlsCACert": str(pki.ca_file),
                "tlsMinVersion": "1.3",
            },
            "auth": {"enabled": True, "userName": ETCD_USER, "password": PASSWORD},
        },
        "wrong CA": {
            "address": [etcds["one-way"].https],
            **tls,
            "tlsCACertPath": str(pki.other_ca_file),
        },
        "expired": {"address": [etcds["expired"].https], **tls},
        "wrong host": {"address": [etcds["wrong-host"].https], **tls},
        "wrong password": {
            "address": [etcds["locked"].https],
            **tls,
            **client,
            **login,
            "password": "not-it",
        },
        "no client certificate": {"address": [etcds["mutual"].https], **tls},
    }[case]


GOOD = ["one-way TLS", "mutual TLS", "password", "mutual TLS and password", "milvus.yaml spelling"]
REFUSALS = {
    "wrong CA": UNTRUSTED,
    "expired": EXPIRED,
    "wrong host": WRONG_HOST,
    "wrong password": BAD_PASSWORD,
    "no client certificate": NO_CLIENT_CERT,
}


def metastore_config(etcd: dict[str, Any], root: str) -> MetaStoreSettings:
    return MetaStoreSettings.model_validate({"storeType": "etcd", "etcd": etcd, "rootPath": root})


@pytest.mark.parametrize("case", GOOD)
def test_etcd_metastore_over_tls_and_with_a_password(pki, etcds, root_path, case):
    config = metastore_config(etcd_settings(pki, etcds, case), root_path)
    store = open_metastore(config)
    try:
        store.create_task(TaskRecord("t1", TaskState.PAUSED, "", {"x": 1}, 1.0, 1.0))
        stored = store.get_task("t1")
        assert stored is not None and stored.spec == {"x": 1}
    finally:
        store.close()
    address = config.etcd.address[0]
    url = address if "://" in address else f"https://{address}"
    assert describe_metastore(config) == f"etcd at {url} (rootPath {root_path})"


@pytest.mark.parametrize("case", ["password", "mutual TLS and password"])
def test_a_login_etcd_forgot_is_renewed(pki, etcds, root_path, case):
    """etcd forgets a token unused for --auth-token-ttl (and all at a restart): the client
    logs in again instead of being refused for good."""
    store = open_metastore(metastore_config(etcd_settings(pki, etcds, case), root_path))
    try:
        assert store.list_tasks() == []
        time.sleep(TOKEN_TTL + 1.5)  # etcd checks its tokens' time every second
        store.create_task(TaskRecord("t1", TaskState.PAUSED, "", {}, 1.0, 1.0))
        assert [t.task_id for t in store.list_tasks()] == ["t1"]
    finally:
        store.close()


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_etcd_metastore_refusal_names_endpoint_and_reason(pki, etcds, root_path, case):
    etcd = etcd_settings(pki, etcds, case)
    with pytest.raises(MetaStoreUnavailableError) as raised:
        open_metastore(metastore_config(etcd, root_path))
    address = etcd["address"][0]
    assert str(raised.value) == f"etcd metastore unavailable: {address}: {REFUSALS[case]}"
    assert PASSWORD not in str(raised.value)


def test_reachability_probe_says_why_the_source_etcd_refuses(pki, etcds):
    source = SourceSettings.model_validate({"etcd": etcd_settings(pki, etcds, "wrong CA")})
    etcd = next(e for e in source_endpoints(source) if e.role == "source etcd")
    outage = ReachabilityWatch(timeout=2).check([etcd])[etcd.key]
    assert outage.refusal == f"{etcds['one-way'].https}: {UNTRUSTED}"


@pytest.mark.parametrize("case", ["milvus.yaml spelling", "wrong password"])
def test_check_reads_the_source_etcd_or_says_why_not(pki, etcds, case):
    etcd = etcd_settings(pki, etcds, case)
    settings = CdcSettings.model_validate({"sourceConfig": {"etcd": etcd, "etcdRootPath": "x"}})
    if case == "wrong password":
        with pytest.raises(CheckFailedError) as raised:
            check_source_etcd(settings, 3)
        assert str(raised.value) == f"{etcds['locked'].https}: {BAD_PASSWORD}"
        return
    version, detail = check_source_etcd(settings, 3)
    assert version.startswith("etcd 3.") and detail == "0 collection(s) under x/meta"


def empty_rocksdb(path: Path) -> str:
    """A RocksDB no Milvus has written yet: a source queue that is always there."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    Rdict(str(path), options).close()
    return str(path)


def test_source_etcd_over_tls_at_create_and_the_metastore_of_the_daemon(
    daemon_factory, milvus_lite_service, pki, etcds, tmp_path, root_path
):
    """One daemon whose metastore is the etcd of mutual TLS and a password; a named cluster
    per case, each reading its source etcd as the case says: the good one creates its task,
    each bad one answers 503 naming the endpoint and the reason, and stores nothing."""
    queue = {"mqType": "rocksmq", "rocksmq": {"path": empty_rocksdb(tmp_path / "rmq")}}
    clusters = {
        f"c{i}": {**queue, "etcdRootPath": "no-source", "etcd": etcd_settings(pki, etcds, case)}
        for i, case in enumerate(["milvus.yaml spelling", *sorted(REFUSALS)])
    }
    store = {"storeType": "etcd", "rootPath": root_path}
    store["etcd"] = etcd_settings(pki, etcds, "mutual TLS and password")
    daemon = daemon_factory(metaStoreConfig=store, clusters=clusters).start()
    for i, case in enumerate(["milvus.yaml spelling", *sorted(REFUSALS)]):
        body = {
            "task_id": f"t{i}",
            "source_cluster": f"c{i}",
            "milvus_connect_param": lite_param(milvus_lite_service, connect_timeout=3),
            "collection_infos": [{"name": f"coll{i}"}],  # apart: one target for all
        }
        reply = daemon.call("create", body)
        if i == 0:
            assert reply.code == 200, reply.body
            continue
        address = clusters[f"c{i}"]["etcd"]["address"][0]
        assert reply.status == 503, (case, reply.body)
        cause = f"SourceUnavailableError: source etcd {address}: {REFUSALS[case]}"
        assert reply.message.endswith(cause), (case, reply.message)
        assert PASSWORD not in reply.raw.decode()
    listed = daemon.call("list").data["tasks"]
    assert [t["task_id"] for t in listed] == ["t0"]
    assert daemon.call("get", {"task_id": "t0"}).data["task"]["state"] == "Running"
    daemon.stop()
    assert PASSWORD not in daemon.log_text()
    # nothing of the refused creates in the store either
    reopened = open_metastore(metastore_config(store["etcd"], root_path))
    try:
        assert [t.task_id for t in reopened.list_tasks()] == ["t0"]
    finally:
        reopened.close()


def test_daemon_with_a_wrong_ca_for_its_etcd_metastore_says_why_it_cannot_start(
    daemon_factory, pki, etcds, root_path
):
    etcd = etcd_settings(pki, etcds, "wrong CA")
    daemon = daemon_factory(metaStoreConfig={"storeType": "etcd", "etcd": etcd}).launch()
    assert daemon.process is not None
    try:
        code = daemon.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        raise
    assert code != 0
    expected = f"etcd metastore unavailable: {etcd['address'][0]}: {UNTRUSTED}"
    assert expected in daemon.log_text(), daemon.log_text()[-2000:]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"address": ["a:1"], "endpoints": "b:1"}, "give address or endpoints"),
        ({"ssl": {"enabled": True}, "enableTLS": True}, "give ssl.enabled or enableTLS, not both"),
        ({"auth": {"userName": "u", "passwd": "x"}}, "etcd.auth.passwd: unknown key"),
        ({"enableTLS": True, "tlsCACertPath": "/no/ca.pem"}, "etcd.tlsCACertPath: no such file"),
        (
            {"ssl": {"enabled": True, "tlsCert": "CERT"}},
            "etcd.tlsCertPath and etcd.tlsKeyPath go together",
        ),
    ],
)
def test_etcd_settings_that_cannot_work_are_refused_by_name(pki, block, message):
    given = dict(block)
    if "ssl" in given and given["ssl"].get("tlsCert") == "CERT":
        given["ssl"] = {**given["ssl"], "tlsCert": str(pki.client_cert)}
    with pytest.raises(ValueError, match=message):
        SourceSettings.model_validate({"etcd": given})
