"""RocksMQ WAL reader: the RocksDB of a standalone Milvus on the same host, opened as a RocksDB
*secondary instance* (rocksdict). A secondary never takes the primary's LOCK and never writes to
its files; it sees what Milvus wrote after ``try_catch_up_with_primary()``.

What Milvus 2.3 keeps at ``<rocksmq.path>`` (checked on a real 2.3.5):

- column family ``default``: one key per message, ``<topic>/<msgID>`` with the id in decimal.
  Ids are hybrid-TSO numbers (``physical ms << 18 | logical``, 18 digits until about 2090), so
  within a topic key order is id order; Milvus's own consumer relies on the same. The value is the
  plain msgstream payload (the request protobuf, field 1 = ``common.MsgBase``).
- column family ``properties``: kept by Milvus "for upgrading"; empty in 2.3.5. Not read.
- ``<rocksmq.path>_meta_kv`` (a second RocksDB): ``topic_id/<topic>``, ``message_size/<topic>``,
  ``page_message_size/<topic>/<id>``, ``page_ts/...``, ``acked_ts/...`` and the id allocator's
  ``rmq_id``. Nothing there is needed to read messages; it is never opened.

Milvus 2.4/2.5 still store the plain payload (their producer moves the message properties into
``MsgBase.properties`` inside it). Milvus 2.6 (streaming service) writes values as the 10 bytes
``FF FE FD FC "STREAM"`` followed by ``RMQMessageLayout{payload = 1, properties = 2 (map)}``;
such values are unwrapped here so records look the same as from Kafka (payload, properties).

A record's ``msg_id`` is the id as 8 bytes little-endian int64, as Milvus's ``MsgPosition`` has it.
Retention (``rocksmq.retentionTimeInMinutes`` / ``retentionSizeInMB``) deletes old messages
whatever this reader has read: the earliest id is the first key still present.

Pitfalls of rocksdict (0.3.29): opening an ``Rdict`` creates the directory when it is missing and
writes a ``rocksdict-config.json`` into the database directory, even as a secondary (fixed
upstream by rocksdict PR #186). So the path is checked before opening, and the daemon needs write
permission on ``<rocksmq.path>`` for that one file (RocksDB and Milvus ignore it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing import util as mp_util

from rocksdict import AccessType, BlockBasedOptions, Options, Rdict, RdictIter, ReadOptions

from metastore import Position
from replicator.codec.wire import WireError, find_bytes_field, iter_fields
from replicator.events import RawRecord
from replicator.sources.base import READ_BYTES, SourceUnavailableError
from replicator.sources.rocksmq_scratch import make_scratch

BACKEND = "rocksmq"
POLL_INTERVAL = 0.1  # seconds between catch-ups while a channel has nothing new
# A channel that has had nothing for QUIET_AFTER seconds is looked at every QUIET_POLL seconds
# only. Each look is a seek, and while any topic is written the sequence moves all the time, so
# every look of every channel seeks; a seek at the end of a topic reads the block holding the
# next topic's first record, which may hold a 2.6 MB insert. DML channels of 2.3-2.6 carry a time
# tick every 200 ms and are never quiet; a quiet one (the replicate channel, a WAL left after a
# switch) shows a new record up to QUIET_POLL later.
QUIET_AFTER = 1.0
QUIET_POLL = 0.5
# ... and once quiet for QUIET_LONG_AFTER, every QUIET_LONG_POLL: a look still costs a seek, and
# where the next topic holds inserts a seek reads one of them in every table file (5-20 ms seen)
QUIET_LONG_AFTER = 10.0
QUIET_LONG_POLL = 2.0
# a catch-up even when the primary's files show no write (a change they do not show is read
# this late at worst)
CATCH_UP_AT_LEAST = 1.0
# A reader goes on with the iterator its last read left (no seek) for at most this long: an
# iterator holds the table files of the store as it was made (the primary's compactions delete
# them), and sees no record written after that.
CURSOR_AGE = 5.0
STREAMING_MAGIC = b"\xff\xfe\xfd\xfcSTREAM"  # Milvus 2.6 RocksMQ value prefix

log = logging.getLogger(__name__)


def encode_id(msg_id: int) -> bytes:
    return struct.pack("<q", msg_id)


def decode_id(msg_id: bytes) -> int:
    if len(msg_id) != 8:
        raise ValueError(f"a RocksMQ message id is 8 bytes, got {len(msg_id)}")
    return int(struct.unpack("<q", msg_id)[0])


def unwrap_value(value: bytes) -> tuple[bytes, dict[str, str]]:
    """(payload, properties) of a stored value: as it is for Milvus 2.3-2.5, unwrapped from the
    2.6 streaming layout when it has the magic prefix. A value that cannot be unwrapped is passed
    on as it is: the decoder then reports it as an undecodable record at its position."""
    if not value.startswith(STREAMING_MAGIC):
        return value, {}
    body = value[len(STREAMING_MAGIC) :]
    payload = b""
    properties: dict[str, str] = {}
    try:
        for number, wire_type, field in iter_fields(body):
            if wire_type != 2 or not isinstance(field, bytes):
                continue
            if number == 1:
                payload = field
            elif number == 2:  # map entry {key = 1, value = 2}
                key = (find_bytes_field(field, 1) or b"").decode("utf-8", "replace")
                properties[key] = (find_bytes_field(field, 2) or b"").decode("utf-8", "replace")
    except WireError:
        return value, {}
    return payload, properties


def _topic_prefix(pchannel: str) -> bytes:
    if "/" in pchannel:
        raise ValueError(f"a RocksMQ topic name has no '/': {pchannel!r}")
    return pchannel.encode() + b"/"


def _upper_bound(prefix: bytes) -> bytes:
    # the prefix ends with "/" (0x2F): every key of the topic sorts before prefix[:-1] + "0"
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _parse_id(prefix: bytes, key: bytes) -> int | None:
    suffix = key[len(prefix) :]
    if not key.startswith(prefix) or not suffix.isdigit():
        return None
    return int(suffix)


@dataclass
class _Cursor:
    """An iterator left by a read on the next record of its topic."""

    it: RdictIter
    after: int  # the id of the last record read: the cursor goes on after it
    made: float  # monotonic


class _SecondaryDB:
    """One RocksDB secondary instance on the RocksMQ store (column family ``default`` only),
    with its own scratch directory (the secondary's info log), removed on close.

    Shared by every reader of a source: one catch-up serves them all, at most one per
    ``POLL_INTERVAL`` (a catch-up costs about a millisecond and holds the GIL).
    """

    def __init__(self, path: str, secondary_dir: str | None) -> None:
        self.path = path
        self.broken = False
        self.users = 0  # readers holding it (guarded by the source's lock)
        self.released_at = 0.0  # when the last reader let it go (monotonic)
        self._lock = threading.Lock()
        self._caught_up_at = time.monotonic()
        self._asked_at = 0.0
        self.catch_ups = 0  # made (not asked)
        self._files_caught_up: tuple[tuple[str, int, int], ...] | None = None
        if not os.path.isfile(os.path.join(path, "CURRENT")):
            # checked first: rocksdict would create the directory (and no database is there yet)
            raise SourceUnavailableError(f"rocksmq: no RocksDB at {path!r} (is Milvus running?)")
        self._scratch = make_scratch(secondary_dir)
        # removed by close(), or at the exit of a process that still holds it (lingering): the
        # daemon's, and one multiprocessing started, which ends by os._exit and so runs no
        # atexit hook but multiprocessing's own finalizers (a channel group's process left a
        # directory in /tmp at each end with weakref.finalize); a process killed leaves it to
        # the next make_scratch
        self._remove_scratch = mp_util.Finalize(
            self,
            shutil.rmtree,
            args=(self._scratch,),
            kwargs={"ignore_errors": True},
            exitpriority=0,
        )
        options = Options(raw_mode=True)
        options.create_if_missing(False)
        # keep every table file open: the primary may delete files a secondary still reads
        options.set_max_open_files(-1)
        # no block cache: each reader reads a block once, and the default cache (8 MB in 16
        # shards of 512 KB) cannot hold an insert's block anyway (a 2.6 MB value is a block of
        # its own); putting one in and out of it made a seek cost 60 % more
        table = BlockBasedOptions()
        table.disable_cache()
        options.set_block_based_table_factory(table)
        # for looks that only ask whether a topic holds a record after one: a seek positions
        # an iterator in every table file, and where a file holds nothing of the topic at or
        # after the target it reads the first block of the next topic, often an insert of
        # megabytes; checking its checksum was most of a look's cost (7 ms against 0.2 ms)
        self._unverified = ReadOptions()
        self._unverified.set_verify_checksums(False)
        try:
            self._db: Rdict | None = Rdict(
                path,
                options,
                column_families={"default": options},
                access_type=AccessType.secondary(self._scratch),
            )
        except Exception as exc:
            self._remove_scratch()
            raise SourceUnavailableError(f"rocksmq: cannot open {path!r}: {exc}") from exc

    def _failed(self, what: str, exc: Exception) -> SourceUnavailableError:
        self.broken = True  # the source opens a new instance for the next reader
        return SourceUnavailableError(f"rocksmq: {what} {self.path!r}: {exc}")

    @property
    def db(self) -> Rdict:
        db = self._db
        if db is None:
            raise SourceUnavailableError(f"rocksmq: {self.path!r} is closed")
        return db

    def catch_up(self, min_interval: float = 0.0) -> None:
        """Apply what the primary wrote since the last catch-up, unless another reader asked
        less than ``min_interval`` seconds ago, or the primary's files show no write since (a
        catch-up costs about a millisecond of the GIL; looking at the files, some
        microseconds; at least one every CATCH_UP_AT_LEAST seconds all the same)."""
        with self._lock:
            now = time.monotonic()
            if now - self._asked_at < min_interval:
                return
            self._asked_at = now
            files = self._primary_files()  # before the catch-up: a write during it shows next
            if (
                files is not None
                and files == self._files_caught_up
                and now - self._caught_up_at < CATCH_UP_AT_LEAST
            ):
                return
            try:
                self.db.try_catch_up_with_primary()
            except SourceUnavailableError:
                raise
            except Exception as exc:
                raise self._failed("catching up with", exc) from exc
            self._files_caught_up = files
            self._caught_up_at = time.monotonic()
            self.catch_ups += 1

    def _primary_files(self) -> tuple[tuple[str, int, int], ...] | None:
        """(name, size, mtime) of the primary's WAL files and MANIFEST: every write appends to
        its newest WAL file, a flush or a compaction writes the MANIFEST. None when they cannot
        be looked at (the catch-up then goes ahead and says what is wrong)."""
        try:
            with os.scandir(self.path) as entries:
                found = []
                for entry in entries:
                    name = entry.name
                    if name.endswith(".log") or name.startswith("MANIFEST-"):
                        info = entry.stat()
                        found.append((name, info.st_size, info.st_mtime_ns))
        except OSError:
            return None
        return tuple(sorted(found))

    def sequence(self) -> int:
        """The last write applied to this instance; it moves only when a catch-up brings new
        writes of the primary, so a reader that found nothing at a sequence need not look again
        until it moves (an idle channel then costs no seek)."""
        try:
            return int(self.db.latest_sequence_number())
        except SourceUnavailableError:
            raise
        except Exception as exc:
            raise self._failed("reading the sequence of", exc) from exc

    def iterator(self) -> RdictIter:
        # No iterate bounds: in rocksdict 0.3.29 ReadOptions.set_iterate_lower_bound sets the
        # upper bound, and neither bound was applied here; callers check the topic prefix.
        return self.db.iter()

    def first_last(self, prefix: bytes) -> tuple[int, int] | None:
        """(first id, last id) of a topic, None when it holds no message."""
        try:
            it = self.iterator()
            it.seek(prefix)
            first = _parse_id(prefix, it.key()) if it.valid() else None
            it.seek_for_prev(_upper_bound(prefix))
            last = _parse_id(prefix, it.key()) if it.valid() else None
            it.status()
        except SourceUnavailableError:
            raise
        except Exception as exc:
            raise self._failed("reading", exc) from exc
        if first is None or last is None:
            return None
        return first, last

    @staticmethod
    def _position(it: RdictIter, prefix: bytes, after: int | None, direct: bool) -> None:
        """At the first record past ``after`` of a topic (or at ``after`` itself), or at its
        head. Seeking to the id after it, when it has the same width, spares reading the block
        of ``after`` again: an insert's block is megabytes."""
        if after is not None and direct:
            following = str(after + 1)
            it.seek(
                prefix + (following if len(following) == len(str(after)) else str(after)).encode()
            )
            return
        it.seek(prefix)
        if after is not None and it.valid():
            first = _parse_id(prefix, it.key())
            if first is not None and first <= after:
                it.seek(prefix + str(after).encode())

    def holds_after(self, prefix: bytes, after: int, direct: bool = False) -> bool:
        """Whether a topic holds a record with an id greater than ``after``. Checksums are
        not verified: only keys are looked at here, and the values a reader takes are read
        again, verified, by :meth:`read_from` (a key misread by a damaged block only makes a read
        come early or late, never skip or take a record)."""
        try:
            it = self.db.iter(self._unverified)
            self._position(it, prefix, after, direct)
            while it.valid():
                key = it.key()
                if not key.startswith(prefix):
                    return False
                msg_id = _parse_id(prefix, key)
                if msg_id is not None and msg_id > after:
                    return True
                it.next()
            it.status()
        except SourceUnavailableError:
            raise
        except Exception as exc:
            raise self._failed("reading", exc) from exc
        return False

    def read_from(
        self,
        cursor: _Cursor | None,
        prefix: bytes,
        after: int | None,
        max_records: int,
        direct: bool = False,
    ) -> tuple[list[tuple[int, bytes]], _Cursor | None]:
        """Up to ``max_records`` (id, value) of a topic with ids greater than ``after``, and
        about READ_BYTES of values; and the cursor to go on with next time, None when the read
        reached the topic's end (an iterator sees the store as it was when it was made: new
        records need a new one). ``cursor``: the one a read of the same topic left on the record
        after ``after``, used instead of a seek.

        Ids of one width sort as numbers (Milvus's consumer relies on it), so the record after
        ``after`` is one seek away when ``direct`` says the topic's ids are as wide as it;
        otherwise (a position from elsewhere) the topic's head is looked at first.

        A seek positions the iterator in every table file, and in each it reads the block at
        or after the target: during a backlog, a later insert of megabytes, checksummed, in
        every file. Going on from where the last read stopped reads only the blocks read."""
        found: list[tuple[int, bytes]] = []
        try:
            if cursor is not None and cursor.after == after:
                it = cursor.it
            else:
                it = self.iterator()
                self._position(it, prefix, after, direct)
                cursor = _Cursor(it, 0, time.monotonic())
            size = 0
            while it.valid() and len(found) < max_records and size < READ_BYTES:
                key = it.key()
                if not key.startswith(prefix):
                    break  # past the topic
                msg_id = _parse_id(prefix, key)
                if msg_id is not None and (after is None or msg_id > after):
                    value = it.value()
                    found.append((msg_id, value))
                    size += len(value)
                    after = msg_id
                it.next()
            it.status()
            more = it.valid() and it.key().startswith(prefix)
        except SourceUnavailableError:
            raise
        except Exception as exc:
            raise self._failed("reading", exc) from exc
        if not more or after is None or time.monotonic() - cursor.made > CURSOR_AGE:
            return found, None
        cursor.after = after
        return found, cursor

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()
        self._remove_scratch()


class RocksmqChannelReader:
    def __init__(self, source: RocksmqSource, pchannel: str, start: Position | None) -> None:
        self.pchannel = pchannel
        self._prefix = _topic_prefix(pchannel)
        self._source = source
        self._store: _SecondaryDB | None = source._acquire()
        self._last_id: int | None = None
        self._empty_at: int | None = None  # the sequence at which the last read found nothing
        self._found_at = time.monotonic()  # when a read last found records
        self._looked_at = 0.0  # when the topic was last read
        self._id_width = 0  # the digits of the ids read (0: none read since the last seek)
        try:
            self.seek(start)
        except BaseException:
            self.close()
            raise

    def _db(self) -> _SecondaryDB:
        if self._store is None:
            raise SourceUnavailableError(f"rocksmq {self.pchannel}: the reader is closed")
        return self._store

    def seek(self, position: Position | None) -> None:
        self._cursor: _Cursor | None = None
        self._last_id = None if position is None else decode_id(position.msg_id)
        self._empty_at = None
        self._found_at = time.monotonic()
        self._id_width = 0
        if self._last_id is not None:
            held = self._db().first_last(self._prefix)
            if held is not None and held[0] > self._last_id + 1:
                log.warning(
                    "rocksmq %s: resuming after id %d but the earliest id still held is %d; "
                    "Milvus's retention may have deleted records in between",
                    self.pchannel,
                    self._last_id,
                    held[0],
                )

    def _read(self, store: _SecondaryDB, max_records: int) -> list[tuple[int, bytes]]:
        sequence = store.sequence()  # before the read: a write landing during it moves it
        if sequence == self._empty_at:
            return []
        now = time.monotonic()
        if self._resting(now):
            return []
        self._looked_at = now
        direct = self._last_id is not None and len(str(self._last_id)) == self._id_width
        cursor, self._cursor = self._cursor, None
        if (
            cursor is not None
            or self._last_id is None
            or store.holds_after(self._prefix, self._last_id, direct)
        ):
            found, self._cursor = store.read_from(
                cursor, self._prefix, self._last_id, max_records, direct
            )
        else:
            found = []  # the cheap look found nothing new: no verified read
        self._empty_at = None if found else sequence
        if found:
            self._found_at = now
            self._id_width = len(str(found[-1][0]))
        return found

    def _resting(self, now: float) -> bool:
        """Quiet, and looked at less than QUIET_POLL (or QUIET_LONG_POLL) ago: neither a look
        nor a catch-up."""
        quiet = now - self._found_at
        if quiet <= QUIET_AFTER:
            return False
        poll = QUIET_POLL if quiet <= QUIET_LONG_AFTER else QUIET_LONG_POLL
        return now - self._looked_at < poll

    def read_batch(self, max_records: int, timeout: float) -> list[RawRecord]:
        store = self._db()
        deadline = time.monotonic() + timeout
        found = self._read(store, max_records)
        while not found:
            if not self._resting(time.monotonic()):
                store.catch_up(POLL_INTERVAL)
            found = self._read(store, max_records)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                break
            time.sleep(min(POLL_INTERVAL, remaining))
        records = []
        for msg_id, value in found:
            payload, properties = unwrap_value(value)
            records.append(
                RawRecord(
                    pchannel=self.pchannel,
                    msg_id=encode_id(msg_id),
                    payload=payload,
                    properties=properties,
                    offset=msg_id,
                )
            )
        if found:
            self._last_id = found[-1][0]
        return records

    def more_buffered(self) -> bool:
        """Did the last read stop before the topic's end (a limit of records or bytes), with
        the next record there to read at once?"""
        return self._cursor is not None

    def close(self) -> None:
        self._cursor = None  # its iterator goes before the store can be closed
        store, self._store = self._store, None
        if store is not None:
            self._source._release(store)


class RocksmqSource:
    """Readers of one source share one secondary instance (opened with the first reader, closed
    ``linger`` seconds after the last one let it go, unless another took it meanwhile: a task's
    start asks every channel's watermarks one after another, and opening the instance reads
    every table file's footer, about 80 ms of CPU on a 500 MB store, each time).
    ``secondary_dir`` is where its scratch directory goes (default: the system's temporary
    directory)."""

    backend = BACKEND
    LINGER = 5.0

    def __init__(
        self, path: str, secondary_dir: str | None = None, linger: float | None = None
    ) -> None:
        self.path = path
        self.secondary_dir = secondary_dir
        self.linger = self.LINGER if linger is None else linger
        self._lock = threading.Lock()
        self._shared: _SecondaryDB | None = None

    def open_channel(self, pchannel: str, start: Position | None) -> RocksmqChannelReader:
        return RocksmqChannelReader(self, pchannel, start)

    def _acquire(self) -> _SecondaryDB:
        with self._lock:
            if self._shared is None or self._shared.broken:
                self._shared = _SecondaryDB(self.path, self.secondary_dir)
            self._shared.users += 1
            return self._shared

    def _release(self, store: _SecondaryDB) -> None:
        with self._lock:
            store.users -= 1
            if store.users > 0:
                return
            if self._shared is store and not store.broken and self.linger > 0:
                store.released_at = time.monotonic()
                timer = threading.Timer(self.linger, self._close_unused, args=(store,))
                timer.daemon = True
                timer.start()
                return
            if self._shared is store:
                self._shared = None
        store.close()

    def _close_unused(self, store: _SecondaryDB) -> None:
        """Closes ``store`` when no reader took it since it was let go ``linger`` ago."""
        with self._lock:
            if store.users > 0 or time.monotonic() - store.released_at < self.linger * 0.99:
                return  # in use again, or let go again later (that release set its own timer)
            if self._shared is store:
                self._shared = None
        store.close()

    @staticmethod
    def offset_of(msg_id: bytes) -> int:
        return decode_id(msg_id)

    @staticmethod
    def position_before(offset: int) -> bytes | None:
        return encode_id(offset - 1) if offset > 0 else None

    def watermarks(self, pchannel: str, timeout: float | None = None) -> tuple[int, int]:
        """(first id held, last id + 1); (0, 0) when the topic holds nothing. Ids of a topic
        increase but need not be consecutive: the next record gets an id >= the second value.
        ``timeout`` is not used: the store is a local path, read without a network."""
        store = self._acquire()
        try:
            store.catch_up()
            held = store.first_last(_topic_prefix(pchannel))
        finally:
            self._release(store)
        if held is None:
            return 0, 0
        return held[0], held[1] + 1
