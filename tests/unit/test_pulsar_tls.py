"""Pulsar TLS settings (trust certificates, hostname verification, insecure connections, a
client certificate) reach pulsar-client's ``Client`` as its own arguments. No Pulsar broker
runs here: the mapping is checked, and a real client is built with it (it connects lazily)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pydantic import ValidationError

from replicator.config.connections import PulsarSettings
from replicator.sources.pulsar import PulsarSource
from replicator.sources.pulsar_auth import PulsarTls, tls_client_args

SECRET = "pulsar-token-never-shown"


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca", "client", "client-key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("not read before the client connects\n")
        files[name] = str(path)
    return files


def test_tls_settings_map_to_the_client_arguments(pem: dict[str, str]) -> None:
    tls = PulsarTls(
        trust_certs_file=pem["ca"],
        validate_hostname=True,
        allow_insecure=False,
        cert_file=pem["client"],
        key_file=pem["client-key"],
    )
    assert tls_client_args("pulsar+ssl://broker:6651", tls) == {
        "use_tls": True,
        "tls_trust_certs_file_path": pem["ca"],
        "tls_validate_hostname": True,
        "tls_allow_insecure_connection": False,
        "tls_certificate_file_path": pem["client"],
        "tls_private_key_file_path": pem["client-key"],
    }
    insecure = PulsarTls(validate_hostname=False, allow_insecure=True)
    assert tls_client_args("pulsar+ssl://broker:6651", insecure) == {
        "use_tls": True,
        "tls_validate_hostname": False,
        "tls_allow_insecure_connection": True,
    }
    # a plain URL (a WAL switch may name one) gets none of them
    assert tls_client_args("pulsar://broker:6650", tls) == {}


def test_the_daemon_settings_reach_a_real_client(
    pem: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = PulsarSettings.model_validate(
        {
            "address": "pulsar+ssl://127.0.0.1:1",
            "authPlugin": "token",
            "authParams": f"token:{SECRET}",
            "tlsTrustCertsFilePath": pem["ca"],
            "tlsEnableHostnameVerification": False,
        }
    )
    made: list[dict[str, Any]] = []
    real = pulsar.Client

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(pulsar, "Client", spy)
    source = PulsarSource(**settings.source_kwargs())
    client = source.new_client()  # a real client: pulsar-client took the arguments
    client.close()
    assert made[0]["use_tls"] is True
    assert made[0]["tls_trust_certs_file_path"] == pem["ca"]
    assert made[0]["tls_validate_hostname"] is False
    assert made[0]["tls_allow_insecure_connection"] is False
    assert SECRET not in repr(source)


def test_hostname_verification_is_on_by_default() -> None:
    kwargs = PulsarSettings(address="pulsar+ssl://broker:6651").source_kwargs()
    args = tls_client_args(kwargs["address"], PulsarTls(**kwargs["tls"]))
    assert args["tls_validate_hostname"] is True
    assert args["tls_allow_insecure_connection"] is False


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"address": "pulsar://broker:6650", "tlsTrustCertsFilePath": "ca"},
            "pulsar.tlsTrustCertsFilePath is set but pulsar.address is not pulsar+ssl://",
        ),
        (
            {"address": "pulsar+ssl://broker:6651", "tlsTrustCertsFilePath": "/no/such/ca.pem"},
            "pulsar.tlsTrustCertsFilePath: no such file: /no/such/ca.pem",
        ),
        (
            {"address": "pulsar+ssl://broker:6651", "tlsCertificateFilePath": "CERT"},
            "pulsar.tlsCertificateFilePath and pulsar.tlsKeyFilePath go together",
        ),
    ],
)
def test_tls_settings_that_cannot_work_are_refused_by_name(
    settings: dict[str, str], message: str, pem: dict[str, str]
) -> None:
    given = {k: pem["client"] if v == "CERT" else v for k, v in settings.items()}
    with pytest.raises(ValidationError, match=re.escape(message)):
        PulsarSettings.model_validate(given)
