"""The range reader against a server whose pages are longer and shorter than asked."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from replicator.backfill.ranges import Key, literal
from replicator.backfill.transfer import read_pages


class IrregularServer:
    """Answers ``pk > <literal>`` (or everything) with the lowest keys after the cursor, in a
    shuffled order, ``limit`` times a factor that cycles above and below 1."""

    def __init__(self, keys: list[Key], factors: list[float]) -> None:
        self.keys = sorted(keys)
        self.by_literal = {literal(k): k for k in keys}
        self.factors = itertools.cycle(factors)
        self.calls = 0

    def __call__(self, filter: str, limit: int) -> list[dict[str, Any]]:
        self.calls += 1
        if filter == "ALL":
            rest = self.keys
        else:
            prefix = "pk > "
            assert filter.startswith(prefix)
            last = self.by_literal[filter[len(prefix) :]]
            rest = [k for k in self.keys if k > last]
        n = max(1, int(limit * next(self.factors)))
        page = [{"pk": k} for k in rest[:n]]
        random.Random(self.calls).shuffle(page)
        return page


@pytest.mark.parametrize(
    "keys",
    [
        list(range(-700, 1373)),
        [f"k'{i}\\\"é{i:05}" for i in range(373)] + ["", "ü", "\u4e2d"],
    ],
)
@pytest.mark.parametrize("factors", [[1.1, 0.72], [0.01, 3.0, 0.5], [1.0]])
def test_every_key_once_whatever_the_page_sizes(keys: list[Key], factors: list[float]) -> None:
    server = IrregularServer(keys, factors)
    pages = list(read_pages(server, "pk", "", 100, "ALL"))
    seen = [row["pk"] for page in pages for row in page]
    assert seen == sorted(keys)
    # short pages occurred while rows remained, and the read still went on to the end
    if min(factors) < 1:
        assert any(len(p) < 100 for p in pages[:-1])
    assert server.calls == len(pages) + 1  # ended only on an empty page


def test_a_page_that_goes_backwards_is_an_error() -> None:
    def stuck(filter: str, limit: int) -> list[dict[str, Any]]:
        return [{"pk": 1}]

    with pytest.raises(RuntimeError, match="not above"):
        list(read_pages(stuck, "pk", "", 10, "ALL"))
