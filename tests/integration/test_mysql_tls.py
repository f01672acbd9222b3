"""MariaDB as the MySQL metastore over TLS: users that must use TLS (``REQUIRE SSL``) and
show a client certificate (``REQUIRE X509``), reached through the SQLAlchemy URL's ``ssl_*``
options and the Go DSN's ``tls``; a wrong CA, an expired certificate, another host's
certificate and a wrong password named with the endpoint, word for word."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from harness.secure_stores import MYSQL_TLS_USER, MYSQL_X509_USER, SecureMariaDB, secure_mariadb
from harness.tls import Pki, make_test_pki

from metastore import MetaStoreUnavailableError, TaskRecord, TaskState
from metastore.sql import SqlMetaStore
from metastore.sql_urls import mysql_url_from_source
from replicator.config.connections import MetaStoreSettings
from replicator.config.settings import load_settings
from replicator.config.stores import describe_metastore, open_metastore
from replicator.log_redaction import SecretRedactor
from server.cli.serve import read_passwords_again

pytestmark = pytest.mark.integration

PASSWORD = "Maria-Pa55-never-shown"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_test_pki(tmp_path_factory.mktemp("mysql-pki"))


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[SecureMariaDB]:
    with secure_mariadb(tmp_path_factory.mktemp("mariadb-tls"), pki, PASSWORD) as db:
        yield db


def settings(source: str, root: str) -> MetaStoreSettings:
    return MetaStoreSettings.model_validate(
        {"storeType": "mysql", "mysqlSourceUrl": source, "rootPath": root}
    )


def uses_tls(store: object) -> str:
    """The cipher of the store's own connection (empty: plaintext)."""
    assert isinstance(store, SqlMetaStore)
    with store._engine.connect() as conn:
        row = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'").first()
    return str(row[1]) if row else ""


def test_mysql_metastore_over_tls_with_a_ca_and_a_client_certificate(mariadb, pki, root_path):
    port, db = mariadb.service.port, mariadb.service.database
    forms = {
        # one-way TLS, the SQLAlchemy URL's spelling
        "url": mariadb.url(MYSQL_TLS_USER, ssl_ca=str(pki.ca_file)),
        # mutual TLS, the Go tool's DSN with our files
        "dsn": (
            f"{MYSQL_X509_USER}:{PASSWORD}@tcp(127.0.0.1:{port})/{db}?charset=utf8&tls=true"
            f"&ssl_ca={pki.ca_file}&ssl_cert={pki.client_cert}&ssl_key={pki.client_key}"
        ),
    }
    for form, source in forms.items():
        config = settings(source, f"{root_path}-{form}")
        store = open_metastore(config)
        try:
            assert store.list_tasks() == []
            assert uses_tls(store), form
        finally:
            store.close()
        where = f"mysql://127.0.0.1:{port}/{db} (TLS) (rootPath {root_path}-{form})"
        assert describe_metastore(config) == where


def denied(user: str) -> str:
    return f"(1045, \"Access denied for user '{user}'@'127.0.0.1' (using password: YES)\")"


def test_mysql_metastore_refusals_name_endpoint_and_reason(mariadb, pki, root_path):
    port, db = mariadb.service.port, mariadb.service.database
    where = f"cannot open the SQL metastore mysql://127.0.0.1:{port}/{db} (TLS): "
    verify = (
        "(2003, \"Can't connect to MySQL server on '127.0.0.1' ([SSL: CERTIFICATE_VERIFY_FAILED] "
        "certificate verify failed: "
    )
    cases = {
        "wrong CA": (
            (pki.server_cert, pki.server_key),
            mariadb.url(MYSQL_TLS_USER, ssl_ca=str(pki.other_ca_file)),
            verify + 'self-signed certificate in certificate chain)")',  # the server sends its CA
        ),
        "wrong password": (
            (pki.server_cert, pki.server_key),
            mariadb.url(MYSQL_TLS_USER, ssl_ca=str(pki.ca_file)).replace(PASSWORD, "not-it"),
            denied(MYSQL_TLS_USER),
        ),
        "no client certificate": (
            (pki.server_cert, pki.server_key),
            mariadb.url(MYSQL_X509_USER, ssl_ca=str(pki.ca_file)),
            denied(MYSQL_X509_USER),
        ),
        "expired": (
            (pki.expired_cert, pki.expired_key),
            mariadb.url(MYSQL_TLS_USER, ssl_ca=str(pki.ca_file)),
            verify + 'certificate has expired)")',
        ),
        "wrong host": (
            (pki.wrong_host_cert, pki.wrong_host_key),
            mariadb.url(MYSQL_TLS_USER, ssl_ca=str(pki.ca_file)),
            verify + "IP address mismatch, certificate is not valid for '127.0.0.1'.)\")",
        ),
    }
    try:
        for case, (served, source, reason) in cases.items():
            mariadb.serve_certificate(*served)
            with pytest.raises(MetaStoreUnavailableError) as raised:
                SqlMetaStore(mysql_url_from_source(source), root_path, connect_timeout=3)
            assert str(raised.value) == where + reason, case
            assert PASSWORD not in str(raised.value)
    finally:
        mariadb.serve_certificate(pki.server_cert, pki.server_key)


def test_mysql_tls_settings_that_cannot_work_are_refused_by_name(pki, tmp_path):
    missing = tmp_path / "no-ca.pem"
    with pytest.raises(ValueError, match=f"mysqlSourceUrl: ssl_ca: no such file: {missing}"):
        mysql_url_from_source(f"mysql+pymysql://u:p@db/cdc?ssl_ca={missing}")
    with pytest.raises(ValueError, match="ssl_cert and ssl_key go together"):
        mysql_url_from_source(f"u:p@tcp(db:3306)/cdc?ssl_cert={pki.client_cert}")
    with pytest.raises(ValueError, match="tls=custom names a TLS configuration"):
        mysql_url_from_source("u:p@tcp(db:3306)/cdc?tls=custom")
    assert mysql_url_from_source("u:p@tcp(db:3306)/cdc?tls=skip-verify") == (
        "mysql+pymysql://u:p@db:3306/cdc?ssl_check_hostname=false&insecure_skip_verify=true"
    )
    with pytest.raises(ValueError, match="insecure_skip_verify=true turns off the verification"):
        mysql_url_from_source(f"u:p@tcp(db)/cdc?ssl_ca={pki.ca_file}&insecure_skip_verify=true")
    with pytest.raises(ValueError, match="insecure_skip_verify=yes: expected true or false"):
        mysql_url_from_source("mysql+pymysql://u:p@db/cdc?insecure_skip_verify=yes")


def test_a_password_changed_on_mysql_and_in_the_configuration_is_read_again(
    mariadb, pki, root_path, tmp_path
):
    """The store user's password changed on MariaDB (its connections ended, as a restart
    does): the store's error names the refusal until the configuration file has the new one,
    then the same store goes on (server/cli/serve.py reads the file again when refused)."""
    user, new = "cdc_rotated", "Maria-Rotated-Pa55-never-shown"
    mariadb.as_root(
        f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}' REQUIRE SSL",
        f"GRANT ALL PRIVILEGES ON `{mariadb.service.database}`.* TO '{user}'@'127.0.0.1'",
    )
    config = tmp_path / "cdc.yaml"

    def configure(password: str) -> None:
        url = mariadb.url(user, ssl_ca=str(pki.ca_file)).replace(PASSWORD, password)
        store = {"storeType": "mysql", "mysqlSourceUrl": url, "rootPath": root_path}
        config.write_text(yaml.safe_dump({"metaStoreConfig": store}))

    configure(PASSWORD)
    loaded = load_settings(str(config), environ={})
    read_passwords_again(loaded, str(config), {}, SecretRedactor())
    store = open_metastore(loaded.metaStoreConfig)
    try:
        store.create_task(TaskRecord("before", TaskState.PAUSED, "", {}, 1.0, 1.0))
        mariadb.as_root(f"ALTER USER '{user}'@'127.0.0.1' IDENTIFIED BY '{new}'")
        mariadb.kill_connections(user)
        with pytest.raises(MetaStoreUnavailableError) as raised:
            store.list_tasks()
        assert "Access denied for user 'cdc_rotated'@'127.0.0.1'" in str(raised.value)
        configure(new)
        store.create_task(TaskRecord("after", TaskState.PAUSED, "", {}, 1.0, 1.0))
        assert [t.task_id for t in store.list_tasks()] == ["after", "before"]
    finally:
        store.close()


def test_a_client_certificate_without_a_ca_verifies_the_server_against_the_system_store(
    mariadb, pki, root_path, caplog
):
    """PyMySQL verifies nothing without a CA: a client certificate alone used to connect to
    whoever posed as the server (CERT_NONE) and send it the password. The server's certificate
    is now checked against the system's CAs, which do not hold the test CA: refused, in both
    spellings. Turned off only by name, with a warning at every start."""
    port, db = mariadb.service.port, mariadb.service.database
    files = {"ssl_cert": str(pki.client_cert), "ssl_key": str(pki.client_key)}
    forms = {
        "url": mariadb.url(MYSQL_X509_USER, **files),
        "dsn": (
            f"{MYSQL_X509_USER}:{PASSWORD}@tcp(127.0.0.1:{port})/{db}"
            f"?ssl_cert={pki.client_cert}&ssl_key={pki.client_key}"
        ),
    }
    where = f"cannot open the SQL metastore mysql://127.0.0.1:{port}/{db} (TLS): "
    for form, source in forms.items():
        with pytest.raises(MetaStoreUnavailableError) as raised:
            open_metastore(settings(source, f"{root_path}-{form}"))
        assert str(raised.value) == where + (
            "(2003, \"Can't connect to MySQL server on '127.0.0.1' ([SSL: "
            "CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in "
            'certificate chain)")'
        ), form
        assert PASSWORD not in str(raised.value)

    lax = settings(mariadb.url(MYSQL_X509_USER, **files, insecure_skip_verify="true"), root_path)
    caplog.set_level("WARNING", logger="replicator.config.stores")
    store = open_metastore(lax)
    try:
        assert store.list_tasks() == [] and uses_tls(store)
    finally:
        store.close()
    label = f"mysql://127.0.0.1:{port}/{db} (TLS, server not verified)"
    assert describe_metastore(lax) == f"{label} (rootPath {root_path})"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "metaStoreConfig.mysqlSourceUrl: insecure_skip_verify (or tls=skip-verify): the MySQL "
        f"metastore {label} is reached over TLS without verifying its certificate; whoever "
        "poses as it receives the password"
    ]
