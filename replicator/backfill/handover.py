"""Where streaming restarts after a backfill: never between the halves of an upsert.

Milvus 2.3-2.5 writes an upsert as an Insert and a Delete with one timestamp, one record after the
other. A start position taken at the end of a channel (a new task's) can fall between them: the
job's copy, read later, holds the upserted row, and the stream would replay the Delete alone and
remove it. So the start is moved back to before every record, within a window before it, whose
timestamp is not older than the first record after it. A DML record's time is its rows'
(:func:`record_time`): the upsert's Insert has ``MsgBase.timestamp`` 0, and read by its header
alone it looked older than its Delete, so the start stayed between them. Milvus 2.6 writes an
upsert as a transaction (BeginTxn, Insert, Delete, CommitTxn): a start inside one would read its
end without its BeginTxn and drop it, so the start is moved back before the BeginTxn of every
transaction open at it. Starting earlier is always safe here: the whole stretch from the start to
the in-flight bound is replayed in WAL order with inserts written as upserts, so every key it
touches ends with its last operation.
"""

from __future__ import annotations

import logging

from metastore import Position
from replicator.codec.msgstream import MSG_TIME_TICK, record_time
from replicator.codec.streaming import is_streaming, read_meta
from replicator.codec.wire import WireError
from replicator.events import RawRecord
from replicator.sources.base import WalSource

log = logging.getLogger(__name__)

WINDOW = 2000  # records looked at before the start
AFTER = 200  # records after it that say which timestamp comes first
READ_TIMEOUT = 1.0


def group_start(source: WalSource, start: Position) -> Position:
    """``start``, moved back as far as needed not to split a timestamp's records, nor a 2.6
    transaction open at it (same ts: the stored position's time tick, so it is not a regression
    for the metastore)."""
    first = source.offset_of(start.msg_id) + 1  # the first record read after ``start``
    earliest, latest = source.watermarks(start.pchannel)
    low = max(earliest, first - WINDOW)
    if first >= latest or low >= first:
        return start
    before = source.position_before(low)
    opened = Position(start.backend, start.pchannel, before, 0) if before is not None else None
    reader = source.open_channel(start.pchannel, opened)
    stamped: list[tuple[int, int]] = []  # (offset, ts) of the 2.3-2.5 records but time ticks
    open_txns: dict[tuple[str, int], int] = {}  # 2.6 transactions begun before ``first``
    try:
        while True:
            records = reader.read_batch(500, READ_TIMEOUT)
            if not records:
                break
            for record in records:
                if is_streaming(record.properties):
                    if record.offset < first:
                        _follow_transaction(record, open_txns)
                    continue
                try:
                    msg_type, ts = record_time(record.payload)
                except (WireError, ValueError):
                    continue
                if msg_type != MSG_TIME_TICK:
                    stamped.append((record.offset, ts))
            if records[-1].offset >= min(latest - 1, first + AFTER):
                break
    finally:
        reader.close()
    split = list(open_txns.values())  # a transaction's records apply with its BeginTxn read
    after = [ts for offset, ts in stamped if offset >= first]
    if after:
        oldest_after = min(after)
        split += [offset for offset, ts in stamped if offset < first and ts >= oldest_after]
    if not split:
        return start
    log.info(
        "channel %s: streaming starts %d record(s) earlier, not to split records of one "
        "timestamp or a transaction",
        start.pchannel,
        first - min(split),
    )
    # no message id: from the channel's first record (a position before it cannot be named)
    msg_id = source.position_before(min(split)) or b""
    return Position(start.backend, start.pchannel, msg_id, start.ts)


def _follow_transaction(record: RawRecord, open_txns: dict[tuple[str, int], int]) -> None:
    """Keep the offset of each 2.6 BeginTxn until its CommitTxn or RollbackTxn is read."""
    try:
        meta = read_meta(record)
    except (WireError, ValueError):
        return  # unreadable here: the worker that reads it stops with the reason
    if meta.txn is None:
        return
    key = (meta.vchannel, meta.txn.txn_id)
    if meta.type_name == "BeginTxn":
        open_txns.setdefault(key, record.offset)
    elif meta.type_name in ("CommitTxn", "RollbackTxn"):
        open_txns.pop(key, None)
