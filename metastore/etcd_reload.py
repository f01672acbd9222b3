"""An etcd client that takes up rotated certificates: made again from its TLS files whenever
they change (checked at most once a second, before a call; :mod:`metastore.tls_files`).

The etcd client library loads the CA, certificate and key into its gRPC channels once; a
daemon's metastore and source etcd clients live as long as the daemon, so after cert-manager
replaced the files (a new pair, a new CA) every reconnection would still present the old
certificate and trust the old CA, and fail for good once the server rolled over. Here a call
made after the files changed goes through a client made from the new files; the old client is
left to the calls already under way on it (and to the garbage collector). A new client that
cannot be made yet (the files half-written, the etcd not answering its login) leaves the old
one in use and is tried again at the next check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import etcd3

from metastore.tls_files import TlsFiles

log = logging.getLogger(__name__)


class ReloadingEtcdClient:
    """Every attribute is the current client's; ``lease`` makes leases that refresh and revoke
    through this client (so through the newest files)."""

    def __init__(
        self,
        connect: Callable[[], etcd3.MultiEndpointEtcd3Client],
        files: TlsFiles,
        where: str,
    ) -> None:
        self._connect = connect
        self._files = files
        self._where = where
        self._lock = threading.Lock()
        mark = files.mark()
        self._client = connect()
        files.accept(mark)

    def current(self) -> etcd3.MultiEndpointEtcd3Client:
        """The client made from the files as they are (made again when they changed)."""
        mark = self._files.changed()
        if mark is None:
            return self._client
        with self._lock:
            try:
                client = self._connect()
            except Exception as exc:  # noqa: BLE001 - kept on the old client, tried again later
                log.warning(
                    "etcd %s: its TLS files changed, but no client can be made from them yet "
                    "(%s); the old one stays in use until the next try",
                    self._where,
                    type(exc).__name__,
                )
                return self._client
            self._client = client
            self._files.accept(mark)
        log.info("etcd %s: its TLS files changed; reconnected with them", self._where)
        return client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current(), name)

    def lease(self, ttl: int, lease_id: int | None = None) -> etcd3.Lease:
        grant = self.current().lease(ttl, lease_id)
        grant.etcd_client = self  # its refresh and revoke go through the newest files
        return grant

    def close(self) -> None:
        self._client.close()


__all__ = ["ReloadingEtcdClient"]
