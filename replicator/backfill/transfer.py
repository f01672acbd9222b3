"""One key range copied from the source to the target: what a Spark task runs.

Executors import only this module and pymilvus (no metastore, no daemon settings), so a Spark
cluster needs nothing else. Rows are read in key order, page by page (Strong consistency: everything
written before the job recorded its positions is seen) and written with upsert, so a range
copied twice, after a retry or a killed job, replaces its rows instead of doubling them. A copied
range then proves itself (``proof.prove_range``) before the driver records it as done.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any, Protocol
from urllib.parse import urlsplit

from pymilvus import DataType, MilvusClient

from replicator.backfill.proof import prove_range
from replicator.backfill.ranges import Key, literal

# Milvus caps a query at 16384 rows
MAX_BATCH = 16384


def client_kwargs(connect: dict[str, Any]) -> dict[str, Any]:
    """``MilvusClient`` arguments for a task's ``milvus_connect_param`` (or the source's
    settings as a dict with ``uri``, ``username``, ``password``, ``token``)."""
    if connect.get("uri"):
        parts = urlsplit(connect["uri"])
        secure = parts.scheme == "https" or bool(connect.get("enable_tls"))
        port = parts.port or (443 if parts.scheme == "https" else 19530)
        host = parts.hostname
    else:
        secure = bool(connect.get("enable_tls"))
        host, port = connect["host"], connect["port"]
    kwargs: dict[str, Any] = {"uri": f"{'https' if secure else 'http'}://{host}:{port}"}
    if connect.get("token"):
        kwargs["token"] = connect["token"]
    elif connect.get("username"):
        kwargs["user"] = connect["username"]
        kwargs["password"] = connect["password"]
    dial = connect.get("dial_config") or {}
    for key in ("server_name", "server_pem_path", "ca_pem_path", "client_pem_path"):
        if dial.get(key):
            kwargs[key] = dial[key]
    if dial.get("client_key_path"):
        kwargs["client_key_path"] = dial["client_key_path"]
    return kwargs


def connect(params: dict[str, Any], db: str) -> MilvusClient:
    kwargs = client_kwargs(params)
    if db and db != "default":
        kwargs["db_name"] = db
    return MilvusClient(dedicated=True, timeout=60, **kwargs)


class PageQuery(Protocol):
    """One page of a range read: the rows matching ``filter``, at most about ``limit`` of them.
    The server may return more or fewer than ``limit`` while rows remain (Milvus 2.3.5 with the
    iterator hints did both), so a reader must not take a short page for the end."""

    def __call__(self, filter: str, limit: int) -> list[dict[str, Any]]: ...


def read_pages(
    query: PageQuery, pk: str, expr: str, batch: int, everything: str
) -> Iterator[list[dict[str, Any]]]:
    """The rows matching ``expr`` (``everything`` when empty) page by page, each page sorted by
    key and read after the highest key of the one before. The read ends only when the server
    has nothing after the last key (an empty page), never because a page was short."""
    batch = min(batch, MAX_BATCH)
    last: Key | None = None
    while True:
        parts = [f"({expr})"] if expr else []
        if last is not None:
            parts.insert(0, f"{pk} > {literal(last)}")
        page = query(" and ".join(parts) or everything, batch)
        if not page:
            return
        page = sorted(page, key=lambda row: row[pk])
        if last is not None and not page[0][pk] > last:
            raise RuntimeError(f"query after {pk} > {literal(last)} returned a key not above it")
        yield page
        last = page[-1][pk]


def pages_by_key(
    client: MilvusClient,
    collection: str,
    pk: str,
    expr: str,
    fields: list[str],
    partition: str | None,
    batch: int,
) -> Iterator[list[dict[str, Any]]]:
    """``read_pages`` on a pymilvus client. pymilvus's query iterator pages the same way but puts
    a varchar key into its expression unescaped (a key holding a quote breaks it); here the
    cursor is a literal escaped by ``ranges.literal``. ``iterator``/``reduce_stop_for_best``
    ask the server for the lowest keys first, as pymilvus's iterator does; the page length
    they give varies, which ``read_pages`` does not rely on."""
    query = _query(client, collection, fields, partition, iterator=True)
    yield from read_pages(query, pk, expr, batch, f"{pk} >= {_lowest(client, collection, pk)}")


def _query(
    client: MilvusClient,
    collection: str,
    fields: list[str],
    partition: str | None,
    iterator: bool,
) -> PageQuery:
    hints = {"iterator": "True", "reduce_stop_for_best": "True"} if iterator else {}

    def query(filter: str, limit: int) -> list[dict[str, Any]]:
        return list(
            client.query(
                collection,
                filter=filter,
                output_fields=fields,
                partition_names=[partition] if partition else None,
                limit=limit,
                consistency_level="Strong",
                timeout=120,
                **hints,
            )
        )

    return query


class SourceRange:
    """One range of one partition on the source, for ``proof.prove_range``: its keys read
    again in pages of ``MAX_BATCH`` (another size than the copy's), its rows by key."""

    def __init__(
        self, client: MilvusClient, collection: str, pk: str, expr: str, partition: str | None
    ) -> None:
        self.client, self.collection, self.pk = client, collection, pk
        self.expr, self.partition = expr, partition

    def alive_keys(self) -> Iterator[Key]:
        for page in pages_by_key(
            self.client, self.collection, self.pk, self.expr, [self.pk], self.partition, MAX_BATCH
        ):
            for row in page:
                yield row[self.pk]

    def rows(self, keys: list[Key]) -> list[dict[str, Any]]:
        query = _query(self.client, self.collection, ["*"], self.partition, iterator=False)
        return query(f"{self.pk} in [{', '.join(literal(k) for k in keys)}]", len(keys))


_LOWEST: dict[tuple[int, str], str] = {}


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


def copy_range(work: dict[str, Any]) -> dict[str, int]:
    """Copy one range and prove it (``proof.prove_range``); the rows written, and how many of
    them the proof added. ``work`` holds: source and target connection parameters, db/name on
    both sides, the range's filter, the partitions, the batch size. A failure drops the
    worker's cached clients: a retry connects again."""
    source = cached_client(work["source"], work["db"])
    target = cached_client(work["target"], work["target_db"])
    pk, name, target_name = work["pk"], work["name"], work["target_name"]
    rows = added = 0
    try:
        for partition in work["partitions"] or [None]:

            def write(page: list[dict[str, Any]], partition: str | None = partition) -> None:
                if partition:
                    target.upsert(target_name, page, partition_name=partition)
                else:
                    target.upsert(target_name, page)

            written: set[Key] = set()
            batch = int(work["batch_rows"])
            for page in pages_by_key(source, name, pk, work["filter"], ["*"], partition, batch):
                write(page)
                written.update(row[pk] for row in page)
                rows += len(page)
            side = SourceRange(source, name, pk, work["filter"], partition)
            added += prove_range(side, pk, written, write)
    except BaseException:
        forget_clients()
        raise
    return {"rows": rows + added, "added_by_proof": added}
