"""A channel's batches as row events for a Kafka target (see :mod:`replicator.sinks.kafka`).

Same rules as :class:`~replicator.pipeline.apply.BatchApplier` (its order, partitions and
counts), but every row becomes one event in the channel's log, committed with the channel's
position. An event's time is its message's (the one time Milvus gives all rows of a message;
a 2.6 transaction's, its commit's). An upsert (Milvus writes it as a Delete and an Insert of
the same key at one timestamp, the delete first in our order) becomes ONE ``upsert`` event.
``replay`` changes nothing here: a transaction is committed whole or not at all, so nothing is
written twice.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from replicator.events import Delete, Insert
from replicator.pipeline.apply import DEFAULT_PARTITION, BatchApplier, TargetCollection, delete_keys
from replicator.sinks.encode_pool import (
    Encoded,
    encoded_rows,
    log_encoded,
    shared_pool,
    unpaired,
)
from replicator.sinks.kafka import ChannelLog, KafkaTarget
from replicator.sinks.kafka_columns import insert_events
from replicator.sinks.kafka_events import row_key, ts_view
from replicator.sinks.milvus import MilvusTarget


def channel_writer(
    target: MilvusTarget, resolve: Callable[[int], TargetCollection | None], pchannel: str
) -> tuple[BatchApplier, ChannelLog | None]:
    """The writer of one channel's batches, and the target's durable log of the channel when
    it commits events with positions (Kafka; None for a Milvus)."""
    if isinstance(target, KafkaTarget):
        channel_log = target.channel_log(pchannel)
        return EventWriter(target, resolve, channel_log), channel_log
    return BatchApplier(target, resolve), None


class EventWriter(BatchApplier):
    def __init__(
        self,
        target: KafkaTarget,
        resolve: Callable[[int], TargetCollection | None],
        channel_log: ChannelLog,
    ) -> None:
        super().__init__(target, resolve)
        self._kafka = target
        self.log = channel_log

    def _apply_collection(
        self, collection: TargetCollection, events: list[Insert | Delete], replay: bool
    ) -> None:
        db, name = collection.db, collection.name
        self._kafka.model.require(db, name)  # NOT_FOUND as a Milvus would answer
        pk_name = collection.pk_name
        topic = self._kafka.row_topic(db, name)
        deleted: dict[tuple[Any, int], int] = {}  # (pk, ts) of this batch's deletes -> event
        encoding = self._encode_ahead(collection, events)
        for event in events:
            if isinstance(event, Delete):
                keys = delete_keys(event.request)
                partition = self._delete_partition(collection, event.partition_name)
                for pk in keys:
                    value = _event("delete", db, name, partition or None, pk, None, event.ts)
                    deleted[(pk, event.ts)] = self.log.add(topic, row_key(db, name, pk), value)
                self.stats.rows_deleted += len(keys)
                self.stats.count(event, len(keys), event.request.ByteSize())
                continue
            partition = self._partition(collection, event.partition_name) or DEFAULT_PARTITION
            future = encoding.get(id(event))
            encoded = encoded_rows(future) if future is not None else None
            if encoded is not None:
                rows = log_encoded(self.log, topic, encoded)
                self.stats.rows_inserted += rows
                self.stats.count(event, rows, event.request.ByteSize())
                continue
            rows = insert_events(
                self.log,
                topic,
                db,
                name,
                partition,
                pk_name,
                event.request.fields_data,
                event.num_rows,
                event.ts,
                deleted,
            )
            self.stats.rows_inserted += rows
            self.stats.count(event, rows, event.request.ByteSize())

    def _encode_ahead(
        self, collection: TargetCollection, events: list[Insert | Delete]
    ) -> dict[int, Future[Encoded]]:
        """The inserts of a batch the daemon's encoding processes take (see
        :mod:`replicator.sinks.encode_pool`), submitted all at once, by ``id`` of the event:
        those before the batch's first delete (no upsert pairs them), in a partition the target
        knows already (making one logs its event first, in order)."""
        pool = shared_pool()
        if pool is None:
            return {}
        db, name = collection.db, collection.name
        submitted: dict[int, Future[Encoded]] = {}
        for event in events[: unpaired(events, Delete)]:
            if not isinstance(event, Insert) or event.num_rows < pool.min_rows:
                continue
            partition = self._known_partition(collection, event.partition_name)
            if partition is not None:
                submitted[id(event)] = pool.submit(
                    event.request, db, name, partition, collection.pk_name, event.num_rows, event.ts
                )
        return submitted

    def _known_partition(self, collection: TargetCollection, source_partition: str) -> str | None:
        """What ``_partition`` answers (or the default) when that creates nothing; None when
        it would create the partition."""
        partition = self._partition_if_known(collection, source_partition)
        return None if partition is None else partition or DEFAULT_PARTITION


def _event(
    op: str,
    db: str,
    collection: str,
    partition: str | None,
    pk: Any,
    row: dict[str, Any] | None,
    ts: int,
) -> dict[str, Any]:
    return {
        "op": op,
        "db": db,
        "collection": collection,
        "partition": partition,
        "pk": pk,
        "row": row,
        "ts": ts_view(ts),
    }
