"""Log in to an etcd with a user and password, and stay logged in.

etcd answers a login with a token that it forgets when it has not been used for
``--auth-token-ttl`` (300 s by default) and whenever it restarts; the etcd client library logs
in once, in its constructor, so a client idle for five minutes (the source's etcd of a daemon
without tasks) or outliving an etcd restart would be refused for good ("etcdserver: invalid
auth token"). Here every call of the client's channels carries the current token, and a call
refused for a token that a new login cures logs in again and is sent once more.

Cured by a new login, as Go's clientv3 has it (``shouldRefreshToken``): a forgotten token
("invalid auth token"), a token older than a change to etcd's users or roles ("revision of auth
store is old": any user or role added, changed or removed makes every earlier token fail so,
JWT tokens included, until they expire), and a token etcd no longer finds a user in ("user name
is empty"). A stream (a lease's keep-alive) cannot be sent again: its refusal marks the token
stale, and the next call logs in first.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from etcd3 import etcdrpc

log = logging.getLogger(__name__)

_AUTHENTICATE = "/etcdserverpb.Auth/Authenticate"
_AUTH_FAILED = "authentication failed"  # etcd's ErrAuthFailed
# etcd's words for a token a new login cures (etcd's rpctypes ErrInvalidAuthToken,
# ErrAuthOldRevision, ErrUserEmpty)
_CURED = ("invalid auth token", "revision of auth store is old", "user name is empty")


class EtcdLogin:
    """The token of one user, shared by the channels of a client's endpoints."""

    def __init__(
        self,
        username: str,
        password: str,
        timeout: float | None,
        password_source: Callable[[], str] | None = None,
    ) -> None:
        """``password_source``: where the password is read again when etcd refuses it (it was
        changed there, and in the daemon's configuration file): a new password needs no
        restart."""
        self._username = username
        self._password = password
        self._timeout = timeout
        self._source = password_source
        self._lock = threading.Lock()
        self.token = ""
        self.stale = False  # a stream was refused for its token: log in before the next call

    def log_in(self, channel: grpc.Channel) -> str:
        """Log in over ``channel`` (a wrong password raises etcd's ``grpc.RpcError``)."""
        try:
            token = self._authenticate(channel, self._password)
        except grpc.RpcError as exc:
            fresh = self._fresh_password(exc)
            if fresh is None:
                raise
            token = self._authenticate(channel, fresh)
            self._password = fresh
            log.info("etcd: the password was changed; logged in with the configuration's new one")
        with self._lock:
            self.token = token
            self.stale = False
        return token

    def _authenticate(self, channel: grpc.Channel, password: str) -> str:
        request = etcdrpc.AuthenticateRequest(name=self._username, password=password)
        return str(etcdrpc.AuthStub(channel).Authenticate(request, self._timeout).token)

    def _fresh_password(self, refusal: grpc.RpcError) -> str | None:
        """The password read again, when etcd refused the one in use and it has changed."""
        if self._source is None or _AUTH_FAILED not in _details(refusal):
            return None
        try:
            fresh = self._source()
        except Exception as exc:  # noqa: BLE001 - a configuration that cannot be read: no change
            log.warning("etcd: the password was refused; the configuration cannot be read: %s", exc)
            return None
        return fresh if fresh and fresh != self._password else None

    def log_in_first(self, channels: list[grpc.Channel]) -> None:
        """Log in over the first endpoint that answers; raise the last refusal else."""
        failure: grpc.RpcError | None = None
        for channel in channels:
            try:
                self.log_in(channel)
                return
            except grpc.RpcError as exc:
                failure = exc
                if _code(exc) != grpc.StatusCode.UNAVAILABLE:
                    break  # etcd answered: its refusal is the answer
        if failure is not None:
            raise failure

    def intercept(self, channel: grpc.Channel) -> grpc.Channel:
        """``channel``, its calls carrying the token, logging in again once when refused."""
        return grpc.intercept_channel(channel, _TokenCalls(self, channel))


class _Details(
    collections.namedtuple(
        "_Details",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,  # type: ignore[misc]  # grpc has no type information
):
    """A call's details with other metadata (gRPC's own type cannot be built)."""


def _with_token(details: Any, token: str) -> _Details:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != "token"]
    metadata.append(("token", token))
    return _Details(
        details.method,
        details.timeout,
        metadata,
        None,  # the token goes as metadata only (call credentials are refused on plain HTTP)
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


def _code(error: Any) -> Any:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def _details(error: Any) -> str:
    details = getattr(error, "details", None)
    return (details() if callable(details) else "") or ""


def cured_by_login(error: Any) -> bool:
    """Is ``error`` (a gRPC error, or None) etcd refusing a token that a new login cures?"""
    text = _details(error)
    return _code(error) is not None and any(words in text for words in _CURED)


class _TokenCalls(  # grpc has no type information: its bases are Any
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, login: EtcdLogin, raw: grpc.Channel) -> None:
        self._login = login
        self._raw = raw  # logging in again goes around the interceptor

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        if details.method == _AUTHENTICATE:
            return continuation(details, request)
        token = self._login.log_in(self._raw) if self._login.stale else self._login.token
        outcome = continuation(_with_token(details, token), request)
        if cured_by_login(outcome.exception()):
            token = self._login.log_in(self._raw)
            outcome = continuation(_with_token(details, token), request)
        return outcome

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return self._watched(continuation(_with_token(details, self._login.token), request))

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Iterator[Any]
    ) -> Any:
        # a lease keep-alive: not sent again (its requests are consumed); the next call logs in
        return self._watched(continuation(_with_token(details, self._login.token), requests))

    def _watched(self, call: Any) -> Any:
        """``call``, its refusal for a stale token marking the login stale."""

        def done(finished: Any) -> None:
            if cured_by_login(finished.exception()):
                self._login.stale = True

        add = getattr(call, "add_done_callback", None)
        if callable(add):
            add(done)
        return call


__all__ = ["EtcdLogin", "cured_by_login"]
