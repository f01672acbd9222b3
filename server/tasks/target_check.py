"""Is the target Milvus reachable (and do the credentials work)? Asked before a task is stored."""

from __future__ import annotations

from typing import Any

from server.errors import TargetUnreachableError


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
    if connect.get("enable_tls"):
        kwargs["secure"] = True
        dial = connect.get("dial_config") or {}
        for key in (
            "server_name",
            "server_pem_path",
            "ca_pem_path",
            "client_pem_path",
            "client_key_path",
        ):
            if dial.get(key):
                kwargs[key] = dial[key]
    return kwargs


def describe_target(connect: dict[str, Any]) -> str:
    return connect.get("uri") or f"{connect['host']}:{connect['port']}"


def check_target_reachable(connect: dict[str, Any]) -> str:
    """Connect, ask the server version, disconnect. Blocking: run it in a thread.

    Returns the server version; raises ``TargetUnreachableError`` naming the target and the cause
    (with any secret scrubbed from the cause).
    """
    from pymilvus import MilvusClient  # heavy import, kept off the daemon's start-up path

    kwargs = milvus_client_kwargs(connect)
    # A dedicated channel: pymilvus 3 shares channels per address and keeps a shared one open
    # (pinging every 10 s) after close(); a target then answers GOAWAY "too_many_pings".
    kwargs["dedicated"] = True
    try:
        client = MilvusClient(**kwargs)
    except Exception as exc:  # noqa: BLE001 - pymilvus raises many kinds; all mean "not reachable"
        raise TargetUnreachableError(
            f"milvus_connect_param: target Milvus at {describe_target(connect)} is not reachable "
            f"within {connect['connect_timeout']} s: {_scrub(str(exc), connect)}"
        ) from None
    try:
        return str(client.get_server_version())
    except Exception as exc:  # noqa: BLE001
        raise TargetUnreachableError(
            f"milvus_connect_param: target Milvus at {describe_target(connect)} did not answer: "
            f"{_scrub(str(exc), connect)}"
        ) from None
    finally:
        client.close()


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
    from replicator.sinks.kafka import probe  # confluent_kafka, kept off the start-up path

    try:
        probe(param, float(param.get("connect_timeout") or 10))
    except TargetUnavailableError as exc:
        raise TargetUnreachableError(f"kafka_connect_param: {exc}") from None
    return "kafka"
