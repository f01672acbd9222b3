"""SharedRead: callers that arrive while a read is under way share the next read, and nobody gets
the answer of a read that started before its call."""

from __future__ import annotations

import threading
import time

import pytest

from replicator.meta.shared_read import SharedRead


def waiting(shared: SharedRead, count: int, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while len(shared._cond._waiters) < count:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "callers did not wait"
        time.sleep(0.005)


def test_callers_during_a_read_share_the_next_one_and_never_get_an_older_answer():
    gate, started = threading.Event(), threading.Event()
    reads: list[int] = []

    def read() -> int:
        reads.append(len(reads) + 1)
        if len(reads) == 1:
            started.set()
            gate.wait(5)
        return len(reads)

    shared = SharedRead(read)
    answers: dict[str, int] = {}

    def ask(name: str) -> None:
        answers[name] = shared()

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    assert started.wait(5)
    later = [threading.Thread(target=ask, args=(f"later{i}",)) for i in range(5)]
    for thread in later:
        thread.start()
    waiting(shared, 5)  # all five arrived while read 1 was under way
    gate.set()
    for thread in [first, *later]:
        thread.join(5)
    assert answers["first"] == 1
    # read 1 started before they asked: they share read 2, which started after
    assert {answers[f"later{i}"] for i in range(5)} == {2}
    assert shared.reads == 2
    assert shared() == 3  # alone: a read of its own


def test_an_error_reaches_every_caller_of_that_read_and_the_next_read_is_fresh():
    failing = threading.Event()
    failing.set()

    def read() -> str:
        if failing.is_set():
            raise ConnectionError("etcd down")
        return "catalog"

    shared = SharedRead(read)
    with pytest.raises(ConnectionError, match="etcd down"):
        shared()
    failing.clear()
    assert shared() == "catalog"


def test_a_poller_takes_an_answer_no_older_than_max_age_and_reads_again_after():
    reads: list[float] = []

    def read() -> int:
        reads.append(time.monotonic())
        return len(reads)

    shared = SharedRead(read, max_age=0.3)
    assert shared() == 1
    assert [shared() for _ in range(20)] == [1] * 20  # within 0.3 s of read 1's start
    time.sleep(0.35)
    assert shared() == 2 and shared.reads == 2
    # without max_age every call reads
    fresh = SharedRead(read)
    assert [fresh(), fresh()] == [3, 4]
