"""What a failed Milvus call means, decided once from the gRPC code and the answer's status.

A Milvus status carries two codes: ``code`` (Milvus 2.3+, ``pkg/util/merr/errors.go``; the low
16 bits are the reason) and the older ``error_code`` (``common.proto`` ``ErrorCode``). Milvus
Lite sets both to one number of its own (seen: 1 for an alias that exists, 6 for a database
that exists), so ``code`` is read as a merr code only where it differs from ``error_code``. The
reason text is read only for the refusals that neither code names: Milvus 2.3 answers an
existing database, role or user, a loaded collection's drop index and a lack of query nodes with
a generic code and the cause in words, Milvus Lite puts its causes in words, and Milvus 2.3's
AlterIndex fails on its own empty answer ("Marshal called with nil"). Those phrases are listed
here, once; callers test :class:`~replicator.errors.Rejection` values.
"""

from __future__ import annotations

from typing import Any

import grpc

from replicator.errors import Rejection, SinkError, TargetRejectedError, TargetUnavailableError

_REASON_MASK = (1 << 16) - 1

# merr codes (errors.go): collection, partition (202 in 2.3.0), index, database, alias,
# collection of an alias, field
_MERR_NOT_FOUND = {100, 200, 202, 700, 800, 1600, 1603, 1700}
_MERR_EXISTS = {702, 1602}  # index duplicates, alias already exists
_MERR_UNSUPPORTED = {701, 3000}  # index type not supported, unsupported operation
_MERR_REPLICAS = {304, 401, 903}  # resource group nodes, replica not available, node lacks
# service not ready, unavailable, request limit exceeded, quota exceeded: a target whose
# writes are denied for now (quotaAndLimits: forceDeny while a switchover fences it, memory or
# disk quotas) takes them once the quota lifts; the task retries and shows its lag meanwhile
_MERR_RETRIABLE = {1, 2, 4, 9}

# common.proto ErrorCode
_LEGACY_NOT_FOUND = {4, 25, 28}  # CollectionNotExists, IndexNotExist, CollectionNameNotFound
_LEGACY_REPLICAS = {46, 52}  # NoReplicaAvailable, InsufficientMemoryToLoad
# ForceDeny, RateLimit, NotReadyServe, NotReadyCoordActivating
_LEGACY_RETRIABLE = {48, 49, 56, 57}

_GRPC_REJECTIONS = {
    grpc.StatusCode.UNIMPLEMENTED: Rejection.UNIMPLEMENTED,
    grpc.StatusCode.ALREADY_EXISTS: Rejection.ALREADY_EXISTS,
    grpc.StatusCode.NOT_FOUND: Rejection.NOT_FOUND,
}
GRPC_RETRIABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}

# (rejection, phrases) in the order they are tried: "not exist" before "exist"
_PHRASES: tuple[tuple[Rejection, tuple[str, ...]], ...] = (
    (Rejection.UNIMPLEMENTED, ("unimplemented", "marshal called with nil", "properties is empty")),
    (Rejection.NOT_FOUND, ("not exist", "not found", "doesn't exist", "no index")),
    (Rejection.ALREADY_EXISTS, ("exist", "duplicate", "already")),
    (Rejection.REPLICAS, ("replica", "node")),
    (Rejection.LOADED, ("is loaded", "loaded collection", "collection loaded", "release it first")),
)


def grpc_rejection(code: grpc.StatusCode | None, details: str) -> Rejection:
    """A refused gRPC call (the code was not one to retry)."""
    if code in _GRPC_REJECTIONS:
        return _GRPC_REJECTIONS[code]
    return reason_rejection(details)


def _merr(code: int, error_code: int) -> int:
    return code & _REASON_MASK if code != error_code else 0


def status_retriable(code: int, error_code: int) -> bool:
    """A status that says "not now" (rate limit, not ready): the call is tried again later."""
    return _merr(code, error_code) in _MERR_RETRIABLE or error_code in _LEGACY_RETRIABLE


def status_rejection(code: int, error_code: int, reason: str) -> Rejection:
    """A call answered with a failed status."""
    reason_code = _merr(code, error_code)
    if reason_code in _MERR_NOT_FOUND or error_code in _LEGACY_NOT_FOUND:
        return Rejection.NOT_FOUND
    if reason_code in _MERR_EXISTS:
        return Rejection.ALREADY_EXISTS
    if reason_code in _MERR_UNSUPPORTED:
        return Rejection.UNIMPLEMENTED
    if reason_code in _MERR_REPLICAS or error_code in _LEGACY_REPLICAS:
        return Rejection.REPLICAS
    return reason_rejection(reason)


def reason_rejection(reason: str) -> Rejection:
    text = reason.lower()
    for rejection, phrases in _PHRASES:
        if any(phrase in text for phrase in phrases):
            return rejection
    return Rejection.OTHER


# calls whose reply is the status itself (the others carry it as ``status``)
_STATUS_ONLY = {
    "CreateCollection",
    "DropCollection",
    "CreatePartition",
    "CreateIndex",
    "DropIndex",
    "AlterIndex",
    "LoadCollection",
    "ReleaseCollection",
    "LoadPartitions",
    "ReleasePartitions",
    "DropPartition",
    "CreateDatabase",
    "DropDatabase",
    "CreateAlias",
    "AlterAlias",
    "DropAlias",
    "AlterDatabase",
    "AlterCollection",
    "RenameCollection",
    "AddCollectionField",
    "CreateCredential",
    "UpdateCredential",
    "DeleteCredential",
    "CreateRole",
    "DropRole",
    "OperateUserRole",
    "OperatePrivilege",
    "OperatePrivilegeV2",
    "CreatePrivilegeGroup",
    "DropPrivilegeGroup",
    "OperatePrivilegeGroup",
    "RestoreRBAC",
}


def call_failure(exc: grpc.RpcError, what: str, address: str) -> SinkError:
    """The error to raise for a call ``what`` to ``address`` that gRPC failed."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    message = f"{what} on {address}: {code}: {details}"
    if code in GRPC_RETRIABLE:
        return TargetUnavailableError(message)
    return TargetRejectedError(message, grpc_rejection(code, details or ""))


def checked_reply(method: str, response: Any, what: str, address: str) -> Any:
    """``response`` of ``method`` when its status is a success; else the error it means."""
    status = response if method in _STATUS_ONLY else getattr(response, "status", None)
    if status is not None and (status.code != 0 or status.error_code != 0):
        message = f"{what} on {address}: {status.reason or status.code}"
        if status_retriable(status.code, status.error_code):
            raise TargetUnavailableError(message)
        raise TargetRejectedError(
            message, status_rejection(status.code, status.error_code, status.reason)
        )
    return response
