"""Applying one channel's batch of decoded events to the target, in the source's order.

Rules:
- Within a batch, events of one collection are ordered by (timestamp, deletes before inserts).
  Milvus writes an upsert as an Insert and a Delete of the same keys at one timestamp, and a
  delete hides only older rows; applying the delete first reproduces exactly that.
- Consecutive inserts into one (collection, partition) become one request: their ``fields_data``
  are merged column by column into the request's (protobuf ``MergeFrom`` concatenates the
  values; the decoded events are left as they are, so a batch applied again is the same).
- In replay mode (records a crash may already have written) inserts go as upserts, so a row
  is never doubled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replicator.errors import TaskFailedError
from replicator.events import Delete, Insert
from replicator.sinks.milvus import MilvusTarget

DEFAULT_PARTITION = "_default"  # the target's default partition


@dataclass
class TargetCollection:
    """Where a source collection goes on the target, and what writing to it needs."""

    collection_id: int
    db: str
    name: str
    pk_name: str
    partition_key: bool
    default_partition: str
    known_partitions: set[str] = field(default_factory=set)
    # the task's ignore_partition: every row in the target's default partition, no partitions
    single_partition: bool = False


@dataclass
class ApplyStats:
    rows_inserted: int = 0
    rows_deleted: int = 0
    bytes: int = 0
    # rows by (source collection id, source collection name, "insert" | "delete")
    collection_rows: dict[tuple[int, str, str], int] = field(default_factory=dict)
    # message bytes by Milvus message type ("Insert", "Delete")
    bytes_by_type: dict[str, int] = field(default_factory=dict)

    def count(self, event: Insert | Delete, rows: int, size: int) -> None:
        api, kind = ("insert", "Insert") if isinstance(event, Insert) else ("delete", "Delete")
        key = (event.collection_id, event.collection_name, api)
        self.collection_rows[key] = self.collection_rows.get(key, 0) + rows
        self.bytes_by_type[kind] = self.bytes_by_type.get(kind, 0) + size
        self.bytes += size


def body_size(event: Insert | Delete) -> int:
    """The bytes of an event's request: as read (``ByteSize()`` serializes the whole request
    again to count them, as long as parsing it took)."""
    return event.size or event.request.ByteSize()


def delete_keys(request: Any) -> list[int | str]:
    pks = request.primary_keys
    if pks.HasField("int_id"):
        return list(pks.int_id.data)
    if pks.HasField("str_id"):
        return list(pks.str_id.data)
    return list(request.int64_primary_keys)


def unplaced_message(unplaced: dict[int, list[Insert | Delete]]) -> str:
    """What stops a task whose batch holds rows of collections it has no target for."""
    named = ", ".join(
        f"{group[0].db_name or 'default'}.{group[0].collection_name} (id {cid}): "
        f"{sum(e.num_rows for e in group)} row(s) at ts {min(e.ts for e in group)}"
        for cid, group in sorted(unplaced.items())
    )
    return (
        f"rows read as replicated have no target collection: {named}; the task knows no "
        "target for them (its registry never learned the collection), so they are not dropped: "
        "the task stops here, before writing the batch"
    )


def order_for_target(events: Sequence[Insert | Delete]) -> list[Insert | Delete]:
    """Stable order by (ts, delete first): see the module docstring."""
    return sorted(events, key=lambda e: (e.ts, 0 if isinstance(e, Delete) else 1))


class BatchApplier:
    def __init__(
        self,
        target: MilvusTarget,
        resolve: Callable[[int], TargetCollection | None],
    ) -> None:
        self._target = target
        self._resolve = resolve
        self.stats = ApplyStats()

    def apply(self, events: Sequence[Insert | Delete], *, replay: bool = False) -> None:
        """Apply a batch; TaskFailedError, before anything of it is written, when a collection
        of it has no target (the channel read its rows as replicated: they are never dropped
        in silence)."""
        by_collection: dict[int, list[Insert | Delete]] = {}
        for event in events:
            by_collection.setdefault(event.collection_id, []).append(event)
        placed: list[tuple[TargetCollection, list[Insert | Delete]]] = []
        unplaced: dict[int, list[Insert | Delete]] = {}
        for collection_id, group in by_collection.items():
            collection = self._resolve(collection_id)
            if collection is None:
                unplaced[collection_id] = group
            else:
                placed.append((collection, group))
        if unplaced:
            raise TaskFailedError(unplaced_message(unplaced))
        for collection, group in placed:
            self._apply_collection(collection, order_for_target(group), replay)

    def _partition(self, collection: TargetCollection, source_partition: str) -> str:
        """The target partition of a source partition's rows ("": the default one), made on
        the target the first time."""
        if (
            collection.partition_key
            or collection.single_partition
            or source_partition in ("", collection.default_partition)
        ):
            return ""
        if source_partition not in collection.known_partitions:
            self._target.create_partition(collection.db, collection.name, source_partition)
            collection.known_partitions.add(source_partition)
        return source_partition

    def _delete_partition(self, collection: TargetCollection, source_partition: str) -> str:
        """Where a delete applies: the source's partition when it named one (a key held in two
        partitions is deleted from that one only), every partition when it named none; a
        partition-key collection's deletes are routed by the target, by key."""
        if collection.partition_key or collection.single_partition or not source_partition:
            return ""
        if source_partition in (collection.default_partition, DEFAULT_PARTITION):
            return DEFAULT_PARTITION
        return self._partition(collection, source_partition)

    def _apply_collection(
        self, collection: TargetCollection, events: list[Insert | Delete], replay: bool
    ) -> None:
        run: list[Insert] = []

        def flush_inserts() -> None:
            if not run:
                return
            rows = sum(e.num_rows for e in run)
            self._target.insert(
                collection.db,
                collection.name,
                self._partition(collection, run[0].partition_name),
                run[0].request.fields_data,
                rows,
                upsert=replay,
                more=[later.request.fields_data for later in run[1:]],
            )
            self.stats.rows_inserted += rows
            for inserted in run:
                self.stats.count(inserted, inserted.num_rows, body_size(inserted))
            run.clear()

        for event in events:
            if isinstance(event, Insert):
                if run and run[0].partition_name != event.partition_name:
                    flush_inserts()
                run.append(event)
                continue
            flush_inserts()
            keys = delete_keys(event.request)
            if keys:
                partition = self._delete_partition(collection, event.partition_name)
                self._target.delete(
                    collection.db, collection.name, partition, collection.pk_name, keys
                )
                self.stats.rows_deleted += len(keys)
                self.stats.count(event, len(keys), body_size(event))
        flush_inserts()
