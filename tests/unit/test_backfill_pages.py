"""The range reader against servers whose pages are longer and shorter than asked and skip keys
(as Milvus 2.3.5 did with pymilvus's iterator hints: each segment gives its own lowest keys and
the merge stops early), whose counts include keys twice, and whose windows exceed the cap."""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

import pytest

from replicator.backfill import pages
from replicator.backfill.pages import PageReadError, read_pages, read_unchecked
from replicator.backfill.ranges import Key, literal

WHERE = re.compile(r"^(?:pk > (?P<after>.+?))?(?: and )?(?:pk <= (?P<upto>.+?))?$")


class SegmentedServer:
    """Keys spread over ``segments`` (in no key order); a page query takes from each segment its
    lowest ``limit * factor`` keys after the cursor and merges them (keys of one segment above
    another's page are missing: the page has gaps), in a shuffled order. A query with an upper
    bound (a window) or ``exact`` answers as Milvus does without hints: the lowest keys of all.
    ``twice`` keys are counted two times by ``count`` (rows inserted twice under one key)."""

    def __init__(
        self,
        keys: list[Key],
        segments: int = 1,
        factors: tuple[float, ...] = (1.0,),
        twice: frozenset[Key] = frozenset(),
    ) -> None:
        shuffled = list(keys)
        random.Random(7).shuffle(shuffled)
        self.segments = [sorted(shuffled[i::segments]) for i in range(segments)]
        self.keys = sorted(keys)
        self.by_literal = {literal(k): k for k in keys}
        self.factors = itertools.cycle(factors)
        self.twice = twice
        self.row_calls = self.count_calls = 0
        self.window_limits: list[int] = []

    def _bounds(self, filter: str) -> tuple[Key | None, Key | None]:
        if filter == "ALL":
            return None, None
        match = WHERE.match(filter)
        assert match, filter
        after, upto = match.group("after"), match.group("upto")
        return (
            None if after is None else self.by_literal[after],
            None if upto is None else self.by_literal[upto],
        )

    @staticmethod
    def _inside(key: Key, after: Key | None, upto: Key | None) -> bool:
        return (after is None or key > after) and (upto is None or key <= upto)  # type: ignore[operator]

    def rows(self, filter: str, limit: int) -> list[dict[str, Any]]:
        self.row_calls += 1
        after, upto = self._bounds(filter)
        if upto is not None:
            self.window_limits.append(limit)
            found = [k for k in self.keys if self._inside(k, after, upto)][:limit]
        else:
            n = max(1, int(limit * next(self.factors)))
            found = [
                k
                for segment in self.segments
                for k in [x for x in segment if self._inside(x, after, None)][:n]
            ]
        page = [{"pk": k} for k in found]
        random.Random(self.row_calls).shuffle(page)
        return page

    def count(self, filter: str) -> int:
        self.count_calls += 1
        after, upto = self._bounds(filter)
        return sum(1 + (k in self.twice) for k in self.keys if self._inside(k, after, upto))


KEYS: list[list[Key]] = [
    list(range(-700, 1373)),
    [f"k'{i}\\\"é{i:05}" for i in range(373)] + ["", "ü", "\u4e2d", "a b"],
]


@pytest.mark.parametrize("keys", KEYS)
@pytest.mark.parametrize(
    ("segments", "factors"), [(1, (1.0,)), (1, (1.1, 0.72)), (5, (2.8, 0.4)), (4, (0.01, 3.0))]
)
def test_every_key_once_whatever_the_pages(
    keys: list[Key], segments: int, factors: tuple[float, ...]
) -> None:
    server = SegmentedServer(keys, segments, factors)
    read = list(read_pages(server, "pk", "", 100, "ALL"))
    seen = [row["pk"] for page in read for row in page]
    assert seen == sorted(keys)
    if segments == 1 and factors == (1.0,):
        # pages without gaps: no window read again; the short last page ends the read after
        # a count of what follows it, without asking for an empty page
        assert len(read[-1]) < 100
        assert server.row_calls == len(read) and server.count_calls == len(read) + 1


def test_the_pages_that_skip_keys_are_what_is_caught() -> None:
    """The same server read without the count check loses keys: the check is what saves them."""
    keys = list(range(3000))
    server = SegmentedServer(keys, 5, (2.8, 0.4))
    last, seen = None, []
    while page := sorted(
        server.rows("ALL" if last is None else f"pk > {last}", 100), key=lambda r: r["pk"]
    ):
        seen += [r["pk"] for r in page]
        last = page[-1]["pk"]
    assert len(seen) < len(keys)
    checked = SegmentedServer(keys, 5, (2.8, 0.4))
    assert [r["pk"] for p in read_pages(checked, "pk", "", 100, "ALL") for r in p] == keys


def test_keys_counted_twice_cost_queries_not_rows() -> None:
    keys = list(range(500))
    server = SegmentedServer(keys, 3, (1.5, 0.5), twice=frozenset(range(0, 500, 37)))
    seen = [r["pk"] for p in read_pages(server, "pk", "", 50, "ALL") for r in p]
    assert seen == keys


def test_a_window_over_the_cap_is_narrowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "MAX_BATCH", 40)
    keys = list(range(1000))
    # each page: 10 segments' 30 lowest keys, about 300 keys with gaps spread over more than
    # the cap: its window is read again, narrowed to what the cap allows
    server = SegmentedServer(keys, 10, (1.0,))
    read = list(read_pages(server, "pk", "", 30, "ALL"))
    assert [r["pk"] for p in read for r in p] == keys
    assert server.window_limits and max(server.window_limits) <= 40


def test_a_page_that_goes_backwards_is_an_error() -> None:
    class Stuck:
        def rows(self, filter: str, limit: int) -> list[dict[str, Any]]:
            return [{"pk": 1}]

        def count(self, filter: str) -> int:
            return 1

    with pytest.raises(PageReadError, match="not above"):
        list(read_pages(Stuck(), "pk", "", 10, "ALL"))


def test_read_ahead_keeps_order_hands_errors_over_and_stops_when_left() -> None:
    from replicator.backfill.transfer import read_ahead

    assert list(read_ahead(iter([[{"pk": 1}], [{"pk": 2}], [{"pk": 3}]]))) == [
        [{"pk": 1}],
        [{"pk": 2}],
        [{"pk": 3}],
    ]

    def failing() -> Any:
        yield [{"pk": 1}]
        raise PageReadError("the source went away")

    with pytest.raises(PageReadError, match="went away"):
        list(read_ahead(failing()))

    produced: list[int] = []

    def endless() -> Any:
        for n in itertools.count():
            produced.append(n)
            yield [{"pk": n}]

    reader = read_ahead(endless())
    assert next(reader) == [{"pk": 0}]
    reader.close()  # the consumer leaves: the producer stops with at most a page or two ahead
    assert len(produced) <= 3


def test_unchecked_pages_ask_no_count_and_end_on_a_short_page() -> None:
    """The copy's read (its proof counts what it missed): no count, no empty page at the end."""
    keys = list(range(1050))
    server = SegmentedServer(keys, 1, (1.0,))
    read = list(read_unchecked(server.rows, row_keys, "pk", "", 100, "ALL"))
    assert sorted(r["pk"] for p in read for r in p) == keys
    assert server.count_calls == 0 and server.row_calls == 11
    # a server whose pages skip keys: the unchecked read misses some (the proof's counts see it)
    many = list(range(3000))
    skipping = SegmentedServer(many, 5, (2.8, 0.4))
    unchecked = [
        r for p in read_unchecked(skipping.rows, row_keys, "pk", "", 100, "ALL") for r in p
    ]
    assert len(unchecked) < len(many)


def row_keys(page: list[dict[str, Any]]) -> list[Key]:
    return [row["pk"] for row in page]
