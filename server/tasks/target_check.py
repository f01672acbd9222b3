"""Is the target Milvus reachable (and do the credentials work)? Asked before a task is stored."""

from __future__ import annotations

import time
from typing import Any

import grpc

from replicator.config.connections import SourceSettings
from replicator.config.milvus_endpoint import milvus_param
from replicator.sinks.milvus_channel import pymilvus_tls_kwargs
from server.errors import TargetUnreachableError, UnavailableError


class TargetRefusedError(TargetUnreachableError):
    """The target answers and turns the daemon away; ``refusal`` says why (certificates,
    credentials), with no secret in it."""

    def __init__(self, message: str, refusal: str) -> None:
        super().__init__(message)
        self.refusal = refusal


def milvus_client_kwargs(connect: dict[str, Any]) -> dict[str, Any]:
    """pymilvus ``MilvusClient`` arguments for a stored ``milvus_connect_param``."""
    if connect.get("uri"):
        uri = connect["uri"]
    else:
        scheme = "https" if connect.get("enable_tls") else "http"
        uri = f"{scheme}://{connect['host']}:{connect['port']}"
    kwargs: dict[str, Any] = {"uri": uri, "timeout": float(connect["connect_timeout"])}
    if connect.get("token"):
        kwargs["token"] = connect["token"]
    elif connect.get("username"):
        kwargs["user"] = connect["username"]
        kwargs["password"] = connect["password"]
    if connect.get("enable_tls") or uri.startswith("https://"):
        kwargs["secure"] = True
        kwargs.update(pymilvus_tls_kwargs(connect))
    return kwargs


def describe_target(connect: dict[str, Any]) -> str:
    return connect.get("uri") or f"{connect['host']}:{connect['port']}"


def check_target_reachable(
    connect: dict[str, Any], what: str = "milvus_connect_param: target Milvus"
) -> str:
    """Connect, ask the server version, disconnect. Blocking: run it in a thread.

    Returns the server version; raises ``TargetUnreachableError`` naming the target (``what``
    at its address) and the cause (with any secret scrubbed from the cause).
    """
    from pymilvus import MilvusClient  # heavy import, kept off the daemon's start-up path

    kwargs = milvus_client_kwargs(connect)
    # A dedicated channel: pymilvus 3 shares channels per address and keeps a shared one open
    # (pinging every 10 s) after close(); a target then answers GOAWAY "too_many_pings".
    kwargs["dedicated"] = True
    # A connection of its own: gRPC shares a subchannel per address among the process's
    # channels, and one that other clients of the target (a runner's sink, the stale-write
    # watch) saw refused backs off for up to 120 s, failing a new channel's calls at once while
    # the target answers again (a failback asked right after the lost cluster came back).
    kwargs["grpc_options"] = {"grpc.use_local_subchannel_pool": 1}
    try:
        client = MilvusClient(**kwargs)
    except Exception as exc:  # noqa: BLE001 - pymilvus raises many kinds; all mean "not reachable"
        refusal = explain_target_refusal(connect)
        if refusal:  # pymilvus says only "illegal connection params or server unavailable"
            refusal = _scrub(refusal, connect)
            raise TargetRefusedError(
                f"{what} at {describe_target(connect)} refused the daemon: {refusal}", refusal
            ) from None
        raise TargetUnreachableError(
            f"{what} at {describe_target(connect)} is not reachable "
            f"within {connect['connect_timeout']} s: {_scrub(str(exc), connect)}"
        ) from None
    try:
        return str(client.get_server_version())
    except Exception as exc:  # noqa: BLE001
        raise TargetUnreachableError(
            f"{what} at {describe_target(connect)} did not answer: {_scrub(str(exc), connect)}"
        ) from None
    finally:
        client.close()


def check_source_milvus(source: SourceSettings, key: str, timeout: float) -> str:
    """Does the source Milvus (``key``: ``sourceConfig`` or ``clusters.<name>``) let the daemon
    in with its ``milvus`` block, as a backfill's or a verify's clients would connect? Its
    version; ``UnavailableError`` (503: the daemon's configuration, not the request) naming it
    and the reason."""
    connect = {**milvus_param(source.milvus), "connect_timeout": timeout}
    try:
        return check_target_reachable(connect, f"{key}.milvus: source Milvus")
    except TargetUnreachableError as exc:
        raise UnavailableError(exc.message) from None


def explain_target_refusal(connect: dict[str, Any], budget: float = 2.0) -> str:
    """Why a target that answers turns the daemon away (empty: it does not, or does not
    answer): a TLS handshake with the task's files (metastore/tls_probe.py), else the server's
    own answer to GetVersion with the task's credentials. Within ``budget`` seconds in all (a
    target that hangs adds no more than that to an answer)."""
    from pymilvus.grpc_gen import milvus_pb2, milvus_pb2_grpc

    from metastore.tls_probe import handshake_problem, speaks_tls
    from replicator.sinks.milvus_channel import auth_metadata, open_channel, target_address

    deadline = time.monotonic() + budget

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    address, secure = target_address(connect)
    host, _, port = address.rpartition(":")
    dial = connect.get("dial_config") or {}
    problem = handshake_problem(
        host,
        int(port),
        tls=secure,
        ca=dial.get("ca_pem_path") or dial.get("server_pem_path") or "",
        cert=dial.get("client_pem_path") or "",
        key=dial.get("client_key_path") or "",
        server_name=dial.get("server_name") or "",
        timeout=left(),
    )
    if problem is not None:
        return problem.reason if problem.refused else ""
    if not secure and speaks_tls(host, int(port), left()):
        return "it speaks TLS: give an https:// uri or enable_tls"
    channel = open_channel(address, secure, connect)
    try:
        stub = milvus_pb2_grpc.MilvusServiceStub(channel)
        stub.GetVersion(
            milvus_pb2.GetVersionRequest(), metadata=auth_metadata(connect), timeout=left()
        )
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return str(exc.details())
    finally:
        channel.close()
    return ""


def _scrub(text: str, connect: dict[str, Any]) -> str:
    for key in ("password", "token"):
        secret = connect.get(key)
        if secret:
            text = text.replace(secret, "******")
    return text[:500]


def check_kafka_reachable(param: dict[str, Any]) -> str:
    """The Kafka brokers of a ``kafka_connect_param`` answer (blocking: run it in a thread).
    Returns "kafka"; raises ``TargetUnreachableError`` naming the brokers and the cause."""
    from replicator.errors import TargetUnavailableError
    from replicator.sinks.kafka_positions import (
        probe,
    )  # confluent_kafka, kept off the start-up path

    try:
        probe(param, float(param.get("connect_timeout") or 10))
    except TargetUnavailableError as exc:
        raise TargetUnreachableError(f"kafka_connect_param: {exc}") from None
    return "kafka"
