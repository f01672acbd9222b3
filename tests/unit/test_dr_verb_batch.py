"""The boundary search's check that a refused verb changed nothing (tests/harness/dr_verb_batch.py),
on pair records given by hand: no daemon, no cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from harness.dr_verb_batch import _differences, _snapshot

from server.dr.pair import ClusterPair, FenceHold


class Pairs:
    def __init__(self) -> None:
        self.pair = ClusterPair(("a", "b"))

    def get(self, *_clusters: str) -> ClusterPair:
        return self.pair


def search_of(pairs: Pairs) -> Any:
    return SimpleNamespace(
        tasks=lambda: {"t1": {"state": "Paused"}},
        pairs=pairs,
        view=lambda job, own: {"state": "reversing"},
        walk=SimpleNamespace(model=SimpleNamespace(pair=("a", "b"))),
    )


def test_an_ownerless_fence_being_lifted_may_go_without_the_refused_verb_being_blamed() -> None:
    """The table on 346369d (switchover @ fence_left x switchover:own): the job had left the
    fence, its last owner, and m1's recover round lifted it 0.5 s after the hold; the check
    blamed the refused switchover for `FenceHold(owners=(), lifting=True) -> None`."""
    pairs = Pairs()
    search = search_of(pairs)
    pairs.pair = pairs.pair.with_fence("a", FenceHold(owners=(), revision=7, lifting=True))
    before = _snapshot(search, "j1", "t1")
    pairs.pair = pairs.pair.with_fence("a", None)  # any recover round lifted it meanwhile
    assert _differences(before, _snapshot(search, "j1", "t1")) == ""


def test_a_fence_with_an_owner_or_the_operators_that_goes_is_a_change() -> None:
    for hold in (
        FenceHold(owners=("j1",), revision=7),
        FenceHold(operator=True),
        FenceHold(owners=(), revision=7),  # ownerless, not being lifted: nothing lifts it
    ):
        pairs = Pairs()
        search = search_of(pairs)
        pairs.pair = pairs.pair.with_fence("a", hold)
        before = _snapshot(search, "j1", "t1")
        pairs.pair = pairs.pair.with_fence("a", None)
        assert "fences[a]" in _differences(before, _snapshot(search, "j1", "t1")), hold
