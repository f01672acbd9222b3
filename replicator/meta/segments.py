"""The source's segments as its data coordinator records them, and whether the rows of some
segments are readable on the source yet.

A bulk import writes segments of its own; its record says "completed" once they are flushed and
indexed, but a query reads only what the query nodes serve (their *current target*: the
``GetQuerySegmentInfo`` answer, which leaves out segments still being loaded), and they load the
new segments later: seconds after, or never while the collection is released. A copy started at
"completed" reads the collection without them.

Compaction may replace an import's segment before it is served: the new segment names it in
``compactionFrom``, so its rows are served once a segment made from it (at any depth) is.

Records: ``<root>/<meta>/datacoord-meta/s/<collectionID>/<partitionID>/<segmentID>``, value
``datapb.SegmentInfo`` (Milvus's ``data_coord.proto``; the same numbers from 2.3 on)::

    1 ID, 2 collectionID, 3 partitionID, 5 num_of_rows, 6 state (common.SegmentState:
    2 growing, 3 sealed, 4 flushed, 5 flushing, 6 dropped, 7 importing), 15 compactionFrom

Binlog paths are keys of their own (``datacoord-meta/binlog/...``), so these values are small.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from replicator.codec.wire import WireError, int64s, iter_fields, to_signed64

SEGMENTS = "datacoord-meta/s/"
DROPPED = 6


@dataclass(frozen=True)
class SegmentRecord:
    segment_id: int
    state: int
    rows: int
    compaction_from: tuple[int, ...] = ()


def decode_segment(value: bytes) -> SegmentRecord:
    segment_id = state = rows = 0
    parents: list[int] = []
    for number, _, v in iter_fields(value):
        if number == 15:
            parents.extend(int64s(v))
        elif isinstance(v, int):
            if number == 1:
                segment_id = to_signed64(v)
            elif number == 5:
                rows = to_signed64(v)
            elif number == 6:
                state = v
    return SegmentRecord(segment_id, state, rows, tuple(parents))


def read_segments(client: Any, meta_prefix: str, collection_id: int) -> dict[int, SegmentRecord]:
    """The segments of one collection the source's etcd records (dropped ones too, until its
    garbage collector removes them), by id. Blocking."""
    found = {}
    for value, _meta in client.get_prefix(f"{meta_prefix}{SEGMENTS}{collection_id}/"):
        try:
            record = decode_segment(bytes(value))
        except WireError:
            continue  # a partial write: read again at the next look
        found[record.segment_id] = record
    return found


def unserved(
    wanted: Iterable[int], served: set[int], records: Mapping[int, SegmentRecord]
) -> list[int]:
    """The segments of ``wanted`` whose rows the source does not serve yet.

    A segment's rows are served when the query nodes serve it, or when they serve a segment
    compacted from it (at any depth). A dropped segment that nothing was made from holds no rows
    any more (its partition or its rows were deleted): nothing to wait for. A compaction result
    that is dropped with rows of its own and no successor is not taken as a place of the rows
    (a compaction that was rolled back leaves its inputs in place)."""
    successors: dict[int, list[int]] = {}
    for record in records.values():
        for parent in record.compaction_from:
            successors.setdefault(parent, []).append(record.segment_id)

    def settled(segment: int, path: frozenset[int], is_result: bool) -> bool:
        if segment in served:
            return True
        if segment in path:
            return False  # a cycle in the records: never taken as served
        made = successors.get(segment)
        if made:
            return any(settled(s, path | {segment}, True) for s in made)
        record = records.get(segment)
        if record is None or record.state != DROPPED:
            return False
        return not is_result or record.rows == 0

    return [s for s in wanted if not settled(s, frozenset(), False)]
