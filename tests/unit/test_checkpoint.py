"""The commit protocol of one channel (replicator/pipeline/checkpoint.py), one test per failure
branch: a write that fails, a position save that fails after the write, a crash between the
in-flight bound and the write, a crash before the bound, a WAL switch.

The store is the daemon's own SQLite metastore in a temporary file; a crash is modelled by
throwing the checkpoint away and building a new one from what the store holds, as a restarted
daemon does. The target is a table in memory that behaves as Milvus does with primary keys it
already holds: an insert adds a second copy of the row, an upsert replaces it. So "nothing
doubled" is checked by counting copies per key.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from metastore import (
    MetaStore,
    MetaStoreUnavailableError,
    Position,
    PositionConflictError,
    TaskRecord,
    TaskState,
)
from metastore.sql import SqlMetaStore
from metastore.sql_urls import sqlite_url
from replicator.errors import SinkSessionLostError, TargetUnavailableError
from replicator.events import Delete, Insert
from replicator.pipeline import checkpoint as checkpoint_module
from replicator.pipeline.checkpoint import ChannelCheckpoint
from replicator.pipeline.sequencer import Pending
from replicator.pipeline.task_state import RunnerState

TASK = "checkpoint-task"
CHANNEL = "by-dml_0"


class Crash(BaseException):
    """The process dies here (nothing after it runs; nothing catches it)."""


def msg_id(offset: int) -> bytes:
    return offset.to_bytes(8, "little", signed=True)


def offset_of(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def record(offset: int) -> Pending:
    """The insert of one row at ``offset``: its key is its offset."""
    event = Insert(
        ts=1000 + offset,
        collection_id=1,
        db_name="default",
        collection_name="c",
        partition_name="_default",
        num_rows=1,
        request=None,  # type: ignore[arg-type]  # the table below reads only ts
    )
    return Pending(offset, event, msg_id(offset - 1))


class Table:
    """Milvus's behaviour with a key it holds: insert doubles, upsert replaces."""

    def __init__(self) -> None:
        self.copies: Counter[int] = Counter()
        self.calls: list[tuple[list[int], bool]] = []
        self.fail_next: BaseException | None = None
        self.fail_after_applying = False  # the target applied it, the answer was lost

    def apply(self, events: Sequence[Insert | Delete], *, replay: bool = False) -> None:
        keys = [e.ts - 1000 for e in events]
        failure, self.fail_next = self.fail_next, None
        if failure is not None and not self.fail_after_applying:
            raise failure
        self.calls.append((keys, replay))
        for key in keys:
            self.copies[key] = 1 if replay else self.copies[key] + 1
        if failure is not None:
            raise failure

    def doubled(self) -> list[int]:
        return [k for k, n in self.copies.items() if n > 1]


class FlakyStore:
    """The real store, with one chosen call failing once."""

    def __init__(self, inner: MetaStore) -> None:
        self._inner = inner
        self.fail: dict[str, BaseException] = {}

    def _maybe_fail(self, name: str) -> None:
        failure = self.fail.pop(name, None)
        if failure is not None:
            raise failure

    def save_position(self, task_id: str, position: Position, expected: Position | None) -> None:
        self._maybe_fail("save_position")
        self._inner.save_position(task_id, position, expected)

    def put_state(self, task_id: str, key: str, value: bytes) -> None:
        self._maybe_fail("put_state")
        self._inner.put_state(task_id, key, value)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
def store(tmp_path: Path) -> FlakyStore:
    inner = SqlMetaStore(sqlite_url(str(tmp_path / "meta.sqlite3")), "test")
    now = time.time()
    inner.create_task(TaskRecord(TASK, TaskState.RUNNING, "", {}, now, now))
    return FlakyStore(inner)


def restart(store: FlakyStore, table: Table, backend: str = "kafka") -> ChannelCheckpoint:
    """A checkpoint as a (re)started worker builds it: from what the store holds."""
    saved = store.get_positions(TASK).get(CHANNEL)
    return ChannelCheckpoint(
        store,  # type: ignore[arg-type]
        RunnerState(store, TASK),  # type: ignore[arg-type]
        TASK,
        CHANNEL,
        saved.backend if saved is not None else backend,
        saved,
        table,
        offset_of,
    )


def read_after(checkpoint: ChannelCheckpoint, upto: int) -> list[Pending]:
    """The records a worker reads after the saved position, up to ``upto``."""
    return [record(o) for o in range(checkpoint.saved_offset() + 1, upto + 1)]


def commit(checkpoint: ChannelCheckpoint, batch: list[Pending]) -> None:
    last = max(p.offset for p in batch)
    checkpoint.commit(batch, msg_id(last), 1000 + last)


def saved_offset(store: FlakyStore) -> int:
    saved = store.get_positions(TASK).get(CHANNEL)
    return -1 if saved is None else offset_of(saved.msg_id)


def test_a_write_that_fails_saves_no_position_and_keeps_the_bound(store: FlakyStore) -> None:
    table = Table()
    checkpoint = restart(store, table)
    commit(checkpoint, read_after(checkpoint, 4))
    table.fail_next = TargetUnavailableError("target down")
    with pytest.raises(TargetUnavailableError):
        commit(checkpoint, read_after(checkpoint, 9))
    assert saved_offset(store) == 4
    assert RunnerState(store, TASK).inflight_bound(CHANNEL) == 9  # type: ignore[arg-type]


def test_a_failed_write_the_target_applied_is_retried_as_upserts(store: FlakyStore) -> None:
    """A timeout after the target applied the batch: the retry (the worker rewinds to the
    saved position and reads the batch again) must not add second copies."""
    table = Table()
    checkpoint = restart(store, table)
    table.fail_next, table.fail_after_applying = TargetUnavailableError("deadline"), True
    with pytest.raises(TargetUnavailableError):
        commit(checkpoint, read_after(checkpoint, 9))
    assert checkpoint.rewind() is None  # nothing saved yet: from the beginning
    commit(checkpoint, read_after(checkpoint, 9))
    assert table.calls[-1] == (list(range(10)), True)
    assert table.doubled() == [] and sorted(table.copies) == list(range(10))
    assert saved_offset(store) == 9


def test_a_position_save_that_fails_after_the_write_replays_as_upserts_on_restart(
    store: FlakyStore,
) -> None:
    table = Table()
    checkpoint = restart(store, table)
    commit(checkpoint, read_after(checkpoint, 4))
    store.fail["save_position"] = Crash()
    with pytest.raises(Crash):
        commit(checkpoint, read_after(checkpoint, 9))
    assert saved_offset(store) == 4 and table.copies[9] == 1  # written, position not saved
    again = restart(store, table)
    commit(again, read_after(again, 9))
    assert table.calls[-1] == ([5, 6, 7, 8, 9], True)
    assert table.doubled() == [] and saved_offset(store) == 9


def test_a_position_save_that_fails_after_the_write_replays_as_upserts_on_retry(
    store: FlakyStore,
) -> None:
    """The metastore is down for a moment: the worker rewinds instead of restarting."""
    table = Table()
    checkpoint = restart(store, table)
    store.fail["save_position"] = MetaStoreUnavailableError("store down")
    with pytest.raises(MetaStoreUnavailableError):
        commit(checkpoint, read_after(checkpoint, 9))
    checkpoint.rewind()
    commit(checkpoint, read_after(checkpoint, 9))
    assert [replay for _, replay in table.calls] == [False, True]
    assert table.doubled() == [] and saved_offset(store) == 9


def test_a_crash_after_the_bound_and_before_the_write_replays_as_upserts(
    store: FlakyStore,
) -> None:
    table = Table()
    checkpoint = restart(store, table)
    commit(checkpoint, read_after(checkpoint, 4))
    table.fail_next = Crash()
    with pytest.raises(Crash):
        commit(checkpoint, read_after(checkpoint, 9))
    assert table.copies[7] == 0  # never written
    again = restart(store, table)
    assert again.bound == 9
    commit(again, read_after(again, 12))
    # the records under the bound may have been written: upserts (here they were not, and
    # an upsert of a missing key inserts it); nothing is lost either way
    assert table.calls[-1] == ([5, 6, 7, 8, 9, 10, 11, 12], True)
    assert sorted(table.copies) == list(range(13)) and table.doubled() == []


def test_a_crash_before_the_bound_writes_plain_inserts_after_restart(store: FlakyStore) -> None:
    table = Table()
    checkpoint = restart(store, table)
    commit(checkpoint, read_after(checkpoint, 4))
    store.fail["put_state"] = Crash()
    with pytest.raises(Crash):
        commit(checkpoint, read_after(checkpoint, 9))
    assert table.copies[5] == 0
    again = restart(store, table)
    commit(again, read_after(again, 9))
    assert table.calls[-1] == ([5, 6, 7, 8, 9], False)
    assert table.doubled() == []


def test_records_past_the_bound_are_plain_inserts_again(store: FlakyStore) -> None:
    table = Table()
    checkpoint = restart(store, table)
    store.fail["save_position"] = Crash()
    with pytest.raises(Crash):
        commit(checkpoint, read_after(checkpoint, 4))
    again = restart(store, table)
    commit(again, read_after(again, 4))
    commit(again, read_after(again, 9))
    assert [replay for _, replay in table.calls] == [False, True, False]
    assert table.doubled() == []


def test_a_wal_switch_resets_the_bound_and_names_the_new_queue(store: FlakyStore) -> None:
    """The bound counted the old queue's offsets: kept, it would make the new queue's first
    records look like replays (harmless) and, worse, a later crash read them as plain
    inserts past a stale bound. After the switch, the new queue starts with no bound."""
    table = Table()
    checkpoint = restart(store, table)
    commit(checkpoint, read_after(checkpoint, 9))
    position = checkpoint.switch_to("kafka#1", 5000)
    assert position == Position("kafka#1", CHANNEL, b"", 5000)
    assert store.get_positions(TASK)[CHANNEL] == position
    assert RunnerState(store, TASK).inflight_bound(CHANNEL) == -1  # type: ignore[arg-type]
    again = restart(store, table)
    assert (again.backend, again.bound, again.saved_offset()) == ("kafka#1", -1, -1)
    assert not again.replaying(0)


def test_a_position_saved_by_someone_else_stops_the_channel(store: FlakyStore) -> None:
    """Compare-and-set: a second writer of the task's positions is refused, not overwritten."""
    table = Table()
    checkpoint = restart(store, table)
    commit(checkpoint, read_after(checkpoint, 4))
    other = restart(store, table)
    commit(other, read_after(other, 6))
    with pytest.raises(PositionConflictError):
        commit(checkpoint, read_after(checkpoint, 9))


def test_the_saved_offset_of_a_pulsar_position_is_read_by_the_source(store: FlakyStore) -> None:
    """A Pulsar message id is a serialized protobuf, not an 8-byte integer: the checkpoint asks
    the source for the record's order (the runner used to decode every id as little-endian)."""
    from replicator.sources.pulsar import PulsarSource
    from replicator.sources.pulsar_ids import MessageIdParts

    parts = MessageIdParts(ledger_id=7, entry_id=42)
    position = Position("pulsar", CHANNEL, parts.serialize(), 1)
    store.save_position(TASK, position, None)
    checkpoint = ChannelCheckpoint(
        store,  # type: ignore[arg-type]
        RunnerState(store, TASK),  # type: ignore[arg-type]
        TASK,
        CHANNEL,
        "pulsar",
        position,
        Table(),
        PulsarSource.offset_of,
    )
    assert checkpoint.saved_offset() == parts.offset
    assert offset_of(parts.serialize().ljust(8, b"\0")[:8]) != parts.offset


class TransactionalTable(Table):
    """A target that commits a channel's writes with its position, in one transaction (the
    Kafka target's contract, ``DurableLog``): writes wait in the open transaction."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[tuple[list[Insert | Delete], bool]] = []
        self.positions: list[Position] = []
        self.transactions = 0
        # submitted, not committed yet (until ``settle`` or the next commit), and what
        # committing it raises
        self.in_flight: list[tuple[list[tuple[list[Insert | Delete], bool]], Position]] = []
        self.fail: Exception | None = None

    def apply(self, events: Sequence[Insert | Delete], *, replay: bool = False) -> None:
        self.open.append((list(events), replay))

    def commit(self, position: Position | None) -> None:
        self.settle()
        self._transaction(self.open, position)
        self.open = []

    def submit(self, position: Position) -> None:
        self.settle()
        self.in_flight.append((self.open, position))
        self.open = []

    def settle(self) -> None:
        in_flight, self.in_flight = self.in_flight, []
        for writes, position in in_flight:
            self._transaction(writes, position)

    def _transaction(
        self, writes: list[tuple[list[Insert | Delete], bool]], position: Position | None
    ) -> None:
        if self.fail is not None:
            raise self.fail
        self.transactions += 1
        for events, _replay in writes:
            Table.apply(self, events, replay=False)  # a transaction never half-commits
        if position is not None:
            self.positions.append(position)

    def committed(self) -> Position | None:
        return self.positions[-1] if self.positions else None

    def pending(self) -> int:
        return sum(len(events) for events, _ in self.open)

    def discard(self) -> None:
        self.open.clear()


def durable_checkpoint(store: FlakyStore, table: TransactionalTable) -> ChannelCheckpoint:
    saved = store.get_positions(TASK).get(CHANNEL)
    return ChannelCheckpoint(
        store,  # type: ignore[arg-type]
        RunnerState(store, TASK),  # type: ignore[arg-type]
        TASK,
        CHANNEL,
        "kafka",
        saved,
        table,
        offset_of,
        table,
    )


def test_a_transactional_target_commits_events_with_the_position_before_the_store(
    store: FlakyStore,
) -> None:
    table = TransactionalTable()
    checkpoint = durable_checkpoint(store, table)
    checkpoint.commit(read_after(checkpoint, 4), None, 1004)  # no position: nothing committed
    assert table.copies == Counter() and saved_offset(store) == -1
    checkpoint.commit([], msg_id(4), 1004)
    assert sorted(table.copies) == [0, 1, 2, 3, 4]
    assert offset_of(table.positions[-1].msg_id) == 4 == saved_offset(store)


def test_a_store_save_failing_after_the_target_committed_rewinds_to_the_target_position(
    store: FlakyStore,
) -> None:
    """The events and position are in the target; the metastore did not take the position:
    reading again from the store's would write them twice (a transaction has no upsert).
    Issue 48, fault 7: the target's position becomes the saved one, its tick with it (the
    worker's sequencer is rebuilt from it and skips what that tick proves applied; the first
    record's ``before`` is its message id, where the metastore's moved the position back);
    the metastore's stays the next save's expectation, which brings it up."""
    table = TransactionalTable()
    checkpoint = durable_checkpoint(store, table)
    commit(checkpoint, read_after(checkpoint, 4))
    store.fail["save_position"] = MetaStoreUnavailableError("store down")
    with pytest.raises(MetaStoreUnavailableError):
        commit(checkpoint, [record(o) for o in range(5, 10)])
    assert saved_offset(store) == 4
    resume = checkpoint.rewind()
    assert resume is not None and offset_of(resume.msg_id) == 9  # the target's, newer
    assert checkpoint.saved == resume == table.positions[-1] and resume.ts == 1009
    assert saved_offset(store) == 4  # the metastore's, until the next save
    commit(checkpoint, [record(o) for o in range(10, 12)])  # the next records, not 5..9 again
    assert table.doubled() == [] and sorted(table.copies) == list(range(12))
    assert saved_offset(store) == 11 and checkpoint.saved == store.get_positions(TASK)[CHANNEL]


def test_a_backlog_is_committed_in_one_transaction_and_one_save(store: FlakyStore) -> None:
    """Reads that leave more of a backlog buffered (``more``) wait for the next: one
    transaction and one position save for all of them, none before."""
    table = TransactionalTable()
    checkpoint = durable_checkpoint(store, table)
    for lo in (0, 3, 6):
        batch = [record(o) for o in range(lo, lo + 3)]
        assert not checkpoint.commit(batch, msg_id(lo + 2), 1002 + lo, more=True)
        assert table.transactions == 0 and saved_offset(store) == -1
        assert checkpoint.deferred is not None and offset_of(checkpoint.deferred.msg_id) == lo + 2
    assert checkpoint.commit([record(9)], msg_id(9), 1009)  # the read that drained it
    assert table.transactions == 1 and sorted(table.copies) == list(range(10))
    assert saved_offset(store) == 9 and checkpoint.deferred is None
    # a transactional target keeps no in-flight bound (nothing is replayed as upserts)
    assert RunnerState(store, TASK).inflight_bound(CHANNEL) == -1  # type: ignore[arg-type]


def test_a_grouped_commit_ends_at_its_size_or_its_time(
    store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = TransactionalTable()
    checkpoint = durable_checkpoint(store, table)
    monkeypatch.setattr(checkpoint_module, "GROUP_EVENTS", 5)
    assert not checkpoint.commit([record(o) for o in range(3)], msg_id(2), 1002, more=True)
    assert checkpoint.commit([record(o) for o in range(3, 6)], msg_id(5), 1005, more=True)
    assert len(table.in_flight) == 1  # submitted: the channel reads on while it commits
    assert checkpoint.saved is not None and offset_of(checkpoint.saved.msg_id) == 5
    monkeypatch.setattr(checkpoint_module, "GROUP_SECONDS", 0.0)
    assert not checkpoint.commit([record(6)], msg_id(6), 1006, more=True)  # the first waits
    assert checkpoint.commit([record(7)], msg_id(7), 1007, more=True)  # then its time is up
    # the second submit waited for the first; the metastore took the position it committed
    assert table.transactions == 1 and saved_offset(store) == 5
    checkpoint.settle()
    assert table.transactions == 2 and saved_offset(store) == 7 and table.doubled() == []


def test_a_submitted_commit_that_fails_stops_the_channel_and_moves_no_position(
    store: FlakyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit submitted in a backlog fails while the channel reads on: the rewind that
    follows the channel's next failure must not resume after the position it carried (its
    events are not on the target): it raises the commit's failure, and nothing moved."""
    table = TransactionalTable()
    checkpoint = durable_checkpoint(store, table)
    monkeypatch.setattr(checkpoint_module, "GROUP_EVENTS", 0)
    assert checkpoint.commit(read_after(checkpoint, 4), msg_id(4), 1004, more=True)
    table.fail = SinkSessionLostError("kafka: a transaction failed")
    with pytest.raises(SinkSessionLostError):
        checkpoint.rewind()
    assert table.positions == [] and table.copies == Counter() and saved_offset(store) == -1


def test_a_milvus_target_never_waits_for_more(store: FlakyStore) -> None:
    table = Table()
    checkpoint = restart(store, table)
    assert checkpoint.commit([record(0), record(1)], msg_id(1), 1001, more=True)
    assert saved_offset(store) == 1 and table.copies == Counter({0: 1, 1: 1})


@pytest.mark.parametrize("failure", ["before_position", "grouped"])
def test_a_rewind_drops_the_events_a_transactional_target_did_not_commit(
    store: FlakyStore, failure: str
) -> None:
    """Events written to the open transaction and then a failure (the source, a DDL): reading
    again after the rewind must not commit them twice."""
    table = TransactionalTable()
    checkpoint = durable_checkpoint(store, table)
    if failure == "before_position":  # a channel's first records, before a DDL's commit
        checkpoint.commit(read_after(checkpoint, 4), None, 1004)
    else:
        assert not checkpoint.commit(read_after(checkpoint, 4), msg_id(4), 1004, more=True)
    resume = checkpoint.rewind()
    assert resume is None and checkpoint.deferred is None
    commit(checkpoint, read_after(checkpoint, 6))  # 0..6 read again from the start
    assert table.doubled() == [] and sorted(table.copies) == list(range(7))
    assert saved_offset(store) == 6
