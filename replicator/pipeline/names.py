"""Source ids and names -> a task's target names, and what the 2.6 WAL names only by id
(fields, partitions, indexes), learnt from the stream and the catalog."""

from __future__ import annotations

from collections.abc import Callable

from pymilvus.grpc_gen import schema_pb2

from replicator.codec.streaming_events import (
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDropPartition,
)
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.selection import WILDCARD, TaskSelection


class TaskNames:
    """Source ids and names -> the task's target names, plus what the WAL names only by id
    (fields, partitions, indexes), learned from the stream as it is read.

    ``resolve`` is ``CollectionRegistry.resolve``; ``target_db`` maps a source database to the
    target's or None when the task selects nothing in it (:func:`database_mapper`);
    ``target_name`` is ``TaskSelection.target_name`` (grants name collections). Call
    :meth:`observe` with every StreamCreateCollection / StreamCreatePartition /
    StreamDropPartition the runner reads, and :meth:`remember_schema` with the source catalog's
    schemas on start (after a restart the stream does not repeat them)."""

    def __init__(
        self,
        resolve: Callable[[int], TargetCollection | None],
        target_db: Callable[[str], str | None],
        target_name: Callable[[str, str], tuple[str, str]] | None = None,
    ) -> None:
        self._resolve = resolve
        self._target_db = target_db
        self._target_name = target_name
        self._fields: dict[tuple[int, int], str] = {}
        self._partitions: dict[tuple[int, int], str] = {}
        self._indexes: dict[tuple[int, int], tuple[str, str]] = {}

    @classmethod
    def for_task(
        cls, resolve: Callable[[int], TargetCollection | None], selection: TaskSelection
    ) -> TaskNames:
        """The names of a running task: ``TaskNames.for_task(registry.resolve, selection)``."""
        return cls(resolve, database_mapper(selection), selection.target_name)

    def collection(self, collection_id: int) -> TargetCollection | None:
        return self._resolve(collection_id)

    def database(self, db_name: str) -> str | None:
        return self._target_db(db_name or "default")

    def collection_name(self, db: str, name: str) -> str:
        """A collection's target name by source name (grants name collections, not ids)."""
        if self._target_name is None:
            return name
        return self._target_name(db or "default", name)[1]

    def field(self, collection_id: int, field_id: int) -> str | None:
        return self._fields.get((collection_id, field_id))

    def partition(self, collection_id: int, partition_id: int) -> str | None:
        return self._partitions.get((collection_id, partition_id))

    def index(self, collection_id: int, index_id: int) -> tuple[str, str] | None:
        """(field name, index name) of a source index seen created (kept after its drop: the
        source never reuses an id, and a replayed drop must still find the name)."""
        return self._indexes.get((collection_id, index_id))

    def remember_schema(self, collection_id: int, schema: schema_pb2.CollectionSchema) -> None:
        for f in schema.fields:
            self._fields[(collection_id, f.fieldID)] = f.name

    def remember_partition(self, collection_id: int, partition_id: int, name: str) -> None:
        self._partitions[(collection_id, partition_id)] = name

    def remember_index(self, collection_id: int, index_id: int, field: str, name: str) -> None:
        self._indexes[(collection_id, index_id)] = (field, name)

    def observe(self, event: object) -> None:
        if isinstance(event, StreamCreateCollection):
            self.remember_schema(event.collection_id, event.schema)
            for pid, name in zip(event.partition_ids, event.partition_names, strict=False):
                self.remember_partition(event.collection_id, pid, name)
        elif isinstance(event, StreamCreatePartition):
            self.remember_partition(event.collection_id, event.partition_id, event.partition_name)
        elif isinstance(event, StreamDropPartition):
            self._partitions.pop((event.collection_id, event.partition_id), None)


def database_mapper(selection: TaskSelection) -> Callable[[str], str | None]:
    """A source database's target name, None when the task selects nothing in it (the rule of
    the 2.3 replicate channel's database calls in runner.py)."""

    def target_db(db: str) -> str | None:
        if not any(d in (WILDCARD, db) for d, _ in selection.selection):
            return None
        return selection.target_name(db, "")[0]

    return target_db
