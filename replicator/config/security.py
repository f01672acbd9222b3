"""Who may call the daemon and how it keeps secrets: API tokens, TLS, the secrets' key ring."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from replicator.config.section import ConfigSection

MIN_TOKEN_LENGTH = 16


def token_digest(token: str) -> str:
    """The sha256 of an API token, as ``auth.tokens[].sha256`` holds it."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenSettings(ConfigSection):
    """ours: one API token. ``token`` is hashed as soon as it is read (sha256; only the hash is
    kept); ``sha256`` gives the hash itself, so the file need not hold the token."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Literal["admin", "viewer"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="before")
    @classmethod
    def _hash_token(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or "token" not in data:
            return data
        entry = dict(data)
        token = entry.pop("token")
        if isinstance(token, SecretStr):
            token = token.get_secret_value()
        if "sha256" in entry:
            raise ValueError("give token or sha256, not both")
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"token: must be a string of at least {MIN_TOKEN_LENGTH} characters")
        entry["sha256"] = token_digest(token)
        return entry


class AuthSettings(ConfigSection):
    """ours: who may call the API (see README, "Security")."""

    tokens: list[TokenSettings] = Field(default_factory=list)
    # no token configured: the daemon listens on 127.0.0.1 only, unless this is true
    allowAnonymous: bool = False
    # true: /metrics asks for a token too (viewer or admin)
    protectMetrics: bool = False

    @field_validator("tokens")
    @classmethod
    def _distinct(cls, tokens: list[TokenSettings]) -> list[TokenSettings]:
        names = [t.name for t in tokens]
        if len(set(names)) != len(names):
            raise ValueError("token names must be distinct")
        if len({t.sha256 for t in tokens}) != len(tokens):
            raise ValueError("two tokens are the same")
        return tokens


class TlsSettings(ConfigSection):
    """ours: serve HTTPS with this certificate (chain) and key, both PEM files."""

    certFile: str = ""
    keyFile: str = ""

    @model_validator(mode="after")
    def _both(self) -> TlsSettings:
        if bool(self.certFile) != bool(self.keyFile):
            raise ValueError("certFile and keyFile go together: give both or neither")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.certFile)


class SecretsSettings(ConfigSection):
    """ours: the key ring that encrypts the secrets of tasks in the metastore (README,
    "Security"). ``key`` (e.g. ``CDC_SECRETS__KEY``) wins over ``keyFile``; with neither
    present, a key file is made at ``keyFile`` on first start."""

    keyFile: str = "data/cdc-secret.key"
    key: SecretStr = SecretStr("")
