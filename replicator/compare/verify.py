"""Verify one collection range by range, and repair it when asked.

Per key range (the backfill's planner cuts them from the source's keys), both sides' counts and
digests (hash sums) are computed from the query answers' columns (:mod:`range_digest`, no Python
rows made). A range whose digests agree is done: every row was the same on both sides at the
moment of the read. Otherwise (or when a side's read was not sure) both sides are read again as
``{key: row hash}``, and the keys that differ on that read are suspects: they are read again
(by key, on both sides) once the task has applied everything written before the read before
(:mod:`gate`), up to ``tries`` times, and only *settled* differences (the same rows on both
reads, :mod:`classify`) are reported. Keys still changing after every read are given up on:
the range is listed as unsettled (it may be lag) and they are never counted as divergence.

Repair (hand-over). Only settled keys are repaired, and each source row is read right before it
is written: missing and different rows are upserted (into their source partition), extra rows
deleted once a fresh source read confirms the key is gone. The repaired keys are then read again
after the gate, and keys still settled-different are repaired again (up to ``tries``). The
window that remains: the stream may apply a newer write of a key between the repair's source
read and its upsert; the upsert then puts the older row back, the next gated read sees it differ
and repairs it again; if the key keeps changing through every try, the range ends unsettled.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pymilvus import MilvusClient

from replicator.backfill.ranges import Key, KeyRange, literal
from replicator.backfill.state import CollectionPlan
from replicator.backfill.transfer import KEYS_PER_QUERY, rows_by_key
from replicator.compare.classify import Divergence, RangeRead, settled
from replicator.compare.digest import Digest, row_hash
from replicator.compare.gate import AppliedTs, now_ts, wait_applied
from replicator.compare.range_digest import digest_range
from replicator.compare.reader import Schema, range_digest, read_range

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyOptions:
    range_rows: int = 10_000
    batch_rows: int = 5000
    tries: int = 4  # gated reads of a range that differs, after the first read
    settle_timeout: float = 60.0  # seconds to wait for the task to apply a read's moment
    parallelism: int = 2  # ranges of a collection compared at once


@dataclass(frozen=True)
class RangeOutcome:
    key_range: KeyRange
    rows_compared: int
    divergence: Divergence = field(default_factory=Divergence)
    repaired: int = 0
    unsettled: str = ""  # why the range was given up on


@dataclass
class CollectionVerifier:
    source: MilvusClient
    target: MilvusClient
    plan: CollectionPlan
    schema: Schema
    options: VerifyOptions
    applied: AppliedTs
    stop: threading.Event
    repair: bool = False
    clock: Callable[[], int] = now_ts

    @property
    def _names(self) -> tuple[str, str]:
        return self.plan.collection.name, self.plan.collection.target_name

    def _read(self, key_range: KeyRange) -> RangeRead:
        """Both sides of a range, read at the same time (the target in a thread of its own:
        the two servers answer in parallel)."""
        source_name, target_name = self._names
        batch = self.options.batch_rows
        with ThreadPoolExecutor(1, thread_name_prefix="verify-target") as side:
            target = side.submit(
                contextvars.copy_context().run,
                read_range,
                self.target,
                target_name,
                self.schema,
                key_range,
                batch,
            )
            source = read_range(self.source, source_name, self.schema, key_range, batch)
            return RangeRead(source, target.result())

    def _read_keys(self, keys: frozenset[Key]) -> RangeRead:
        """Both sides of ``keys`` only (Strong queries by key)."""
        source_name, target_name = self._names
        pk, kinds = self.schema.pk, self.schema.kinds
        return RangeRead(
            {r[pk]: row_hash(r, kinds) for r in rows_by_key(self.source, source_name, pk, keys)},
            {r[pk]: row_hash(r, kinds) for r in rows_by_key(self.target, target_name, pk, keys)},
        )

    def digests(self, key_range: KeyRange) -> tuple[Digest | None, Digest | None]:
        """Both sides' count and digest of a range, read as columns at the same moment (the
        target in a thread of its own); None for a side whose read was not sure."""
        ref = self.plan.collection
        batch, seen = self.options.batch_rows, self.clock()
        with ThreadPoolExecutor(1, thread_name_prefix="verify-target") as side:
            target = side.submit(
                contextvars.copy_context().run,
                digest_range,
                self.target,
                ref.target_db,
                ref.target_name,
                self.schema,
                key_range,
                batch,
                seen,
            )
            source = digest_range(
                self.source, ref.db, ref.name, self.schema, key_range, batch, seen
            )
            return source, target.result()

    def verify(
        self,
        key_range: KeyRange,
        digests: tuple[Digest | None, Digest | None] | None = None,
    ) -> RangeOutcome:
        """Compare a range: first its count and digest on both sides (:mod:`range_digest`),
        which settles a range that is the same on both. Otherwise it is read again as
        ``{key: row hash}``: keys that differ on that read are the suspects, read again (by key)
        once the task applied what was written before the read before. A key equal on that
        read is proven for the moment of that read and is not read again."""
        source, target = self.digests(key_range)
        if source is not None and source == target:
            return RangeOutcome(key_range, source.count)
        moment = self.clock()
        previous = self._read(key_range)
        rows = max(len(previous.source), len(previous.target))
        if range_digest(previous.source) == range_digest(previous.target):
            return RangeOutcome(key_range, rows)
        suspects = previous.divergence.keys
        log.info(
            "%s %s: digests differ (%d keys); reading them again once the task applied the read",
            self.plan.collection.label,
            key_range.describe(),
            len(suspects),
        )
        reported = Divergence()
        repaired = 0
        for _ in range(self.options.tries):
            if not wait_applied(self.applied, moment, self.options.settle_timeout, self.stop):
                return RangeOutcome(
                    key_range,
                    rows,
                    reported,
                    repaired,
                    f"the task did not apply the source's writes within "
                    f"{self.options.settle_timeout:.0f} s ({len(suspects)} keys differing)",
                )
            moment = self.clock()
            current = self._read_keys(suspects)
            found, moving = settled(previous, current)
            reported = _union(reported, found)
            if found and self.repair:
                repaired += self._repair(found)
                moment = self.clock()  # the next read must see the repair's writes applied
                moving |= found.keys  # and check them
            if not moving:
                return RangeOutcome(key_range, rows, reported, repaired)
            suspects, previous = moving, current
        return RangeOutcome(
            key_range,
            rows,
            reported,
            repaired,
            f"still changing after {self.options.tries + 1} reads ({len(suspects)} keys moving)",
        )

    # --- repair ---------------------------------------------------------------------------
    def _repair(self, found: Divergence) -> int:
        source_name, target_name = self._names
        pk = self.schema.pk
        written = 0
        copy = sorted(found.missing | found.different, key=str)
        partitions: list[str | None] = [*self.plan.partitions] or [None]
        for partition in partitions:
            rows = (
                rows_by_key(self.source, source_name, pk, copy, partition, 0, self.schema.generated)
                if copy
                else []
            )
            if rows:
                if partition:
                    self.target.upsert(target_name, rows, partition_name=partition)
                else:
                    self.target.upsert(target_name, rows)
                written += len(rows)
        if found.extra:
            still = {r[pk] for r in rows_by_key(self.source, source_name, pk, found.extra)}
            gone = sorted(found.extra - still, key=str)
            for start in range(0, len(gone), KEYS_PER_QUERY):
                chunk = gone[start : start + KEYS_PER_QUERY]
                self.target.delete(
                    target_name, filter=f"{pk} in [{', '.join(map(literal, chunk))}]"
                )
                written += len(chunk)
        log.info(
            "%s: repaired %d rows (%d missing, %d different, %d extra)",
            self.plan.collection.label,
            written,
            len(found.missing),
            len(found.different),
            len(found.extra),
        )
        return written


def _union(a: Divergence, b: Divergence) -> Divergence:
    return Divergence(a.missing | b.missing, a.extra | b.extra, a.different | b.different)
