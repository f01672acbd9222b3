"""Reaching a Milvus: a gRPC channel to a target (its address, TLS settings and credentials),
and pymilvus's ``MilvusClient`` arguments for the same settings."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

_MAX_MESSAGE = 512 * 1024 * 1024


def target_address(connect: dict[str, Any]) -> tuple[str, bool]:
    if connect.get("uri"):
        parts = urlsplit(connect["uri"])
        secure = parts.scheme == "https" or bool(connect.get("enable_tls"))
        return (
            f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 19530)}",
            secure,
        )
    return f"{connect['host']}:{connect['port']}", bool(connect.get("enable_tls"))


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def tls_paths(connect: dict[str, Any]) -> tuple[str, str, str]:
    """The CA, client certificate and key files of ``connect``'s ``dial_config`` ("" for one
    not given)."""
    dial = connect.get("dial_config") or {}
    return (
        dial.get("ca_pem_path") or dial.get("server_pem_path") or "",
        dial.get("client_pem_path") or "",
        dial.get("client_key_path") or "",
    )


def open_channel(address: str, secure: bool, connect: dict[str, Any]) -> grpc.Channel:
    """A channel to ``address``, with TLS (``connect``'s ``dial_config``) when ``secure``."""
    options = [
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ]
    if secure:
        dial = connect.get("dial_config") or {}
        if dial.get("server_name"):
            options.append(("grpc.ssl_target_name_override", dial["server_name"]))
        ca, cert, key = tls_paths(connect)
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(ca), private_key=_read(key), certificate_chain=_read(cert)
        )
        return grpc.secure_channel(address, creds, options=options)
    return grpc.insecure_channel(address, options=options)


def pymilvus_tls_kwargs(connect: dict[str, Any]) -> dict[str, str]:
    """pymilvus's TLS arguments for ``connect``'s ``dial_config``. pymilvus sends a client
    certificate only with ``ca_pem_path`` and no ``server_pem_path``, and trusts a
    ``ca_pem_path`` given alone not at all (the system's CAs then), so the CA goes where
    pymilvus reads it: beside the client certificate, else as ``server_pem_path``."""
    dial = connect.get("dial_config") or {}
    ca = dial.get("ca_pem_path") or dial.get("server_pem_path") or ""
    kwargs = {"server_name": dial["server_name"]} if dial.get("server_name") else {}
    if dial.get("client_pem_path") and dial.get("client_key_path") and ca:
        kwargs["ca_pem_path"] = ca
        kwargs["client_pem_path"] = dial["client_pem_path"]
        kwargs["client_key_path"] = dial["client_key_path"]
    elif ca:
        kwargs["server_pem_path"] = ca
    return kwargs


def client_kwargs(connect: dict[str, Any]) -> dict[str, Any]:
    """``MilvusClient`` arguments for a task's ``milvus_connect_param`` (or a cluster's Milvus
    endpoint in that shape: ``milvus_endpoint.milvus_param``)."""
    if connect.get("uri"):
        parts = urlsplit(connect["uri"])
        secure = parts.scheme == "https" or bool(connect.get("enable_tls"))
        port = parts.port or (443 if parts.scheme == "https" else 19530)
        host = parts.hostname
    else:
        secure = bool(connect.get("enable_tls"))
        host, port = connect["host"], connect["port"]
    kwargs: dict[str, Any] = {"uri": f"{'https' if secure else 'http'}://{host}:{port}"}
    if connect.get("token"):
        kwargs["token"] = connect["token"]
    elif connect.get("username"):
        kwargs["user"] = connect["username"]
        kwargs["password"] = connect["password"]
    if secure:
        kwargs.update(pymilvus_tls_kwargs(connect))
    return kwargs


def auth_metadata(connect: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``authorization`` metadata every call carries: the token, or user and password."""
    metadata: list[tuple[str, str]] = []
    if connect.get("token"):
        metadata.append(("authorization", base64.b64encode(connect["token"].encode()).decode()))
    elif connect.get("username"):
        pair = f"{connect['username']}:{connect['password']}".encode()
        metadata.append(("authorization", base64.b64encode(pair).decode()))
    return metadata


__all__ = [
    "auth_metadata",
    "client_kwargs",
    "open_channel",
    "pymilvus_tls_kwargs",
    "target_address",
    "tls_paths",
]
