"""Where streaming restarts after a backfill: never between the halves of an upsert.

Milvus 2.3-2.5 writes an upsert as an Insert and a Delete with one timestamp, one record after the
other. A start position taken at the end of a channel (a new task's) can fall between them: the
job's copy, read later, holds the upserted row, and the stream would replay the Delete alone and
remove it. So the start is moved back to before every record, within a window before it, whose
timestamp is not older than the first record after it. A DML record's time is its rows'
(:func:`record_time`): the upsert's Insert has ``MsgBase.timestamp`` 0, and read by its header
alone it looked older than its Delete, so the start stayed between them.

Milvus 2.6 writes an upsert as a transaction (BeginTxn, Insert, Delete, CommitTxn): a start inside
one would read its end without its BeginTxn and drop it, so the start is moved back before the
BeginTxn of every transaction open at it, however far back that is. How far to read is taken
from the WAL itself: every 2.6 record carries the last-confirmed message id (``_lc``, or ``_lcs``
for "this record's own id"), which Milvus keeps behind the first record of every transaction not
yet committed, rolled back or expired when the record was appended
(``internal/streamingnode/server/wal/interceptors/timetick/ack/last_confirmed.go``; the time-tick
interceptor stamps it on every message as the point a reader resumes from without losing any
message of a later tick). So the ``_lc`` of the start's own record and of the one
after it lies before the BeginTxn of every transaction open at the start, including one whose
records all lie far back and whose CommitTxn was not written yet, which no window before the start
would see. The id is the WAL's own (``pkg/streaming/walimpls/impls/*/message_id.go``): a Kafka
offset or a RocksMQ id in base 36, a Pulsar ``MessageIdData`` in base64; see :func:`wal_msg_id`.

What is read is checked as well, so a missing or wrong ``_lc`` cannot lose a transaction silently:
a body, CommitTxn or RollbackTxn of a transaction open at the start (not expired there: one that
is can never commit) whose BeginTxn was not read makes the read go back further (at least twice
as far each time, or to the ``_lc`` those records carry), until the BeginTxn is found or the
channel's earliest record is reached. A BeginTxn that the queue no longer holds (retention took
it) stops the task with a :class:`TaskFailedError` naming the channel and the transaction, rather
than skipping its rows.

Starting earlier is always safe here: the whole stretch from the start to the in-flight bound is
replayed in WAL order with inserts written as upserts, so every key it touches ends with its last
operation.
"""

from __future__ import annotations

import base64
import binascii
import logging
import struct
from dataclasses import dataclass, field

from metastore import Position
from replicator.codec import streaming_headers as sh
from replicator.codec.msgstream import MSG_TIME_TICK, record_time
from replicator.codec.streaming import is_streaming, read_meta
from replicator.codec.streaming_events import StreamMeta
from replicator.codec.wire import WireError
from replicator.errors import TaskFailedError
from replicator.events import RawRecord
from replicator.hybrid_time import from_ms
from replicator.sources.base import WalSource

log = logging.getLogger(__name__)

WINDOW = 2000  # offsets looked at before the start (2.3-2.5 records; the first read for 2.6)
AFTER = 200  # records after it that say which timestamp comes first
READ_TIMEOUT = 1.0

TxnKey = tuple[str, int]  # (vchannel, txn_id)


def group_start(source: WalSource, start: Position) -> Position:
    """``start``, moved back as far as needed not to split a timestamp's records, nor a 2.6
    transaction open at it (same ts: the stored position's time tick, so it is not a regression
    for the metastore). Raises :class:`TaskFailedError` when a transaction open at the start
    began in records the queue no longer holds."""
    at = source.offset_of(start.msg_id)  # the start's own record
    first = at + 1  # records from here on are read after ``start``
    earliest, latest = source.watermarks(start.pchannel)
    # nothing after the start: only a transaction still open at the end can be split
    low = max(earliest, first - WINDOW if first < latest else at)
    if low >= first:
        return start
    if not _nameable(source, low):  # offsets are not record counts on this WAL (Pulsar)
        low = max(earliest, at)
    while True:
        seen = _read(source, start.pchannel, low, at, min(latest - 1, first + AFTER))
        further = seen.reach_back(low, first)
        if further is None:
            break
        if low <= earliest:
            if seen.needed():
                raise TaskFailedError(_lost_begins(start.pchannel, earliest, seen.needed()))
            break
        low = max(earliest, further)
        if not _nameable(source, low):
            low = earliest
    if seen.bound is not None and seen.bound < earliest:
        log.warning(
            "channel %s: the start's last-confirmed record (offset %d) is no longer held (the "
            "earliest is %d); a transaction that began there and has no record since is not seen",
            start.pchannel,
            seen.bound,
            earliest,
        )
    split = list(seen.begun.values())  # a transaction's records apply with its BeginTxn read
    after = [ts for offset, ts in seen.stamped if offset >= first]
    if after:
        oldest_after = min(after)
        split += [offset for offset, ts in seen.stamped if offset < first and ts >= oldest_after]
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


@dataclass
class _Seen:
    """What one read from ``low`` says about the records around the start."""

    at: int  # offset of the start's own record
    begun: dict[TxnKey, int] = field(default_factory=dict)  # open at the start: BeginTxn offset
    # not ended before the start, BeginTxn not read: the lowest _lc their records carry
    missing: dict[TxnKey, int | None] = field(default_factory=dict)
    # of those: the newest _tt and the keepalive (hybrid units) of their records, and which
    # have a record after the start
    newest: dict[TxnKey, tuple[int, int]] = field(default_factory=dict)
    after: set[TxnKey] = field(default_factory=set)
    closed: set[TxnKey] = field(default_factory=set)  # committed or rolled back before the start
    later: set[TxnKey] = field(default_factory=set)  # begun after the start
    tick: int = 0  # the newest _tt up to the start
    bound: int | None = None  # the lowest _lc of the start's record and the one after it
    bound_read: bool = False  # the record after the start was read
    stamped: list[tuple[int, int]] = field(default_factory=list)  # 2.3-2.5 (offset, ts)

    def needed(self) -> dict[TxnKey, int | None]:
        """The transactions open at the start whose BeginTxn was not read: those with a record
        after it, and those not expired at it (newest _tt + keepalive < the start's tick, as the
        sequencer judges it: Milvus refuses to append to an expired one, so it has no later
        record, and the stream would drop it anyway)."""
        return {
            key: bound
            for key, bound in self.missing.items()
            if key in self.after or self.newest[key][1] <= 0 or sum(self.newest[key]) >= self.tick
        }

    def reach_back(self, low: int, first: int) -> int | None:
        """Where the next read must start to find every BeginTxn needed, or None when this
        read found them all."""
        needed = self.needed()
        wanted = [b for b in (self.bound, *needed.values()) if b is not None]
        if needed:  # at least twice as far back as this read went
            wanted.append(low - max(first - low, WINDOW))
        further = min(wanted, default=low)
        return further if further < low else None

    def follow(self, source: WalSource, record: RawRecord, first: int) -> None:
        """Track a 2.6 record: transactions, and the last-confirmed id around the start."""
        try:
            meta = read_meta(record)
        except (WireError, ValueError):
            return  # unreadable here: the worker that reads it stops with the reason
        if record.offset < first:
            self.tick = max(self.tick, meta.time_tick)
        if record.offset >= self.at and not self.bound_read:
            confirmed = _confirmed_offset(source, meta, record.offset)
            if confirmed is not None:
                self.bound = confirmed if self.bound is None else min(self.bound, confirmed)
            self.bound_read = record.offset >= first
        if meta.txn is None:
            return
        key = (meta.vchannel, meta.txn.txn_id)
        before = record.offset < first
        if meta.type_name == "BeginTxn":
            if before:
                self.begun.setdefault(key, record.offset)
            else:
                self.later.add(key)
            return
        if key in self.begun or key in self.later or key in self.closed:
            if before and meta.type_name in ("CommitTxn", "RollbackTxn"):
                self.begun.pop(key, None)
                self.closed.add(key)
            return
        if before and meta.type_name in ("CommitTxn", "RollbackTxn"):
            self.missing.pop(key, None)  # ended before the start: not needed
            self.newest.pop(key, None)
            self.after.discard(key)
            self.closed.add(key)
            return
        # a record of a transaction not ended before the start whose BeginTxn was not read:
        # its own _lc lies before that BeginTxn
        confirmed = _confirmed_offset(source, meta, record.offset)
        known = self.missing.get(key)
        if key not in self.missing or known is None:
            self.missing[key] = confirmed
        elif confirmed is not None:
            self.missing[key] = min(known, confirmed)
        newest = max(self.newest.get(key, (0, 0))[0], meta.time_tick)
        self.newest[key] = (newest, from_ms(meta.txn.keepalive_ms))
        if not before:
            self.after.add(key)


def _read(source: WalSource, pchannel: str, low: int, at: int, last: int) -> _Seen:
    """Read from ``low`` to the record at ``last`` (or the channel's end)."""
    first = at + 1
    before = source.position_before(low)
    opened = Position(source.backend, pchannel, before, 0) if before is not None else None
    reader = source.open_channel(pchannel, opened)
    seen = _Seen(at)
    try:
        while True:
            records = reader.read_batch(500, READ_TIMEOUT)
            if not records:
                break
            for record in records:
                if is_streaming(record.properties):
                    seen.follow(source, record, first)
                    continue
                if record.offset < first - WINDOW:
                    continue  # 2.3-2.5 records: only the window before the start matters
                try:
                    msg_type, ts = record_time(record.payload)
                except (WireError, ValueError):
                    continue
                if msg_type != MSG_TIME_TICK:
                    seen.stamped.append((record.offset, ts))
            if records[-1].offset >= last:
                break
    finally:
        reader.close()
    return seen


def _nameable(source: WalSource, offset: int) -> bool:
    """Whether reading can be made to start at ``offset``: on Kafka and RocksMQ any offset;
    Pulsar's pack (ledger, entry, batch index), so one computed by subtraction may name no
    message id (:func:`replicator.sources.pulsar_ids.msg_id_before` refuses it)."""
    try:
        source.position_before(offset)
    except ValueError:
        return False
    return True


def wal_msg_id(backend: str, value: str) -> bytes | None:
    """The message id a 2.6 ``_lc`` property names, as the source reports record ids (its
    ``offset_of`` takes it); None for a WAL this daemon does not read.

    Milvus writes the id with its WAL's ``Marshal()``: Kafka's offset and RocksMQ's id as
    ``strconv.FormatInt(v, 36)`` (``pkg/streaming/walimpls/impls/{kafka,rmq}/message_id.go``,
    ``pkg/streaming/util/message/encoder.go``); Pulsar's as base64 (standard alphabet) of the
    client's serialized ``MessageIdData`` (``.../impls/pulsar/message_id.go``). Our Kafka and
    RocksMQ readers report ids as 8-byte little-endian int64, as Milvus's ``MsgPosition``; the
    Pulsar reader reports the serialized ``MessageIdData`` itself."""
    if backend in ("kafka", "rocksmq"):
        number = sh.parse_base36(sh.LAST_CONFIRMED, value)
        try:
            return struct.pack("<q", number)
        except struct.error:
            raise sh.PropertyError(sh.LAST_CONFIRMED, f"{value!r} is out of range") from None
    if backend == "pulsar":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise sh.PropertyError(sh.LAST_CONFIRMED, f"{value!r} is not base64") from None
    return None


def _confirmed_offset(source: WalSource, meta: StreamMeta, offset: int) -> int | None:
    """The offset of the record's last-confirmed id; None when it has none readable."""
    if meta.last_confirmed_is_self:
        return offset
    if meta.last_confirmed is None:
        return None
    try:
        msg_id = wal_msg_id(source.backend, meta.last_confirmed)
        return None if msg_id is None else source.offset_of(msg_id)
    except (WireError, ValueError):
        return None


def _lost_begins(pchannel: str, earliest: int, missing: dict[TxnKey, int | None]) -> str:
    named = ", ".join(f"{txn_id} on {vchannel}" for vchannel, txn_id in sorted(missing)[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return (
        f"channel {pchannel}: the BeginTxn of transaction {named}{more}, open at the backfill's "
        f"start, is no longer held by the source queue (earliest offset {earliest}); its rows "
        "after the start cannot be replayed: run a new backfill"
    )
