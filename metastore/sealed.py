"""Secrets at rest: a metastore that encrypts the secrets it stores and decrypts what it reads,
around any backend.

Sealed (metastore/keyring.py): the fields of a task's spec in ``SECRET_FIELDS`` (the target's
password and token) and the task state under ``SEALED_STATE`` (the record of a WAL switch: the
settings the source's message carried, which may hold credentials). Everything else is stored
as it is. A clear value (a row from a version without encryption) is read as it is, and
``reseal`` encrypts it; ``reseal`` also moves secrets sealed with an older key to the first key
of the ring (the rotation).

A secret that does not open (a key the ring lacks, an altered value) does not fail the read: the
task is returned with the envelope in place and the reason in it, so get and list still answer;
``secrets_problem`` tells the supervisor why such a task cannot start. State values that do not
open raise ``SecretUnreadableError``.

The store records the ids of the keys its secrets are sealed with (``secret_key_ids``; never a
key): an id is recorded before a value is sealed with it and again after it was written, and
``reseal`` forgets the ids no value uses any more (unless recorded again meanwhile). A ring that
lacks a recorded key seals nothing (``KeysMissingError``): a secret sealed with a key the rest
of a fleet lacks would lock them out of it. ``missing_keys`` says what a ring lacks.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from metastore.base import Lease, MetaStore, TaskRecord, TaskState
from metastore.delegating import DelegatingStore
from metastore.errors import ConcurrentUpdateError, TaskNotFoundError
from metastore.keyring import KeyRing, SecretUnreadableError, is_sealed

log = logging.getLogger(__name__)

SECRET_FIELDS: tuple[tuple[str, ...], ...] = (
    ("milvus_connect_param", "password"),
    ("milvus_connect_param", "token"),
    ("kafka_connect_param", "sasl", "password"),
)
SEALED_STATE = "wal/"  # WAL-switch records (replicator/pipeline/task_state.py)
_SEALED_BYTES = b'{"$sealed"'
_UNREADABLE = "unreadable"

KeySource = Callable[[], KeyRing]


class KeysMissingError(SecretUnreadableError):
    """This daemon's key ring lacks keys the store's secrets are sealed with: it seals nothing
    until it has them."""


@dataclass(frozen=True)
class MissingKeys:
    """The ids of keys the store's secrets are sealed with that a key ring lacks (ids only)."""

    missing: tuple[str, ...]
    held: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"the metastore's secrets are encrypted with key(s) {', '.join(self.missing)}, "
            f"which this daemon's key ring lacks (it holds {', '.join(self.held) or 'no key'})"
        )


@dataclass
class ResealReport:
    sealed: int = 0  # values written with the ring's first key
    tasks: set[str] = field(default_factory=set)
    unreadable: list[str] = field(default_factory=list)  # why a value could not be read
    forgotten: list[str] = field(default_factory=list)  # key ids no value uses any more
    skipped: str = ""  # why nothing was done: the ring lacks keys the store records


def _lookup(spec: Mapping[str, Any], path: tuple[str, ...]) -> tuple[Any, Any]:
    """(the mapping that holds the field, its value); (None, None) when absent."""
    node: Any = spec
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping):
        return None, None
    return node, node.get(path[-1])


def _context(task_id: str, path: tuple[str, ...] | str) -> str:
    return f"task {task_id} {path if isinstance(path, str) else '.'.join(path)}"


def _stale(value: Any, ring: KeyRing) -> bool:
    """Clear (and not empty), or sealed with another key than the ring's first."""
    if is_sealed(value):
        return bool(value.get("kid") != ring.primary)
    return isinstance(value, str) and bool(value)


def _key_ids_of_spec(spec: Mapping[str, Any]) -> set[str]:
    sealed = (_lookup(spec, path)[1] for path in SECRET_FIELDS)
    return {str(value.get("kid", "")) for value in sealed if is_sealed(value)}


def _key_id_of_value(value: bytes) -> str | None:
    if not value.startswith(_SEALED_BYTES):
        return None
    try:
        return str(json.loads(value).get("kid", ""))
    except ValueError:
        return None


def _sealed_state(store: MetaStore, task_id: str) -> dict[str, bytes]:
    """A task's WAL-switch records as stored (sealed or clear)."""
    try:
        return store.list_state(task_id, SEALED_STATE)
    except TaskNotFoundError:
        return {}


def _key_ids_in(tasks: Iterable[TaskRecord], states: Iterable[Mapping[str, bytes]]) -> set[str]:
    """The ids of the keys the values of these specs and WAL-switch records are sealed with."""
    found: set[str] = set()
    for task in tasks:
        found |= _key_ids_of_spec(task.spec)
    for values in states:
        found |= {kid for value in values.values() if (kid := _key_id_of_value(value)) is not None}
    return found


def sealed_key_ids(store: MetaStore) -> set[str]:
    """The ids of the keys the secrets in ``store`` (a backend, not a ``SealedMetaStore``) are
    sealed with, read from the values themselves: every task's spec and WAL-switch records."""
    tasks = store.list_tasks()
    return _key_ids_in(tasks, (_sealed_state(store, task.task_id) for task in tasks))


def key_ids_in_use(store: MetaStore) -> set[str]:
    """The key ids ``store`` (a backend) records; a store written before the record existed is
    read through once, and the ids its values hold are recorded."""
    recorded = store.secret_key_ids()
    if recorded:
        return set(recorded)
    found = sealed_key_ids(store)
    for key_id in sorted(found):
        store.record_secret_key_id(key_id)
    return found


def _missing(recorded: Iterable[str], ring: KeyRing) -> MissingKeys | None:
    """The recorded key ids ``ring`` lacks; None when it holds them all."""
    missing = set(recorded) - set(ring.ids)
    return MissingKeys(tuple(sorted(missing)), tuple(ring.ids)) if missing else None


def _has_secret(spec: Mapping[str, Any]) -> bool:
    """A secret to seal: a clear value, or a sealed one (sealed again)."""
    values = (_lookup(spec, path)[1] for path in SECRET_FIELDS)
    return any(is_sealed(value) or (isinstance(value, str) and value) for value in values)


def _stale_value(value: bytes, ring: KeyRing) -> bool:
    """A state value to seal: clear (and not empty), or sealed with another key."""
    if not value:
        return False
    key_id = _key_id_of_value(value)
    return key_id is None or key_id != ring.primary


def secrets_problem(store: MetaStore, task: TaskRecord) -> str | None:
    """Why the task's secrets cannot be read by this daemon; None when they can."""
    for path in SECRET_FIELDS:
        _, value = _lookup(task.spec, path)
        if is_sealed(value):
            return str(value.get(_UNREADABLE) or f"{_context(task.task_id, path)} is sealed")
    try:
        store.list_state(task.task_id, SEALED_STATE)
    except SecretUnreadableError as exc:
        return str(exc)
    return None


class SealedMetaStore(DelegatingStore):
    """A ``MetaStore`` around another that seals secrets on the way in and opens them on the
    way out. ``keys`` is called at each use (a key file edited by ``secrets rotate`` is read
    again)."""

    def __init__(self, inner: MetaStore, keys: KeySource) -> None:
        super().__init__(inner)
        self._keys = keys

    # --- the key ids in use --------------------------------------------------------------------
    def missing_keys(self) -> MissingKeys | None:
        """What this daemon's ring lacks of the keys the store records; None: nothing."""
        return _missing(self.inner.secret_key_ids(), self._keys())

    def _ring_to_seal_with(self) -> KeyRing:
        """The ring, once the id of its first key is recorded (before any value is sealed with
        it); ``KeysMissingError`` when it lacks a key the store's secrets are sealed with."""
        ring = self._keys()
        missing = _missing(self.inner.secret_key_ids(), ring)
        if missing is not None:
            raise KeysMissingError(
                f"{missing}: it stores no new secret until it has them (secrets.keyFile or "
                "CDC_SECRETS__KEY)"
            )
        if ring.primary is not None:
            self.inner.record_secret_key_id(ring.primary)
        return ring

    def _sealed_with(self, ring: KeyRing) -> None:
        """After a sealed value was written: its key id recorded again, so that a ``reseal``
        that read the record before the value was written does not forget the id."""
        if ring.primary is not None:
            self.inner.record_secret_key_id(ring.primary)

    # --- specs ---------------------------------------------------------------------------------
    def _seal_spec(
        self, task_id: str, spec: Mapping[str, Any], ring: KeyRing, only_stale: bool = False
    ) -> dict[str, Any]:
        sealed = copy.deepcopy(dict(spec))
        for path in SECRET_FIELDS:
            holder, value = _lookup(sealed, path)
            if holder is None or (only_stale and not _stale(value, ring)):
                continue
            context = _context(task_id, path)
            if is_sealed(value):
                value = ring.open(value, context)
            if isinstance(value, str) and value:
                holder[path[-1]] = ring.seal(value, context)
        return sealed

    def _open(self, task: TaskRecord | None) -> TaskRecord | None:
        if task is None or not any(is_sealed(_lookup(task.spec, p)[1]) for p in SECRET_FIELDS):
            return task
        ring = self._keys()
        spec = copy.deepcopy(dict(task.spec))
        for path in SECRET_FIELDS:
            holder, value = _lookup(spec, path)
            if not is_sealed(value):
                continue
            try:
                holder[path[-1]] = ring.open(value, _context(task.task_id, path))
            except SecretUnreadableError as exc:
                holder[path[-1]] = {**value, _UNREADABLE: str(exc)}
        return replace(task, spec=spec)

    def _opened(self, task: TaskRecord) -> TaskRecord:
        opened = self._open(task)
        assert opened is not None
        return opened

    # --- tasks ---------------------------------------------------------------------------------
    def create_task(self, task: TaskRecord) -> TaskRecord:
        if not _has_secret(task.spec):
            return self.inner.create_task(task)
        ring = self._ring_to_seal_with()
        sealed = self._seal_spec(task.task_id, task.spec, ring)
        stored = self.inner.create_task(replace(task, spec=sealed))
        self._sealed_with(ring)
        return replace(stored, spec=task.spec)

    def get_task(self, task_id: str) -> TaskRecord | None:
        return self._open(self.inner.get_task(task_id))

    def list_tasks(self) -> list[TaskRecord]:
        return [self._opened(t) for t in self.inner.list_tasks()]

    def update_task(
        self,
        task_id: str,
        *,
        state: TaskState,
        reason: str,
        expected_revision: int,
        lease: Lease | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskRecord:
        updated = self.inner.update_task(
            task_id,
            state=state,
            reason=reason,
            expected_revision=expected_revision,
            lease=lease,
            extra=extra,
        )
        return self._opened(updated)

    def replace_spec(
        self,
        task_id: str,
        spec: Mapping[str, Any],
        *,
        expected_revision: int,
        lease: Lease | None = None,
    ) -> TaskRecord:
        if not _has_secret(spec):
            return self.inner.replace_spec(
                task_id, spec, expected_revision=expected_revision, lease=lease
            )
        ring = self._ring_to_seal_with()
        sealed = self._seal_spec(task_id, spec, ring)
        stored = self.inner.replace_spec(
            task_id, sealed, expected_revision=expected_revision, lease=lease
        )
        self._sealed_with(ring)
        return replace(stored, spec=spec)

    # --- per-task state ------------------------------------------------------------------------
    def _seal_value(self, task_id: str, key: str, value: bytes, ring: KeyRing) -> bytes:
        plain = value.decode("utf-8", "surrogateescape")
        return json.dumps(ring.seal(plain, _context(task_id, key))).encode()

    def _open_value(self, task_id: str, key: str, value: bytes) -> bytes:
        if not key.startswith(SEALED_STATE) or not value.startswith(_SEALED_BYTES):
            return value
        plain = self._keys().open(json.loads(value), _context(task_id, key))
        return plain.encode("utf-8", "surrogateescape")

    def put_state(
        self, task_id: str, key: str, value: bytes, *, lease: Lease | None = None
    ) -> None:
        if not key.startswith(SEALED_STATE) or not value:
            self.inner.put_state(task_id, key, value, lease=lease)
            return
        ring = self._ring_to_seal_with()
        self.inner.put_state(task_id, key, self._seal_value(task_id, key, value, ring), lease=lease)
        self._sealed_with(ring)

    def replace_state(self, task_id: str, key: str, value: bytes, expected: bytes | None) -> bool:
        if key.startswith(SEALED_STATE):  # sealed anew at every write: no bytes to compare
            raise ValueError(f"state {key} is sealed: it is not replaced by compare-and-set")
        return self.inner.replace_state(task_id, key, value, expected)

    def get_state(self, task_id: str, key: str) -> bytes | None:
        value = self.inner.get_state(task_id, key)
        return None if value is None else self._open_value(task_id, key, value)

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        found = self.inner.list_state(task_id, prefix)
        return {key: self._open_value(task_id, key, value) for key, value in found.items()}

    # --- migration and rotation ----------------------------------------------------------------
    def reseal(self) -> ResealReport:
        """Seal every clear secret, and every secret sealed with an older key, with the ring's
        first key, then forget the recorded key ids no value uses any more. Values that do not
        open are reported and left as they are. A store without a record of its key ids (from
        a version before it) gets one first; a ring that lacks a recorded key changes nothing
        (``skipped`` says why)."""
        ring = self._keys()
        report = ResealReport()
        recorded = self.inner.secret_key_ids()
        tasks = self.inner.list_tasks()
        states = {task.task_id: _sealed_state(self.inner, task.task_id) for task in tasks}
        if not recorded:
            for key_id in sorted(_key_ids_in(tasks, states.values())):
                self.inner.record_secret_key_id(key_id)
            recorded = self.inner.secret_key_ids()
        missing = _missing(recorded, ring)
        if missing is not None:
            report.skipped = str(missing)
            return report
        stale = any(_stale(_lookup(t.spec, p)[1], ring) for t in tasks for p in SECRET_FIELDS)
        stale = stale or any(
            _stale_value(value, ring) for values in states.values() for value in values.values()
        )
        if stale and ring.primary is not None:
            self.inner.record_secret_key_id(ring.primary)  # before a value is sealed with it
            recorded = self.inner.secret_key_ids()
        in_use: set[str] = set()
        for task in tasks:
            in_use |= self._reseal_spec(task, ring, report)
            in_use |= self._reseal_state(task.task_id, states[task.task_id], ring, report)
        if report.sealed:
            self._sealed_with(ring)
        for key_id, version in sorted(recorded.items()):
            if key_id not in in_use and self.inner.forget_secret_key_id(key_id, version):
                report.forgotten.append(key_id)
        return report

    def _reseal_spec(
        self, task: TaskRecord | None, ring: KeyRing, report: ResealReport
    ) -> set[str]:
        """The ids of the keys the task's secrets are sealed with afterwards."""
        for _attempt in range(5):  # a task changed meanwhile is read again
            if task is None:
                return set()
            stale = sum(_stale(_lookup(task.spec, p)[1], ring) for p in SECRET_FIELDS)
            if not stale:
                return _key_ids_of_spec(task.spec)
            try:
                spec = self._seal_spec(task.task_id, task.spec, ring, only_stale=True)
                self.inner.replace_spec(task.task_id, spec, expected_revision=task.revision)
            except SecretUnreadableError as exc:
                report.unreadable.append(str(exc))
                return _key_ids_of_spec(task.spec)
            except TaskNotFoundError:
                return set()
            except ConcurrentUpdateError:
                task = self.inner.get_task(task.task_id)
                continue
            report.sealed += stale
            report.tasks.add(task.task_id)
            return _key_ids_of_spec(spec)
        return set() if task is None else _key_ids_of_spec(task.spec)

    def _reseal_state(
        self, task_id: str, values: Mapping[str, bytes], ring: KeyRing, report: ResealReport
    ) -> set[str]:
        """The ids of the keys the task's WAL-switch records are sealed with afterwards."""
        in_use: set[str] = set()
        for key, value in values.items():
            if not _stale_value(value, ring):
                if value and ring.primary is not None:
                    in_use.add(ring.primary)
                continue
            try:
                sealed = value.startswith(_SEALED_BYTES)
                plain = self._open_value(task_id, key, value) if sealed else value
                self.inner.put_state(task_id, key, self._seal_value(task_id, key, plain, ring))
            except SecretUnreadableError as exc:
                report.unreadable.append(str(exc))
                if (key_id := _key_id_of_value(value)) is not None:
                    in_use.add(key_id)
                continue
            except TaskNotFoundError:
                return in_use
            report.sealed += 1
            report.tasks.add(task_id)
            if ring.primary is not None:
                in_use.add(ring.primary)
        return in_use
