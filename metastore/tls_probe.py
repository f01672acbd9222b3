"""What keeps a client out of a TLS endpoint, in words an operator can act on.

gRPC clients (etcd's, Milvus's) report a failed TLS handshake with little more than
"connection failed"; a plain TLS handshake of Python's ``ssl`` to the same endpoint with the
same CA and client certificate says exactly what is wrong: ``certificate verify failed: unable
to get local issuer certificate`` (a wrong CA), ``certificate verify failed: certificate has
expired``, ``certificate verify failed: IP address mismatch, certificate is not valid for
'127.0.0.1'.``, or that the server turned the client's certificate away. Used by the etcd
clients here (metastore/etcd_diagnosis.py) and by the daemon's checks of a target Milvus.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

from metastore.tls_files import expired_certificate


@dataclass(frozen=True)
class ConnectProblem:
    """What went wrong; ``refused``: the endpoint turned the client away (credentials or
    certificates), as opposed to not answering."""

    reason: str
    refused: bool

    def __str__(self) -> str:
        return self.reason


def handshake_problem(
    host: str,
    port: int,
    *,
    tls: bool,
    ca: str = "",
    cert: str = "",
    key: str = "",
    server_name: str = "",
    timeout: float = 2.0,
) -> ConnectProblem | None:
    """What keeps a client of ``host:port`` out, seen from a TCP connection and (``tls``) a
    TLS handshake with the CA ``ca`` (empty: the system's) and the client certificate
    ``cert``/``key``, checking the name ``server_name`` (default: ``host``); None: nothing."""
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return ConnectProblem(exc.strerror or type(exc).__name__, refused=False)
    with raw:
        if not tls:
            return None
        try:
            context = _client_context(ca, cert, key)
        except (OSError, ssl.SSLError) as exc:
            return ConnectProblem(f"cannot use the TLS files: {exc}", refused=True)
        try:
            with context.wrap_socket(raw, server_hostname=server_name or host) as conn:
                problem = _server_refusal(conn, min(timeout, 0.5), offered=bool(cert))
        except ssl.SSLCertVerificationError as exc:
            return ConnectProblem(f"certificate verify failed: {exc.verify_message}", refused=True)
        except ssl.SSLError as exc:
            problem = ConnectProblem(f"TLS handshake failed: {exc.reason or exc}", refused=True)
        except OSError as exc:
            return ConnectProblem(f"TLS handshake failed: {exc}", refused=False)
        return _named_expiry(problem, cert)


def speaks_tls(host: str, port: int, timeout: float = 2.0) -> bool:
    """Does ``host:port`` complete a TLS handshake (its certificate not checked)?"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except OSError:  # ssl.SSLError included
        return False


def _server_refusal(conn: ssl.SSLSocket, wait: float, *, offered: bool) -> ConnectProblem | None:
    """Under TLS 1.3 a server refuses the client's certificate after the handshake: its
    alert arrives with the first read (a server that accepts sends its HTTP/2 settings, or
    waits for the client's). Go servers (etcd, Milvus) answer a missing certificate with the
    same alert as a bad one, so ``offered`` (was one sent?) tells the two apart."""
    conn.settimeout(wait)
    try:
        conn.recv(1)
    except ssl.SSLError as exc:
        if not offered:
            return ConnectProblem(
                "the server wants a client certificate (mutual TLS) and none was given: "
                f"{exc.reason or exc}",
                refused=True,
            )
        return ConnectProblem(
            f"the server refused the client certificate: {exc.reason or exc}", refused=True
        )
    except OSError:
        return None
    return None


def _named_expiry(problem: ConnectProblem | None, cert: str) -> ConnectProblem | None:
    """A refusal of a client whose certificate expired names the file and when (a server
    says only "bad certificate" or "certificate expired")."""
    if problem is None or not problem.refused:
        return problem
    expired = expired_certificate(cert)
    return ConnectProblem(f"{expired}: {problem.reason}", refused=True) if expired else problem


def _client_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key or None)
    context.set_alpn_protocols(["h2"])  # as gRPC asks
    return context


__all__ = ["ConnectProblem", "handshake_problem", "speaks_tls"]
