"""Comparing a task's source and target: an order-independent digest of rows (``digest``,
shared with the backfill), classification of differing keys (``classify``), the wait for the
task's applied position (``gate``), a range's verify and repair (``verify``), the job that runs
them (``job``) and its record in the metastore (``state``)."""

from replicator.compare.classify import Divergence, classify, settled
from replicator.compare.digest import Digest, digest_rows, encode_row, row_hash
from replicator.compare.state import CollectionResult, VerifyJob, VerifyState

__all__ = [
    "CollectionResult",
    "Digest",
    "Divergence",
    "VerifyJob",
    "VerifyState",
    "classify",
    "digest_rows",
    "encode_row",
    "row_hash",
    "settled",
]
