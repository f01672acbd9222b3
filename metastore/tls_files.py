"""The TLS files of a client (CA, certificate, key): noticing that they changed, so a client
made from them is made again (certificates rotated by cert-manager, a new CA), and reading when
the client's certificate expires.

gRPC reads a channel's certificates once, when the channel is made; a client that keeps its
channel after the files were replaced would present the old certificate and trust the old CA
at every reconnection, failing for good once the old ones expire or the server rolls over. The
clients here (the etcd clients, :mod:`metastore.etcd_reload`; a task's target Milvus,
``replicator/sinks/milvus.py``) ask :meth:`TlsFiles.changed` before their calls: the files are
read again at most once per ``RELOAD_CHECK_SECONDS``, and a change makes a new channel with
them. So a rotation is taken up by the first call made at least that long after the files
changed, with no restart.
"""

from __future__ import annotations

import datetime
import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

RELOAD_CHECK_SECONDS = 1.0  # how often a client's TLS files are read again, at most


def fingerprint(paths: tuple[str, ...]) -> str:
    """A digest of the files' contents ("" for a path not given; a missing file counts as
    its absence, so its return is a change too)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.encode() + b"\0")
        if path:
            try:
                digest.update(Path(path).read_bytes())
            except OSError:
                digest.update(b"\1missing")
        digest.update(b"\0")
    return digest.hexdigest()


class TlsFiles:
    """The files one client was made from; :meth:`changed` says when they are no longer
    what it read (take :meth:`mark` before reading them, so a change while they are read is
    seen at the next check)."""

    def __init__(self, *paths: str, interval: float = RELOAD_CHECK_SECONDS) -> None:
        self.paths = tuple(paths)
        self.interval = interval
        self._lock = threading.Lock()
        self._seen = ""
        self._checked = 0.0

    @property
    def any(self) -> bool:
        return any(self.paths)

    def mark(self) -> str:
        """The files' fingerprint now: what a client made next reads (call before reading)."""
        return fingerprint(self.paths)

    def accept(self, mark: str) -> None:
        """The client now in use was made from the files as they were at ``mark``."""
        with self._lock:
            self._seen = mark
            self._checked = time.monotonic()

    def changed(self) -> str | None:
        """The new fingerprint when the files differ from the accepted ones (checked at most
        once per ``interval``); None otherwise."""
        if not self.any:
            return None
        with self._lock:
            now = time.monotonic()
            if now - self._checked < self.interval:
                return None
            self._checked = now
            seen = self._seen
        current = fingerprint(self.paths)
        return current if current != seen else None


@dataclass(frozen=True)
class CertificateExpiry:
    """When the certificate of a file stops being valid."""

    path: str
    not_after: datetime.datetime  # UTC

    def seconds_left(self, now: float | None = None) -> float:
        return self.not_after.timestamp() - (time.time() if now is None else now)

    @property
    def when(self) -> str:
        return self.not_after.strftime("%Y-%m-%dT%H:%M:%SZ")

    def expired(self, now: float | None = None) -> bool:
        return self.seconds_left(now) <= 0

    def describe(self, now: float | None = None) -> str:
        """``client certificate /etc/cdc/client.pem expired at 2026-12-01T00:00:00Z`` (or
        ``expires at ...``)."""
        verb = "expired" if self.expired(now) else "expires"
        return f"client certificate {self.path} {verb} at {self.when}"


def certificate_expiry(path: str) -> CertificateExpiry | None:
    """The expiry of the first certificate in the PEM file ``path`` (the client's own: the
    rest is its chain); None when there is no path or no certificate to read there."""
    if not path:
        return None
    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    return CertificateExpiry(path, cert.not_valid_after_utc)


def expired_certificate(path: str) -> str:
    """Why the certificate at ``path`` cannot be used, when it has expired ("" otherwise)."""
    expiry = certificate_expiry(path)
    return expiry.describe() if expiry is not None and expiry.expired() else ""


__all__ = [
    "RELOAD_CHECK_SECONDS",
    "CertificateExpiry",
    "TlsFiles",
    "certificate_expiry",
    "expired_certificate",
    "fingerprint",
]
