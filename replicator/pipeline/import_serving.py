"""Is a completed bulk import readable on the source yet? Its record says "completed" once its
segments are flushed and indexed, but queries (and so a backfill) read only what the source's
query nodes serve, and they load new segments later: 15 s after "completed" on a quiet Milvus
2.3.5 here, or not before a released collection is loaded again. A copy started at "completed"
reads the collection without the import's rows (:mod:`replicator.meta.segments`).

:class:`ServingCheck` asks the source which segments of a collection it serves
(``GetQuerySegmentInfo``: the query coordinator's current target, what a query reads) and
tells the task's imports (:meth:`TaskImports.serving_seen`) which segments are still missing;
the import is copied only once none is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from replicator.meta.segments import SegmentRecord, unserved
from replicator.pipeline.imports import TaskImports

# (db, collection) -> (segment ids the source's query nodes serve, what it said when that is
# nothing, e.g. that the collection is not loaded)
LoadedSegments = Callable[[str, str], tuple[set[int], str]]
# collection id -> its segments as the source's data coordinator records them
SegmentRecords = Callable[[int], Mapping[int, SegmentRecord]]


class ServingCheck:
    def __init__(self, loaded: LoadedSegments, records: SegmentRecords) -> None:
        self._loaded = loaded
        self._records = records

    def __call__(self, imports: TaskImports) -> None:
        """One look at the source for every completed import of the task not yet served.
        Blocking; raises ``SourceUnavailableError`` when the source cannot be asked."""
        answers: dict[str, tuple[set[int], str]] = {}
        for item in imports.unserved():
            label = item["source_collection"]
            if label not in answers:
                db, _, name = label.partition(".")
                answers[label] = self._loaded(db, name)
            served, said = answers[label]
            missing = [s for s in item.get("segments") or [] if s not in served]
            if missing:  # compaction may have made other segments of them
                missing = unserved(missing, served, self._records(int(item["collection_id"])))
            imports.serving_seen(int(item["job_id"]), missing, said)


class LoadedOnSource:
    """``GetQuerySegmentInfo`` on the source Milvus (``sourceConfig.milvus``): one client per
    database, opened when first asked."""

    TIMEOUT = 10.0

    def __init__(self, connect: dict[str, Any]) -> None:
        self._connect = connect
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, db: str, name: str) -> tuple[set[int], str]:
        try:
            served = self._served(self._client(db), name)
        except Exception as exc:  # noqa: BLE001 - whatever it was is shown on the import
            return set(), f"{type(exc).__name__}: {exc}"
        return served, "" if served else "it serves no segment of the collection: is it loaded?"

    def _client(self, db: str) -> Any:
        with self._lock:
            client = self._clients.get(db)
            if client is None:
                from pymilvus import MilvusClient  # only a daemon that backfills needs it

                from replicator.sinks.milvus_channel import client_kwargs

                kwargs = client_kwargs(self._connect)
                if db and db != "default":
                    kwargs["db_name"] = db
                client = self._clients[db] = MilvusClient(timeout=self.TIMEOUT, **kwargs)
            return client

    def _served(self, client: Any, name: str) -> set[int]:
        if hasattr(client, "list_loaded_segments"):  # pymilvus 3: the call names the database
            return {int(s.segment_id) for s in client.list_loaded_segments(name, self.TIMEOUT)}
        # before 3 the client has no such method; its handler sends the same request with the
        # client's database
        handler = client._get_connection()
        return {int(i.segmentID) for i in handler.get_query_segment_info(name, self.TIMEOUT)}
