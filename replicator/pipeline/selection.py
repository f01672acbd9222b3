"""Which source collections a task replicates, and under which names on the target."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from replicator.config.task_spec import DEFAULT_DB, TaskSpec

WILDCARD = "*"

Selection = AbstractSet[tuple[str, str]]


def selection_matches(selection: Selection, db: str, collection: str) -> bool:
    return any(d in (WILDCARD, db) and c in (WILDCARD, collection) for d, c in selection)


def selections_overlap(a: Selection, b: Selection) -> bool:
    return any(
        (da == db or WILDCARD in (da, db)) and (ca == cb or WILDCARD in (ca, cb))
        for da, ca in a
        for db, cb in b
    )


@dataclass(frozen=True)
class TaskSelection:
    selection: frozenset[tuple[str, str]]
    # source db -> (target db, {source collection: target collection})
    mapping: Mapping[str, tuple[str, Mapping[str, str]]]

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> TaskSelection:
        mapping = {
            m["source_db"]: (m["target_db"], dict(m.get("collection_mapping") or {}))
            for m in spec.name_mapping
        }
        return cls(spec.selection, mapping)

    def selects(self, db: str, collection: str) -> bool:
        return selection_matches(set(self.selection), db or DEFAULT_DB, collection)

    def target_name(self, db: str, collection: str) -> tuple[str, str]:
        db = db or DEFAULT_DB
        if db in self.mapping:
            target_db, collections = self.mapping[db]
            return target_db, collections.get(collection, collection)
        return db, collection
