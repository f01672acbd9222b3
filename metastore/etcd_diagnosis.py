"""Why an etcd could not be used, in words an operator can act on, naming the endpoint.

The etcd client (gRPC) reports a failed TLS handshake as ``ConnectionFailedError`` with no
text; gRPC's own detail says little more ("Unwrap failed", "Hostname Verification Check
failed"). So when a call fails to connect, each endpoint is asked again with a TLS handshake of
our own under the same CA and client certificate (metastore/tls_probe.py), which says exactly
what is wrong. An etcd that answered and refused (a wrong password) says why itself
(``etcdserver: authentication failed, invalid user ID or password``).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from metastore.etcd_addresses import parse_etcd_address
from metastore.etcd_connect import EtcdTls
from metastore.tls_probe import ConnectProblem, handshake_problem

# etcd's answers that turn a client away (the rest: it was not reached, or did not answer)
_REFUSALS = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,  # etcd's "authentication failed" and "invalid auth token"
    grpc.StatusCode.FAILED_PRECONDITION,  # "authentication is not enabled" and the like
)


EtcdFailure = ConnectProblem  # what explain_etcd_failure says


def endpoint_urls(addresses: list[str], tls: EtcdTls | None) -> list[str]:
    """``https://host:port`` per address, as the client dials it (no credentials)."""
    urls = []
    for address in addresses:
        host, port, secure = parse_etcd_address(address)
        scheme = "https" if secure or tls is not None else "http"
        urls.append(f"{scheme}://{_bracketed(host)}:{port}")
    return urls


def explain_etcd_failure(
    addresses: list[str], tls: EtcdTls | None, exc: BaseException, timeout: float = 2.0
) -> EtcdFailure:
    """Why ``exc`` (raised by an etcd client for ``addresses``) happened: etcd's own answer
    when it answered; else, per endpoint, what a TLS handshake with the same settings meets."""
    rpc = _rpc_error(exc)
    where = ", ".join(endpoint_urls(addresses, tls))
    if rpc is not None and rpc.code() in _REFUSALS:
        return EtcdFailure(f"{where}: {rpc.details()}", refused=True)
    if rpc is not None and rpc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EtcdFailure(f"{where}: no answer in time", refused=False)
    reasons = []
    for address in addresses:
        host, port, secure = parse_etcd_address(address)
        secure = secure or tls is not None
        files = tls or EtcdTls()
        problem = handshake_problem(
            host,
            port,
            tls=secure,
            ca=files.ca_cert_path,
            cert=files.cert_path,
            key=files.key_path,
            timeout=timeout,
        )
        if problem is not None:
            url = endpoint_urls([address], tls)[0]
            reasons.append(EtcdFailure(f"{url}: {problem.reason}", problem.refused))
    if reasons:
        return EtcdFailure(
            "; ".join(r.reason for r in reasons), refused=all(r.refused for r in reasons)
        )
    detail = rpc.details() if rpc is not None else ""
    return EtcdFailure(f"{where}: {detail or f'{type(exc).__name__}: {exc}'}", refused=False)


def _rpc_error(exc: BaseException) -> grpc.RpcError | None:
    """The gRPC error behind ``exc`` (the etcd client raises its own, from within the
    handler of gRPC's)."""
    for link in _chain(exc):
        if isinstance(link, grpc.RpcError) and hasattr(link, "code"):
            return link
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["EtcdFailure", "endpoint_urls", "explain_etcd_failure"]
