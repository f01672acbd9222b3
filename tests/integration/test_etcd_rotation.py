"""Certificates and logins that change while the daemon runs, against real etcd servers (Debian's
etcd 3.4): the etcd's and the client's certificates swapped for ones of a new CA, the etcd
restarted on its ports, and the same metastore client goes on (its TLS files read again; no
restart), after saying exactly why it was turned away while only the server had rotated; a
token made stale by a change to etcd's users (simple and JWT tokens) is cured by a new login."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from etcd3 import etcdrpc
from harness.secure_stores import ETCD_USER, enable_etcd_auth
from harness.services import EtcdService, ServerTls, etcd_server
from harness.tls import Pki, make_test_pki

from metastore import Lease, MetaStore, MetaStoreUnavailableError, TaskRecord, TaskState
from metastore.etcd_connect import EtcdTls, connect_etcd
from metastore.tls_files import RELOAD_CHECK_SECONDS
from replicator.config.connections import MetaStoreSettings
from replicator.config.settings import CdcSettings, load_settings
from replicator.config.stores import open_metastore
from replicator.log_redaction import SecretRedactor
from replicator.sources.base import SourceUnavailableError
from server.cli.serve import read_passwords_again
from server.tasks.engine import cluster_context
from tests.integration.test_etcd_tls import empty_rocksdb

pytestmark = pytest.mark.integration

PASSWORD = "Rotation-Pa55-never-shown"
UNTRUSTED = "certificate verify failed: unable to get local issuer certificate"


def install_server(pki: Pki, where: Path) -> ServerTls:
    """The server's files of ``pki`` at fixed paths under ``where`` (as a mounted secret)."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.server_cert, where / "server.pem")
    shutil.copyfile(pki.server_key, where / "server.key")
    shutil.copyfile(pki.ca_file, where / "ca.pem")
    return ServerTls(where / "server.pem", where / "server.key", where / "ca.pem")


def install_client(pki: Pki, where: Path) -> dict[str, str]:
    """The client's files of ``pki`` at fixed paths under ``where``: cdc.yaml's TLS keys."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.ca_file, where / "ca.pem")
    shutil.copyfile(pki.client_cert, where / "client.pem")
    shutil.copyfile(pki.client_key, where / "client.key")
    return {
        "enableTLS": True,
        "tlsCACertPath": str(where / "ca.pem"),
        "tlsCertPath": str(where / "client.pem"),
        "tlsKeyPath": str(where / "client.key"),
    }


def store_of(etcd: dict, root: str) -> MetaStore:
    return open_metastore(
        MetaStoreSettings.model_validate({"storeType": "etcd", "etcd": etcd, "rootPath": root})
    )


def task(task_id: str) -> TaskRecord:
    return TaskRecord(task_id, TaskState.PAUSED, "", {"id": task_id}, 1.0, 1.0)


class Rotation:
    """An etcd with mutual TLS whose server and client files sit at fixed paths (as mounted
    secrets), of an old CA, and the certificates of a new CA to rotate to."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = tmp_path
        self.old, self.new = make_test_pki(tmp_path / "old"), make_test_pki(tmp_path / "new")
        self.server_dir, self.client_dir = tmp_path / "server", tmp_path / "client"
        self.tls = install_server(self.old, self.server_dir)

    def first_run(
        self, root: str, before: Callable[[MetaStore], None]
    ) -> tuple[MetaStore, EtcdService]:
        """A store opened on the etcd of the old certificates, ``before`` done with it, the
        etcd stopped (its data kept): the store, and the etcd as it was."""
        etcd: dict[str, Any] = {"address": [], **install_client(self.old, self.client_dir)}
        with etcd_server(self.base / "etcd", tls=self.tls) as first:
            etcd["address"] = [first.endpoint]
            store = store_of(etcd, root)
            before(store)
        return store, first


def first_success(store: MetaStore, task_id: str, within: float) -> float:
    """Seconds until ``store`` stores ``task_id`` (retrying as the daemon's loops do)."""
    started = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - started < within:
        try:
            store.create_task(task(task_id))
            return time.monotonic() - started
        except MetaStoreUnavailableError as exc:
            last = exc
            time.sleep(0.2)
    raise AssertionError(f"never stored within {within} s; last: {last}")


def test_a_rotation_of_ca_and_pairs_is_taken_up_without_a_restart(tmp_path, root_path):
    rotation = Rotation(tmp_path)
    store, first = rotation.first_run(root_path, lambda s: s.create_task(task("before")))
    tls, new = rotation.tls, rotation.new
    ports = (first.port, first.peer_port)
    try:
        # the server rotated (a new CA and pair), the daemon's files not yet: its error says why
        install_server(new, rotation.server_dir)
        with etcd_server(tmp_path / "etcd", tls=tls, ports=ports):
            with pytest.raises(MetaStoreUnavailableError) as raised:
                store.list_tasks()
            assert str(raised.value) == (
                f"etcd metastore unavailable: {first.endpoint}: {UNTRUSTED}"
            )
            # then the daemon's files: the same client goes on with them, no restart
            install_client(new, rotation.client_dir)
            first_success(store, "after", within=10 + RELOAD_CHECK_SECONDS)
            assert [t.task_id for t in store.list_tasks()] == ["after", "before"]
    finally:
        store.close()


def test_a_rotation_while_a_member_holds_its_lease(tmp_path, root_path):
    """The member's etcd lease made before the rotation is kept alive after it (its
    keep-alive goes through the new files), and the task lease it holds stays its own."""
    rotation = Rotation(tmp_path)
    leases: list[Lease | None] = []

    def hold(store: MetaStore) -> None:
        store.create_task(task("t1"))
        store.heartbeat("m1", {"address": "x"}, ttl=30)
        leases.append(store.acquire_lease("t1", "m1", ttl=30))

    store, first = rotation.first_run(root_path, hold)
    held = leases[0]
    assert held is not None
    try:
        install_server(rotation.new, rotation.server_dir)
        install_client(rotation.new, rotation.client_dir)
        with etcd_server(tmp_path / "etcd", tls=rotation.tls, ports=(first.port, first.peer_port)):
            time.sleep(RELOAD_CHECK_SECONDS)
            store.heartbeat("m1", {"address": "x"}, ttl=30)  # the heartbeat
            assert store.leases().get("t1") == held
    finally:
        store.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("login-pki"))


def jwt_flags(where: Path) -> list[str]:
    """etcd's ``--auth-token jwt`` with an RSA key pair of its own."""
    where.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = where / "jwt.key", where / "jwt.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return ["--auth-token", f"jwt,pub-key={public},priv-key={private},sign-method=RS256"]


@pytest.fixture(scope="module", params=["simple", "jwt"])
def locked_etcd(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[EtcdService]:
    """An etcd with mutual TLS and a password, its tokens simple or JWT."""
    base = tmp_path_factory.mktemp(f"etcd-{request.param}")
    flags = jwt_flags(base / "keys") if request.param == "jwt" else []
    tls = ServerTls(pki.server_cert, pki.server_key, pki.ca_file)
    with etcd_server(base / "etcd", tls=tls, extra_args=flags) as service:
        enable_etcd_auth(service.endpoint, pki, PASSWORD)
        yield service


def test_a_token_made_stale_by_a_change_of_users_is_cured_by_a_new_login(
    locked_etcd, pki, root_path
):
    """Any user or role added on the etcd makes every earlier token fail ("revision of auth
    store is old"): the metastore logs in again, as Go's clientv3 does."""
    files = {
        "enableTLS": True,
        "tlsCACertPath": str(pki.ca_file),
        "tlsCertPath": str(pki.client_cert),
        "tlsKeyPath": str(pki.client_key),
    }
    login = {"enableAuth": True, "username": ETCD_USER, "password": PASSWORD}
    store = store_of({"address": [locked_etcd.endpoint], **files, **login}, root_path)
    admin = connect_etcd(
        [locked_etcd.endpoint],
        username=ETCD_USER,
        password=PASSWORD,
        tls=EtcdTls(str(pki.ca_file), str(pki.client_cert), str(pki.client_key)),
    )
    try:
        store.create_task(task("t1"))
        name = f"user-{root_path.replace('/', '-')}"
        admin.authstub.UserAdd(etcdrpc.AuthUserAddRequest(name=name, password="x"), 5)
        store.create_task(task("t2"))  # refused for its old token, then sent again
        assert [t.task_id for t in store.list_tasks()] == ["t1", "t2"]
        store.heartbeat("m1", {"address": "x"}, ttl=30)
        admin.authstub.UserDelete(etcdrpc.AuthUserDeleteRequest(name=name), 5)
        store.heartbeat("m1", {"address": "x"}, ttl=30)  # a keep-alive, then a put
        assert "m1" in {m.member_id for m in store.members()}
    finally:
        admin.close()
        store.close()


def test_a_password_changed_on_etcd_and_in_the_configuration_is_read_again(
    pki, tmp_path, root_path
):
    """etcd's password changed (etcdctl user passwd) under a running metastore: its error
    names etcd's refusal until the configuration file has the new one, then the same store
    goes on, no restart (server/cli/serve.py reads the file again at a refused login)."""
    new_password = "Rotated-Etcd-Pa55-never-shown"
    tls = ServerTls(pki.server_cert, pki.server_key, pki.ca_file)
    files = EtcdTls(str(pki.ca_file), str(pki.client_cert), str(pki.client_key))
    with etcd_server(tmp_path / "etcd", tls=tls) as service:
        enable_etcd_auth(service.endpoint, pki, PASSWORD)
        config = tmp_path / "cdc.yaml"

        def configure(password: str) -> None:
            etcd = {
                "address": [service.endpoint],
                "enableTLS": True,
                "tlsCACertPath": files.ca_cert_path,
                "tlsCertPath": files.cert_path,
                "tlsKeyPath": files.key_path,
                "enableAuth": True,
                "username": ETCD_USER,
                "password": password,
            }
            store = {"storeType": "etcd", "etcd": etcd, "rootPath": root_path}
            config.write_text(yaml.safe_dump({"metaStoreConfig": store}))

        configure(PASSWORD)
        settings = load_settings(str(config), environ={})
        redactor = SecretRedactor()
        read_passwords_again(settings, str(config), {}, redactor)
        store = open_metastore(settings.metaStoreConfig)
        try:
            store.create_task(task("before"))
            admin = connect_etcd(
                [service.endpoint], username=ETCD_USER, password=PASSWORD, tls=files
            )
            change = etcdrpc.AuthUserChangePasswordRequest(name=ETCD_USER, password=new_password)
            admin.authstub.UserChangePassword(change, 5)
            admin.close()
            with pytest.raises(MetaStoreUnavailableError) as raised:
                store.list_tasks()
            assert str(raised.value) == (
                f"etcd metastore unavailable: {service.endpoint}: "
                "etcdserver: authentication failed, invalid user ID or password"
            )
            configure(new_password)
            store.create_task(task("after"))
            assert [t.task_id for t in store.list_tasks()] == ["after", "before"]
            assert redactor.scrub(f"x {new_password} y") == "x ****** y"
        finally:
            store.close()


def test_the_source_etcd_of_a_daemon_follows_a_rotation(tmp_path):
    """The source etcd client a daemon keeps for its tasks' catalog reads
    (server/tasks/engine.py) reads its files again after the rotation: the same context reads
    the catalog again, no restart."""
    rotation = Rotation(tmp_path)
    files = install_client(rotation.old, rotation.client_dir)
    with etcd_server(tmp_path / "etcd", tls=rotation.tls) as first:
        source = {
            "etcd": {"address": [first.endpoint], **files},
            "etcdRootPath": "no-source",
            "mqType": "rocksmq",
            "rocksmq": {"path": empty_rocksdb(tmp_path / "rmq")},
        }
        context = cluster_context(CdcSettings.model_validate({"sourceConfig": source}), None)
        assert context.catalog() == {}
    install_server(rotation.new, rotation.server_dir)
    install_client(rotation.new, rotation.client_dir)
    with etcd_server(tmp_path / "etcd", tls=rotation.tls, ports=(first.port, first.peer_port)):
        last: Exception | None = None
        deadline = time.monotonic() + 10 + RELOAD_CHECK_SECONDS
        while time.monotonic() < deadline:
            try:
                assert context.catalog() == {}
                return
            except SourceUnavailableError as exc:
                last = exc
                time.sleep(0.2)
        raise AssertionError(f"the catalog was never read again; last: {last}")
