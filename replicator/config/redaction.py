"""What of the configuration may be shown, logged or inherited: its secrets found and hidden."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from pydantic import BaseModel, SecretStr

from metastore.sql_urls import mysql_url_from_source
from replicator.config.connections import MetaStoreSettings
from replicator.config.settings import CLIENT_ENV, ENV_PREFIX, CdcSettings


def redacted(settings: CdcSettings) -> dict[str, Any]:
    """The merged configuration for display, secrets replaced by '******'."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    _redact_tree(data)
    return data


_SECRET_KEYS = {
    "password",
    "saslpassword",
    "tlskeypassword",
    "token",
    "authparams",
    "mysqlsourceurl",
    "key",
    "sha256",
}


def _redact_tree(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key.lower() in _SECRET_KEYS and value:
                node[key] = "******"
            else:
                _redact_tree(value)
    elif isinstance(node, list):
        for item in node:
            _redact_tree(item)


def secret_values(node: Any) -> list[str]:
    """Every secret the configuration holds, for the log redactor: each ``SecretStr`` (at any
    depth) and the password inside ``mysqlSourceUrl``, also as the URL spells it."""
    found: list[str] = []
    if isinstance(node, SecretStr):
        found.append(node.get_secret_value())
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            found.extend(secret_values(getattr(node, name)))
    elif isinstance(node, list | tuple):
        for item in node:
            found.extend(secret_values(item))
    elif isinstance(node, dict):
        for item in node.values():
            found.extend(secret_values(item))
    if isinstance(node, MetaStoreSettings) and node.mysqlSourceUrl.get_secret_value():
        # read without SQLAlchemy: `milvus-cdc task ...` reads the settings and loads no driver
        quoted = urlsplit(mysql_url_from_source(node.mysqlSourceUrl.get_secret_value())).password
        if quoted:
            password = unquote(quoted)
            found.extend([password, quote(password, safe="")])
    return [s for s in found if s]


def scrub_secret_environment(environ: MutableMapping[str, str]) -> list[str]:
    """Remove the ``CDC_`` variables once the settings are read: every configuration variable
    (a whole section such as ``CDC_SECRETS``, ``CDC_METASTORECONFIG``, ``CDC_CLUSTERS`` or
    ``CDC_AUTH`` holds secrets as well as a single key does) and the client's ``CDC_TOKEN``;
    only the client's ``CDC_CONFIG``, ``CDC_URL`` and ``CDC_CACERT`` stay. Child processes get
    an allow-list of variables besides (replicator/backfill/child_env.py). Returns the names
    removed."""
    removed = []
    for name in list(environ):
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in _KEPT_ENV:
            del environ[name]
            removed.append(name)
    return removed


_KEPT_ENV = CLIENT_ENV - {"CDC_TOKEN"}
