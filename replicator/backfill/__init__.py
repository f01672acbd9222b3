"""Backfill: copy a task's existing rows on Spark, then hand over to streaming.

``job`` is the Spark driver (``python -m replicator.backfill``), ``transfer`` what each Spark task
runs, ``ranges`` the key ranges, ``state`` what is kept in the metastore, ``phase`` the daemon's
side (launch, relaunch, hand-over), ``progress`` the numbers shown to operators.
"""

from replicator.backfill.ranges import KeyRange, cut_ranges
from replicator.backfill.state import BackfillJob, BackfillState, CollectionPlan, CollectionRef

__all__ = [
    "BackfillJob",
    "BackfillState",
    "CollectionPlan",
    "CollectionRef",
    "KeyRange",
    "cut_ranges",
]
