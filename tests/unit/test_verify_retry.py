"""A verify range whose read fails on its connection is read again; other failures end the job."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from replicator.backfill.ranges import KeyRange
from replicator.compare import job
from replicator.compare.verify import RangeOutcome

RANGE = KeyRange(0, None, 100, 100)


class Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(f"{code}")
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class Verifier:
    """Stands for ``CollectionVerifier``: fails its first ``failures`` calls with ``code``."""

    def __init__(self, failures: int, code: grpc.StatusCode) -> None:
        self.failures, self.code = failures, code
        self.calls: list[Any] = []

    def verify(self, key_range: KeyRange, digests: Any = None) -> RangeOutcome:
        self.calls.append(digests)
        if len(self.calls) <= self.failures:
            raise Failure(self.code)
        return RangeOutcome(key_range, 42)


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job, "RANGE_BACKOFF", 0.01)


def test_a_range_whose_connection_failed_is_read_again() -> None:
    verifier = Verifier(2, grpc.StatusCode.UNAVAILABLE)
    digests = ("spark", "digests")
    outcome = job.verify_retrying(verifier, RANGE, digests, threading.Event())  # type: ignore[arg-type]
    assert outcome.rows_compared == 42
    # the first read used the Spark digests; the next ones read the range anew
    assert verifier.calls == [digests, None, None]


def test_a_request_the_server_refused_ends_the_job_at_once() -> None:
    verifier = Verifier(1, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(Failure):
        job.verify_retrying(verifier, RANGE, None, threading.Event())  # type: ignore[arg-type]
    assert len(verifier.calls) == 1


def test_the_last_failure_ends_the_job_with_its_reason() -> None:
    verifier = Verifier(5, grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(Failure):
        job.verify_retrying(verifier, RANGE, None, threading.Event(), tries=3)  # type: ignore[arg-type]
    assert len(verifier.calls) == 3


def test_a_stopping_job_does_not_read_again() -> None:
    verifier = Verifier(1, grpc.StatusCode.UNAVAILABLE)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Failure):
        job.verify_retrying(verifier, RANGE, None, stop)  # type: ignore[arg-type]
    assert len(verifier.calls) == 1
