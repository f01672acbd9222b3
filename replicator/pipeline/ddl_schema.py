"""2.6 AlterCollection of a collection's schema, on the target: the fields the source added
(AddCollectionField), the dynamic field it enabled (``dynamicfield.enabled``), and the functions
it added (AddCollectionFunction). What the target cannot add stops the task, naming it: the rows
that follow need it, and none is written without it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pymilvus.grpc_gen import schema_pb2

from replicator.errors import TargetRejectedError, TaskFailedError
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.ddl_outcome import EXISTS, Outcome, attempt, combine
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.schema_convert import target_schema

DYNAMIC_FIELD_PROPERTY = "dynamicfield.enabled"  # common.EnableDynamicSchemaKey


class SchemaDdl:
    def __init__(self, target: MilvusTarget) -> None:
        self.target = target

    def add_fields(
        self, collection: TargetCollection, schema: schema_pb2.CollectionSchema
    ) -> Outcome:
        db, name = collection.db, collection.name
        described = self.target.describe_collection(db, name).schema
        have = {f.name for f in described.fields}
        new = [f for f in target_schema(schema).fields if f.name not in have]
        outcomes = []
        if schema.enable_dynamic_field and not described.enable_dynamic_field:
            outcomes.append(self._enable_dynamic_field(collection))
        for f in new:
            f.fieldID = 0  # the target numbers its own fields
            call = partial(self.target.add_collection_field, db, name, f)
            kind = schema_pb2.DataType.Name(f.data_type)
            outcomes.append(self._add(collection, "field", f.name, kind, call, "carry it"))
        outcomes += self._add_functions(collection, schema, described)
        if not outcomes:
            return Outcome("unchanged", f"schema of {db}.{name}")
        return combine(outcomes, f"schema of {db}.{name}")

    def _add_functions(
        self,
        collection: TargetCollection,
        schema: schema_pb2.CollectionSchema,
        described: schema_pb2.CollectionSchema,
    ) -> list[Outcome]:
        """The functions (BM25, text embedding) the source added to the collection, added on
        the target: their output is computed there from the rows' input, so a target without
        them would hold rows without it. One the target cannot add stops the task, naming it
        (never dropped in silence)."""
        db, name = collection.db, collection.name
        have = {f.name for f in described.functions}
        outcomes = []
        for function in (f for f in schema.functions if f.name not in have):
            call = partial(self.target.add_collection_function, db, name, function)
            kind = schema_pb2.FunctionType.Name(function.type)
            what = (
                f"{kind} of {', '.join(function.input_field_names)} into "
                f"{', '.join(function.output_field_names)}"
            )
            outcomes.append(self._add(collection, "function", function.name, what, call, "need it"))
        return outcomes

    def _add(
        self,
        collection: TargetCollection,
        kind: str,
        added: str,
        what: str,
        call: Callable[[], None],
        rows: str,
    ) -> Outcome:
        """Add a ``kind`` ("field", "function") on the target. One it cannot add (it does not
        offer the call) stops the task here, naming what it lacks: the source's rows depend on
        it from now on, so none is written without it."""
        db, name = collection.db, collection.name
        outcome = attempt(f"add {kind} {added} to {db}.{name}", call, done_if=EXISTS)
        if outcome.status == "skipped":
            rpc = f"AddCollection{kind.capitalize()}"
            raise TaskFailedError(
                f"collection {db}.{name}: the source added {kind} {added} ({what}), and the "
                f"target cannot add a {kind} (it does not offer {rpc}): the rows that follow "
                f"{rows}; add the {kind} on the target (or use a target of Milvus 2.6+) and "
                "resume the task"
            )
        return outcome

    def _enable_dynamic_field(self, collection: TargetCollection) -> Outcome:
        """The source made the collection dynamic (2.6: AlterCollection ``dynamicfield.enabled``
        adds ``$meta``, nullable, default ``{}``): so must the target be, before a row with keys
        outside the schema is written there. A target that cannot (Milvus Lite takes the
        property and stays static; Milvus before 2.6 has no such property) stops the task,
        naming ``$meta``."""
        db, name = collection.db, collection.name
        refused = ""
        try:
            self.target.alter_collection(db, name, [(DYNAMIC_FIELD_PROPERTY, "true")])
        except TargetRejectedError as exc:
            refused = f" ({exc})"
        if not self.target.describe_collection(db, name).schema.enable_dynamic_field:
            raise TaskFailedError(
                f"collection {db}.{name}: the source enabled its dynamic field, and the target "
                f"cannot hold field $meta (JSON, the dynamic field){refused}: the rows that "
                "follow carry keys outside the schema; make the target's collection dynamic "
                "(or use a target of Milvus 2.6+) and resume the task"
            )
        return Outcome("applied", f"dynamic field of {db}.{name}")


__all__ = ["DYNAMIC_FIELD_PROPERTY", "SchemaDdl"]
