"""``python -m replicator.compare.spark_digests``: a large collection's range digests computed
as one Spark job, one task per key range (the backfill's runner and master).

The daemon (:mod:`spark_launch`) writes the work on stdin (connection parameters hold secrets:
never on a command line or in a file): the Spark master and properties, and one item per range
naming both sides, the key field and kinds, the range's bounds, the page size and the moment
every read must see. Each Spark task digests its range on both sides as columns
(:func:`range_digest.digest_range`, as the daemon would) and answers the range's index with
both counts and digests; the driver prints them as one JSON line on stdout, after ``MARKER``
(counts and hashes only: no row, no secret). Executors import this module, ``range_digest``
and pymilvus only.
"""

from __future__ import annotations

import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from replicator.backfill.ranges import KeyRange
from replicator.backfill.transfer import cached_client, forget_clients
from replicator.compare.digest import Digest
from replicator.compare.range_digest import digest_range
from replicator.compare.reader import Schema
from replicator.log_redaction import connect_secrets, redact_root_logging

log = logging.getLogger("replicator.compare.spark_digests")

# the answer's line on stdout starts with it (anything else written there is not the answer)
MARKER = "milvus-cdc-verify-digests "

Side = list[Any] | None  # [count, total as hex] or None: the read was not sure


def encode(digest: Digest | None) -> Side:
    return None if digest is None else [digest.count, f"{digest.total:x}"]


def decode(side: Side) -> Digest | None:
    return None if side is None else Digest(int(side[0]), int(side[1], 16))


def digest_work(work: dict[str, Any]) -> dict[str, Any]:
    """What one Spark task runs: both sides' digests of one range. A failure drops the worker's
    cached clients (a retry connects again)."""
    key_range = KeyRange.from_json(work["range"])
    schema = Schema(work["pk"], work["kinds"], False)
    batch, seen = int(work["batch_rows"]), int(work["seen_ts"])
    try:
        source = cached_client(work["source"], work["db"])
        target = cached_client(work["target"], work["target_db"])
        # the two servers answer at once, as in the daemon (CollectionVerifier.digests)
        with ThreadPoolExecutor(1, thread_name_prefix="verify-target") as side:
            other = side.submit(
                digest_range,
                target,
                work["target_db"],
                work["target_name"],
                schema,
                key_range,
                batch,
                seen,
            )
            found = digest_range(source, work["db"], work["name"], schema, key_range, batch, seen)
            theirs = other.result()
    except BaseException:
        forget_clients()
        raise
    return {"index": key_range.index, "source": encode(found), "target": encode(theirs)}


def run(request: dict[str, Any]) -> list[dict[str, Any]]:
    from replicator.backfill.job import session_with

    works = request["works"]
    session = session_with(request["spark_conf"], request.get("app_name", "milvus-cdc-verify"))
    try:
        context = session.sparkContext
        log.info("digesting %d range(s) on %s", len(works), context.master)
        results: list[dict[str, Any]] = (
            context.parallelize(works, len(works)).map(digest_work).collect()
        )
        return results
    finally:
        session.stop()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    request = json.loads(sys.stdin.read())
    ends = [work[end] for work in request["works"] for end in ("source", "target")]
    redact_root_logging(connect_secrets(*ends))
    results = run(request)
    sys.stdout.write(MARKER + json.dumps({"ranges": results}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
