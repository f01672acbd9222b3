"""The collections a running task replicates: source id -> target collection, kept current from
the source catalog and from the DDL the task reads. Shared by the task's channel workers.

A collection is registered before the target has made it (its data is decoded from then on) and
marked created once the target has it: the replicate channel's calls about it wait for that."""

from __future__ import annotations

import threading
import time
from typing import Any

from replicator.meta.catalog import DEFAULT_DB
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.selection import WILDCARD, TaskSelection
from replicator.sinks.schema_convert import has_partition_key, pk_field


class CollectionRegistry:
    def __init__(
        self, selection: TaskSelection, default_partition: str, *, single_partition: bool = False
    ) -> None:
        self._selection = selection
        self._default_partition = default_partition
        self._single_partition = single_partition  # ignore_partition: one partition per collection
        self._by_id: dict[int, TargetCollection] = {}
        self._pchannels: dict[int, frozenset[str]] = {}
        self._source_names: dict[int, tuple[str, str]] = {}
        self._created: set[int] = set()
        self._unselected: set[int] = set()  # collections known and not replicated
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def add(
        self, collection_id: int, db: str, name: str, schema: Any, pchannels: tuple[str, ...]
    ) -> TargetCollection | None:
        """Register a source collection; None when the task does not select it."""
        db = db or DEFAULT_DB
        if not self._selection.selects(db, name):
            with self._lock:
                self._unselected.add(collection_id)
            return None
        target_db, target_name = self._selection.target_name(db, name)
        collection = TargetCollection(
            collection_id=collection_id,
            db=target_db,
            name=target_name,
            pk_name=pk_field(schema).name,
            partition_key=has_partition_key(schema),
            default_partition=self._default_partition,
            single_partition=self._single_partition,
        )
        with self._lock:
            self._by_id[collection_id] = collection
            self._pchannels[collection_id] = frozenset(pchannels)
            self._source_names[collection_id] = (db, name)
        return collection

    def mark_created(self, collection_id: int) -> None:
        """The target has the collection now."""
        with self._changed:
            self._created.add(collection_id)
            self._changed.notify_all()

    def settled(self, collection_id: int) -> bool:
        """On the target, or known not to be replicated: its create record changes nothing."""
        return collection_id in self._created or collection_id in self._unselected

    def remove(self, collection_id: int) -> None:
        with self._lock:
            self._by_id.pop(collection_id, None)
            self._source_names.pop(collection_id, None)
            self._created.discard(collection_id)

    def _ready(self, source_name: tuple[str, str]) -> bool:
        return any(
            name == source_name and collection_id in self._created
            for collection_id, name in self._source_names.items()
        )

    def wait_created(self, db: str, name: str, timeout: float, stop: threading.Event) -> bool:
        """Wait until a selected source collection of this name is on the target; False after
        ``timeout`` seconds or once ``stop`` is set."""
        deadline = time.monotonic() + timeout
        key = (db or DEFAULT_DB, name)
        with self._changed:
            while not self._ready(key):
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    def selects(self, db: str, name: str) -> bool:
        """Does the task replicate a source collection of this name?"""
        return self._selection.selects(db or DEFAULT_DB, name)

    @property
    def single_partition(self) -> bool:
        return self._single_partition

    def known(self, collection_id: int) -> bool:
        """Replicated, or known not to be."""
        return collection_id in self._by_id or collection_id in self._unselected

    def may_select_unknown(self) -> bool:
        """Could a collection whose name is not known be one the task replicates? (A task with
        a ``*`` selection replicates collections it has never seen named.)"""
        return any(collection == WILDCARD for _db, collection in self._selection.selection)

    def wanted(self, collection_id: int) -> bool:
        return collection_id in self._by_id

    def resolve(self, collection_id: int) -> TargetCollection | None:
        return self._by_id.get(collection_id)

    def source_name(self, collection_id: int) -> tuple[str, str] | None:
        """(db, name) on the source of a replicated collection."""
        return self._source_names.get(collection_id)

    def collections(self) -> list[TargetCollection]:
        with self._lock:
            return list(self._by_id.values())

    def pchannels(self, collection_id: int) -> frozenset[str]:
        return self._pchannels.get(collection_id, frozenset())
