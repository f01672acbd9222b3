"""Pulsar authentication from Milvus's ``authPlugin``/``authParams``, and TLS to the brokers,
as pulsar-client's ``Client`` arguments."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar

_PLUGIN_ALIASES = {
    "token": "token",
    "org.apache.pulsar.client.impl.auth.authenticationtoken": "token",
    "tls": "tls",
    "org.apache.pulsar.client.impl.auth.authenticationtls": "tls",
    "basic": "basic",
    "org.apache.pulsar.client.impl.auth.authenticationbasic": "basic",
    "oauth2": "oauth2",
    "org.apache.pulsar.client.impl.auth.oauth2.authenticationoauth2": "oauth2",
    "athenz": "athenz",
    "org.apache.pulsar.client.impl.auth.authenticationathenz": "athenz",
}
# Java/Go spellings of the OAuth2 keys -> the C++ client's
_OAUTH2_KEYS = {
    "issuerUrl": "issuer_url",
    "privateKey": "private_key",
    "clientId": "client_id",
    "clientSecret": "client_secret",
}


@dataclass(frozen=True)
class AuthConfig:
    """How to authenticate, parsed from Milvus's ``pulsar.authPlugin`` / ``pulsar.authParams``.

    ``method`` is one of token, token-file, tls, basic, oauth2, athenz, library (a C++
    authentication plugin given by the path of its shared library). The repr shows the method
    and the parameter names, never their values.
    """

    method: str
    params: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"AuthConfig(method={self.method!r}, params=<{', '.join(sorted(self.params))}>)"

    __str__ = __repr__


def parse_auth_params(text: str) -> dict[str, str]:
    """``authParams`` as a dict: a JSON object, or Milvus's ``key1:value1,key2:value2`` (each item
    is split at its first colon; Milvus's own parser drops items with more than one colon)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except ValueError:
            raise ValueError("Pulsar authParams: not valid JSON") from None
        if not isinstance(loaded, dict):
            raise ValueError("Pulsar authParams: the JSON is not an object")
        return {str(key): str(value) for key, value in loaded.items()}
    params: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        if sep and key.strip():
            params[key.strip()] = value.strip()
    return params


def auth_config(auth_plugin: str, auth_params: str) -> AuthConfig | None:
    """The authentication Milvus would use with the same ``authPlugin``/``authParams`` (None:
    none). ``ValueError`` names the plugin and the parameter names, never a value."""
    plugin = auth_plugin.strip()
    if not plugin:
        return None
    method = _PLUGIN_ALIASES.get(plugin.lower())
    raw = auth_params.strip()
    if method is None:
        if plugin.endswith((".so", ".dylib", ".dll")):
            return AuthConfig("library", {"path": plugin, "params": raw})
        raise ValueError(
            f"Pulsar authPlugin {plugin!r} is not supported "
            f"(use one of: {', '.join(sorted(set(_PLUGIN_ALIASES.values())))})"
        )
    if method == "token" and raw and ":" not in raw and not raw.startswith("{"):
        return AuthConfig("token", {"token": raw})  # a bare token, as the Java/C++ clients accept
    params = parse_auth_params(raw)
    names = sorted(params)
    if method == "token":
        if params.get("token"):
            return AuthConfig("token", {"token": params["token"]})
        if params.get("file"):
            path = params["file"]
            return AuthConfig("token-file", {"file": path[2:] if path.startswith("//") else path})
        raise ValueError(f"Pulsar token authentication needs 'token' or 'file'; got {names}")
    if method == "tls":
        if not params.get("tlsCertFile") or not params.get("tlsKeyFile"):
            raise ValueError(
                f"Pulsar TLS authentication needs tlsCertFile and tlsKeyFile; got {names}"
            )
        return AuthConfig("tls", {k: params[k] for k in ("tlsCertFile", "tlsKeyFile")})
    if method == "basic":
        username = params.get("userId") or params.get("username")
        if not username or "password" not in params:
            raise ValueError(f"Pulsar basic authentication needs userId and password; got {names}")
        return AuthConfig("basic", {"username": username, "password": params["password"]})
    if method == "oauth2":
        converted = {_OAUTH2_KEYS.get(key, key): value for key, value in params.items()}
        if not converted.get("issuer_url"):
            raise ValueError(f"Pulsar OAuth2 authentication needs issuerUrl; got {names}")
        converted.pop("type", None)
        return AuthConfig("oauth2", converted)
    return AuthConfig("athenz", params)


def build_authentication(config: AuthConfig | None) -> Any:
    """The pulsar-client authentication object for ``config`` (None: no authentication)."""
    if config is None:
        return None
    params = config.params
    if config.method == "token":
        return pulsar.AuthenticationToken(params["token"])
    if config.method == "token-file":
        return pulsar.AuthenticationToken(_token_file_reader(params["file"]))
    if config.method == "tls":
        return pulsar.AuthenticationTLS(params["tlsCertFile"], params["tlsKeyFile"])
    if config.method == "basic":
        return pulsar.AuthenticationBasic(params["username"], params["password"])
    if config.method == "oauth2":
        return pulsar.AuthenticationOauth2(json.dumps(dict(params)))
    if config.method == "athenz":
        return pulsar.AuthenticationAthenz(json.dumps(dict(params)))
    if config.method == "library":
        return pulsar.Authentication(params["path"], params["params"])
    raise ValueError(f"unknown Pulsar authentication method {config.method!r}")


@dataclass(frozen=True)
class PulsarTls:
    """TLS to the brokers of a ``pulsar+ssl://`` service URL (PEM files)."""

    trust_certs_file: str = ""  # the brokers' CA; empty: the system's
    validate_hostname: bool = True
    allow_insecure: bool = False  # any broker certificate is accepted
    cert_file: str = ""  # mutual TLS (the ``tls`` authPlugin is the other way to give one)
    key_file: str = ""


def tls_client_args(service_url: str, tls: PulsarTls) -> dict[str, Any]:
    """pulsar-client ``Client`` arguments of ``tls`` for ``service_url``: none for a plain
    ``pulsar://`` URL (a WAL switch may name one), the TLS ones for ``pulsar+ssl://``."""
    if not service_url.strip().startswith("pulsar+ssl://"):
        return {}
    args: dict[str, Any] = {
        "use_tls": True,
        "tls_validate_hostname": tls.validate_hostname,
        "tls_allow_insecure_connection": tls.allow_insecure,
    }
    if tls.trust_certs_file:
        args["tls_trust_certs_file_path"] = tls.trust_certs_file
    if tls.cert_file:
        args["tls_certificate_file_path"] = tls.cert_file
        args["tls_private_key_file_path"] = tls.key_file
    return args


def _token_file_reader(path: str) -> Callable[[], str]:
    def read() -> str:  # read at every (re)connection: the token can be rotated on disk
        return Path(path).read_text(encoding="utf-8").strip()

    return read


__all__ = [
    "AuthConfig",
    "PulsarTls",
    "auth_config",
    "build_authentication",
    "parse_auth_params",
    "tls_client_args",
]
