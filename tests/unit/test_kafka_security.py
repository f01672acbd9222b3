"""The source's Kafka security: milvus.yaml's keys, checked, mapped to librdkafka, hidden."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from replicator.config.connections import KafkaSettings
from replicator.config.redaction import redacted, scrub_secret_environment, secret_values
from replicator.config.settings import ConfigError, load_settings
from replicator.sources.factory import WalDefaults, open_source
from replicator.sources.kafka import KafkaSource


@pytest.fixture
def pem(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text("not read until a client connects\n")
    return str(path)


def test_no_security_is_plaintext_and_sets_nothing_else() -> None:
    assert KafkaSettings(address="k:9092").client_config() == {
        "bootstrap.servers": "k:9092",
        "security.protocol": "plaintext",
    }


def test_sasl_over_tls_maps_every_key_to_librdkafka(pem: str) -> None:
    kafka = KafkaSettings(
        address="k:9093",
        saslUsername="cdc",
        saslPassword="pw-1",
        saslMechanisms="SCRAM-SHA-512",
        ssl={
            "enabled": True,
            "tlsCaCert": pem,
            "tlsCert": pem,
            "tlsKey": pem,
            "tlsKeyPassword": "pw-2",
        },
    )
    assert kafka.security_protocol == "SASL_SSL"
    assert kafka.client_config() == {
        "bootstrap.servers": "k:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "cdc",
        "sasl.password": "pw-1",
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.ca.location": pem,
        "ssl.certificate.location": pem,
        "ssl.key.location": pem,
        "ssl.key.password": "pw-2",
    }


def test_the_protocol_follows_the_user_and_ssl_enabled_unless_given(pem: str) -> None:
    user = {"saslUsername": "u", "saslPassword": "p", "saslMechanisms": "PLAIN"}
    assert KafkaSettings(**user).security_protocol == "SASL_PLAINTEXT"
    assert KafkaSettings(ssl={"enabled": True}).security_protocol == "SSL"
    assert KafkaSettings(securityProtocol="SSL", ssl={"tlsCaCert": pem}).security_protocol == "SSL"


def test_hostname_verification_is_on_unless_turned_off() -> None:
    on = KafkaSettings(ssl={"enabled": True}).client_security()
    off = KafkaSettings(ssl={"enabled": True, "verifyHostname": False}).client_security()
    assert on["ssl.endpoint.identification.algorithm"] == "https"
    assert off["ssl.endpoint.identification.algorithm"] == "none"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"saslMechanisms": "PLAIN"},
            "kafka.saslMechanisms is set but kafka.saslUsername is empty",
        ),
        (
            {"securityProtocol": "SASL_SSL"},
            "kafka.securityProtocol SASL_SSL needs kafka.saslUsername",
        ),
        (
            {"saslUsername": "u", "saslMechanisms": "PLAIN"},
            "kafka.saslUsername is set but kafka.saslPassword is empty",
        ),
        (
            {"saslUsername": "u", "saslPassword": "p"},
            "kafka.saslUsername is set but kafka.saslMechanisms is empty "
            "(PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)",
        ),
        (
            {
                "saslUsername": "u",
                "saslPassword": "p",
                "saslMechanisms": "PLAIN",
                "securityProtocol": "SSL",
            },
            "kafka.saslUsername is set but kafka.securityProtocol is SSL "
            "(SASL_PLAINTEXT or SASL_SSL use it)",
        ),
        (
            {"securityProtocol": "PLAINTEXT", "ssl": {"enabled": True}},
            "kafka.ssl.enabled is true but kafka.securityProtocol is PLAINTEXT "
            "(SSL or SASL_SSL use TLS)",
        ),
        (
            {"ssl": {"enabled": True, "tlsCaCert": "/nowhere/ca.pem"}},
            "kafka.ssl.tlsCaCert: no such file: /nowhere/ca.pem",
        ),
        (
            {"ssl": {"tlsCaCert": "/nowhere/ca.pem"}},
            "kafka.ssl.tlsCaCert is set but TLS is off (kafka.ssl.enabled)",
        ),
        ({"saslMechanisms": "GSSAPI"}, "saslMechanisms"),
    ],
)
def test_contradictions_are_errors_naming_the_key(settings: dict, message: str) -> None:
    with pytest.raises(ValidationError) as error:
        KafkaSettings(address="k:9092", **settings)
    assert message in str(error.value)


def test_a_cert_without_its_key_is_an_error(pem: str) -> None:
    with pytest.raises(ValidationError) as error:
        KafkaSettings(ssl={"enabled": True, "tlsCert": pem})
    assert "kafka.ssl.tlsCert and kafka.ssl.tlsKey go together" in str(error.value)


def test_a_bad_cluster_kafka_is_an_error_at_load_naming_where() -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(
            None,
            {
                "CDC_SOURCECONFIG__KAFKA__ADDRESS": "k:9092",
                "CDC_SOURCECONFIG__KAFKA__SECURITYPROTOCOL": "PLAINTEXT",
                "CDC_SOURCECONFIG__KAFKA__SSL__ENABLED": "true",
            },
        )
    assert "sourceConfig.kafka" in str(error.value)
    assert "kafka.ssl.enabled is true but kafka.securityProtocol is PLAINTEXT" in str(error.value)


def test_the_passwords_are_secrets_hidden_from_display_and_the_environment(pem: str) -> None:
    environ = {
        "CDC_SOURCECONFIG__KAFKA__ADDRESS": "k:9093",
        "CDC_SOURCECONFIG__KAFKA__SASLUSERNAME": "cdc",
        "CDC_SOURCECONFIG__KAFKA__SASLPASSWORD": "kafka-sasl-hunter2",
        "CDC_SOURCECONFIG__KAFKA__SASLMECHANISMS": "PLAIN",
        "CDC_SOURCECONFIG__KAFKA__SSL__ENABLED": "true",
        "CDC_SOURCECONFIG__KAFKA__SSL__TLSCERT": pem,
        "CDC_SOURCECONFIG__KAFKA__SSL__TLSKEY": pem,
        "CDC_SOURCECONFIG__KAFKA__SSL__TLSKEYPASSWORD": "kafka-key-hunter3",
    }
    settings = load_settings(None, environ)
    shown = redacted(settings)["sourceConfig"]["kafka"]
    assert shown["saslPassword"] == "******"
    assert shown["ssl"]["tlsKeyPassword"] == "******"
    assert "hunter" not in str(redacted(settings))
    assert {"kafka-sasl-hunter2", "kafka-key-hunter3"} <= set(secret_values(settings))
    removed = scrub_secret_environment(environ)  # every configuration variable, once read
    assert {
        "CDC_SOURCECONFIG__KAFKA__SASLPASSWORD",
        "CDC_SOURCECONFIG__KAFKA__SSL__TLSKEYPASSWORD",
    } <= set(removed)
    assert environ == {}


def _config_of(source: object) -> dict:
    assert isinstance(source, KafkaSource)
    return dict(source._config)


@pytest.fixture
def configured() -> dict[str, str]:
    return KafkaSettings(
        saslUsername="cdc", saslPassword="pw", saslMechanisms="SCRAM-SHA-256"
    ).client_security()


@pytest.fixture
def defaults(configured: dict[str, str]) -> WalDefaults:
    return WalDefaults(
        kafka_address="old:9092", kafka_extra={"fetch.wait.max.ms": 20, **configured}
    )


def test_a_wal_switch_naming_no_security_uses_the_clusters_own(
    configured: dict[str, str], defaults: WalDefaults
) -> None:
    switched = _config_of(open_source("kafka", {"address": "new:9092"}, defaults))
    assert switched == {"bootstrap.servers": "new:9092", "fetch.wait.max.ms": 20, **configured}


def test_a_wal_switch_naming_its_security_uses_that_alone(defaults: WalDefaults) -> None:
    message = {"address": "new:9092", "security_protocol": "SSL"}
    switched = _config_of(open_source("kafka", message, defaults))
    assert switched == {
        "bootstrap.servers": "new:9092",
        "fetch.wait.max.ms": 20,
        "security.protocol": "SSL",
    }


def test_milvus_yaml_s_block_with_its_empty_keys_loads_as_it_is() -> None:
    block = yaml.safe_load(
        "address: k:9092\nsaslUsername:\nsaslPassword:\nsaslMechanisms:\nsecurityProtocol:\n"
        "ssl:\n  enabled: false\n  tlsCert:\n  tlsKey:\n  tlsCaCert:\n  tlsKeyPassword:\n"
    )
    assert KafkaSettings.model_validate(block).security_protocol == "PLAINTEXT"
