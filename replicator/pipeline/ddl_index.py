"""2.6 CreateIndex / AlterIndex / DropIndex on the target: created with the user's params
(``AUTOINDEX`` stays ``AUTOINDEX``, so a target of another version picks its own) under the
source's index name; altered params set; dropped by the names seen created (the WAL names
indexes by the source's ids). Milvus Lite names every index after its field: both cases are
handled."""

from __future__ import annotations

import logging
from functools import partial

from replicator.codec import streaming_ddl_ops as ddl
from replicator.errors import Rejection, TargetRejectedError
from replicator.pipeline.apply import TargetCollection
from replicator.pipeline.ddl_outcome import ABSENT, EXISTS, Outcome, attempt, combine
from replicator.pipeline.names import TaskNames
from replicator.sinks.milvus import MilvusTarget

log = logging.getLogger(__name__)

_INDEX_KEYS = {"index_type", "metric_type", "params"}  # fixed at creation, not alterable


class IndexDdl:
    def __init__(self, target: MilvusTarget, names: TaskNames) -> None:
        self.target = target
        self.names = names

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

    def create_index(self, op: ddl.CreateIndex) -> Outcome:
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
        return attempt(
            f"create index {spec.index_name} on {where}",
            lambda: self.target.create_index(
                collection.db, collection.name, field, spec.index_name, spec.request_params
            ),
            done_if=EXISTS,
        )

    def alter_index(self, op: ddl.AlterIndex) -> Outcome:
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
                attempt(
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
        return combine(outcomes, "alter index")

    def drop_index(self, op: ddl.DropIndex) -> Outcome:
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
                attempt(
                    what,
                    partial(self._drop_index_released, collection, field, name),
                    done_if=ABSENT,
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
        return combine(outcomes, "drop index")

    def _drop_index_released(self, collection: TargetCollection, field: str, name: str) -> None:
        """Milvus refuses to drop an index of a loaded collection, so the source's collection
        was released when its index was dropped; the target's may not be (Milvus Lite loads
        what it creates): release it too, as the source is."""
        db, coll = collection.db, collection.name
        try:
            self.target.drop_index(db, coll, field, name)
        except TargetRejectedError as exc:
            if exc.rejection is not Rejection.LOADED:
                raise
            log.warning("%s.%s is loaded on the target: released to drop index %s", db, coll, name)
            self.target.release(db, coll)
            self.target.drop_index(db, coll, field, name)
