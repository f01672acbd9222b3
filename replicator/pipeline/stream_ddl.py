"""Applying the 2.6 DDL operations of :mod:`replicator.codec.streaming_ddl` to a target Milvus
through its public API.

The runner decodes a :class:`StreamDdl` with ``decode_ddl``, applies it at the right moment
(``op.barrier``: after every vchannel of the broadcast has been read past its copy; otherwise at
the first copy) and calls :meth:`StreamDdlApplier.apply` once per broadcast. Every operation is
idempotent: it reads the target's state first or treats "already exists" / "not found" as done,
so applying it again after a crash changes nothing. What a target does not offer (Milvus Lite:
AlterIndex, AddCollectionField, partition load, RBAC; Milvus 2.3: AlterDatabase, AlterIndex,
AddCollectionField, TruncateCollection, privilege groups, RestoreRBAC) is skipped with a warning
and reported as :attr:`Outcome.status` ``"skipped"``; the data is unaffected.

Per operation (source names mapped to the task's target names by :class:`TaskNames`):

- **CreateDatabase / AlterDatabase / DropDatabase**: create with the source's properties (2.3
  ignores properties); alter sets the whole new property set (and deletes keys the source no
  longer has); drop only when the target database holds no collection (a replica must not drop
  what it did not make), else skipped with a warning.
- **AlterAlias / DropAlias**: create or move the alias; drop it if present.
- **CreateIndex / AlterIndex / DropIndex**: create with the user's params (``AUTOINDEX`` stays
  ``AUTOINDEX``, so a target of another version picks its own) under the source's index name;
  alter sets the changed params; drop by the names the applier saw created (ids from the WAL
  are the source's). Milvus Lite names every index after its field: both cases are handled.
- **AlterLoadConfig**: load (or reload) with the source's replica count; all partitions → a
  collection load, fewer → LoadPartitions; fields when a subset is named. A target without that
  many query nodes, or one that cannot change a loaded replica count (2.3), keeps its own with
  a warning. **DropLoadConfig**: release.
- **AlterCollection / SchemaChange**: properties (the whole new set, keys the source dropped are
  deleted where the target can), description and consistency level (not alterable through the
  public API: skipped with a warning), rename / move to another database (RenameCollection;
  the runner must then re-register the collection under its new name), schema (fields the
  target lacks are added with AddCollectionField; nothing else of a schema is alterable).
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
- **RBAC** (only when the task sets ``extra_info.enable_user_role``): users, roles, bindings,
  grants, privilege groups, RestoreRBAC. The source's WAL holds only a bcrypt hash of a user's
  password (see ``streaming_ddl``), which the public API cannot take: a new user is created on
  the target with a random password the daemon never logs or stores (so the user exists for its
  roles, and an operator sets the password on the target); a password change is a no-op with a
  warning.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from pymilvus.grpc_gen import schema_pb2

from replicator.codec import streaming_ddl as ddl
from replicator.codec.streaming_events import (
    StreamCreateCollection,
    StreamCreatePartition,
    StreamDropPartition,
)
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.selection import WILDCARD, TaskSelection
from replicator.sinks.base import SinkError, TargetRejectedError
from replicator.sinks.milvus import (
    MilvusTarget,
    has_partition_key,
    is_unimplemented,
    target_schema,
)

log = logging.getLogger(__name__)

_LOADED = 3  # common_pb2.LoadStateLoaded
_LOADING = 2
_INDEX_KEYS = {"index_type", "metric_type", "params"}  # fixed at creation, not alterable


@dataclass(frozen=True)
class Outcome:
    """What :meth:`StreamDdlApplier.apply` did: ``applied``, ``unchanged`` (the target was
    already in that state), ``skipped`` (the target cannot do it; a warning was logged),
    ``not_selected`` (the task does not replicate it) or ``disabled`` (RBAC not asked for)."""

    status: str
    detail: str = ""


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


def apply(op: ddl.DdlOp, target: MilvusTarget, names: TaskNames, *, rbac: bool = False) -> Outcome:
    """Apply one operation (see :class:`StreamDdlApplier`)."""
    return StreamDdlApplier(target, names, rbac=rbac).apply(op)


class StreamDdlApplier:
    """Applies 2.6 DDL operations to one target; ``rbac`` is the task's
    ``extra_info.enable_user_role``. Blocking (gRPC): call it from the worker thread."""

    def __init__(self, target: MilvusTarget, names: TaskNames, *, rbac: bool = False) -> None:
        self.target = target
        self.names = names
        self.rbac = rbac

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
        return {
            ddl.CreateDatabase: self._create_database,
            ddl.AlterDatabase: self._alter_database,
            ddl.DropDatabase: self._drop_database,
            ddl.AlterAlias: self._alter_alias,
            ddl.DropAlias: self._drop_alias,
            ddl.CreateIndex: self._create_index,
            ddl.AlterIndex: self._alter_index,
            ddl.DropIndex: self._drop_index,
            ddl.LoadConfig: self._load_config,
            ddl.ReleaseCollection: self._release_collection,
            ddl.AlterCollection: self._alter_collection,
            ddl.TruncateCollection: self._truncate_collection,
            ddl.AlterUser: self._alter_user,
            ddl.DropUser: self._drop_user,
            ddl.AlterRole: self._alter_role,
            ddl.DropRole: self._drop_role,
            ddl.UserRole: self._user_role,
            ddl.Privilege: self._privilege,
            ddl.PrivilegeGroup: self._privilege_group,
            ddl.RestoreRBAC: self._restore_r_b_a_c,
        }

    # --- helpers -----------------------------------------------------------------------------
    def _try(self, what: str, call: Callable[[], None], *, done_if: Iterable[str] = ()) -> Outcome:
        """Run one target call: unimplemented -> skipped; an error containing one of
        ``done_if`` (e.g. "already exist", "not found") -> unchanged."""
        try:
            call()
        except TargetRejectedError as exc:
            text = str(exc).lower()
            if _unsupported(exc):
                return Outcome("skipped", f"{what}: the target does not offer this call")
            if any(marker in text for marker in done_if):
                return Outcome("unchanged", what)
            raise
        return Outcome("applied", what)

    def _collection(self, op: ddl.DdlOp) -> TargetCollection | None:
        return self.names.collection(op.collection_id)

    def _field_name(self, collection: TargetCollection, source_field_id: int) -> str:
        name = self.names.field(collection.collection_id, source_field_id)
        if name:
            return name
        # a real Milvus numbers user fields from 100 in creation order, as the source did
        described = self.target.describe_collection(collection.db, collection.name)
        for f in described.schema.fields:
            if f.fieldID == source_field_id:
                return str(f.name)
        raise TargetRejectedError(
            f"field {source_field_id} of {collection.db}.{collection.name}: its name is not "
            "known (neither seen in the stream nor numbered alike on the target)"
        )

    # --- databases ---------------------------------------------------------------------------
    def _create_database(self, op: ddl.CreateDatabase) -> Outcome:
        db = self.names.database(op.db_name)
        if db is None:
            return Outcome("not_selected", f"database {op.db_name}")
        if db == "default" or db in self.target.list_databases():
            return Outcome("unchanged", f"database {db} exists")
        return self._try(
            f"create database {db}",
            lambda: self.target.create_database(db, op.properties),
            done_if=("exist",),
        )

    def _alter_database(self, op: ddl.AlterDatabase) -> Outcome:
        db = self.names.database(op.db_name)
        if db is None:
            return Outcome("not_selected", f"database {op.db_name}")
        what = f"alter database {db}"
        try:
            current = self.target.describe_database(db)
        except TargetRejectedError as exc:
            if _unsupported(exc):
                return Outcome("skipped", f"{what}: the target does not offer this call")
            raise
        wanted = dict(op.properties)
        stale = [k for k in current if k not in wanted]
        changed = [(k, v) for k, v in wanted.items() if current.get(k) != v]
        if not changed and not stale:
            return Outcome("unchanged", what)
        return self._try(what, lambda: self.target.alter_database(db, changed, stale))

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
        return self._try(
            f"drop database {db}",
            lambda: self.target.drop_database(db),
            done_if=("not exist", "not found"),
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
        return self._try(
            f"drop alias {db}.{op.alias}",
            lambda: self.target.drop_alias(db, op.alias),
            done_if=("not exist", "not found", "doesn't exist"),
        )

    # --- indexes -----------------------------------------------------------------------------
    def _create_index(self, op: ddl.CreateIndex) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", f"index {op.index.index_name}")
        spec = op.index
        field = self._field_name(collection, spec.field_id)
        self.names.remember_index(op.collection_id, spec.index_id, field, spec.index_name)
        where = f"{collection.db}.{collection.name}.{field}"
        for index in self.target.describe_indexes(collection.db, collection.name):
            if index.field_name == field:  # Milvus Lite names it after the field
                return Outcome("unchanged", f"index on {where} exists ({index.index_name})")
        return self._try(
            f"create index {spec.index_name} on {where}",
            lambda: self.target.create_index(
                collection.db, collection.name, field, spec.index_name, spec.request_params
            ),
            done_if=("already exist",),
        )

    def _alter_index(self, op: ddl.AlterIndex) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "alter index")
        current = {
            i.index_name: {p.key: p.value for p in i.params}
            for i in self.target.describe_indexes(collection.db, collection.name)
        }
        outcomes = []
        for spec in op.indexes:
            field = self._field_name(collection, spec.field_id)
            self.names.remember_index(op.collection_id, spec.index_id, field, spec.index_name)
            name = spec.index_name if spec.index_name in current else field
            have = current.get(name)
            what = f"alter index {spec.index_name} of {collection.db}.{collection.name}"
            if have is None:
                outcomes.append(Outcome("skipped", f"{what}: no such index on the target"))
                continue
            wanted = {k: v for k, v in spec.index_params if k not in _INDEX_KEYS}
            wanted.update((k, v) for k, v in spec.user_index_params if k not in _INDEX_KEYS)
            changed = [(k, v) for k, v in wanted.items() if have.get(k) != v]
            stale = [k for k in have if k not in wanted and k not in _INDEX_KEYS]
            if not changed and not stale:
                outcomes.append(Outcome("unchanged", what))
                continue
            outcomes.append(
                self._try(
                    what,
                    partial(
                        self.target.alter_index,
                        collection.db,
                        collection.name,
                        name,
                        changed,
                        stale,
                    ),
                )
            )
        return _combine(outcomes, "alter index")

    def _drop_index(self, op: ddl.DropIndex) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "drop index")
        on_target = self.target.describe_indexes(collection.db, collection.name)
        if op.index_ids:
            known = [self.names.index(op.collection_id, i) for i in op.index_ids]
            unknown = [i for i, k in zip(op.index_ids, known, strict=True) if k is None]
            pairs = [k for k in known if k is not None]
        else:  # every index of the collection
            unknown = []
            pairs = [(str(i.field_name), str(i.index_name)) for i in on_target]
        outcomes = []
        present = {(str(i.field_name), str(i.index_name)) for i in on_target}
        present_fields = {f for f, _ in present}
        for field, name in pairs:
            what = f"drop index {name} of {collection.db}.{collection.name}"
            if (field, name) not in present and field not in present_fields:
                outcomes.append(Outcome("unchanged", f"{what}: absent"))
                continue
            outcomes.append(
                self._try(
                    what,
                    partial(self._drop_index_released, collection, field, name),
                    done_if=("not exist", "not found", "no index"),
                )
            )
        if unknown:
            outcomes.append(
                Outcome(
                    "skipped",
                    f"drop index of {collection.db}.{collection.name}: source index ids "
                    f"{unknown} were not seen created, so their names are unknown; kept",
                )
            )
        return _combine(outcomes, "drop index")

    def _drop_index_released(self, collection: TargetCollection, field: str, name: str) -> None:
        """Milvus refuses to drop an index of a loaded collection, so the source's collection
        was released when its index was dropped; the target's may not be (Milvus Lite loads
        what it creates): release it too, as the source is."""
        db, coll = collection.db, collection.name
        try:
            self.target.drop_index(db, coll, field, name)
        except TargetRejectedError as exc:
            if "loaded" not in str(exc).lower():
                raise
            log.warning("%s.%s is loaded on the target: released to drop index %s", db, coll, name)
            self.target.release(db, coll)
            self.target.drop_index(db, coll, field, name)

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
            text = str(exc).lower()
            if _unsupported(exc) and partitions:
                # Milvus Lite has no partition load state: load the collection instead
                self.target.load(db, name, replicas=op.replica_number, load_fields=load_fields)
                return Outcome("skipped", f"{what}: partition load not offered; loaded all")
            if op.replica_number > 1 and ("replica" in text or "node" in text):
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
        return self._try(f"release {db}.{name}", lambda: self.target.release(db, name))

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
            outcomes.append(self._add_fields(collection, op.schema))
        if op.changes & {"name", "db"}:
            outcomes.append(self._rename(collection, op))
        if not outcomes:
            return Outcome("unchanged", f"nothing replicable in {list(op.mask_paths)}")
        return _combine(outcomes, f"alter collection {collection.db}.{collection.name}")

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
            outcome = self._try(what, lambda: self.target.alter_collection(db, name, changed))
            if outcome.status != "applied":
                return outcome
        if stale:
            try:
                self.target.alter_collection(db, name, [], stale)
            except TargetRejectedError as exc:
                if not _unsupported(exc) and "properties is empty" not in str(exc):
                    raise
                return Outcome("skipped", f"{what}: the target cannot delete keys {stale}")
        return Outcome("applied", what)

    def _add_fields(
        self, collection: TargetCollection, schema: schema_pb2.CollectionSchema
    ) -> Outcome:
        db, name = collection.db, collection.name
        have = {f.name for f in self.target.describe_collection(db, name).schema.fields}
        new = [f for f in target_schema(schema).fields if f.name not in have]
        if not new:
            return Outcome("unchanged", f"schema of {db}.{name}")
        outcomes = []
        for f in new:
            f.fieldID = 0  # the target numbers its own fields
            outcomes.append(
                self._try(
                    f"add field {f.name} to {db}.{name}",
                    partial(self.target.add_collection_field, db, name, f),
                    done_if=("already exist", "duplicate"),
                )
            )
        return _combine(outcomes, f"schema of {db}.{name}")

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
        return self._try(
            f"rename {collection.db}.{collection.name} to {new_db}.{new_name}",
            lambda: self.target.rename_collection(collection.db, collection.name, new_db, new_name),
        )

    def _truncate_collection(self, op: ddl.TruncateCollection) -> Outcome:
        collection = self._collection(op)
        if collection is None:
            return Outcome("not_selected", "truncate")
        db, name = collection.db, collection.name
        try:
            self.target.truncate_collection(db, name)
        except TargetRejectedError as exc:
            if not _unsupported(exc):
                raise
            recreate_empty(self.target, db, name)
            return Outcome("applied", f"truncate {db}.{name} (dropped and re-created)")
        return Outcome("applied", f"truncate {db}.{name}")

    # --- RBAC --------------------------------------------------------------------------------
    def _alter_user(self, op: ddl.AlterUser) -> Outcome:
        try:
            users = self.target.list_users()
        except TargetRejectedError as exc:
            if _unsupported(exc):
                return Outcome("skipped", f"user {op.user}: the target has no users")
            raise
        if op.user in users:
            return Outcome(
                "skipped" if op.had_password_hash else "unchanged",
                f"user {op.user} exists; the source's password cannot be replicated (the WAL "
                "holds only its hash): set it on the target",
            )
        outcome = self._try(
            f"create user {op.user}",
            lambda: self.target.create_user(op.user, _unusable_password()),
            done_if=("already exist",),
        )
        if outcome.status == "applied":
            log.warning(
                "user %s created on the target with a random password: set its password there",
                op.user,
            )
        return outcome

    def _drop_user(self, op: ddl.DropUser) -> Outcome:
        return self._try(
            f"drop user {op.user}",
            lambda: self.target.drop_user(op.user),
            done_if=("not exist", "not found"),
        )

    def _alter_role(self, op: ddl.AlterRole) -> Outcome:
        return self._try(
            f"create role {op.role}",
            lambda: self.target.create_role(op.role),
            done_if=("already exist",),
        )

    def _drop_role(self, op: ddl.DropRole) -> Outcome:
        return self._try(
            f"drop role {op.role}",
            lambda: self.target.drop_role(op.role, force=op.force),
            done_if=("not exist", "not found"),
        )

    def _user_role(self, op: ddl.UserRole) -> Outcome:
        verb = "bind" if op.grant else "unbind"
        return self._try(
            f"{verb} user {op.user} and role {op.role}",
            lambda: self.target.operate_user_role(op.user, op.role, add=op.grant),
            done_if=("already",) if op.grant else ("not exist", "not found"),
        )

    def _privilege(self, op: ddl.Privilege) -> Outcome:
        entity = op.entity
        db = self.names.database(entity.db_name or "default") if entity.db_name != "*" else "*"
        if db is None:
            return Outcome("not_selected", f"privilege on {entity.db_name}")
        mapped = type(entity)()
        mapped.CopyFrom(entity)
        mapped.db_name = db
        if entity.object.name == "Collection" and entity.object_name not in ("", "*"):
            mapped.object_name = self.names.collection_name(entity.db_name, entity.object_name)
        verb = "grant" if op.grant else "revoke"
        return self._try(
            f"{verb} {entity.grantor.privilege.name} on {db}.{mapped.object_name} "
            f"for {entity.role.name}",
            lambda: self.target.operate_privilege(mapped, grant=op.grant),
            done_if=("already", "not exist", "not found"),
        )

    def _privilege_group(self, op: ddl.PrivilegeGroup) -> Outcome:
        try:
            groups = self.target.privilege_groups()
        except TargetRejectedError as exc:
            if _unsupported(exc):
                return Outcome("skipped", f"privilege group {op.group}: not offered")
            raise
        if op.drop and not op.privileges:
            if op.group not in groups:
                return Outcome("unchanged", f"privilege group {op.group} is absent")
            return self._try(
                f"drop privilege group {op.group}",
                lambda: self.target.drop_privilege_group(op.group),
            )
        outcomes = []
        if op.group not in groups and not op.drop:
            outcomes.append(
                self._try(
                    f"create privilege group {op.group}",
                    lambda: self.target.create_privilege_group(op.group),
                    done_if=("already exist",),
                )
            )
        have = set(groups.get(op.group, []))
        todo = [p for p in op.privileges if (p in have) == op.drop]
        if todo:
            outcomes.append(
                self._try(
                    f"{'remove' if op.drop else 'add'} {todo} of group {op.group}",
                    lambda: self.target.operate_privilege_group(op.group, todo, add=not op.drop),
                )
            )
        return _combine(outcomes or [Outcome("unchanged", op.group)], f"group {op.group}")

    def _restore_r_b_a_c(self, op: ddl.RestoreRBAC) -> Outcome:
        meta = type(op.meta)()
        meta.CopyFrom(op.meta)
        for user in meta.users:  # the source's hashes are no passwords for the target
            user.password = ""
        return self._try("restore RBAC", lambda: self.target.restore_rbac(meta))


def recreate_empty(target: MilvusTarget, db: str, name: str) -> None:
    """Truncate on a target without TruncateCollection: drop and re-create ``db.name`` with its
    schema, shards, consistency level, description, properties, partitions, indexes, aliases
    and load state (see the module docstring for why not delete-by-filter)."""
    described = target.describe_collection(db, name)
    partitions = [p for p in target.partitions(db, name) if p != "_default"]
    if has_partition_key(described.schema):
        partitions = []  # made by the target itself (its default number of them)
    indexes = target.describe_indexes(db, name)
    aliases = target.aliases_of(db, name)
    loaded = target.load_state(db, name) in (_LOADED, _LOADING)
    target.drop_collection(db, name)  # with its aliases
    schema = schema_pb2.CollectionSchema()
    schema.CopyFrom(described.schema)
    target.create_collection(
        db, name, schema, described.shards_num, int(described.consistency_level)
    )
    properties = [(p.key, p.value) for p in described.properties]
    if properties:
        target.alter_collection(db, name, properties)
    for partition in partitions:
        target.create_partition(db, name, partition)
    for index in indexes:
        params = [(p.key, p.value) for p in index.params]
        target.create_index(db, name, index.field_name, index.index_name, params)
    for alias in aliases:
        target.create_alias(db, alias, name)
    if loaded:
        target.load(db, name)


def _unusable_password() -> str:
    """A password nobody knows (never logged or stored): the user exists for its roles and
    grants until an operator sets one on the target."""
    return secrets.token_urlsafe(24)[:30] + "aA1!"


def _unsupported(exc: SinkError) -> bool:
    """The target has no such call: gRPC UNIMPLEMENTED, or Milvus 2.3's AlterIndex, which
    fails on its own empty response ("Marshal called with nil")."""
    return is_unimplemented(exc) or "marshal called with nil" in str(exc).lower()


def _combine(outcomes: list[Outcome], what: str) -> Outcome:
    statuses = {o.status for o in outcomes}
    details = "; ".join(o.detail for o in outcomes if o.detail)
    for status in ("skipped", "applied", "unchanged", "not_selected"):
        if status in statuses:
            return Outcome(status, f"{what}: {details}" if details else what)
    return Outcome("unchanged", what)


__all__ = [
    "Outcome",
    "StreamDdlApplier",
    "TaskNames",
    "apply",
    "database_mapper",
    "recreate_empty",
]
