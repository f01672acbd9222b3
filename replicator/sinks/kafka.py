"""A Kafka target: the task's changes as JSON events on a topic, exactly once.

Exactly once, for consumers reading with ``isolation.level=read_committed``:

- **Rows.** Each channel collects its row events in a :class:`ChannelLog`. When the channel
  saves its position, the events and the position go in ONE Kafka transaction: the events to
  the event topic, the position to the daemon's own positions topic (as Kafka Connect's
  exactly-once sources keep their offsets). The metastore's position is saved after.
- **DDL.** A change of the target's metadata (create or drop a collection, a partition, an
  index, an alias, a database) is committed at once, its events and the whole
  :class:`~replicator.sinks.target_model.TargetModel` in one transaction. Before a channel
  applies a DDL, it commits its rows with the position just before the DDL's record (see
  ``ChannelWorker``), so a collection's rows and its DDL reach the topic in source order.
  Read again after a crash, a DDL is answered "already exists" or "not found" by the model,
  as a Milvus would, and is not announced twice.
- **Restarts.** A task starts from the positions its positions topic holds, read with
  ``read_committed`` (:mod:`kafka_positions`): a transaction a crash left open is aborted by
  the broker (our ``init_transactions`` with the task's ``transactional.id`` aborts it and
  fences the old producer), a read_committed consumer never sees its events, and its records
  are read from the source again. A metastore position ahead of the topic's (a channel that
  moved with no event to write) is kept: nothing between them was written.

Any failure of a transaction stops the task's workers with :class:`SinkSessionLostError`; the
runner connects again and starts over from what Kafka committed. The channel workers of a task
share one target (one producer); transactions are serialized by a lock. A commit serializes its
events before it takes the lock (while another channel's transaction commits) and produces them
in their order.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from itertools import chain, repeat
from operator import length_hint
from typing import Any

from confluent_kafka import (
    KafkaError,
    KafkaException,
    Producer,
)
from pymilvus.grpc_gen import schema_pb2

from metastore import Position
from replicator.errors import (
    SinkError,
    SinkSessionLostError,
    TargetRejectedError,
    TargetUnavailableError,
)
from replicator.sinks.kafka_columns import Entry, Event, Rows, Run, topic_runs
from replicator.sinks.kafka_commits import Commit, Committer
from replicator.sinks.kafka_events import ddl_key, dumps, ts_view
from replicator.sinks.kafka_positions import (
    DEFAULT_POSITIONS_TOPIC,
    MODEL_KEY,
    READ_STATE_TIMEOUT,
    client_config,
    ensure_positions_topic,
    read_state,
)
from replicator.sinks.milvus import MilvusTarget
from replicator.sinks.target_capabilities import KAFKA, Target
from replicator.sinks.target_model import Change, TargetModel

log = logging.getLogger(__name__)

# a Kafka broker's default largest record (message.max.bytes, 1 MiB plus its batch overhead)
MAX_EVENT_BYTES = 1_000_000
# the model is written again with a commit this long after it was last written, so a positions
# topic that is not compacted (its records expire) still holds it at the next start
MODEL_REFRESH_SECONDS = 6 * 3600.0
_READS = ("Has", "Show", "Describe", "List", "GetLoadState")
# how long a produce refused by the full local queue waits before it is tried again: with
# delivery reports for failed records only, poll() has nothing to return early for and waits
# all of it (0.1 s cost a 300,000-event catch-up about 8% of its time, once a transaction held
# more than the queue's 100,000 messages)
QUEUE_FULL_WAIT = 0.005
# a target's producer settings but its address, security and transactional id
PRODUCER_SETTINGS: dict[str, Any] = {
    "transaction.timeout.ms": 60_000,
    "linger.ms": 5,
    "partitioner": "murmur2_random",  # what Java clients use for the same key
    "message.max.bytes": 16 * 1024 * 1024,
    # a report for a failed record only (_delivered): none for each of the others
    "delivery.report.only.error": True,
}


def produce_runs(producer: Producer, runs: list[Run]) -> None:
    """A transaction's runs, in order, by ``produce`` mapped over every message's topic, key
    and value: one call in C, which holds the interpreter lock from the first message to the
    last (a transaction's runs, hundreds in a catch-up, no longer give it up between them;
    2-4 % more events a second, within the bench's noise). A ``produce_batch`` of the same
    took 0.4 µs a message more (a dict each, and its delivery callback given per message).
    When the local queue is full, the message refused and every one after it are given again
    once it drained (the order holds); any other refusal fails the transaction."""
    topics = list(chain.from_iterable(repeat(topic, len(values)) for topic, _, values in runs))
    keys = list(chain.from_iterable(keys for _, keys, _ in runs))
    values = list(chain.from_iterable(values for _, _, values in runs))
    produce = producer.produce
    while values:
        left = iter(values)
        try:
            deque(map(produce, topics, left, keys), maxlen=0)
            return
        except BufferError:  # at the value just taken from `left`
            start = len(values) - length_hint(left) - 1
            topics, keys, values = topics[start:], keys[start:], values[start:]
            producer.poll(QUEUE_FULL_WAIT)


def transactional_id(task_id: str, group: str = "") -> str:
    """The producer's ``transactional.id`` of a task (``group``: of one channel group)."""
    return f"milvus-cdc.{task_id}" + (f".{group}" if group else "")


def topic_for(template: str, db: str, collection: str) -> str:
    return template.replace("{db}", db).replace("{collection}", collection)


class ChannelLog:
    """The row events one channel wrote since its last commit, kept as (topic, key, value) and
    inserts' :class:`Rows`, serialized whole at the commit, when the commit's id and position
    are known."""

    def __init__(self, target: KafkaTarget, pchannel: str) -> None:
        self._target = target
        self.pchannel = pchannel
        self.events: list[Entry] = []
        self._count = 0  # events, an insert's rows each
        self._in_flight: Commit | None = None  # submitted, its transaction not ended yet

    def add(self, topic: str, key: bytes, value: dict[str, Any]) -> int:
        """One event; its index in ``events`` (an insert of the same key and time may take
        its place, see ``kafka_columns.insert_events``)."""
        self.events.append((topic, key, value))
        self._count += 1
        return len(self.events) - 1

    def add_rows(self, rows: Rows) -> None:
        self.events.append(rows)
        self._count += len(rows.keys)

    def commit(self, position: Position | None) -> None:
        """The events and ``position`` in one transaction (the metastore's save follows),
        committed when it returns, with the channel's commits submitted before."""
        handed = self._target.commit(
            self.pchannel, self.events, position, count=self._count, wait=False
        )
        self.discard()
        self.settle()
        if handed is not None:
            handed.wait()

    def submit(self, position: Position) -> None:
        """What ``commit`` does, without waiting for the broker: the channel reads on while
        the transaction is committed. Once the channel's previous submitted commit ended
        (raising what failed it): one at a time is in flight, so memory stays bounded."""
        self.settle()
        self._in_flight = self._target.commit(
            self.pchannel, self.events, position, count=self._count, wait=False
        )
        self.discard()

    def settle(self) -> None:
        """Wait for the submitted commit (raising what failed it)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.wait()

    def committed(self) -> Position | None:
        """The channel's last position Kafka committed (this connection's or before it)."""
        return self._target.committed_positions.get(self.pchannel)

    def pending(self) -> int:
        return self._count

    def discard(self) -> None:
        self.events = []
        self._count = 0


class KafkaTarget(MilvusTarget):
    """A ``kafka_connect_param`` target. Its metadata calls are answered by the model (see
    :mod:`target_model`); its writes are events (see :mod:`kafka_events`)."""

    def __init__(
        self,
        params: dict[str, Any],
        task_id: str,
        incarnation: str,
        timeout: float = 60.0,
        state_timeout: float = READ_STATE_TIMEOUT,
        group: str = "",
    ) -> None:
        """``group``: a channel group's producer (:mod:`kafka_groups`): its transactional id
        is the task's plus the group; it never writes the model (the task's DDL is made by the
        parent's target, see ``answer``)."""
        # no gRPC channel: nothing of MilvusTarget's connection is used
        self.address = params["address"]
        self._timeout = timeout
        self.fence = None
        self.topic = str(params["topic"])
        self.ddl_topic = str(params.get("ddl_topic") or "")
        self.positions_topic = str(params.get("positions_topic") or DEFAULT_POSITIONS_TOPIC)
        self.task_id = task_id
        self._prefix = f"{task_id}@{incarnation}/"
        self._lock = threading.RLock()  # the model's changes
        self._closed = False
        self._committer = Committer(
            f"kafka-commit-{task_id}",
            self._transact,
            f"kafka {self.address}: the target is closed",
        )
        config = client_config(params)
        self._producer = Producer(
            {
                **config,
                "transactional.id": transactional_id(task_id, group),
                **PRODUCER_SETTINGS,
                "on_delivery": self._delivered,
            }
        )
        self.max_event_bytes = int(params.get("max_event_bytes") or MAX_EVENT_BYTES)
        self._refused: KafkaError | None = None  # a record the broker refused for good
        try:
            # aborts what a crashed predecessor left open and fences it (a real broker)
            self._producer.init_transactions(timeout)
        except KafkaException as exc:
            raise TargetUnavailableError(
                f"kafka {self.address}: cannot start transactions: {exc.args[0].str()}"
            ) from None
        ensure_positions_topic(config, self.positions_topic)
        positions, model = read_state(config, self.positions_topic, self._prefix, state_timeout)
        self.committed_positions: dict[str, Position] = positions
        self.model = TargetModel.from_json(model) if model else TargetModel()
        self._model_written = time.monotonic() if model else float("-inf")
        if group:
            self._model_written = float("inf")  # the parent's target writes the model

    # --- what Kafka committed -------------------------------------------------------------------
    # --- the Milvus calls, answered by the model -----------------------------------------------
    def close(self) -> None:
        self._committer.close()  # a transaction under way ends first; those queued fail
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._producer.flush(5)
            except Exception:
                log.debug("kafka producer flush on close failed", exc_info=True)

    def target(self) -> Target:
        """A topic holds every type: its events are JSON."""
        return KAFKA

    def sibling(self) -> MilvusTarget:
        """The same target for another thread of the task (one model, one producer)."""
        return _Sibling(self)

    def channel_log(self, pchannel: str) -> ChannelLog:
        return ChannelLog(self, pchannel)

    def _call(self, method: str, request: Any, what: str) -> Any:
        """A call answered by the model; a change is committed at once, its DDL events and the
        model in one transaction (so the change is announced exactly once: read again after a
        restart, it is answered "already exists" or "not found", as a Milvus would)."""
        if self.fence is not None:
            self.fence.check()
        with self._lock:
            if method.startswith(_READS):
                return self.model.handle(method, request)[0]
            changed = self.model.copy()
            response, changes = changed.handle(method, request)
            if not changes and changed.state == self.model.state:
                return response  # nothing changed (a flush, the same index again)
            events = [self._ddl_event(change) for change in changes]
            self.commit("", events, None, model=changed)
            self.model = changed
            return response

    def answer(self, method: str, request: Any, what: str) -> tuple[Any, dict[str, Any]]:
        """A call of a channel group's target (:mod:`kafka_groups`), made here: its answer
        and the model as it is after it."""
        response = self._call(method, request, what)
        with self._lock:
            return response, self.model.state

    def _ddl_event(self, change: Change) -> Event:
        topic = self.ddl_topic or topic_for(self.topic, change.db, change.collection)
        what = change.op.split("_", 1)[1] if "_" in change.op else change.op
        name = str(
            change.detail.get("partition")
            or change.detail.get("index")
            or change.detail.get("alias")
            or ""
        )
        value = {
            "op": change.op,
            "db": change.db,
            "collection": change.collection or None,
            **change.detail,
            "ts": ts_view(None),
        }
        return topic, ddl_key(change.db, change.collection, f"{what}:{name}"), value

    def insert(
        self,
        db: str,
        collection: str,
        partition: str,
        fields_data: Sequence[schema_pb2.FieldData],
        num_rows: int,
        *,
        upsert: bool = False,
        more: Sequence[Sequence[schema_pb2.FieldData]] = (),
    ) -> None:
        raise SinkError("a Kafka target is written by its channel writer, not by insert()")

    def delete(self, db: str, collection: str, partition: str, pk_name: str, keys: Any) -> None:
        raise SinkError("a Kafka target is written by its channel writer, not by delete()")

    def row_topic(self, db: str, collection: str) -> str:
        return topic_for(self.topic, db, collection)

    # --- commits --------------------------------------------------------------------------------
    def commit(
        self,
        pchannel: str,
        events: Sequence[Entry],
        position: Position | None,
        *,
        model: TargetModel | None = None,
        count: int | None = None,
        wait: bool = True,
    ) -> Commit | None:
        """One transaction holds ``events``, then ``model`` (DDL), then ``position`` (a
        channel's; its record says ``count`` events, default one an entry), made by the
        committer's thread (:mod:`kafka_commits`) with every commit submitted before it.
        Returns once it is committed; ``wait`` False: at once, ``wait()`` on what it returns
        (None: nothing to commit) ends with its transaction.

        The events are serialized here, in the caller's thread, while the committer's
        transaction waits for the broker."""
        if not events and position is None and model is None:
            return None
        if self.fence is not None:
            self.fence.check()
        commit_id = uuid.uuid4().hex
        source = {
            "channel": pchannel or None,
            "position": position.msg_id.hex() if position is not None else None,
            "commit": commit_id,
        }
        runs: list[Run] | BaseException
        try:
            runs = topic_runs(events, source, self.max_event_bytes)
        except Exception as exc:  # noqa: BLE001 - raised in the transaction, which it aborts
            runs = exc
        record = None
        if position is not None:
            record = dumps(
                {
                    "task_id": self.task_id,
                    "channel": position.pchannel,
                    "backend": position.backend,
                    "msg_id": position.msg_id.hex(),
                    "ts": position.ts,
                    "commit": commit_id,
                    "events": len(events) if count is None else count,
                }
            )
        handed = self._committer.submit(Commit(pchannel, commit_id, runs, model, position, record))
        if wait:
            handed.wait()
        return handed

    def _transact(self, commits: list[Commit]) -> None:
        """One transaction of ``commits`` (the committer's thread)."""
        model = next((c.model for c in reversed(commits) if c.model is not None), None)
        if model is None and time.monotonic() - self._model_written > MODEL_REFRESH_SECONDS:
            model = self.model  # every change is committed at once: this is the committed one
            commits[-1].model = model
        channels = ", ".join(dict.fromkeys(c.pchannel or "(ddl)" for c in commits))
        try:
            if self._closed:
                raise SinkSessionLostError(f"kafka {self.address}: the target is closed")
            self._producer.begin_transaction()
            runs: list[Run] = []
            for commit in commits:
                if isinstance(commit.runs, BaseException):
                    raise commit.runs
                runs += commit.runs
            for commit in commits:  # then each commit's model and position, after every event
                if commit.model is not None:
                    state = {"commit": commit.commit_id, "state": commit.model.state}
                    runs.append((self.positions_topic, [self._key(MODEL_KEY)], [dumps(state)]))
                if commit.position_record is not None:
                    key = self._key(commit.pchannel)
                    runs.append((self.positions_topic, [key], [commit.position_record]))
            produce_runs(self._producer, runs)
            remaining = self._timeout
            if self.fence is not None:
                self.fence.check()
                remaining = min(remaining, self.fence.remaining())
            self._producer.commit_transaction(remaining)
        except KafkaException as exc:
            self._abort()
            refused, self._refused = self._refused, None
            if refused is not None:  # not a matter of trying again: the task stops
                raise TargetRejectedError(
                    f"kafka {self.address}: the broker refused a record of channel "
                    f"{channels}: {refused.str()}"
                ) from None
            raise SinkSessionLostError(
                f"kafka {self.address}: a transaction of channel {channels} "
                f"failed: {exc.args[0].str()}"
            ) from None
        except BaseException:
            self._abort()
            raise
        if model is not None:
            self._model_written = time.monotonic()
        for commit in commits:
            if commit.position is not None:
                self.committed_positions[commit.pchannel] = commit.position

    def _delivered(self, error: KafkaError | None, _message: Any) -> None:
        """A record's delivery report (only failed ones are reported): a refusal that retrying
        cannot change is kept, and the commit that fails with it stops the task with it."""
        if error is not None and not error.retriable() and self._refused is None:
            self._refused = error

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(10)
        except Exception:
            log.debug("abort_transaction failed", exc_info=True)
        # whatever this target committed is read again by the next connection
        self._closed = True

    def _key(self, name: str) -> bytes:
        return f"{self._prefix}{name}".encode()


class _Sibling(MilvusTarget):
    """Another thread's handle on a KafkaTarget (the alias mirror's): its calls are the owner's
    (one model, one producer); closing it closes nothing, the owner's workers may still be
    committing."""

    def __init__(self, owner: KafkaTarget) -> None:  # no gRPC channel: nothing of its own
        self._owner = owner
        self.address = owner.address
        self.fence = owner.fence

    def _call(self, method: str, request: Any, what: str) -> Any:
        return self._owner._call(method, request, what)

    def target(self) -> Target:
        return KAFKA

    def close(self) -> None:
        pass


__all__ = ["PRODUCER_SETTINGS", "ChannelLog", "KafkaTarget", "produce_runs"]
