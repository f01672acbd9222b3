"""Reading a collection for a comparison: the schema's field kinds, a key range as
``{key: row hash}``, and whole rows by key (for a repair).

Ranges are read with the backfill's key-ordered pager (``transfer.pages_by_key``: escaped
key cursor, Strong consistency), over every partition at once: a row's partition is not part
of what is compared.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pymilvus import MilvusClient

from replicator.backfill.pages import MAX_BATCH
from replicator.backfill.ranges import Key, KeyRange, literal
from replicator.backfill.transfer import pages_by_key
from replicator.compare.digest import Digest, FieldKinds, digest_hashes, row_hash

log = logging.getLogger(__name__)

# keys per ``pk in [...]`` query of a repair
KEYS_PER_QUERY = 500


@dataclass(frozen=True)
class Schema:
    pk: str
    kinds: FieldKinds
    partition_key: bool


def schema_of(client: MilvusClient, collection: str) -> Schema:
    fields = client.describe_collection(collection)["fields"]
    kinds = {f["name"]: getattr(f["type"], "name", str(f["type"])) for f in fields}
    pk = next(f["name"] for f in fields if f.get("is_primary"))
    return Schema(pk, kinds, any(f.get("is_partition_key") for f in fields))


def ensure_loaded(client: MilvusClient, collection: str, side: str) -> str | None:
    """Load the collection when it is not (a query needs it loaded); a note saying so, or
    None when it was loaded already."""
    state = client.get_load_state(collection).get("state")
    if getattr(state, "name", str(state)) == "Loaded":
        return None
    log.info("loading %s on the %s to compare it", collection, side)
    client.load_collection(collection, timeout=300)
    return f"{collection} was not loaded on the {side}; the verify loaded it"


def read_range(
    client: MilvusClient, collection: str, schema: Schema, key_range: KeyRange, batch: int
) -> dict[Key, int]:
    """``{key: row hash}`` of the rows of ``key_range`` (everything written before the last
    ``strong_barrier`` on the collection included)."""
    hashes: dict[Key, int] = {}
    expr = key_range.filter(schema.pk)
    for page in pages_by_key(client, collection, schema.pk, expr, ["*"], None, batch):
        for row in page:
            hashes[row[schema.pk]] = row_hash(row, schema.kinds)
    return hashes


def strong_barrier(client: MilvusClient, collection: str, expr: str) -> int:
    """A Strong count of the rows matching ``expr``; returns only once the server has applied
    every write acknowledged before the call.

    Needed before ``pages_by_key``: measured on Milvus 2.3.5, a query with the iterator hints
    it sends (``iterator``, ``reduce_stop_for_best``) does not wait for Strong consistency: read
    right after a delete and an upsert it still returned the deleted row and the old version
    (tests/e2e/test_verify.py shows the effect: differences made just before a verify went
    unseen). A count first makes the pages see those writes: once per collection and side
    (a Strong query waits up to a time tick, about 0.2 s: once per range it cost 0.4 s per
    range in bench/verify.py), so the range reads see everything written before the verify
    reached the collection; later writes are the gate's business (:mod:`verify`)."""
    answer = client.query(
        collection,
        filter=expr,
        output_fields=["count(*)"],
        consistency_level="Strong",
        timeout=120,
    )
    return int(answer[0]["count(*)"])


def range_digest(hashes: Mapping[Key, int]) -> Digest:
    return digest_hashes(hashes.values())


def rows_by_key(
    client: MilvusClient,
    collection: str,
    pk: str,
    keys: Iterable[Key],
    partition: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``keys`` that exist (in ``partition`` when given), read with Strong
    consistency."""
    found: list[dict[str, Any]] = []
    ordered = list(keys)
    for start in range(0, len(ordered), KEYS_PER_QUERY):
        chunk = ordered[start : start + KEYS_PER_QUERY]
        expr = f"{pk} in [{', '.join(literal(k) for k in chunk)}]"
        found += client.query(
            collection,
            filter=expr,
            output_fields=["*"],
            partition_names=[partition] if partition else None,
            limit=min(MAX_BATCH, len(chunk)),
            consistency_level="Strong",
            timeout=120,
        )
    return found
