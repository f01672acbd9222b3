"""Reading a collection for a comparison: the schema's field kinds and a key range as
``{key: row hash}`` (whole rows by key, for a repair: ``transfer.rows_by_key``).

Ranges are read with the backfill's checked, key-ordered pager (``transfer.pages_by_key``:
escaped key cursor, every page Strong, so a range read sees every write acknowledged before
it), over every partition at once: a row's partition is not part of what is compared.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pymilvus import MilvusClient

from replicator.backfill.columns import function_outputs
from replicator.backfill.ranges import Key, KeyRange
from replicator.backfill.transfer import pages_by_key
from replicator.compare.digest import Digest, FieldKinds, digest_hashes, row_hash

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Schema:
    pk: str
    kinds: FieldKinds
    partition_key: bool
    # fields a function fills (a BM25 output): compared, but a repair's write leaves them out
    generated: frozenset[str] = frozenset()


def schema_of(client: MilvusClient, collection: str) -> Schema:
    fields = client.describe_collection(collection)["fields"]
    kinds = {f["name"]: getattr(f["type"], "name", str(f["type"])) for f in fields}
    pk = next(f["name"] for f in fields if f.get("is_primary"))
    partition_key = any(f.get("is_partition_key") for f in fields)
    return Schema(pk, kinds, partition_key, function_outputs(fields))


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
    """``{key: row hash}`` of the rows of ``key_range`` (everything written before the read
    included)."""
    hashes: dict[Key, int] = {}
    expr = key_range.filter(schema.pk)
    for page in pages_by_key(client, collection, schema.pk, expr, ["*"], None, batch):
        for row in page:
            hashes[row[schema.pk]] = row_hash(row, schema.kinds)
    return hashes


def range_digest(hashes: Mapping[Key, int]) -> Digest:
    return digest_hashes(hashes.values())
