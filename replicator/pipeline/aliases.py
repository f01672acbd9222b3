"""Aliases of the replicated collections, mirrored from the source's etcd to the target.

Milvus 2.3-2.5 writes no WAL record when an alias is created, moved or dropped: the alias exists
only in the source's etcd. The mirror reads the source's aliases every few seconds and makes the
target's aliases of the task's collections the same (under the target names the task maps them
to). An alias therefore follows its collection within one interval; it is not ordered with the
data around it. Aliases on the target that point at collections the task does not replicate are
left alone, unless the source moves that alias onto a replicated collection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from replicator.fibers import Steps, pause
from replicator.meta.catalog import AliasMeta
from replicator.pipeline.registry import CollectionRegistry
from replicator.sinks.base import SinkError
from replicator.sinks.milvus import MilvusTarget
from replicator.sources.base import SourceUnavailableError

log = logging.getLogger(__name__)

SYNC_SECONDS = 2.0
VERIFY_SECONDS = 60.0  # look at the target again even when the source did not change

AliasKey = tuple[str, str]  # (target database, alias)


class AliasMirror:
    def __init__(
        self,
        read_aliases: Callable[[], list[AliasMeta]],
        registry: CollectionRegistry,
        target: MilvusTarget,
        stop: threading.Event,
        interval: float = SYNC_SECONDS,
    ) -> None:
        self._read_aliases = read_aliases
        self._registry = registry
        self._target = target
        self._stop = stop
        self._interval = interval
        self._settled: dict[AliasKey, str] | None = None  # what the target was last made equal to
        self._reported: set[str] = set()

    def close(self) -> None:
        self._target.close()

    def steps(self) -> Steps:
        """The mirror as a fiber (:mod:`replicator.fibers`), woken by the task's stop."""
        since_verify = 0.0
        while not self._stop.is_set():
            if since_verify >= VERIFY_SECONDS:
                self._settled, since_verify = None, 0.0
            try:
                self.sync_once()
            except (SourceUnavailableError, SinkError) as exc:
                self._settled = None
                message = str(exc)
                if message not in self._reported:  # once per cause, not every round
                    self._reported.add(message)
                    log.warning("aliases not mirrored yet, retrying: %s", message)
            yield from pause(self._stop, self._interval)
            since_verify += self._interval

    def desired(self) -> dict[AliasKey, str]:
        """(target db, alias) -> target collection, for the aliases of replicated collections."""
        collections = {c.collection_id: c for c in self._registry.collections()}
        wanted = {}
        for alias in self._read_aliases():
            collection = collections.get(alias.collection_id)
            if collection is not None:
                wanted[(collection.db, alias.name)] = collection.name
        return wanted

    def sync_once(self) -> list[str]:
        """Make the target's aliases equal to the source's; the changes made, as text."""
        wanted = self.desired()
        if wanted == self._settled:
            return []
        target = self._target
        present: set[AliasKey] = set()  # target collections that exist, as (db, name)
        current: dict[AliasKey, str] = {}
        for collection in self._registry.collections():
            if not target.has_collection(collection.db, collection.name):
                continue  # not created on the target yet (or already dropped)
            present.add((collection.db, collection.name))
            for alias in target.aliases_of(collection.db, collection.name):
                current[(collection.db, alias)] = collection.name
        changes = []
        complete = True
        for (db, alias), name in sorted(wanted.items()):
            if current.get((db, alias)) == name:
                continue
            if (db, name) not in present:
                complete = False  # its collection comes later; try again next round
                continue
            target.create_alias(db, alias, name)
            changes.append(f"alias {db}.{alias} -> {name}")
        for db, alias in sorted(current.keys() - wanted.keys()):
            target.drop_alias(db, alias)
            changes.append(f"dropped alias {db}.{alias}")
        for change in changes:
            log.info("target: %s", change)
        self._settled = wanted if complete else None
        return changes
