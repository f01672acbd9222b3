"""Tokens and roles (server/http/auth.py) and their settings, without a server."""

from __future__ import annotations

import hashlib
import logging

import pytest

from replicator.config.redaction import redacted, scrub_secret_environment, secret_values
from replicator.config.security import AuthSettings
from replicator.config.settings import ConfigError, load_settings
from server.errors import ForbiddenError, UnauthorizedError
from server.http.auth import ANONYMOUS, Authenticator, Principal, challenge, listen_host

ADMIN = "a" * 20
VIEWER = "v" * 20


def settings(**auth: object) -> AuthSettings:
    tokens = [
        {"name": "ops", "role": "admin", "token": ADMIN},
        {"name": "watch", "role": "viewer", "sha256": hashlib.sha256(VIEWER.encode()).hexdigest()},
    ]
    return AuthSettings.model_validate({"tokens": tokens, **auth})


def test_tokens_are_kept_as_hashes_only():
    loaded = settings()
    assert ADMIN not in repr(loaded) and ADMIN not in str(loaded.model_dump())
    assert loaded.tokens[0].sha256 == hashlib.sha256(ADMIN.encode()).hexdigest()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"Bearer {ADMIN}", Principal("ops", "admin")),
        (f"bearer   {ADMIN}  ", Principal("ops", "admin")),
        (f"BEARER {VIEWER}", Principal("watch", "viewer")),
    ],
)
def test_identify_known_tokens(header, expected):
    assert Authenticator(settings()).identify(header) == expected


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", f"Basic {ADMIN}", f"Bearer{ADMIN}", "Bearer x", "Bearer é✓🔑",
     "Bearer \udcff", f"Bearer {ADMIN}x", "Bearer " + "A" * 100_000],
)  # fmt: skip
def test_identify_refuses_with_401(header):
    with pytest.raises(UnauthorizedError) as refused:
        Authenticator(settings()).identify(header)
    assert challenge(refused.value)["WWW-Authenticate"].startswith('Bearer realm="milvus-cdc"')


def test_anonymous_rules():
    assert Authenticator(AuthSettings()).identify(None) == ANONYMOUS  # nothing configured
    assert Authenticator(AuthSettings()).identify("Bearer anything") == ANONYMOUS
    allowed = Authenticator(settings(allowAnonymous=True))
    assert allowed.identify(None) == ANONYMOUS
    with pytest.raises(UnauthorizedError):
        allowed.identify("Bearer wrong-token")
    assert not Authenticator(AuthSettings(protectMetrics=True)).protect_metrics  # nothing to ask


def test_challenge_names_an_invalid_token():
    with pytest.raises(UnauthorizedError) as refused:
        Authenticator(settings()).identify("Bearer wrong-token")
    assert challenge(refused.value) == {
        "WWW-Authenticate": 'Bearer realm="milvus-cdc", error="invalid_token"'
    }
    assert challenge(UnauthorizedError("no token")) == {
        "WWW-Authenticate": 'Bearer realm="milvus-cdc"'
    }
    assert challenge(ForbiddenError("no")) == {}


@pytest.mark.parametrize(
    ("host", "auth", "expected"),
    [
        ("0.0.0.0", {}, "127.0.0.1"),
        ("::", {}, "127.0.0.1"),
        ("10.1.2.3", {}, "127.0.0.1"),
        ("127.0.0.1", {}, "127.0.0.1"),
        ("::1", {}, "::1"),
        ("localhost", {}, "localhost"),
        ("0.0.0.0", {"allowAnonymous": True}, "0.0.0.0"),
        ("0.0.0.0", {"tokens": [{"name": "a", "role": "admin", "token": ADMIN}]}, "0.0.0.0"),
    ],
)
def test_listen_host(host, auth, expected, caplog):
    with caplog.at_level(logging.WARNING):
        assert listen_host(host, AuthSettings.model_validate(auth)) == expected
    if not auth.get("tokens"):
        assert "unauthenticated" in caplog.text


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"CDC_AUTH__TOKENS": "[{name: a, role: admin, token: short}]"},
            "auth.tokens.0: token: must be a string of at least 16 characters",
        ),
        (
            {"CDC_AUTH__TOKENS": "[{name: a, role: root, token: aaaaaaaaaaaaaaaaaaaa}]"},
            "auth.tokens.0.role",
        ),
        (
            {"CDC_AUTH__TOKENS": f"[{{name: a, role: admin, token: {ADMIN}, sha256: x}}]"},
            "give token or sha256, not both",
        ),
        (
            {"CDC_AUTH__TOKENS": "[{name: a, role: admin, sha256: abc}]"},
            "auth.tokens.0.sha256",
        ),
        (
            {
                "CDC_AUTH__TOKENS": f"[{{name: a, role: admin, token: {ADMIN}}},"
                f" {{name: a, role: viewer, token: {VIEWER}}}]"
            },
            "auth.tokens: token names must be distinct",
        ),
        ({"CDC_TLS__CERTFILE": "/x.pem"}, "tls: certFile and keyFile go together"),
    ],
)
def test_bad_auth_settings_name_the_key(environ, message):
    with pytest.raises(ConfigError) as refused:
        load_settings(environ=environ)
    assert message in str(refused.value)
    assert ADMIN not in str(refused.value)


def test_client_variables_are_not_configuration_keys_and_tokens_are_redacted():
    loaded = load_settings(
        environ={
            "CDC_URL": "http://h:1",
            "CDC_TOKEN": ADMIN,
            "CDC_CACERT": "/ca.pem",
            "CDC_AUTH__TOKENS": f"[{{name: ops, role: admin, token: {ADMIN}}}]",
            "CDC_SECRETS__KEY": "k1:" + "A" * 43 + "=",
        }
    )
    shown = redacted(loaded)
    assert shown["auth"]["tokens"] == [{"name": "ops", "role": "admin", "sha256": "******"}]
    assert shown["secrets"]["key"] == "******"


def test_every_secret_setting_reaches_the_log_redactor():
    secrets = {
        "CDC_SOURCECONFIG__MILVUS__PASSWORD": "src-milvus-password",
        "CDC_SOURCECONFIG__MILVUS__TOKEN": "src-milvus-token",
        "CDC_SOURCECONFIG__ETCD__PASSWORD": "src-etcd-password",
        "CDC_SOURCECONFIG__PULSAR__AUTHPARAMS": "token:pulsar-secret",
        "CDC_METASTORECONFIG__ETCD__PASSWORD": "meta-etcd-password",
        "CDC_METASTORECONFIG__MYSQLSOURCEURL": "root:my/sql@pw@tcp(db:3306)/cdc",
    }
    loaded = load_settings(environ={**secrets, "CDC_METASTORECONFIG__STORETYPE": "mysql"})
    found = secret_values(loaded)
    for value in secrets.values():
        assert value in found
    assert "my/sql@pw" in found and "my%2Fsql%40pw" in found  # the password alone, both ways
    shown = str(redacted(loaded))
    for value in [*secrets.values(), "my/sql@pw"]:
        assert value not in shown


def test_configuration_variables_are_removed_once_read():
    """Whole sections hold secrets as single keys do: every configuration variable goes, and
    the client's token; the client's address, CA and configuration file stay."""
    environ = {
        "CDC_AUTH__TOKENS": "[...]",
        "CDC_SECRETS__KEY": "k1:...",
        "CDC_SECRETS": "{key: 'k1:...'}",
        "CDC_AUTH": "{tokens: [...]}",
        "CDC_METASTORECONFIG": "{mysqlSourceUrl: 'root:pw@tcp(h)/db'}",
        "CDC_CLUSTERS": "{a: {milvus: {password: pw}}}",
        "cdc_sourceConfig__milvus__password": "pw",
        "CDC_METASTORECONFIG__MYSQLSOURCEURL": "root:pw@tcp(h)/db",
        "CDC_ADDRESS": "0.0.0.0:8444",
        "CDC_TOKEN": "the CLI's",
        "CDC_URL": "http://h:1",
        "CDC_CACERT": "/ca.pem",
        "CDC_CONFIG": "/cdc.yaml",
        "HOME": "/root",
    }
    removed = scrub_secret_environment(environ)
    assert sorted(environ) == ["CDC_CACERT", "CDC_CONFIG", "CDC_URL", "HOME"]
    assert len(removed) == 10
