"""The connection under :class:`~replicator.sinks.milvus.MilvusTarget`: one gRPC channel to a
target Milvus, opened again with its TLS files when they are rotated, and the one place a call
is made, fenced and classified (:mod:`milvus_status`); the target's version is asked here too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
from pymilvus.grpc_gen import milvus_pb2, milvus_pb2_grpc

from metastore.fenced import Fence
from metastore.tls_files import TlsFiles
from replicator.sinks.milvus_channel import (
    auth_metadata,
    open_channel,
    target_address,
    tls_paths,
)
from replicator.sinks.milvus_status import call_failure, checked_reply
from replicator.sinks.target_capabilities import Target, target_of

log = logging.getLogger(__name__)


def _log_warning(text: str) -> None:
    log.warning("%s", text)


class TargetConnection:
    """One connection to a target Milvus; blocking calls, used from worker threads."""

    def __init__(self, connect: dict[str, Any], timeout: float = 60.0) -> None:
        address, secure = target_address(connect)
        self.address = address
        self._connect = connect
        self._timeout = timeout
        self._secure = secure
        # its TLS files, read again when they change (a rotation: metastore/tls_files.py)
        self._files = TlsFiles(*(tls_paths(connect) if secure else ()))
        mark = self._files.mark()
        self._channel = open_channel(address, secure, connect)
        self._files.accept(mark)
        self._stub = milvus_pb2_grpc.MilvusServiceStub(self._channel)
        # set by a task's runner: no call once it is closed, and none outlasting its lease
        self.fence: Fence | None = None
        # a note for the operator: a task's runner sets its warnings (progress.warnings)
        self.warn: Callable[[str], None] = _log_warning
        self._metadata = auth_metadata(connect)

    def close(self) -> None:
        self._channel.close()

    def _reopen_if_rotated(self) -> None:
        """A new channel when the TLS files changed since this one was made (a target serves
        one thread: no call is under way on the old one, which is closed). Files that cannot
        be read yet (half-written) leave the old channel in use until the next check."""
        mark = self._files.changed()
        if mark is None:
            return
        try:
            channel = open_channel(self.address, self._secure, self._connect)
        except OSError as exc:
            log.warning("target %s: its TLS files changed, unreadable: %s", self.address, exc)
            return
        old, self._channel = self._channel, channel
        self._stub = milvus_pb2_grpc.MilvusServiceStub(channel)
        self._files.accept(mark)
        old.close()
        log.info("target %s: its TLS files changed; reconnected with them", self.address)

    # --- plumbing ----------------------------------------------------------------------------
    def _call(self, method: str, request: Any, what: str) -> Any:
        """One call; a failure is classified here, once (see :mod:`milvus_status`). A fenced
        target (a task's runner) makes no call once its fence is closed, and bounds each by
        the time the fence has left."""
        timeout = self._timeout
        if self.fence is not None:
            self.fence.check()
            timeout = min(timeout, self.fence.remaining())
        self._reopen_if_rotated()
        try:
            response = getattr(self._stub, method)(
                request, timeout=timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise call_failure(exc, what, self.address) from None
        return checked_reply(method, response, what, self.address)

    def call(self, method: str, request: Any, what: str) -> Any:
        """Any MilvusService call with a request the caller built (the replicate channel's)."""
        return self._call(method, request, what)

    def target(self) -> Target:
        """What this target is (a Milvus of a version, Milvus Lite), asked before every DDL that
        depends on it (a collection created, a field or a function added: what it can hold is
        decided from it, :mod:`target_capabilities`). Never kept: the channel reconnects by
        itself, and a server replaced or downgraded behind the same address answers then (a
        version kept from the first connection let a 2.3 target receive what it cannot hold);
        a DDL is rare, one more call costs nothing."""
        response = self._call("GetVersion", milvus_pb2.GetVersionRequest(), "get version")
        return target_of(str(response.version))
