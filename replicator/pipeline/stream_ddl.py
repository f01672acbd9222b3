"""Applying the 2.6 DDL operations of :mod:`replicator.codec.streaming_ddl` to a target Milvus
through its public API: the dispatcher, and databases, aliases, load, collections and truncate
here; indexes in :mod:`ddl_index`, RBAC in :mod:`ddl_rbac`.

The runner decodes a :class:`StreamDdl` with ``decode_ddl``, applies it at the right moment
(``op.barrier``: after every vchannel of the broadcast has been read past its copy; otherwise at
the first copy) and calls :meth:`StreamDdlApplier.apply` once per broadcast. Every operation is
idempotent: it reads the target's state first or treats "already exists" / "not found" as done,
so applying it again after a crash changes nothing. What a target does not offer (Milvus Lite:
AlterIndex, partition load, RBAC; Milvus 2.3: AlterDatabase, AlterIndex, TruncateCollection,
privilege groups, RestoreRBAC) is skipped with a warning and reported as :attr:`Outcome.status`
``"skipped"``; the data is unaffected. A field the target cannot add (AddCollectionField, which
Milvus Lite and 2.3-2.5 lack) stops the task instead, naming the collection, the field and its
type: the rows that follow carry the field and could not be written without it.

Per operation (source names mapped to the task's target names by :class:`TaskNames`):

- **CreateDatabase / AlterDatabase / DropDatabase**: create with the source's properties (2.3
  ignores properties); alter sets the whole new property set (and deletes keys the source no
  longer has); drop only when the target database holds no collection (a replica must not drop
  what it did not make), else skipped with a warning.
- **AlterAlias / DropAlias**: create or move the alias; drop it if present.
- **CreateIndex / AlterIndex / DropIndex**: see :mod:`ddl_index`.
- **AlterLoadConfig**: load (or reload) with the source's replica count; all partitions → a
  collection load, fewer → LoadPartitions; fields when a subset is named. A target without that
  many query nodes, or one that cannot change a loaded replica count (2.3), keeps its own with
  a warning. **DropLoadConfig**: release.
- **AlterCollection / SchemaChange**: properties (the whole new set, keys the source dropped are
  deleted where the target can), description and consistency level (not alterable through the
  public API: skipped with a warning), rename / move to another database (RenameCollection;
  the runner must then re-register the collection under its new name), schema (fields the
  target lacks are added with AddCollectionField, or the task stops naming them; a schema the
  source made dynamic makes the target's dynamic through ``dynamicfield.enabled``, or the task
  stops naming ``$meta``; nothing else of a schema is alterable).
- **TruncateCollection**: the target's TruncateCollection (2.6+, Milvus Lite). A target without
  it (2.3-2.5) gets the same result by **drop and re-create**: the collection is described
  first (schema, shards, consistency level, properties, description), with its partitions,
  indexes, aliases and load state, then dropped and re-created with all of those. Deleting by an
  always-true filter was the alternative; 2.3 refuses such filters unless the collection is
  loaded (loading needs every vector field indexed, and loading and releasing a collection the
  source had not loaded changes the target's state), and it only tombstones the rows, so
  re-creating is both more reliable and cheaper on the target. Trade-off: the target's
  collection id changes, and a reader of the target sees "collection not found" for the moment
  between drop and create.
- **RBAC** (only when the task sets ``extra_info.enable_user_role``): see :mod:`ddl_rbac`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from replicator.codec import streaming_ddl_ops as ddl
from replicator.errors import Rejection, TargetRejectedError
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.ddl_index import IndexDdl
from replicator.pipeline.ddl_outcome import ABSENT, EXISTS, Outcome, attempt, combine, unsupported
from replicator.pipeline.ddl_rbac import RbacDdl
from replicator.pipeline.ddl_schema import SchemaDdl
from replicator.pipeline.names import TaskNames, database_mapper
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.schema_convert import has_partition_key

log = logging.getLogger(__name__)

_LOADED = 3  # common_pb2.LoadStateLoaded
_LOADING = 2


class StreamDdlApplier:
    """Applies 2.6 DDL operations to one target; ``rbac`` is the task's
    ``extra_info.enable_user_role``. Blocking (gRPC): call it from the worker's fiber."""

    def __init__(self, target: MilvusTarget, names: TaskNames, *, rbac: bool = False) -> None:
        self.target = target
        self.names = names
        self.rbac = rbac
        self._indexes = IndexDdl(target, names)
        self._rbac = RbacDdl(target, names)
        self._schema = SchemaDdl(target)
        # truncates begun and not done: what re-creating each collection takes
        self._truncating: dict[tuple[str, str], EmptyCopy] = {}

    def apply(self, op: ddl.DdlOp) -> Outcome:
        if isinstance(op, ddl.NotReplicated):
            return Outcome("not_selected", op.reason)
        if op.rbac and not self.rbac:
            return Outcome("disabled", f"{op.type_name}: the task does not replicate RBAC")
        handler = self._handlers()[type(op)]
        outcome: Outcome = handler(op)
        if outcome.status == "skipped":
            log.warning("%s: %s", op.type_name, outcome.detail)
        else:
            log.info("%s: %s %s", op.type_name, outcome.status, outcome.detail)
        return outcome

    def _handlers(self) -> dict[type, Callable[[Any], Outcome]]:
        indexes, rbac = self._indexes, self._rbac
        return {
            ddl.CreateDatabase: self._create_database,
            ddl.AlterDatabase: self._alter_database,
            ddl.DropDatabase: self._drop_database,
            ddl.AlterAlias: self._alter_alias,
            ddl.DropAlias: self._drop_alias,
            ddl.CreateIndex: indexes.create_index,
            ddl.AlterIndex: indexes.alter_index,
            ddl.DropIndex: indexes.drop_index,
            ddl.LoadConfig: self._load_config,
            ddl.ReleaseCollection: self._release_collection,
            ddl.AlterCollection: self._alter_collection,
            ddl.TruncateCollection: self._truncate_collection,
            ddl.AlterUser: rbac.alter_user,
            ddl.DropUser: rbac.drop_user,
            ddl.AlterRole: rbac.alter_role,
            ddl.DropRole: rbac.drop_role,
            ddl.UserRole: rbac.user_role,
            ddl.Privilege: rbac.privilege,
            ddl.PrivilegeGroup: rbac.privilege_group,
            ddl.RestoreRBAC: rbac.restore_rbac,
            ddl.ImportJob: self._import,
        }

    def _import(self, op: ddl.ImportJob) -> Outcome:
        """Nothing to make on the target: the imported rows never pass through the WAL (the
        runner shows the job as pending until a backfill copies them)."""
        return Outcome(
            "skipped",
            f"bulk import job {op.job_id} into {op.collection_name}: its rows are not in the WAL",
        )

    def _collection(self, op: ddl.DdlOp) -> TargetCollection | None:
        return self.names.collection(op.collection_id)

    # --- databases ---------------------------------------------------------------------------
    def _create_database(self, op: ddl.CreateDatabase) -> Outcome:
        db = self.names.database(op.db_name)
        if db is None:
            return Outcome("not_selected", f"database {op.db_name}")
        if db == "default" or db in self.target.list_databases():
            return Outcome("unchanged", f"database {db} exists")
        return attempt(
            f"create database {db}",
            lambda: self.target.create_database(db, op.properties),
            done_if=EXISTS,
        )

    def _alter_database(self, op: ddl.AlterDatabase) -> Outcome:
        db = self.names.database(op.db_name)
        if db is None:
            return Outcome("not_selected", f"database {op.db_name}")
        what = f"alter database {db}"
        try:
            current = self.target.describe_database(db)
        except TargetRejectedError as exc:
            if unsupported(exc):
                return Outcome("skipped", f"{what}: the target does not offer this call")
            raise
        wanted = dict(op.properties)
        stale = [k for k in current if k not in wanted]
        changed = [(k, v) for k, v in wanted.items() if current.get(k) != v]
        if not changed and not stale:
            return Outcome("unchanged", what)
        return attempt(what, lambda: self.target.alter_database(db, changed, stale))

    def _drop_database(self, op: ddl.DropDatabase) -> Outcome:
        db = self.names.database(op.db_name)
        if db is None:
            return Outcome("not_selected", f"database {op.db_name}")
        if db == "default":
            return Outcome("skipped", "the default database is never dropped")
        if db not in self.target.list_databases():
            return Outcome("unchanged", f"database {db} is absent")
        left = self.target.list_collections(db)
        if left:
            return Outcome(
                "skipped",
                f"database {db} still holds {len(left)} collection(s) on the target "
                f"({', '.join(sorted(left)[:5])}); kept",
            )
        return attempt(
            f"drop database {db}",
            lambda: self.target.drop_database(db),
            done_if=ABSENT,
        )

    # --- aliases -----------------------------------------------------------------------------
    def _alter_alias(self, op: ddl.AlterAlias) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", f"alias {op.alias} of {op.collection_name}")
        db = collection.db
        if op.alias in self.target.aliases_of(db, collection.name):
            return Outcome("unchanged", f"alias {db}.{op.alias} -> {collection.name}")
        self.target.create_alias(db, op.alias, collection.name)
        return Outcome("applied", f"alias {db}.{op.alias} -> {collection.name}")

    def _drop_alias(self, op: ddl.DropAlias) -> Outcome:
        db = self.names.database(op.db_name)
        if db is None:
            return Outcome("not_selected", f"alias {op.alias}")
        if op.alias not in self.target.aliases_of(db, ""):  # every alias of the database
            return Outcome("unchanged", f"alias {db}.{op.alias} is absent")
        return attempt(
            f"drop alias {db}.{op.alias}",
            lambda: self.target.drop_alias(db, op.alias),
            done_if=ABSENT,
        )

    # --- load configuration ------------------------------------------------------------------
    def _load_config(self, op: ddl.LoadConfig) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "load")
        db, name = collection.db, collection.name
        all_partitions = self.target.partitions(db, name)
        wanted = [self.names.partition(op.collection_id, p) for p in op.partition_ids]
        partitions: list[str] = []
        named = [p for p in wanted if p]
        if wanted and len(named) == len(wanted) and set(all_partitions) - set(named):
            partitions = named
        fields = [self.names.field(op.collection_id, f) for f in op.load_field_ids]
        load_fields: list[str] = [f for f in fields if f] if None not in fields else []
        target_fields = self.target.describe_collection(db, name).schema.fields
        if set(load_fields) >= {f.name for f in target_fields}:
            load_fields = []  # every field: a plain load
        what = f"load {db}.{name} ({op.replica_number} replica(s)"
        what += f", partitions {partitions})" if partitions else ")"
        try:
            self.target.load(
                db, name, replicas=op.replica_number, partitions=partitions, load_fields=load_fields
            )
        except TargetRejectedError as exc:
            if unsupported(exc) and partitions:
                # Milvus Lite has no partition load state: load the collection instead
                self.target.load(db, name, replicas=op.replica_number, load_fields=load_fields)
                return Outcome("skipped", f"{what}: partition load not offered; loaded all")
            if op.replica_number > 1 and exc.rejection is Rejection.REPLICAS:
                return Outcome("skipped", f"{what}: the target keeps its own replicas ({exc})")
            raise
        return Outcome("applied", what)

    def _release_collection(self, op: ddl.ReleaseCollection) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "release")
        db, name = collection.db, collection.name
        if self.target.load_state(db, name) not in (_LOADED, _LOADING):
            return Outcome("unchanged", f"{db}.{name} is not loaded")
        return attempt(f"release {db}.{name}", lambda: self.target.release(db, name))

    # --- collections -------------------------------------------------------------------------
    def _alter_collection(self, op: ddl.AlterCollection) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "alter collection")
        outcomes = []
        if "properties" in op.changes:
            outcomes.append(self._properties(collection, op.properties))
        if op.changes & {"description", "consistency"}:
            parts = sorted(op.changes & {"description", "consistency"})
            outcomes.append(
                Outcome(
                    "skipped",
                    f"{collection.db}.{collection.name}: {' and '.join(parts)} cannot be "
                    "altered through the public API",
                )
            )
        if "schema" in op.changes and op.schema is not None:
            self.names.remember_schema(op.collection_id, op.schema)
            outcomes.append(self._schema.add_fields(collection, op.schema))
        if op.changes & {"name", "db"}:
            outcomes.append(self._rename(collection, op))
        if not outcomes:
            return Outcome("unchanged", f"nothing replicable in {list(op.mask_paths)}")
        return combine(outcomes, f"alter collection {collection.db}.{collection.name}")

    def _properties(self, collection: TargetCollection, properties: ddl.KeyValues) -> Outcome:
        db, name = collection.db, collection.name
        described = self.target.describe_collection(db, name)
        current = {p.key: p.value for p in described.properties}
        wanted = dict(properties)
        changed = [(k, v) for k, v in wanted.items() if current.get(k) != v]
        stale = [k for k in current if k not in wanted]
        what = f"properties of {db}.{name}"
        if not changed and not stale:
            return Outcome("unchanged", what)
        if changed:
            outcome = attempt(what, lambda: self.target.alter_collection(db, name, changed))
            if outcome.status != "applied":
                return outcome
        if stale:
            try:
                self.target.alter_collection(db, name, [], stale)
            except TargetRejectedError as exc:
                if not unsupported(exc):
                    raise
                return Outcome("skipped", f"{what}: the target cannot delete keys {stale}")
        return Outcome("applied", what)

    def _rename(self, collection: TargetCollection, op: ddl.AlterCollection) -> Outcome:
        new_db = self.names.database(op.new_db_name) if op.new_db_name else collection.db
        new_name = op.new_name or collection.name
        if new_db is None:
            return Outcome("skipped", f"{collection.name} moves to a database the task skips")
        if (new_db, new_name) == (collection.db, collection.name):
            return Outcome("unchanged", "same name")
        if self.target.has_collection(new_db, new_name) and not self.target.has_collection(
            collection.db, collection.name
        ):
            return Outcome("unchanged", f"already renamed to {new_db}.{new_name}")
        return attempt(
            f"rename {collection.db}.{collection.name} to {new_db}.{new_name}",
            lambda: self.target.rename_collection(collection.db, collection.name, new_db, new_name),
        )

    def _truncate_collection(self, op: ddl.TruncateCollection) -> Outcome:
        """Truncate, or drop and re-create where the target has no TruncateCollection. What
        re-creating needs is read before anything changes and kept until the truncate is
        done: a truncate that fails half-way (Milvus Lite under load: "Directory not empty"),
        leaving the collection gone, is applied again from it when the record is read again,
        instead of failing the task on a collection it can no longer describe. (Lite 3.2
        fails that way when a reader queries the collection during its truncate: the query
        re-opens it, and what it writes can leave a directory behind that makes every later
        create fail "File exists"; the channel then retries, showing that error, until an
        operator removes the directory.)"""
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "truncate")
        db, name = collection.db, collection.name
        copy = self._truncating.get((db, name))
        if copy is None:
            copy = self._truncating[(db, name)] = EmptyCopy.of(self.target, db, name)
        outcome = Outcome("applied", f"truncate {db}.{name}")
        try:
            self.target.truncate_collection(db, name)
        except TargetRejectedError as exc:
            gone = exc.rejection is Rejection.NOT_FOUND  # by an earlier try, half-way
            if not (unsupported(exc) or gone):
                raise
            recreate_empty(self.target, db, name, copy)
            outcome = Outcome("applied", f"truncate {db}.{name} (dropped and re-created)")
        del self._truncating[(db, name)]
        return outcome


@dataclass(frozen=True)
class EmptyCopy:
    """What it takes to make a collection again, empty: its schema, shards, consistency
    level, description, properties, partitions, indexes, aliases and load state."""

    described: Any
    partitions: list[str]
    indexes: list[Any]
    aliases: list[str]
    loaded: bool

    @classmethod
    def of(cls, target: MilvusTarget, db: str, name: str) -> EmptyCopy:
        described = target.describe_collection(db, name)
        partitions = [p for p in target.partitions(db, name) if p != "_default"]
        if has_partition_key(described.schema):
            partitions = []  # made by the target itself, as many as it had
        return cls(
            described,
            partitions,
            target.describe_indexes(db, name),
            target.aliases_of(db, name),
            target.load_state(db, name) in (_LOADED, _LOADING),
        )


def recreate_empty(target: MilvusTarget, db: str, name: str, copy: EmptyCopy) -> None:
    """Truncate on a target without TruncateCollection: drop ``db.name`` (when it is still
    there) and make it again from ``copy`` (see the module docstring for why not
    delete-by-filter)."""
    if target.has_collection(db, name):
        target.drop_collection(db, name)  # with its aliases
    described = copy.described
    schema = schema_pb2.CollectionSchema()
    schema.CopyFrom(described.schema)
    target.create_collection(
        db,
        name,
        schema,
        described.shards_num,
        int(described.consistency_level),
        num_partitions=int(described.num_partitions),
    )
    properties = [(p.key, p.value) for p in described.properties]
    if properties:
        target.alter_collection(db, name, properties)
    for partition in copy.partitions:
        target.create_partition(db, name, partition)
    for index in copy.indexes:
        params = [(p.key, p.value) for p in index.params]
        target.create_index(db, name, index.field_name, index.index_name, params)
    for alias in copy.aliases:
        target.create_alias(db, alias, name)
    if copy.loaded:
        target.load(db, name)


__all__ = [
    "EmptyCopy",
    "Outcome",
    "StreamDdlApplier",
    "TaskNames",
    "database_mapper",
    "recreate_empty",
]
