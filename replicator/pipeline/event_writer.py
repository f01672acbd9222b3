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
from typing import Any

from replicator.events import Delete, Insert
from replicator.pipeline.apply import (
    DEFAULT_PARTITION,
    BatchApplier,
    TargetCollection,
    body_size,
    delete_keys,
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
        for event in events:
            if isinstance(event, Delete):
                keys = delete_keys(event.request)
                partition = self._delete_partition(collection, event.partition_name)
                for pk in keys:
                    value = _event("delete", db, name, partition or None, pk, None, event.ts)
                    deleted[(pk, event.ts)] = self.log.add(topic, row_key(db, name, pk), value)
                self.stats.rows_deleted += len(keys)
                self.stats.count(event, len(keys), body_size(event))
                continue
            partition = self._partition(collection, event.partition_name) or DEFAULT_PARTITION
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
            self.stats.count(event, rows, body_size(event))


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
