"""Collections and partitions on the target: created, dropped, under the task's names.

Both source generations go through here: a 2.3-2.5 DDL record is applied when read (a drop
behind its barrier, see :mod:`barriers`); a 2.6 one when its broadcast's turn comes (see
:mod:`broadcast_ddl`). Every operation is idempotent (the target is asked first), so a record
read again after a restart changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pymilvus.grpc_gen import common_pb2, schema_pb2

from replicator.errors import SourceUnavailableError
from replicator.events import CreateCollection, DropCollection, DropPartition
from replicator.hybrid_time import to_seconds
from replicator.meta.catalog import COLLECTION_CREATED, DEFAULT_DB, CollectionMeta
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.barriers import Barriers
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.task_state import RunnerState
from replicator.sinks.milvus import MilvusTarget

log = logging.getLogger(__name__)

VCHANNEL_OF_CONTROL = "_vcchan"  # 2.6's control channel is no shard
CONSISTENCY_PROPERTY = "consistency_level"  # pkg/common/common.go ConsistencyLevel
CATALOG_MISS_SECONDS = 5.0
# Milvus 2.3-2.5 writes a CreateCollection to the WAL before the collection's catalog entry
# (rootcoord's createCollectionTask takes the record's positions as the collection's start
# positions, then adds the meta): a record this recent is waited on, an older one missing from
# the catalog was dropped (and collected) or its creation undone
CATALOG_LAG_SECONDS = 30.0
CATALOG_POLL_SECONDS = 0.2


def schema_consistency(schema: schema_pb2.CollectionSchema) -> int:
    """A 2.6 collection's consistency level: its CreateCollection carries it only as the schema
    property ``consistency_level`` (rootcoord's createCollectionTask sets the schema's
    properties to the request's, where the proxy appended the level as a number; Milvus's
    backup tools write the enum's name). Strong when absent, as before 2.6 without a catalog."""
    for pair in schema.properties:
        if pair.key == CONSISTENCY_PROPERTY:
            value = pair.value.strip()
            if value.lstrip("-").isdigit():
                return int(value)
            try:
                return int(common_pb2.ConsistencyLevel.Value(value))
            except ValueError:
                log.warning("unknown consistency level %r; the target's default is used", value)
    return 0


def schema_properties(schema: schema_pb2.CollectionSchema) -> list[tuple[str, str]]:
    """The collection properties a 2.6 schema carries (``timezone``, TTL, mmap, ...), for the
    target's CreateCollection; the consistency level goes in its own field."""
    return [(p.key, p.value) for p in schema.properties if p.key != CONSISTENCY_PROPERTY]


def held_schema(
    record: schema_pb2.CollectionSchema, catalog: schema_pb2.CollectionSchema
) -> schema_pb2.CollectionSchema:
    """A CreateCollection record's schema with each field's flags as the source's catalog holds
    them. A client may send Milvus 2.3 flags it does not know (``nullable``, a clustering key):
    the record keeps them (protobuf carries unknown fields along), yet the source holds the
    field without them: its catalog, which is what it describes, has none, and it refuses a
    null. A target must not be asked for (or stopped over) a flag the source does not hold."""
    held = {field.fieldID: field for field in catalog.fields}
    schema = schema_pb2.CollectionSchema()
    schema.CopyFrom(record)
    for field in schema.fields:
        kept = held.get(field.fieldID)
        if kept is not None:
            field.nullable = kept.nullable
            field.is_clustering_key = kept.is_clustering_key
    return schema


def make_on_target(
    target: MilvusTarget,
    registry: CollectionRegistry,
    collection: TargetCollection,
    meta: CollectionMeta,
) -> None:
    """Create a catalog collection on the target (unless it exists) under its target name,
    with its shards, consistency level and properties; its rows may be written from then on."""
    target.create_collection(
        collection.db,
        collection.name,
        meta.schema,
        meta.shards,
        meta.consistency_level,
        schema_properties(meta.schema),
        num_partitions=len(meta.partitions),
    )
    registry.mark_created(meta.collection_id)


class CollectionDdl:
    def __init__(
        self,
        registry: CollectionRegistry,
        target: MilvusTarget,
        state: RunnerState,
        barriers: Barriers,
        describe: Callable[[int], CollectionMeta | None],
        stop: threading.Event | None = None,
    ) -> None:
        self._registry = registry
        self._target = target
        self._state = state
        self._barriers = barriers
        # one collection of the source catalog, for what a CreateCollection record lacks
        self._describe = describe
        self._stop = stop or threading.Event()  # set: the task stops, nothing waits longer
        self._misses: dict[int, float] = {}  # collection id -> when to ask the catalog again

    def apply_record(
        self, event: CreateCollection | DropCollection | DropPartition, pchannel: str
    ) -> None:
        """A 2.3-2.5 DDL record, applied when read; a drop once every channel reached it.

        A CreateCollection has a copy on each of the collection's channels: the first copy this
        process reads makes it (unless the task made it at its start, from the catalog), or
        finds it is not replicated; the others change nothing. They read neither the catalog
        nor take the lock the task's channel groups share, nor ask the target again (in a
        backlog of many collections, every copy of every create waited on the other groups'
        DDL)."""
        if self.settled(event):
            return
        # asked before the lock: it may wait for the catalog, the other channels need not
        meta = self._catalog_entry(event) if isinstance(event, CreateCollection) else None
        with self._barriers.ddl_lock:
            if isinstance(event, CreateCollection):
                if not self._registry.settled(event.collection_id):  # by a copy waited on
                    self.create(event, meta)
            elif self._registry.resolve(event.collection_id) is None:
                return  # not replicated
            elif isinstance(event, DropPartition):
                if self._barriers.partition_drop_reached(
                    event.collection_id, event.partition_name, pchannel
                ):
                    self.drop_partition(event.collection_id, event.partition_name)
            elif self._barriers.drop_reached(event.collection_id, pchannel):
                self.drop(event.collection_id)

    def settled(self, event: CreateCollection | DropCollection | DropPartition) -> bool:
        """Does the record change nothing here? A CreateCollection of a collection this
        process has made (or knows it does not replicate)."""
        return isinstance(event, CreateCollection) and self._registry.settled(event.collection_id)

    def describe(self, collection_id: int) -> CollectionMeta | None:
        """The source catalog's entry of a collection, as it is now."""
        return self._describe(collection_id)

    def _catalog_entry(self, event: CreateCollection) -> CollectionMeta | None:
        """The catalog's entry of a created collection; for a record younger than
        ``CATALOG_LAG_SECONDS``, asked again until the catalog has it (it follows the record by
        milliseconds, but a channel read at once gets there first)."""
        meta = self._describe(event.collection_id)
        written = to_seconds(event.ts)
        waited = False
        while meta is None and time.time() < written + CATALOG_LAG_SECONDS:
            waited = True
            if self._stop.wait(CATALOG_POLL_SECONDS):
                # not applied on a guess: the record is read again when the task runs again
                raise SourceUnavailableError(
                    f"stopped while waiting for collection {event.collection_id} to appear in "
                    "the source catalog"
                )
            meta = self._describe(event.collection_id)
        if meta is None:
            log.warning(
                "collection %s (%d) created at ts %d is not in the source catalog%s: its "
                "database is taken from the record (%r; empty means the default one)",
                event.collection_name,
                event.collection_id,
                event.ts,
                f" {CATALOG_LAG_SECONDS:.0f} s after its creation" if waited else "",
                event.db_name,
            )
        elif waited:
            log.info(
                "collection %s.%s (%d): the source catalog had it after its create record",
                meta.db_name,
                meta.name,
                event.collection_id,
            )
        return meta

    def create(self, event: CreateCollection, meta: CollectionMeta | None) -> None:
        """Register a created collection and make it on the target when the task selects it.
        Milvus 2.3 leaves the record's db_name empty (it names no database at all) and the
        record has no consistency level: both come from ``meta``, the source catalog's entry,
        when it has one."""
        db = meta.db_name if meta is not None else event.db_name
        schema = event.schema if meta is None else held_schema(event.schema, meta.schema)
        collection = self._registry.add(
            event.collection_id, db, event.collection_name, schema, event.pchannels
        )
        if collection is None:
            return
        shards = len([v for v in event.vchannels if not v.endswith(VCHANNEL_OF_CONTROL)]) or 1
        consistency = meta.consistency_level if meta is not None else schema_consistency(schema)
        self._state.remember_collection(
            CollectionMeta(
                collection_id=event.collection_id,
                db_id=0,
                db_name=db or DEFAULT_DB,
                name=event.collection_name,
                schema=schema,
                vchannels=event.vchannels,
                pchannels=event.pchannels,
                shards=shards,
                consistency_level=consistency,
                state=COLLECTION_CREATED,
                create_time=0,
            )
        )
        created = self._target.create_collection(
            collection.db,
            collection.name,
            schema,
            shards,
            consistency,
            schema_properties(schema),
            num_partitions=len(event.partition_names) or (len(meta.partitions) if meta else 0),
        )
        self._registry.mark_created(event.collection_id)
        if created:
            log.info("created collection %s.%s on the target", collection.db, collection.name)

    def learn(self, collection_id: int) -> None:
        """A data record names a collection the task has not placed (created before the task
        on a source whose catalog was not read for it, or dropped since the catalog was read):
        look it up in the source catalog, register it and make it on the target. A miss is
        remembered for a few seconds (a burst of its records asks the catalog once)."""
        now = time.monotonic()
        if self._misses.get(collection_id, 0.0) > now:
            return
        meta = self._describe(collection_id)
        if meta is None or meta.creating:
            self._misses[collection_id] = now + CATALOG_MISS_SECONDS
            return
        with self._barriers.ddl_lock:
            if self._registry.known(collection_id):
                return
            collection = self._registry.add(
                collection_id, meta.db_name, meta.name, meta.schema, meta.pchannels
            )
            if collection is None:
                return
            log.info(
                "collection %s.%s (%d) learnt from the source catalog",
                meta.db_name,
                meta.name,
                collection_id,
            )
            self._state.remember_collection(meta)
            make_on_target(self._target, self._registry, collection, meta)

    def flush(self, collection_ids: list[int] | None) -> None:
        """Flush these collections on the target (None: every collection of the task)."""
        collections = (
            self._registry.collections()
            if collection_ids is None
            else [c for i in collection_ids if (c := self._registry.resolve(i)) is not None]
        )
        by_db: dict[str, list[str]] = {}
        for collection in collections:
            by_db.setdefault(collection.db, []).append(collection.name)
        for db, names in sorted(by_db.items()):
            self._target.flush(db, sorted(names))
            log.info("flushed %s on the target", ", ".join(f"{db}.{n}" for n in sorted(names)))

    def drop(self, collection_id: int) -> None:
        collection = self._registry.resolve(collection_id)
        if collection is None:
            return
        if self._target.drop_collection(collection.db, collection.name):
            log.info("dropped collection %s.%s on the target", collection.db, collection.name)
        self._registry.remove(collection_id)
        self._state.forget_collection(collection_id)

    def create_partition(self, collection_id: int, partition: str) -> None:
        collection = self._registry.resolve(collection_id)
        if collection is None or collection.partition_key or collection.single_partition:
            return  # a partition-key collection's partitions are the target's own
        if partition in ("", collection.default_partition):
            return
        self._target.create_partition(collection.db, collection.name, partition)
        collection.known_partitions.add(partition)

    def drop_partition(self, collection_id: int, partition: str) -> None:
        collection = self._registry.resolve(collection_id)
        if collection is None:
            return
        if collection.single_partition:
            log.warning(
                "partition %s of %s.%s was dropped on the source; with ignore_partition its "
                "rows stay in the target's default partition",
                partition,
                collection.db,
                collection.name,
            )
            return
        if self._target.drop_partition(collection.db, collection.name, partition):
            log.info(
                "dropped partition %s of %s.%s on the target",
                partition,
                collection.db,
                collection.name,
            )
        collection.known_partitions.discard(partition)
