"""Why an etcd could not be used, in words an operator can act on, naming the endpoint.

The etcd client (gRPC) reports a failed TLS handshake as ``ConnectionFailedError`` with no
text; gRPC's own detail says little more ("Unwrap failed", "Hostname Verification Check
failed"). So when a call fails to connect, each endpoint is asked again with a plain TLS
handshake of Python's ``ssl`` under the same CA and client certificate, which says exactly what
is wrong: ``certificate verify failed: unable to get local issuer certificate`` (a wrong CA),
``certificate verify failed: certificate has expired``, ``certificate verify failed: Hostname
mismatch, certificate is not valid for '127.0.0.1'.``, or that the server turned our own
certificate away. An etcd that answered and refused (a wrong password) says why itself
(``etcdserver: authentication failed, invalid user ID or password``).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from metastore.etcd_connect import EtcdTls, parse_etcd_address

# the gRPC codes of a call that never reached etcd (everything else is etcd's own answer)
_NOT_REACHED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN)
_REFUSALS = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,  # etcd's "authentication failed" and "invalid auth token"
    grpc.StatusCode.FAILED_PRECONDITION,  # "authentication is not enabled" and the like
)


@dataclass(frozen=True)
class EtcdFailure:
    """What went wrong; ``refused``: the etcd turned the daemon away (credentials or
    certificates), as opposed to not answering."""

    reason: str
    refused: bool

    def __str__(self) -> str:
        return self.reason


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
        problem = handshake_problem(host, port, tls if secure else None, timeout)
        if problem is not None:
            url = endpoint_urls([address], tls)[0]
            reasons.append(EtcdFailure(f"{url}: {problem.reason}", problem.refused))
    if reasons:
        return EtcdFailure(
            "; ".join(r.reason for r in reasons), refused=all(r.refused for r in reasons)
        )
    detail = rpc.details() if rpc is not None else ""
    return EtcdFailure(f"{where}: {detail or f'{type(exc).__name__}: {exc}'}", refused=False)


def handshake_problem(
    host: str, port: int, tls: EtcdTls | None, timeout: float
) -> EtcdFailure | None:
    """What keeps a client of ``host:port`` out, seen from a TCP connection and (``tls``) a
    TLS handshake under the same CA and client certificate; None: nothing found."""
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return EtcdFailure(exc.strerror or type(exc).__name__, refused=False)
    with raw:
        if tls is None:
            return None
        try:
            context = _client_context(tls)
        except (OSError, ssl.SSLError) as exc:
            return EtcdFailure(f"cannot use the TLS files: {exc}", refused=True)
        try:
            with context.wrap_socket(raw, server_hostname=host) as conn:
                return _server_refusal(conn)
        except ssl.SSLCertVerificationError as exc:
            return EtcdFailure(f"certificate verify failed: {exc.verify_message}", refused=True)
        except ssl.SSLError as exc:
            return EtcdFailure(f"TLS handshake failed: {exc.reason or exc}", refused=True)
        except OSError as exc:
            return EtcdFailure(f"TLS handshake failed: {exc}", refused=False)


def _server_refusal(conn: ssl.SSLSocket) -> EtcdFailure | None:
    """Under TLS 1.3 a server refuses the client's certificate after the handshake: its
    alert arrives with the first read (a server that accepts sends its HTTP/2 settings)."""
    conn.settimeout(1.0)
    try:
        conn.recv(1)
    except ssl.SSLError as exc:
        return EtcdFailure(
            f"the server refused the client certificate: {exc.reason or exc}", refused=True
        )
    except OSError:
        return None
    return None


def _client_context(tls: EtcdTls) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca_cert_path or None)
    if tls.cert_path:
        context.load_cert_chain(tls.cert_path, tls.key_path or None)
    context.set_alpn_protocols(["h2"])  # as gRPC asks
    return context


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


__all__ = ["EtcdFailure", "endpoint_urls", "explain_etcd_failure", "handshake_problem"]
