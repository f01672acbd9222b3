"""One key range copied from the source to the target: what a Spark task runs.

Executors import only this module, ``sinks/milvus_channel.py`` (the client's TLS files and login)
and pymilvus (no metastore, no daemon settings), so a Spark cluster needs nothing else. Rows are
read in key order, page by page (seeing every write made before the job recorded its positions:
``guarantee_after``) and written with upsert, so a range copied twice, after a retry or a killed
job, replaces its rows instead of doubling them. A copied range then proves itself
(``proof.prove_range``) before the driver records it as done.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pymilvus import DataType, MilvusClient

from replicator.backfill.columns import (
    ColumnPage,
    generated_fields,
    page_keys,
    query_columns,
    upsert_columns,
)
from replicator.backfill.pages import MAX_BATCH, read_pages, read_unchecked, window_filter
from replicator.backfill.proof import Run, prove_range
from replicator.backfill.ranges import Key, literal
from replicator.hybrid_time import from_seconds
from replicator.sinks.milvus_channel import client_kwargs


def connect(params: dict[str, Any], db: str) -> MilvusClient:
    kwargs = client_kwargs(params)
    if db and db != "default":
        kwargs["db_name"] = db
    return MilvusClient(dedicated=True, timeout=60, **kwargs)


def pages_by_key(
    client: MilvusClient,
    collection: str,
    pk: str,
    expr: str,
    fields: list[str],
    partition: str | None,
    batch: int,
    guarantee_ts: int = 0,
) -> Iterator[list[dict[str, Any]]]:
    """``pages.read_pages`` on a pymilvus client (reads as ``MilvusRangeQuery``). pymilvus's
    query iterator pages the same way but puts a varchar key into its expression unescaped (a
    key holding a quote breaks it), and
    sends the hints that make 2.3.5 skip keys; here the cursor is a literal escaped by
    ``ranges.literal`` and every page is checked against a count."""
    query = MilvusRangeQuery(client, collection, fields, partition, guarantee_ts)
    yield from read_pages(query, pk, expr, batch, every_key_filter(client, collection, pk))


# Seconds added to a job's start (the daemon's clock) to make the timestamp its reads must see:
# more than the clock skew between the daemon and the source Milvus can be (NTP keeps it to
# milliseconds). See ``guarantee_after``.
CLOCK_MARGIN = 5.0


def guarantee_after(started_at: float) -> int:
    """The hybrid timestamp a backfill's reads must see: every write the source acknowledged
    before the job's positions were saved (they are saved before ``started_at``) has a smaller
    one. Reads then ask for it (Milvus's ``guarantee_timestamp``) instead of Strong consistency,
    which waits for the next time tick on every query (0.21 s each on 2.3.5); once the source
    has passed it they are served at once."""
    return from_seconds(started_at + CLOCK_MARGIN)


class MilvusRangeQuery:
    """``pages.RangeQuery`` on a pymilvus client, one collection (and partition): reads that see
    every write up to ``guarantee_ts`` (a hybrid timestamp; 0: Strong consistency). No
    iterator hints: with them Milvus 2.3.5 returns pages that skip keys, and reads that are not
    Strong."""

    def __init__(
        self,
        client: MilvusClient,
        collection: str,
        fields: list[str],
        partition: str | None,
        guarantee_ts: int = 0,
    ) -> None:
        self.client, self.collection, self.fields = client, collection, fields
        self.partitions = [partition] if partition else None
        self.consistency: dict[str, Any] = (
            {"consistency_level": "Customized", "guarantee_timestamp": guarantee_ts}
            if guarantee_ts
            else {"consistency_level": "Strong"}
        )

    def rows(self, filter: str, limit: int) -> list[dict[str, Any]]:
        return list(
            self.client.query(
                self.collection,
                filter=filter,
                output_fields=self.fields,
                partition_names=self.partitions,
                limit=limit,
                timeout=120,
                **self.consistency,
            )
        )

    def count(self, filter: str, seen: bool = False) -> int:
        """How many rows match ``filter``: with eventual consistency (see ``pages``), or, when
        ``seen``, reading as ``rows`` does."""
        consistency = self.consistency if seen else {"consistency_level": "Eventually"}
        result = self.client.query(
            self.collection,
            filter=filter,
            output_fields=["count(*)"],
            partition_names=self.partitions,
            timeout=120,
            **consistency,
        )
        return int(result[0]["count(*)"])


class SourceRange:
    """One range of one partition on the source, for ``proof.prove_range``: the count of its
    rows outside the written keys, its keys read again in pages of ``MAX_BATCH`` (another size
    than the copy's), its rows by key."""

    def __init__(
        self,
        client: MilvusClient,
        collection: str,
        pk: str,
        expr: str,
        partition: str | None,
        guarantee_ts: int = 0,
        generated: frozenset[str] = frozenset(),
    ) -> None:
        self.client, self.collection, self.pk = client, collection, pk
        self.expr, self.partition, self.guarantee_ts = expr, partition, guarantee_ts
        self.generated = generated  # left out of the rows (the target computes them)

    def alive_keys(self) -> Iterator[Key]:
        for page in pages_by_key(
            self.client,
            self.collection,
            self.pk,
            self.expr,
            [self.pk],
            self.partition,
            MAX_BATCH,
            self.guarantee_ts,
        ):
            for row in page:
                yield row[self.pk]

    def rows(self, keys: list[Key]) -> list[dict[str, Any]]:
        return rows_by_key(
            self.client,
            self.collection,
            self.pk,
            keys,
            self.partition,
            self.guarantee_ts,
            self.generated,
        )

    def count_unwritten(self, after: Key | None, upto: Key | None, runs: list[Run]) -> int:
        pk = self.pk
        parts = [f"({self.expr})"] if self.expr else []
        if runs:
            parts.append(f"not ({excluding(pk, runs)})")
        everything = every_key_filter(self.client, self.collection, pk)
        where = window_filter(pk, " and ".join(parts), after, upto, everything)
        # read as the pages are (not Eventually, as the page checks' counts): the proof's count
        # must see every key written before the job started
        query = MilvusRangeQuery(
            self.client, self.collection, [], self.partition, self.guarantee_ts
        )
        return query.count(where, seen=True)


def excluding(pk: str, runs: list[Run]) -> str:
    """A Milvus expression matching the keys of ``runs`` (one ``in [...]`` for the single keys,
    an interval for each longer run)."""
    singles = [literal(first) for first, last in runs if first == last]
    terms = [f"{pk} in [{', '.join(singles)}]"] if singles else []
    terms += [
        f"({pk} >= {literal(first)} and {pk} <= {literal(last)})"
        for first, last in runs
        if first != last
    ]
    return " or ".join(terms)


# keys per ``pk in [...]`` query of ``rows_by_key``
KEYS_PER_QUERY = 500


def rows_by_key(
    client: MilvusClient,
    collection: str,
    pk: str,
    keys: Iterable[Key],
    partition: str | None = None,
    guarantee_ts: int = 0,
    generated: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The rows of ``keys`` that exist (in ``partition`` when given), read as
    ``MilvusRangeQuery`` reads, ``KEYS_PER_QUERY`` keys a query; as an upsert takes them back
    (a repair's and a proof's writes), see ``writable``, without the ``generated`` fields
    (``columns.generated_fields``)."""
    query = MilvusRangeQuery(client, collection, ["*"], partition, guarantee_ts)
    found: list[dict[str, Any]] = []
    ordered = list(keys)
    for start in range(0, len(ordered), KEYS_PER_QUERY):
        chunk = ordered[start : start + KEYS_PER_QUERY]
        rows = query.rows(f"{pk} in [{', '.join(literal(k) for k in chunk)}]", len(chunk))
        found += [writable(row, generated) for row in rows]
    return found


def writable(row: dict[str, Any], generated: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A row pymilvus answered, as its upsert takes it: a binary vector comes as a list holding
    one ``bytes`` (so may other byte vectors), which the upsert refuses ("should be a
    binary_vector, but got a list"); it goes as the ``bytes``. No other field's value is a list
    of bytes."""
    return {
        name: value[0]
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], bytes)
        else value
        for name, value in row.items()
        if name not in generated
    }


_LOWEST: dict[tuple[int, str], str] = {}


def every_key_filter(client: MilvusClient, collection: str, pk: str) -> str:
    """An expression matching every key."""
    return f"{pk} >= {_lowest(client, collection, pk)}"


def _lowest(client: MilvusClient, collection: str, pk: str) -> str:
    """What follows ``pk >=`` to match every key."""
    cache = (id(client), collection)
    if cache not in _LOWEST:
        fields = client.describe_collection(collection)["fields"]
        kind = next(f["type"] for f in fields if f["name"] == pk)
        # (Milvus parses "-9223372036854775808" as minus a number out of range)
        _LOWEST[cache] = '""' if kind == DataType.VARCHAR else f"0 or {pk} < 0"
    return _LOWEST[cache]


# Clients kept for the life of a Spark Python worker (workers are reused across tasks), so a
# range does not pay two connections: measured, 16 ranges of 12,500 rows ran at 0.70 of the
# single-process copier with a connection pair per range (bench/results/backfill.md).
_CLIENTS: dict[str, MilvusClient] = {}


def cached_client(params: dict[str, Any], db: str) -> MilvusClient:
    key = json.dumps([params, db], sort_keys=True)
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = connect(params, db)
    return client


def forget_clients() -> None:
    while _CLIENTS:
        _, client = _CLIENTS.popitem()
        with contextlib.suppress(Exception):
            client.close()


_DONE = object()
T = TypeVar("T")


def read_ahead(pages: Iterator[T]) -> Iterator[T]:
    """``pages`` with the next page read while the caller writes the current one: a page read
    is a Strong query, which waits for the source's next time tick (about 0.2 s on Milvus
    2.3.5); the wait then overlaps the target's upsert. At most one page is held ahead."""
    ahead: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def hand(item: Any) -> bool:
        """Put ``item`` for the consumer; False once the consumer has gone."""
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for page in pages:
                if not hand(page):
                    return
            hand(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            hand(exc)

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ahead.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def copy_range(work: dict[str, Any]) -> dict[str, int]:
    """Copy one range and prove it (``proof.prove_range``); the rows written, and how many of
    them the proof added. ``work`` holds: source and target connection parameters, db/name on
    both sides, the range's filter, the partitions, the batch size. A failure drops the
    worker's cached clients: a retry connects again."""
    source = cached_client(work["source"], work["db"])
    target = cached_client(work["target"], work["target_db"])
    pk, name, target_name = work["pk"], work["name"], work["target_name"]
    db, target_db = work["db"], work["target_db"]
    batch, seen = int(work["batch_rows"]), int(work.get("guarantee_ts") or 0)
    rows = added = 0
    try:
        generated = generated_fields(source, name)  # a BM25 output: the target computes it
        for partition in work["partitions"] or [None]:

            def write(page: list[dict[str, Any]], partition: str | None = partition) -> None:
                if partition:
                    target.upsert(target_name, page, partition_name=partition)
                else:
                    target.upsert(target_name, page)

            written: set[Key] = set()

            def query(where: str, limit: int, partition: str | None = partition) -> ColumnPage:
                return query_columns(source, db, name, pk, where, partition, limit, seen)

            # pages as columns, not checked against counts: the proof counts what they missed
            everything = every_key_filter(source, name, pk)
            pages = read_unchecked(query, page_keys, pk, work["filter"], batch, everything)
            for page in read_ahead(pages):
                upsert_columns(target, target_db, target_name, partition, page, generated)
                written.update(page.keys)
                rows += len(page.keys)
            side = SourceRange(source, name, pk, work["filter"], partition, seen, generated)
            added += prove_range(side, pk, written, write)
    except BaseException:
        forget_clients()
        raise
    return {"rows": rows + added, "added_by_proof": added}
