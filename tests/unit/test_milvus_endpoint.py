"""A cluster's Milvus endpoint (``clusters.<name>.milvus``): its TLS settings checked at start,
and turned into what pymilvus reads (which trusts the CA and sends the client certificate only
when each file is under the name it looks for); its secrets kept out of the Spark drivers'
logs."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from replicator.config.connections import SourceSettings
from replicator.config.milvus_endpoint import SourceMilvusSettings, milvus_param
from replicator.log_redaction import connect_secrets, redact_root_logging
from replicator.sinks.milvus_channel import client_kwargs


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    made = {}
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("not read here\n")
        made[name] = str(tmp_path / name)
    return made


@pytest.mark.parametrize(
    ("milvus", "message"),
    [
        (
            {"uri": "http://m:19530", "ca_pem_path": "ca.pem"},
            "milvus.ca_pem_path is set but TLS is off",
        ),
        ({"uri": "https://m:443", "ca_pem_path": "/no/ca.pem"}, "milvus.ca_pem_path: no such file"),
        (
            {"uri": "https://m:443", "ca_pem_path": "ca.pem", "server_pem_path": "ca.pem"},
            "give ca_pem_path or server_pem_path",
        ),
        (
            {"uri": "https://m:443", "ca_pem_path": "ca.pem", "client_pem_path": "client.pem"},
            "milvus.client_pem_path and milvus.client_key_path go together",
        ),
        (
            {
                "uri": "http://m:19530",
                "secure": True,
                "client_pem_path": "client.pem",
                "client_key_path": "client.key",
            },
            "mutual TLS needs ca_pem_path as well",
        ),
    ],
)
def test_milvus_tls_settings_that_cannot_work_are_refused_by_name(
    files: dict[str, str], milvus: dict, message: str
) -> None:
    given = {k: files.get(v, v) if k.endswith("_path") else v for k, v in milvus.items()}
    with pytest.raises(ValueError, match=message):
        SourceSettings.model_validate({"milvus": given})


def test_one_way_tls_puts_the_ca_where_pymilvus_trusts_it(files: dict[str, str]) -> None:
    """pymilvus ignores a ``ca_pem_path`` given without a client certificate."""
    milvus = SourceMilvusSettings(uri="https://m:443", token="u:p", ca_pem_path=files["ca.pem"])
    assert client_kwargs(milvus_param(milvus)) == {
        "uri": "https://m:443",
        "token": "u:p",
        "server_pem_path": files["ca.pem"],
    }


def test_mutual_tls_sends_the_client_certificate_whatever_the_ca_is_called(
    files: dict[str, str],
) -> None:
    """pymilvus sends no client certificate when ``server_pem_path`` is set."""
    milvus = SourceMilvusSettings(
        uri="http://m:19530",
        secure=True,
        username="cdc",
        password="secret",
        server_pem_path=files["ca.pem"],
        client_pem_path=files["client.pem"],
        client_key_path=files["client.key"],
        server_name="milvus.example",
    )
    assert client_kwargs(milvus_param(milvus)) == {
        "uri": "https://m:19530",
        "user": "cdc",
        "password": "secret",
        "server_name": "milvus.example",
        "ca_pem_path": files["ca.pem"],
        "client_pem_path": files["client.pem"],
        "client_key_path": files["client.key"],
    }


def test_a_spark_driver_logs_no_password_or_token_it_was_handed() -> None:
    """The backfill's and a Spark verify's drivers redact the Milvus secrets they get on stdin
    from every line their root logger writes (a pymilvus error quoting a request, say)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    connects = [{"username": "cdc", "password": "pw-4711"}, {"token": "cdc:tok-0815"}]
    redactor = redact_root_logging(connect_secrets(*connects))
    try:
        logging.getLogger("replicator.backfill").warning("refused cdc:tok-0815 and %s", "pw-4711")
        assert out.getvalue() == "refused ****** and ******\n"
        assert redactor.scrub("ValueError: pw-4711") == "ValueError: ******"
    finally:
        root.removeHandler(handler)
        for other in root.handlers:  # pytest's own
            other.removeFilter(redactor)
