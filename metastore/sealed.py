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
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
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


@dataclass
class ResealReport:
    sealed: int = 0  # values written with the ring's first key
    tasks: set[str] = field(default_factory=set)
    unreadable: list[str] = field(default_factory=list)  # why a value could not be read


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
        sealed = self._seal_spec(task.task_id, task.spec, self._keys())
        stored = self.inner.create_task(replace(task, spec=sealed))
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
    ) -> TaskRecord:
        updated = self.inner.update_task(
            task_id, state=state, reason=reason, expected_revision=expected_revision, lease=lease
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
        sealed = self._seal_spec(task_id, spec, self._keys())
        stored = self.inner.replace_spec(
            task_id, sealed, expected_revision=expected_revision, lease=lease
        )
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
        if key.startswith(SEALED_STATE) and value:
            value = self._seal_value(task_id, key, value, self._keys())
        self.inner.put_state(task_id, key, value, lease=lease)

    def get_state(self, task_id: str, key: str) -> bytes | None:
        value = self.inner.get_state(task_id, key)
        return None if value is None else self._open_value(task_id, key, value)

    def list_state(self, task_id: str, prefix: str = "") -> dict[str, bytes]:
        found = self.inner.list_state(task_id, prefix)
        return {key: self._open_value(task_id, key, value) for key, value in found.items()}

    # --- migration and rotation ----------------------------------------------------------------
    def reseal(self) -> ResealReport:
        """Seal every clear secret, and every secret sealed with an older key, with the ring's
        first key. Values that do not open are reported and left as they are."""
        ring = self._keys()
        report = ResealReport()
        for task in self.inner.list_tasks():
            self._reseal_spec(task, ring, report)
            self._reseal_state(task.task_id, ring, report)
        return report

    def _reseal_spec(self, task: TaskRecord | None, ring: KeyRing, report: ResealReport) -> None:
        for _attempt in range(5):  # a task changed meanwhile is read again
            if task is None:
                return
            stale = sum(_stale(_lookup(task.spec, p)[1], ring) for p in SECRET_FIELDS)
            if not stale:
                return
            try:
                spec = self._seal_spec(task.task_id, task.spec, ring, only_stale=True)
                self.inner.replace_spec(task.task_id, spec, expected_revision=task.revision)
            except SecretUnreadableError as exc:
                report.unreadable.append(str(exc))
                return
            except TaskNotFoundError:
                return
            except ConcurrentUpdateError:
                task = self.inner.get_task(task.task_id)
                continue
            report.sealed += stale
            report.tasks.add(task.task_id)
            return

    def _reseal_state(self, task_id: str, ring: KeyRing, report: ResealReport) -> None:
        for key, value in self.inner.list_state(task_id, SEALED_STATE).items():
            sealed = value.startswith(_SEALED_BYTES)
            if not value or (sealed and json.loads(value).get("kid") == ring.primary):
                continue
            try:
                plain = self._open_value(task_id, key, value) if sealed else value
                self.inner.put_state(task_id, key, self._seal_value(task_id, key, plain, ring))
            except SecretUnreadableError as exc:
                report.unreadable.append(str(exc))
                continue
            except TaskNotFoundError:
                return
            report.sealed += 1
            report.tasks.add(task_id)
