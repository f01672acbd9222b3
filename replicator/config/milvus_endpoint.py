"""A cluster's Milvus endpoint: the ``milvus`` block of ``sourceConfig`` and of each named
cluster, which backfill, verify and disaster recovery connect with.

Keys as pymilvus names them (``uri``, ``token`` or ``username``/``password``, ``secure`` and
the ``*_pem_path`` files), so a client's settings can be copied as they are. One-way TLS needs
the CA (``ca_pem_path``, or pymilvus's ``server_pem_path``); mutual TLS (Milvus's
``common.security.tlsMode: 2``) the CA and a client certificate and key as well.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import Field, PrivateAttr, SecretStr, model_validator

from replicator.config.section import ConfigSection

TLS_FILES = ("server_pem_path", "ca_pem_path", "client_pem_path", "client_key_path")


class SourceMilvusSettings(ConfigSection):
    """ours: the cluster's Milvus (gRPC) endpoint; backfill, verify and DR read through it."""

    uri: str = ""
    username: str = ""
    password: SecretStr = SecretStr("")
    token: SecretStr = SecretStr("")
    # ours: every proxy of the cluster (their uris), when clients reach several: a switchover's
    # fence is in effect once each of them refuses a write (each proxy picks up the quota on
    # its own); empty: ``uri`` alone
    proxies: list[str] = Field(default_factory=list)
    # TLS as pymilvus spells it: ``secure`` (implied by an https:// uri), the CA the server's
    # certificate chains to (``ca_pem_path``, or ``server_pem_path``; empty: the system's), a
    # client certificate and key for mutual TLS, the name to check in the server's certificate
    secure: bool = False
    server_pem_path: str = ""
    ca_pem_path: str = ""
    client_pem_path: str = ""
    client_key_path: str = ""
    server_name: str = ""
    # where the block is read again when the Milvus refuses the credentials in use (they were
    # changed there and in the file): the daemon's configuration (server/cli/serve.py)
    _read_again: Callable[[], SourceMilvusSettings] | None = PrivateAttr(default=None)

    @property
    def tls(self) -> bool:
        return self.secure or self.uri.startswith("https://")

    @property
    def source(self) -> Callable[[], SourceMilvusSettings] | None:
        """The block as the configuration says now (None: only the one given at start)."""
        return self._read_again

    def read_again_from(self, source: Callable[[], SourceMilvusSettings]) -> None:
        self._read_again = source

    @model_validator(mode="after")
    def _tls_consistent(self) -> SourceMilvusSettings:
        for key in TLS_FILES:
            path = getattr(self, key)
            if path and not self.tls:
                raise ValueError(f"milvus.{key} is set but TLS is off (an https:// uri or secure)")
            if path and not os.path.isfile(path):
                raise ValueError(f"milvus.{key}: no such file: {path}")
        if self.server_pem_path and self.ca_pem_path:
            raise ValueError(
                "milvus: give ca_pem_path or server_pem_path (both name the CA to trust), not both"
            )
        if bool(self.client_pem_path) != bool(self.client_key_path):
            raise ValueError("milvus.client_pem_path and milvus.client_key_path go together")
        if self.client_pem_path and not (self.ca_pem_path or self.server_pem_path):
            raise ValueError("milvus.client_pem_path: mutual TLS needs ca_pem_path as well")
        return self


def dial_config(milvus: SourceMilvusSettings) -> dict[str, str]:
    """The endpoint's TLS files as a task's ``dial_config`` spells them: the CA as
    ``ca_pem_path`` beside a client certificate (mutual TLS), else as ``server_pem_path``."""
    ca = milvus.ca_pem_path or milvus.server_pem_path
    dial = {"server_name": milvus.server_name}
    if milvus.client_pem_path:
        dial.update(
            ca_pem_path=ca,
            client_pem_path=milvus.client_pem_path,
            client_key_path=milvus.client_key_path,
        )
    else:
        dial["server_pem_path"] = ca
    return {key: value for key, value in dial.items() if value}


def milvus_param(milvus: SourceMilvusSettings) -> dict[str, Any]:
    """A cluster's Milvus endpoint shaped as a task's ``milvus_connect_param`` (``uri``,
    credentials, ``enable_tls``, ``dial_config``), which every Milvus client here reads
    (secrets revealed: never log it)."""
    return {
        "uri": milvus.uri,
        "username": milvus.username,
        "password": milvus.password.get_secret_value(),
        "token": milvus.token.get_secret_value(),
        "enable_tls": milvus.tls,
        "dial_config": dial_config(milvus),
    }
