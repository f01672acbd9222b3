"""The RocksMQ WAL reader against a real Milvus 2.3.5 standalone whose message queue is RocksMQ.

The reader opens Milvus's RocksDB as a secondary instance while Milvus runs (Milvus keeps its
lock and goes on writing), and catches up with it to see new records.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from harness.services import wait_until

from metastore import Position
from replicator.codec.msgstream import decode
from replicator.codec.wire import find_bytes_field, iter_fields
from replicator.events import CreateCollection, Delete, Event, Insert, RawRecord, TimeTick
from replicator.sources import rocksmq
from replicator.sources import shared as shared_module
from replicator.sources.base import SourceUnavailableError
from replicator.sources.rocksmq import (
    STREAMING_MAGIC,
    RocksmqChannelReader,
    RocksmqSource,
    unwrap_value,
)
from replicator.sources.shared_records import RECORD_OVERHEAD
from replicator.sources.shared_source import SharedSource

if TYPE_CHECKING:
    from harness.milvus_source import MilvusSource

pytestmark = pytest.mark.e2e

DIM = 8
BACKEND = "rocksmq"


# --------------------------------------------------------------------------------------------
# Fixtures: one Milvus on RocksMQ for the module, one collection written to it


@pytest.fixture(scope="module")
def rocksmq_milvus(milvus_source_rocksmq: MilvusSource) -> MilvusSource:
    assert milvus_source_rocksmq.rocksmq_path is not None
    return milvus_source_rocksmq


@pytest.fixture(scope="module")
def client(rocksmq_milvus: MilvusSource) -> Iterator[Any]:
    from pymilvus import MilvusClient

    milvus = MilvusClient(uri=rocksmq_milvus.uri, timeout=30, dedicated=True)
    try:
        yield milvus
    finally:
        milvus.close()


@pytest.fixture(scope="module")
def source(rocksmq_milvus: MilvusSource) -> RocksmqSource:
    return RocksmqSource(str(rocksmq_milvus.rocksmq_path))


@dataclass(frozen=True)
class Written:
    name: str
    collection_id: int
    pchannel: str
    start_position: bytes  # the channel's start position Milvus stored in etcd


@pytest.fixture(scope="module")
def written(rocksmq_milvus: MilvusSource, client: Any) -> Written:
    """A collection with one shard: created, 10 rows inserted, ids 1 and 2 deleted."""
    from pymilvus import DataType, MilvusClient

    name = f"rmq_{uuid.uuid4().hex[:10]}"
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
    client.create_collection(name, schema=schema, shards_num=1)
    assert client.insert(name, _rows(range(10)))["insert_count"] == 10
    client.delete(name, ids=[1, 2])
    collection_id = int(client.describe_collection(name)["collection_id"])
    pchannels, starts = _collection_channels(rocksmq_milvus, collection_id)
    assert len(pchannels) == 1, pchannels
    assert pchannels[0] in rocksmq_milvus.dml_channels
    return Written(name, collection_id, pchannels[0], starts[pchannels[0]])


def _rows(ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "vec": [float(i) + d / 10 for d in range(DIM)]} for i in ids]


def _collection_channels(
    milvus: MilvusSource, collection_id: int
) -> tuple[list[str], dict[str, bytes]]:
    """CollectionInfo from etcd: physical_channel_names (8) and start_positions (11,
    KeyDataPair{key = 1, data = 2})."""
    import etcd3

    host, _, port = milvus.etcd_endpoint.rpartition(":")
    etcd = etcd3.client(host=host, port=int(port))
    try:
        key = f"{milvus.meta_root}/root-coord/database/collection-info/1/{collection_id}"
        value, _meta = etcd.get(key)
    finally:
        etcd.close()
    assert value, f"{key} is missing"
    pchannels: list[str] = []
    starts: dict[str, bytes] = {}
    for number, _wire_type, field in iter_fields(value):
        if number == 8 and isinstance(field, bytes):
            pchannels.append(field.decode())
        elif number == 11 and isinstance(field, bytes):
            channel = (find_bytes_field(field, 1) or b"").decode()
            starts[channel] = find_bytes_field(field, 2) or b""
    return pchannels, starts


def _unused_channel(milvus: MilvusSource, source: RocksmqSource, used: str) -> str:
    """A channel of the source's naming no Milvus writes to: the session's RocksMQ Milvus also
    serves as a target of the e2e tests, which may have used every real DML channel."""
    channel = f"{milvus.dml_channels[0].rsplit('_', 1)[0]}_{len(milvus.dml_channels) + 100}"
    assert channel != used
    return channel


def _decode(record: RawRecord) -> Event:
    event = decode(record, BACKEND, lambda _cid: True)
    assert isinstance(event, Event), event
    return event


def _read_until(
    reader: RocksmqChannelReader, done: Any, timeout: float = 30.0, batch: int = 100
) -> list[RawRecord]:
    """Records from `reader` until done(records read so far) is true."""
    records: list[RawRecord] = []
    deadline = time.monotonic() + timeout
    while not done(records):
        assert time.monotonic() < deadline, f"gave up after {len(records)} records"
        records.extend(reader.read_batch(batch, 0.5))
    return records


def _position(record: RawRecord) -> Position:
    return Position(BACKEND, record.pchannel, record.msg_id, 0)


# --------------------------------------------------------------------------------------------
# Reading


def test_reads_the_channel_from_the_beginning(source: RocksmqSource, written: Written) -> None:
    def seen_delete_and_tick(records: list[RawRecord]) -> bool:
        events = [_decode(r) for r in records]
        return any(isinstance(e, Delete) for e in events) and any(
            isinstance(e, TimeTick) for e in events
        )

    # from just before the collection's start position (the channel may hold other
    # collections' records from earlier tests; the session's Milvus is shared)
    start = source.position_before(source.offset_of(written.start_position))
    begin = None if start is None else Position(BACKEND, written.pchannel, start, 0)
    reader = source.open_channel(written.pchannel, begin)
    try:
        records = _read_until(reader, seen_delete_and_tick)
    finally:
        reader.close()

    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), "ids strictly increasing"
    for record in records:
        assert record.pchannel == written.pchannel
        assert record.msg_id == struct.pack("<q", record.offset)
        assert record.properties == {}
        assert record.payload[:1] == b"\x0a", "plain msgstream payload: field 1 is MsgBase"

    events = [_decode(r) for r in records]
    print(f"\n{written.pchannel}: " + ", ".join(type(e).__name__ for e in events))
    # this collection's events and the ticks (other collections may share the channel)
    events = [
        e
        for e in events
        if getattr(e, "collection_id", written.collection_id) == written.collection_id
    ]
    first = events[0]
    assert isinstance(first, CreateCollection)
    assert first.collection_id == written.collection_id
    assert first.collection_name == written.name
    # Milvus's own start position of the channel is the CreateCollection's id, 8 bytes LE
    assert records[0].msg_id == written.start_position

    first_delete = next(i for i, e in enumerate(events) if isinstance(e, Delete))
    inserts = [e for e in events[:first_delete] if isinstance(e, Insert)]
    assert inserts and all(e.collection_id == written.collection_id for e in inserts)
    assert sum(e.num_rows for e in inserts) == 10
    delete = events[first_delete]
    assert isinstance(delete, Delete)
    assert delete.num_rows == 2
    assert sorted(delete.request.primary_keys.int_id.data) == [1, 2]
    assert any(isinstance(e, TimeTick) for e in events)


def test_batches_and_seek(
    source: RocksmqSource, written: Written, caplog: pytest.LogCaptureFixture
) -> None:
    reader = source.open_channel(written.pchannel, None)
    try:
        head = _read_until(reader, lambda rs: len(rs) >= 4, batch=2)
        assert len(head) == 4, "read_batch returns at most max_records"

        reader.seek(_position(head[1]))
        (after,) = reader.read_batch(1, 5.0)
        assert (after.offset, after.payload) == (head[2].offset, head[2].payload)

        reader.seek(None)
        again = reader.read_batch(3, 5.0)
        assert [r.offset for r in again] == [r.offset for r in head[:3]]
    finally:
        reader.close()

    # opening at a position starts right after it
    resumed = source.open_channel(written.pchannel, _position(head[1]))
    try:
        got = resumed.read_batch(2, 5.0)
        assert [r.offset for r in got] == [head[2].offset, head[3].offset]
    finally:
        resumed.close()

    # a position older than everything held reads from the first record, with a warning (the
    # records in between may have been deleted by Milvus's retention)
    old = Position(BACKEND, written.pchannel, struct.pack("<q", 5), 0)
    with caplog.at_level(logging.WARNING, logger="replicator.sources.rocksmq"):
        from_old = source.open_channel(written.pchannel, old)
    try:
        assert from_old.read_batch(1, 5.0)[0].offset == head[0].offset
    finally:
        from_old.close()
    assert "retention may have deleted records" in caplog.text
    # resuming right before the first record held is not a gap
    caplog.clear()
    just_before = Position(BACKEND, written.pchannel, struct.pack("<q", head[0].offset - 1), 0)
    with caplog.at_level(logging.WARNING, logger="replicator.sources.rocksmq"):
        source.open_channel(written.pchannel, just_before).close()
    assert "retention" not in caplog.text


def test_readers_in_threads_share_one_secondary_instance(
    rocksmq_milvus: MilvusSource, written: Written, tmp_path: Path
) -> None:
    scratch = tmp_path / "secondary"
    source = RocksmqSource(str(rocksmq_milvus.rocksmq_path), secondary_dir=str(scratch), linger=0.5)
    readers = [source.open_channel(written.pchannel, None) for _ in range(4)]
    try:
        assert len(os.listdir(scratch)) == 1, "one secondary instance for all readers"
        results: list[list[int]] = [[] for _ in readers]

        def read(i: int) -> None:
            results[i] = [r.offset for r in _read_until(readers[i], lambda rs: len(rs) >= 6)]

        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(readers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert all(len(offsets) >= 6 for offsets in results), results
        assert len({tuple(offsets[:6]) for offsets in results}) == 1
        readers.pop().close()
        assert len(os.listdir(scratch)) == 1, "still used by the other readers"
    finally:
        for reader in readers:
            reader.close()
    assert len(os.listdir(scratch)) == 1, "kept a while for the next reader"
    wait_until(lambda: os.listdir(scratch) == [], 10, "closed after the last reader lingered")


def test_a_process_that_ends_while_its_instance_lingers_leaves_no_scratch_directory(
    rocksmq_milvus: MilvusSource, written: Written, tmp_path: Path
) -> None:
    """A channel group's process (multiprocessing) ends by ``os._exit`` while its secondary
    instance still lingers: the instance's scratch directory goes with it (it stayed in /tmp,
    one a group and a start, when only an atexit hook removed it)."""
    scratch = tmp_path / "secondary"

    def watermarks_then_end() -> None:
        source = RocksmqSource(str(rocksmq_milvus.rocksmq_path), str(scratch), linger=60)
        source.watermarks(written.pchannel)
        assert len(os.listdir(scratch)) == 1  # open, lingering for the next reader

    child = multiprocessing.get_context("fork").Process(target=watermarks_then_end)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert os.listdir(scratch) == []


def test_watermarks_one_after_another_open_the_store_once(
    rocksmq_milvus: MilvusSource, written: Written, tmp_path: Path
) -> None:
    """A task's start asks every channel's watermarks in turn: one instance serves them all
    (opening one reads every table file; it was opened anew for each channel), and a reader
    opened within ``linger`` takes it too."""
    scratch = tmp_path / "secondary"
    source = RocksmqSource(str(rocksmq_milvus.rocksmq_path), secondary_dir=str(scratch), linger=5)
    opened: list[str] = []
    for pchannel in [written.pchannel, *rocksmq_milvus.dml_channels[:3]]:
        source.watermarks(pchannel)
        opened.extend(os.listdir(scratch))
    reader = source.open_channel(written.pchannel, None)
    opened.extend(os.listdir(scratch))
    reader.close()
    assert len(set(opened)) == 1, opened


def test_sees_records_written_after_it_opened(
    source: RocksmqSource, written: Written, client: Any
) -> None:
    _earliest, latest = source.watermarks(written.pchannel)
    start = Position(BACKEND, written.pchannel, struct.pack("<q", latest - 1), 0)
    reader = source.open_channel(written.pchannel, start)
    try:
        before = reader.read_batch(1000, 0.0)  # whatever was there when it opened
        assert all(r.offset >= latest for r in before)

        new_ids = range(100, 107)
        assert client.insert(written.name, _rows(new_ids))["insert_count"] == 7

        def has_new_insert(records: list[RawRecord]) -> bool:
            return any(
                isinstance(e, Insert) and e.num_rows == 7 for e in (_decode(r) for r in records)
            )

        records = _read_until(reader, has_new_insert)
    finally:
        reader.close()
    assert all(r.offset >= latest for r in records)
    (insert,) = [e for e in (_decode(r) for r in records) if isinstance(e, Insert)]
    assert isinstance(insert, Insert)
    assert insert.collection_id == written.collection_id
    pk = next(f for f in insert.request.fields_data if f.field_name == "id")
    assert list(pk.scalars.long_data.data) == list(new_ids)


def test_watermarks(source: RocksmqSource, written: Written, rocksmq_milvus: MilvusSource) -> None:
    earliest, latest = source.watermarks(written.pchannel)
    assert 0 < earliest < latest

    reader = source.open_channel(written.pchannel, None)
    try:
        (first,) = reader.read_batch(1, 5.0)
        assert first.offset == earliest
        # `latest` is one past the last id held then: reading after latest - 1 gives newer ones
        reader.seek(Position(BACKEND, written.pchannel, struct.pack("<q", latest - 2), 0))
        (last,) = reader.read_batch(1, 5.0)
        assert last.offset == latest - 1
    finally:
        reader.close()

    unused = _unused_channel(rocksmq_milvus, source, written.pchannel)
    assert source.watermarks(unused) == (0, 0)
    assert source.watermarks(f"no-such-topic-{uuid.uuid4().hex[:6]}") == (0, 0)


def test_empty_channel_returns_nothing_within_the_timeout(
    source: RocksmqSource, written: Written, rocksmq_milvus: MilvusSource
) -> None:
    unused = _unused_channel(rocksmq_milvus, source, written.pchannel)
    reader = source.open_channel(unused, None)
    try:
        started = time.monotonic()
        assert reader.read_batch(100, 0.5) == []
        elapsed = time.monotonic() - started
        # it waits the timeout, and does not block beyond it (a loaded machine adds seconds)
        assert 0.45 <= elapsed < 10.0, elapsed
        assert reader.read_batch(100, 0.0) == []
    finally:
        reader.close()


def _idle_looks(
    source: RocksmqSource,
    pchannel: str,
    monkeypatch: pytest.MonkeyPatch,
    seconds: float,
    timeout: float,
) -> list[float]:
    """Reads an empty channel for ``seconds`` in ``read_batch`` calls of ``timeout``; when
    each read of its topic was made (a look: a seek in the store), in seconds from the start."""
    prefix = (pchannel + "/").encode()
    looks: list[float] = []
    real_read = rocksmq._SecondaryDB.read_from

    def counting_read(self, cursor, topic, after, max_records, direct=False):  # type: ignore[no-untyped-def]
        if topic == prefix:
            looks.append(time.monotonic())
        return real_read(self, cursor, topic, after, max_records, direct)

    monkeypatch.setattr(rocksmq._SecondaryDB, "read_from", counting_read)
    reader = source.open_channel(pchannel, None)
    try:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            assert reader.read_batch(100, timeout) == []
    finally:
        reader.close()
    return [t - started for t in looks]


def test_a_quiet_channel_is_looked_at_less_often(
    source: RocksmqSource,
    written: Written,
    rocksmq_milvus: MilvusSource,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While Milvus writes time ticks to the written channel the secondary's sequence moves
    every few milliseconds, so an idle reader of another channel would seek on every poll
    (20 a second); once quiet for QUIET_AFTER it looks every QUIET_POLL."""
    unused = _unused_channel(rocksmq_milvus, source, written.pchannel)
    looks = _idle_looks(source, unused, monkeypatch, rocksmq.QUIET_AFTER + 2.0, 0.2)
    quiet = [t for t in looks if t > rocksmq.QUIET_AFTER + 0.1]
    # about 2.0 / QUIET_POLL looks once quiet (20 a second would be 38)
    assert 2 <= len(quiet) <= 2.0 / rocksmq.QUIET_POLL + 1, len(quiet)
    gaps = [b - a for a, b in itertools.pairwise(quiet)]
    assert min(gaps) >= rocksmq.QUIET_POLL - 0.01, gaps


def test_secondary_scratch_directory_is_removed_on_close(
    rocksmq_milvus: MilvusSource, written: Written, tmp_path: Path
) -> None:
    scratch = tmp_path / "secondary"
    source = RocksmqSource(str(rocksmq_milvus.rocksmq_path), secondary_dir=str(scratch), linger=0)
    reader = source.open_channel(written.pchannel, None)
    try:
        assert len(os.listdir(scratch)) == 1
        assert reader.read_batch(1, 5.0)
    finally:
        reader.close()
    reader.close()  # twice is harmless
    assert source.watermarks(written.pchannel) != (0, 0)
    assert os.listdir(scratch) == []


def test_missing_database_is_unavailable(tmp_path: Path) -> None:
    missing = tmp_path / "no-rocksmq"
    source = RocksmqSource(str(missing))
    with pytest.raises(SourceUnavailableError):
        source.open_channel("by-dev-rootcoord-dml_0", None)
    with pytest.raises(SourceUnavailableError):
        source.watermarks("by-dev-rootcoord-dml_0")
    assert not missing.exists(), "the reader must not create the database directory"

    not_a_db = tmp_path / "not-a-db"
    not_a_db.mkdir()
    (not_a_db / "CURRENT").write_text("MANIFEST-000001\n")
    with pytest.raises(SourceUnavailableError):
        RocksmqSource(str(not_a_db)).open_channel("by-dev-rootcoord-dml_0", None)


# --------------------------------------------------------------------------------------------
# Value framing (no server needed)


def _field(number: int, data: bytes) -> bytes:
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


def test_streaming_layout_is_unwrapped() -> None:
    payload = b"\x0a\x02\x08\x01body"
    layout = (
        _field(1, payload)
        + _field(2, _field(1, b"_t") + _field(2, b"2"))
        + _field(2, _field(1, b"_vc") + _field(2, b"by-dev-rootcoord-dml_0_1v0"))
    )
    assert unwrap_value(STREAMING_MAGIC + layout) == (
        payload,
        {"_t": "2", "_vc": "by-dev-rootcoord-dml_0_1v0"},
    )
    # Milvus 2.3-2.5 values are the payload itself
    assert unwrap_value(payload) == (payload, {})
    # a broken layout is passed on as it is (the decoder reports it at its position)
    broken = STREAMING_MAGIC + b"\x0a\x7f"
    assert unwrap_value(broken) == (broken, {})


def test_a_catch_up_is_made_only_when_the_primary_wrote(tmp_path: Path) -> None:
    """The primary here is a RocksDB of our own (written with rocksdict, keys laid out as
    RocksMQ's ``topic/id``): a catch-up is made when its WAL or MANIFEST changed, and at least
    every CATCH_UP_AT_LEAST seconds; a look in between costs a directory listing."""
    from rocksdict import Options, Rdict

    path = str(tmp_path / "primary")
    options = Options(raw_mode=True)
    primary = Rdict(path, options)
    store = rocksmq._SecondaryDB(path, str(tmp_path / "secondary"))
    try:
        primary[b"a/100"] = b"first"
        primary[b"b/101"] = b"x" * 3_000_000  # the next topic's block: megabytes
        store.catch_up()
        made = store.catch_ups
        assert store.read_from(None, b"a/", None, 10)[0] == [(100, b"first")]
        for _ in range(5):
            store.catch_up()
        assert store.catch_ups == made, "nothing was written"
        assert not store.holds_after(b"a/", 100, direct=True)

        primary[b"a/102"] = b"second"
        assert not store.holds_after(b"a/", 100, direct=True), "not caught up yet"
        store.catch_up()
        assert store.catch_ups == made + 1
        assert store.holds_after(b"a/", 100, direct=True)
        assert not store.holds_after(b"a/", 102, direct=True)
        assert store.read_from(None, b"a/", 100, 10, direct=True)[0] == [(102, b"second")]

        time.sleep(rocksmq.CATCH_UP_AT_LEAST + 0.05)
        store.catch_up()
        assert store.catch_ups == made + 2, "one at least every CATCH_UP_AT_LEAST"
    finally:
        store.close()
        primary.close()


def test_a_reader_goes_on_where_its_last_read_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a backlog in reads of READ_BYTES, each read after the first goes on with the
    iterator the last one left (no seek: a seek reads a block in every table file); records
    written later are read once that iterator reached the topic's end."""
    from rocksdict import Options, Rdict

    path = str(tmp_path / "primary")
    primary = Rdict(path, Options(raw_mode=True))
    source = RocksmqSource(path, secondary_dir=str(tmp_path / "secondary"), linger=0)
    seeks: list[bytes] = []
    real_position = rocksmq._SecondaryDB._position

    def counting_position(it, prefix, after, direct):  # type: ignore[no-untyped-def]
        seeks.append(prefix)
        real_position(it, prefix, after, direct)

    monkeypatch.setattr(rocksmq._SecondaryDB, "_position", staticmethod(counting_position))
    words = rocksmq.READ_BYTES // 24 + 1  # three values of 8 * words bytes fill a read
    for msg_id in range(1000, 1010):
        primary[b"a/%d" % msg_id] = msg_id.to_bytes(8, "little") * words
    primary[b"b/2000"] = b"next topic"
    reader = source.open_channel("a", None)
    try:
        offsets = []
        for _ in range(4):
            offsets.append([r.offset for r in reader.read_batch(100, 1.0)])
        assert offsets == [[1000, 1001, 1002], [1003, 1004, 1005], [1006, 1007, 1008], [1009]]
        assert seeks == [b"a/"], "one seek, then the iterator went on"

        primary[b"a/1010"] = b"later"
        later = reader.read_batch(100, 5.0)
        assert [(r.offset, r.payload) for r in later] == [(1010, b"later")]
        assert reader.read_batch(100, 0.3) == []
    finally:
        reader.close()
        primary.close()


def test_a_channel_quiet_for_long_is_looked_at_more_rarely(
    source: RocksmqSource,
    written: Written,
    rocksmq_milvus: MilvusSource,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above with the times shortened: quiet for QUIET_LONG_AFTER, a channel is looked at
    every QUIET_LONG_POLL (the source writes time ticks to another channel all along)."""
    for name, value in (
        ("QUIET_AFTER", 0.2),
        ("QUIET_POLL", 0.2),
        ("QUIET_LONG_AFTER", 1.0),
        ("QUIET_LONG_POLL", 0.7),
    ):
        monkeypatch.setattr(rocksmq, name, value)
    unused = _unused_channel(rocksmq_milvus, source, written.pchannel)
    looks = _idle_looks(source, unused, monkeypatch, 3.5, 0.1)
    short = [t for t in looks if 0.3 < t < 0.95]
    long = [t for t in looks if t > 1.1]
    assert len(short) >= 2, looks
    assert min(b - a for a, b in itertools.pairwise(short)) >= 0.19
    assert 2 <= len(long) <= 2.4 / 0.7 + 1, long
    assert min(b - a for a, b in itertools.pairwise(long)) >= 0.69, long


def test_a_backlog_goes_on_while_the_reader_under_a_shared_channel_is_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``more_buffered`` is what tells a Kafka target's channel that it is in a backlog, and so
    that it may group its commits. A subscriber of a shared channel that took every record the
    channel's reader had read so far is still in a backlog while that reader's last read
    stopped short of the topic's end (it had read as many records as it asks for, and waits
    for room in its window): it used to say no, and the channel committed and waited for its
    transaction after each take. Once the reader found the end, it says no. Scaled down:
    reads of 3 records, a window of 3 records' bytes."""
    from rocksdict import Options, Rdict

    path = str(tmp_path / "primary")
    primary = Rdict(path, Options(raw_mode=True))
    for msg_id in range(1000, 1010):
        primary[b"a/%d" % msg_id] = b"x" * 100
    primary[b"b/2000"] = b"next topic"
    source = RocksmqSource(path, secondary_dir=str(tmp_path / "secondary"), linger=0)

    reader = source.open_channel("a", None)
    try:
        assert len(reader.read_batch(3, 1.0)) == 3
        assert reader.more_buffered(), "the read stopped at its limit, 7 records before the end"
        assert len(reader.read_batch(100, 1.0)) == 7
        assert not reader.more_buffered(), "the read reached the topic's end"
    finally:
        reader.close()

    monkeypatch.setattr(shared_module, "READ_RECORDS", 3)
    shared = SharedSource(source, window=3 * (100 + RECORD_OVERHEAD))
    subscriber = shared.open_channel("a", None)
    channel = shared.channel("a")
    try:
        wait_until(lambda: channel.stats.records_read == 3, 10, "the channel's first read")
        time.sleep(0.3)
        assert channel.stats.records_read == 3, "the window is full: the reader waits"
        assert len(subscriber.read_batch(100, 1.0)) == 3
        assert subscriber.took_all, "every record the channel read was taken"
        assert subscriber.more_buffered(), "the channel's reader is 7 records from the end"
        taken = 3
        deadline = time.monotonic() + 10
        while taken < 10 and time.monotonic() < deadline:
            taken += len(subscriber.read_batch(100, 0.5))
        assert taken == 10
        wait_until(lambda: not subscriber.more_buffered(), 10, "the backlog's end seen")
    finally:
        subscriber.close()
        primary.close()
