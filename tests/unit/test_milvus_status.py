"""A target's refusal is classified once, from what the answer carries.

The cases are answers seen from the targets we run (Milvus Lite: both codes set to one number of
its own; Milvus 2.3.5: merr codes beside the legacy ``error_code``), and the codes of
``pkg/util/merr/errors.go``."""

from __future__ import annotations

import grpc
import pytest

from replicator.errors import Rejection
from replicator.sinks.milvus_status import grpc_rejection, status_rejection, status_retriable


@pytest.mark.parametrize(
    ("code", "error_code", "reason", "expected"),
    [
        # Milvus Lite (seen): code == error_code, the cause in words
        (1, 1, "alias 'al' already exists", Rejection.ALREADY_EXISTS),
        (6, 6, "database 'default' already exists", Rejection.ALREADY_EXISTS),
        # merr codes (Milvus 2.3+), whatever the words
        (100, 4, "can't find collection", Rejection.NOT_FOUND),
        (700, 25, "index not found[collection=c]", Rejection.NOT_FOUND),
        (800, 1, "database not found[database=x]", Rejection.NOT_FOUND),
        (1602, 1, "alias already exist", Rejection.ALREADY_EXISTS),
        (3000, 1, "unsupported operation", Rejection.UNIMPLEMENTED),
        (903, 1, "node lacks", Rejection.REPLICAS),
        # module bits above the reason code do not hide it
        ((3 << 16) | 100, 4, "collection not found", Rejection.NOT_FOUND),
        # legacy error codes
        (0, 4, "collection not exists", Rejection.NOT_FOUND),
        (0, 25, "", Rejection.NOT_FOUND),
        # words only: "not exist" is not "exist"
        (1, 1, "role does not exist", Rejection.NOT_FOUND),
        (
            65535,
            1,
            "index cannot be dropped, collection is loaded, please release it first",
            Rejection.LOADED,
        ),
        (
            1,
            1,
            "index cannot be dropped on loaded collection; call release() first",
            Rejection.LOADED,
        ),  # Milvus Lite (seen)
        (
            1100,
            1,
            "can't change the replica number for loaded collection: invalid parameter",
            Rejection.REPLICAS,
        ),  # Milvus 2.3.5 (seen)
        (1100, 1, "Marshal called with nil", Rejection.UNIMPLEMENTED),
        (1100, 1, "invalid parameter: dim", Rejection.OTHER),
        (1, 1, "collection not loaded", Rejection.OTHER),
    ],
)
def test_a_failed_status_is_classified(
    code: int, error_code: int, reason: str, expected: Rejection
) -> None:
    assert status_rejection(code, error_code, reason) is expected


@pytest.mark.parametrize(
    ("code", "error_code", "retriable"),
    [
        (4, 49, True),  # request limit exceeded / RateLimit
        (0, 49, True),
        (1, 56, True),  # NotReadyServe
        (2, 1, True),  # merr service unavailable
        (1, 1, False),  # Milvus Lite's generic failure, not "service not ready"
        (4, 4, False),  # Lite or legacy CollectionNotExists, not "request limit"
        (100, 4, False),
    ],
)
def test_a_status_that_says_not_now_is_retried(code: int, error_code: int, retriable: bool) -> None:
    assert status_retriable(code, error_code) is retriable


def test_grpc_codes_name_the_refusal_before_the_words() -> None:
    assert grpc_rejection(grpc.StatusCode.UNIMPLEMENTED, "") is Rejection.UNIMPLEMENTED
    assert grpc_rejection(grpc.StatusCode.ALREADY_EXISTS, "") is Rejection.ALREADY_EXISTS
    assert grpc_rejection(grpc.StatusCode.NOT_FOUND, "already exists") is Rejection.NOT_FOUND
    assert grpc_rejection(grpc.StatusCode.UNKNOWN, "index not found") is Rejection.NOT_FOUND
    assert grpc_rejection(None, "boom") is Rejection.OTHER
