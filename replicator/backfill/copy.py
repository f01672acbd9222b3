"""One key range copied from the source to the target: what a Spark task runs.

Executors import only this module and pymilvus (no metastore, no daemon settings), so a Spark
cluster needs nothing else. Rows are read with a query iterator (Strong consistency: everything
written before the job recorded its positions is seen) and written with upsert, so a range
copied twice, after a retry or a killed job, replaces its rows instead of doubling them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pymilvus import MilvusClient

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


def read_range(
    client: MilvusClient, collection: str, expr: str, partition: str | None, batch: int
) -> Iterator[list[dict[str, Any]]]:
    pages = client.query_iterator(
        collection,
        batch_size=min(batch, MAX_BATCH),
        filter=expr,
        output_fields=["*"],
        partition_names=[partition] if partition else None,
        consistency_level="Strong",
        timeout=120,
    )
    try:
        while page := pages.next():
            yield list(page)
    finally:
        pages.close()


def copy_range(work: dict[str, Any]) -> int:
    """Copy one range; returns the rows written. ``work`` holds: source and target connection
    parameters, db/name on both sides, the range's filter, the partitions, the batch size."""
    source = connect(work["source"], work["db"])
    target = connect(work["target"], work["target_db"])
    rows = 0
    try:
        for partition in work["partitions"] or [None]:
            for page in read_range(
                source, work["name"], work["filter"], partition, int(work["batch_rows"])
            ):
                if partition:
                    target.upsert(work["target_name"], page, partition_name=partition)
                else:
                    target.upsert(work["target_name"], page)
                rows += len(page)
    finally:
        source.close()
        target.close()
    return rows
