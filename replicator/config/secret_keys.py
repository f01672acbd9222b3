"""Where the daemon's secret keys come from (``secrets`` in cdc.yaml), and the store that uses
them.

``secrets.key`` (``CDC_SECRETS__KEY``) holds a key ring itself and wins; otherwise
``secrets.keyFile`` names a file holding one (metastore/keyring.py has the format). The daemon
makes that file (mode 0600) with a new key on its first start when neither exists and the
metastore holds no secret sealed with a key, and says so in the log: back it up, the stored
secrets cannot be read without it. When the store does hold such secrets (a daemon joining a
fleet without the fleet's key file), no key is made: the daemon runs without one, not ready,
until the file appears (server/tasks/supervisor.py says which key ids it lacks). A key file is read
again whenever it changes, so a ``milvus-cdc secrets rotate`` reaches running daemons.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

from metastore import MetaStore
from metastore.format import check_readable
from metastore.keyring import KeyRing, KeyRingError
from metastore.sealed import KeySource, SealedMetaStore, key_ids_in_use
from replicator.config.release import RELEASE
from replicator.config.security import SecretsSettings
from replicator.config.settings import CdcSettings, ConfigError
from replicator.config.stores import open_metastore

log = logging.getLogger(__name__)

ENV_KEY = "secrets.key (CDC_SECRETS__KEY)"


class KeyFile:
    """The key ring of a file, read again when the file changes. A file that cannot be read
    again keeps the ring read before (and says why in the log)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._ring = KeyRing(())
        self._asked = False  # a ring was handed out: a bad file no longer stops the start

    def __call__(self) -> KeyRing:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            self._asked = True
            return self._ring
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        with self._lock:
            first = not self._asked
            self._asked = True
            if stamp != self._stamp:
                try:
                    ring = KeyRing.parse(self.path.read_text(), f"secrets.keyFile {self.path}")
                except (OSError, UnicodeDecodeError, KeyRingError) as exc:
                    if first:
                        raise ConfigError(str(exc)) from exc
                    log.error("key file not read again, the keys read before stay: %s", exc)
                    return self._ring
                known = self._stamp is not None
                self._ring, self._stamp = ring, stamp
                if known:
                    log.info("key file %s read again: keys %s", self.path, ", ".join(ring.ids))
                elif not first:
                    log.info("key file %s appeared: keys %s", self.path, ", ".join(ring.ids))
            return self._ring


def write_key_file(path: Path, ring: KeyRing) -> None:
    """Replace the file at once (a reader sees the old ring or the new one), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(ring.text())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def key_source(settings: SecretsSettings, *, create: bool) -> KeySource:
    """The daemon's keys. ``create``: make the key file when there is none (the daemon does;
    clients and the backfill driver only read)."""
    if settings.key.get_secret_value():
        try:
            ring = KeyRing.parse(settings.key.get_secret_value(), ENV_KEY)
        except KeyRingError as exc:
            raise ConfigError(str(exc)) from exc
        if not ring.keys:
            raise ConfigError(f"{ENV_KEY}: holds no key")
        return lambda: ring
    path = Path(settings.keyFile).expanduser()
    if create and not path.exists():
        write_key_file(path, KeyRing((KeyRing.new_key(),)))
        log.warning(
            "secrets.keyFile %s did not exist: made it with a new key (mode 0600). Back it up: "
            "the passwords and tokens of tasks are stored encrypted with it",
            path.resolve(),
        )
    source = KeyFile(path)
    ring = source()
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("secrets.keyFile %s can be read by others (mode %o): chmod 600", path, mode)
    if create and not ring.keys:
        raise ConfigError(f"secrets.keyFile {path}: holds no key")
    return source


def open_task_store(settings: CdcSettings, *, create_key: bool = False) -> SealedMetaStore:
    """The configured metastore with the task secrets sealed by the configured keys.
    ``create_key`` (the daemon): make the key file when there is none, unless the store holds
    secrets sealed with a key already (that key is not this daemon's to replace)."""
    keys = key_source(settings.secrets, create=False)  # a bad ring stops before the store opens
    store: MetaStore = open_metastore(settings.metaStoreConfig, settings.fleet.leaseSeconds)
    try:
        check_readable(store, RELEASE)  # a newer release's store: refused before any read
        if create_key and not settings.secrets.key.get_secret_value():
            path = Path(settings.secrets.keyFile).expanduser()
            if path.exists() or not key_ids_in_use(store):
                keys = key_source(settings.secrets, create=True)
    except BaseException:
        store.close()
        raise
    return SealedMetaStore(store, keys)


def seal_stored_secrets(store: SealedMetaStore) -> None:
    """At start: secrets stored in clear (by an older version) or under an older key are
    sealed with the first key; those that cannot be read are named in the log."""
    report = store.reseal()
    if report.skipped:
        return  # the supervisor says at its start which keys this daemon lacks
    if report.sealed:
        log.info(
            "sealed %d stored secret(s) of %d task(s) with the current key",
            report.sealed,
            len(report.tasks),
        )
    for problem in report.unreadable:
        log.error("stored secret cannot be read: %s", problem)
    if report.forgotten:
        log.info("no stored secret uses key(s) %s any more", ", ".join(report.forgotten))
