"""The collections a running task replicates: source id -> target collection, kept current from
the source catalog and from the DDL the task reads. Shared by the task's channel workers."""

from __future__ import annotations

import threading
from typing import Any

from replicator.meta.catalog import DEFAULT_DB
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.selection import TaskSelection
from replicator.sinks.milvus import has_partition_key, pk_field


class CollectionRegistry:
    def __init__(self, selection: TaskSelection, default_partition: str) -> None:
        self._selection = selection
        self._default_partition = default_partition
        self._by_id: dict[int, TargetCollection] = {}
        self._pchannels: dict[int, frozenset[str]] = {}
        self._source_names: dict[int, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def add(
        self, collection_id: int, db: str, name: str, schema: Any, pchannels: tuple[str, ...]
    ) -> TargetCollection | None:
        """Register a source collection; None when the task does not select it."""
        db = db or DEFAULT_DB
        if not self._selection.selects(db, name):
            return None
        target_db, target_name = self._selection.target_name(db, name)
        collection = TargetCollection(
            collection_id=collection_id,
            db=target_db,
            name=target_name,
            pk_name=pk_field(schema).name,
            partition_key=has_partition_key(schema),
            default_partition=self._default_partition,
        )
        with self._lock:
            self._by_id[collection_id] = collection
            self._pchannels[collection_id] = frozenset(pchannels)
            self._source_names[collection_id] = (db, name)
        return collection

    def remove(self, collection_id: int) -> None:
        with self._lock:
            self._by_id.pop(collection_id, None)
            self._source_names.pop(collection_id, None)

    def selects(self, db: str, name: str) -> bool:
        """Does the task replicate a source collection of this name?"""
        return self._selection.selects(db or DEFAULT_DB, name)

    def knows(self, db: str, name: str) -> bool:
        """Is a selected source collection of this name being replicated now?"""
        return (db or DEFAULT_DB, name) in set(self._source_names.values())

    def wanted(self, collection_id: int) -> bool:
        return collection_id in self._by_id

    def resolve(self, collection_id: int) -> TargetCollection | None:
        return self._by_id.get(collection_id)

    def collections(self) -> list[TargetCollection]:
        with self._lock:
            return list(self._by_id.values())

    def pchannels(self, collection_id: int) -> frozenset[str]:
        return self._pchannels.get(collection_id, frozenset())
