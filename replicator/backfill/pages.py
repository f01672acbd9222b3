"""Reading a key range page by page, exactly, whatever pages the server returns.

A page is asked as "the rows after the last key, at most ``batch``", sorted here, and the read
goes on after its highest key. That is only exact if every page holds *all* the keys between
the last one read and its own highest key. Milvus does not promise it: 2.3.5 with pymilvus's
iterator hints (``iterator``, ``reduce_stop_for_best``) returns pages longer and shorter than
asked that skip keys of other segments (measured: 9,009 of 9,600 keys read that way from a
collection in 4 sealed segments and a growing one; reading to an empty page does not help).

So every page is checked: the server counts the keys in ``(last, highest]`` (``count(*)``), and
a page holding fewer is replaced by the whole window, read with a limit above that count (the
window is narrowed first when the count is over the server's 16,384-row cap). The read ends on
an empty page, or on a short whole page after which nothing is counted. A server that counts a
key twice (rows inserted twice under one key, before a compaction) makes the check read its
windows again, which costs queries, not rows.

A reader whose completeness is proved otherwise (the backfill's copy: ``proof`` counts, after
the copy, the rows of the range that it did not write) reads with ``read_unchecked``: every page
after the highest key of the page before, ending on an empty page or a page shorter than asked,
without a count, in whatever form the query answers (the copy's pages are protobuf columns).

Counts are asked with eventual consistency: a Strong query on Milvus 2.3.5 waits for the next
time tick (0.21 s measured, against 0.005 s), and a count served after a Strong page by the same
replica sees at least what the page saw. Pages and windows are read with Strong consistency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from replicator.backfill.ranges import Key, literal

log = logging.getLogger(__name__)

# Milvus caps a query at 16384 rows
MAX_BATCH = 16384

Row = dict[str, Any]
P = TypeVar("P")


class RangeQuery(Protocol):
    """The two questions a range read asks the server (Strong consistency)."""

    def rows(self, filter: str, limit: int) -> list[Row]:
        """Rows matching ``filter``, at most about ``limit`` (the server may return more), seeing
        every write acknowledged before the call (Strong consistency)."""
        ...

    def count(self, filter: str) -> int:
        """How many rows match ``filter``, seeing at least what the last ``rows`` answer saw
        (on Milvus: eventual consistency, which is the same on a server with one replica; on a
        lagging replica a count can be older, which the range's proof makes up for)."""
        ...


class PageReadError(RuntimeError):
    """The server's answers contradict each other (a key not after the cursor, a window that
    cannot be read whole)."""


def read_pages(
    query: RangeQuery, pk: str, expr: str, batch: int, everything: str
) -> Iterator[list[Row]]:
    """The rows matching ``expr`` (``everything`` when empty) page by page, each page sorted by
    key, holding every key between the page before and its own highest key. A page shorter
    than ``batch`` ends the read only when nothing is counted after it; otherwise the read
    ends on an empty page."""
    batch = max(1, min(batch, MAX_BATCH))
    last: Key | None = None
    while True:
        page = sorted(
            query.rows(window_filter(pk, expr, last, None, everything), batch), key=_key(pk)
        )
        if not page:
            return
        if last is not None and not page[0][pk] > last:
            raise PageReadError(f"query after {pk} > {literal(last)} returned a key not above it")
        high = page[-1][pk]
        whole = query.count(window_filter(pk, expr, last, high, everything)) == len(page)
        if not whole:
            page, high = _window(query, pk, expr, last, page, everything)
        if page:
            yield page
        last = high
        if (
            whole
            and len(page) < batch
            and not query.count(window_filter(pk, expr, last, None, everything))
        ):
            return


def read_unchecked(
    rows: Callable[[str, int], P],
    keys: Callable[[P], Sequence[Key]],
    pk: str,
    expr: str,
    batch: int,
    everything: str,
) -> Iterator[P]:
    """The pages ``rows(filter, limit)`` answers for ``expr`` (``everything`` when empty), each
    asked after the highest of the ``keys`` of the page before, as they come (not sorted, not
    checked: what they miss is for the caller to find). The read ends on an empty page or on a
    page with fewer keys than ``batch``."""
    batch = max(1, min(batch, MAX_BATCH))
    last: Key | None = None
    while True:
        page = rows(window_filter(pk, expr, last, None, everything), batch)
        found = keys(page)
        if not found:
            return
        if last is not None and not min(found) > last:  # type: ignore[operator]
            raise PageReadError(f"query after {pk} > {literal(last)} returned a key not above it")
        yield page
        if len(found) < batch:
            return
        last = max(found)


def _window(
    query: RangeQuery, pk: str, expr: str, last: Key | None, page: list[Row], everything: str
) -> tuple[list[Row], Key]:
    """Every row in ``(last, high]``, and ``high``: the page's own highest key, or a lower key
    of the page while the window holds more than the server returns at once. (Rows written
    since the page was read are in it or not, as with any read.)"""
    keys = [row[pk] for row in page]
    while True:
        high = keys[-1]
        where = window_filter(pk, expr, last, high, everything)
        count = query.count(where)
        if count <= MAX_BATCH:
            # a margin over the count, for rows written in between
            limit = min(MAX_BATCH, count + max(16, count // 4))
            rows = sorted(query.rows(where, limit), key=_key(pk))
            if not all((last is None or r[pk] > last) and r[pk] <= high for r in rows):
                raise PageReadError(
                    f"a read of the window {pk} in ({last!r}, {high!r}] returned keys outside it"
                )
            log.debug("page after %r read whole: %d rows up to %r", last, len(rows), high)
            return rows, high
        if len(keys) == 1:
            raise PageReadError(f"the window {pk} in ({last!r}, {high!r}] holds {count} rows")
        keys = keys[: len(keys) // 2]


def window_filter(pk: str, expr: str, after: Key | None, upto: Key | None, everything: str) -> str:
    """``expr`` (a Milvus expression) for the keys in ``(after, upto]`` (None: no bound), or
    ``everything`` when there is nothing to say."""
    parts = []
    if after is not None:
        parts.append(f"{pk} > {literal(after)}")
    if upto is not None:
        parts.append(f"{pk} <= {literal(upto)}")
    if expr:
        parts.append(f"({expr})")
    return " and ".join(parts) or everything


def _key(pk: str) -> Any:
    return lambda row: row[pk]
