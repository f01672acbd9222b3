"""A key range's count and digest on one side, read as columns: the verify's common case.

The range is read page by page as protobuf columns (``backfill.columns.query_columns``, the
backfill's copy reader: pymilvus never makes Python rows of it) and each page digested as
columns (:mod:`column_digest`), while the next page is read (``transfer.read_ahead``). Every page
asks to see the writes up to one moment (Milvus's ``guarantee_timestamp``), taken when the range
read starts: the first page waits for the server to pass it, the others are served at once,
where Strong consistency waits for the next time tick on every page (about 0.2 s on 2.3.5).

Pages are read without the per-page count checks of ``pages.read_pages``; instead the range's
rows are counted once (``count(*)``, at the same moment) after the read: a read that holds a
different number of rows than the count answers (a page that skipped keys, rows counted twice,
rows written in between) is *not sure*, and the caller reads the range the exact way instead.
"""

from __future__ import annotations

from pymilvus import MilvusClient

from replicator.backfill.columns import ColumnPage, page_keys, query_columns
from replicator.backfill.pages import read_unchecked
from replicator.backfill.ranges import KeyRange
from replicator.backfill.transfer import MilvusRangeQuery, every_key_filter, read_ahead
from replicator.compare.column_digest import columns_digest
from replicator.compare.digest import Digest
from replicator.compare.reader import Schema


def digest_range(
    client: MilvusClient,
    db: str,
    collection: str,
    schema: Schema,
    key_range: KeyRange,
    batch: int,
    seen_ts: int,
) -> Digest | None:
    """The count and digest of the rows of ``key_range`` that the server holds having seen
    every write up to ``seen_ts`` (a hybrid timestamp), or None when the read could not be
    proven whole."""
    pk = schema.pk
    everything = every_key_filter(client, collection, pk)
    expr = key_range.filter(pk)

    def query(where: str, limit: int) -> ColumnPage:
        return query_columns(client, db, collection, pk, where, None, limit, seen_ts)

    total = Digest()
    for page in read_ahead(read_unchecked(query, page_keys, pk, expr, batch, everything)):
        total += columns_digest(page.fields, schema.kinds)
    counted = MilvusRangeQuery(client, collection, [], None, seen_ts).count(
        expr or everything, seen=True
    )
    return total if counted == total.count else None
