"""The idle saves' budget: a burst, then the rate; never more."""

from __future__ import annotations

import time

from replicator.pipeline.save_budget import SaveBudget


def test_a_burst_then_tokens_at_the_rate_and_never_more() -> None:
    budget = SaveBudget(rate=20.0, burst=5.0)
    assert [budget.take() for _ in range(6)] == [True] * 5 + [False]
    time.sleep(0.3)  # 6 tokens' worth, capped at the burst of 5
    assert sum(budget.take() for _ in range(10)) == 5
    started = time.monotonic()
    taken = 0
    while time.monotonic() - started < 1.0:
        taken += budget.take()
        time.sleep(0.001)
    # 20 a second at most; a loaded machine that stalls the loop loses some to the burst cap
    assert 5 <= taken <= 21
