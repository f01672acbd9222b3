"""The watch of an old primary for writes of stale clients (README "Disaster recovery").

After a switchover a -> b, a takes the reverse flow's writes (task b -> a), so nothing fences
it: a client still writing to a writes rows b never gets. The reverse task watches a's WAL for
them:

- **armed** by the switchover once the reverse task exists, while a is still fenced: the watch
  starts at the end a's DML channels have then (``dr/stale_watch`` of the reverse task), so every
  write a takes after the fence is lifted is read;
- **every round** (a few seconds apart, on the daemon that runs the reverse task) it reads what
  a's WAL took since, for the collections the reverse task replicates, and keeps the keys of
  their inserts and deletes. Those keys are read on b and on a. A key whose rows differ is read
  again once the reverse task has applied everything b held at the first read: still differing,
  with neither side changed in between (the verify's settle rule, :func:`classify.settled`), it
  is a write the reverse flow did not make. A key that moved is read again next round;
- **shown**, per collection: rows a holds that b does not (a stale insert: ``extra``), rows b
  holds that a lost (a stale delete: ``missing``) and rows a holds otherwise (``different``), when
  first and last seen (the WAL time of the record), and a sample of keys; in the reverse task's
  ``progress.stale_writes``, on /metrics (``cdc_stale_write_rows``) and as a warning in the log.
  Nothing is repaired: which side is right is the operator's call (a verify with repair of the
  reverse task makes a equal to b).

It compares states, not intents: a stale write that a later write of the same key undid before a
round looked (the stale client deleting its own insert, or b writing the key) is not seen, and a
stale write that happens to equal b's row is harmless and not counted. Keys that could not be
looked at (more than ``MAX_PENDING`` waiting) are counted as ``unchecked``, never dropped in
silence.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pymilvus import MilvusClient

from metastore import MetaStore, Position
from replicator.backfill.ranges import Key
from replicator.backfill.transfer import rows_by_key
from replicator.compare.classify import KINDS, Divergence, RangeRead, settled
from replicator.compare.digest import row_hash
from replicator.compare.gate import now_ts
from replicator.compare.reader import Schema, schema_of
from replicator.config.settings import CdcSettings
from replicator.config.task_spec import TaskSpec
from replicator.hybrid_time import to_seconds
from replicator.pipeline.runner_context import RunnerContext
from server.dr.fence import client_args
from server.dr.record import iso, moment
from server.dr.wal_tail import changed_keys, end_positions, records_after, selected_collections

log = logging.getLogger(__name__)

WATCH_KEY = "dr/stale_watch"
ROUND_SECONDS = 2.0  # between rounds
READ_SECONDS = 10.0  # a round's reading of the WAL, at most
MAX_RECORDS = 20_000  # records a round reads of one channel, at most
MAX_PENDING = 100_000  # keys waiting for a look, over every collection
SETTLE_SECONDS = 30.0  # a round's wait for the reverse task to apply what b held
SAMPLE = 10  # keys shown per collection
MAX_COUNTED = 10_000  # stale keys remembered per collection (beyond: a key may count twice)


@dataclass
class Found:
    """What the watch found in one collection."""

    extra: int = 0
    missing: int = 0
    different: int = 0
    first_seen: str = ""
    last_seen: str = ""
    sample: list[Key] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.extra + self.missing + self.different


@dataclass
class WatchState:
    """The watch as the metastore keeps it, under the reverse task's state."""

    task_id: str  # the reverse task (b -> a)
    watched: str  # a: the old primary, the task's target
    peer: str  # b: the new primary, the task's source
    job_id: str  # the switchover that armed it
    armed_at: str
    positions: dict[str, dict[str, Any]] = field(default_factory=dict)  # Position.to_json
    pending: dict[str, list[list[Any]]] = field(default_factory=dict)  # "db.coll" -> [key, ts]
    records_read: int = 0
    keys_checked: int = 0
    unchecked: int = 0
    stale: dict[str, Found] = field(default_factory=dict)  # "db.coll" -> found
    # the stale keys counted, with their two rows' hashes: a key read again (an upsert's delete
    # and insert in two rounds) is counted once, unless its rows changed
    counted: dict[str, list[list[Any]]] = field(default_factory=dict)  # "db.coll" -> [key, sig]
    watched_up_to: dict[str, Any] | None = None  # the start of the last round read to the end
    gap: str = ""  # writes the watch could not see (its arming could not read the WAL)
    problem: str = ""  # why the last round did not look at everything

    @property
    def stale_rows(self) -> int:
        return sum(found.rows for found in self.stale.values())

    def view(self) -> dict[str, Any]:
        return {
            "watching": self.watched,
            "against": self.peer,
            "job_id": self.job_id,
            "armed_at": self.armed_at,
            "watched_up_to": self.watched_up_to,
            "records_read": self.records_read,
            "keys_checked": self.keys_checked,
            "keys_pending": sum(len(keys) for keys in self.pending.values()),
            "unchecked": self.unchecked,
            "stale_rows": self.stale_rows,
            "collections": {
                name: {**asdict(found), "rows": found.rows} for name, found in self.stale.items()
            },
            "gap": self.gap or None,
            "problem": self.problem or None,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> WatchState:
        data = json.loads(raw)
        data["stale"] = {name: Found(**found) for name, found in data.get("stale", {}).items()}
        return cls(**data)


def load_watch(store: MetaStore, task_id: str) -> WatchState | None:
    raw = store.get_state(task_id, WATCH_KEY)
    return None if raw is None else WatchState.from_bytes(raw)


def save_watch(store: MetaStore, state: WatchState) -> None:
    store.put_state(state.task_id, WATCH_KEY, state.to_bytes())


def arm(
    store: MetaStore, context: RunnerContext, task_id: str, watched: str, peer: str, job_id: str
) -> WatchState:
    """Start watching ``watched``'s WAL from its channels' ends now (it is still fenced)."""
    state = WatchState(task_id, watched, peer, job_id, iso(time.time()))
    try:
        state.positions = {ch: p.to_json() for ch, p in end_positions(context).items()}
    except Exception as exc:  # noqa: BLE001 - the watch says why it starts late
        state.gap = f"the WAL of {watched} was not read when the watch was armed: {exc}"
    save_watch(store, state)
    return state


class StaleWriteWatch:
    """The rounds of one reverse task's watch (in threads; :meth:`round` is one)."""

    def __init__(
        self,
        settings: CdcSettings,
        context: RunnerContext,
        spec: TaskSpec,
        applied: Callable[[], int],
        refresh_consistent_ts: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        self.settings = settings
        self.context = context
        self.spec = spec
        self.applied = applied  # the reverse task's consistent-up-to (hybrid; 0 unknown)
        self.refresh_consistent_ts = refresh_consistent_ts
        self.stop = stop
        self._clients: dict[tuple[str, str], MilvusClient] = {}

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def round(self, state: WatchState) -> list[str]:
        """Read what the watched WAL took since the last round and judge its keys; the
        collections where new stale rows were found."""
        started = time.time()
        if not state.positions:  # armed without a read of the WAL: from its end now
            state.positions = {ch: p.to_json() for ch, p in end_positions(self.context).items()}
            state.gap = f"{state.gap}; writes before {iso(started)} not watched"
            return []
        complete = self._read(state)
        if complete:
            state.watched_up_to = moment(started)
        return self._judge(state)

    # --- reading -----------------------------------------------------------------------------
    def _read(self, state: WatchState) -> bool:
        selected = selected_collections(self.context, self.spec)
        source = self.context.source()
        deadline = time.monotonic() + READ_SECONDS
        complete = True
        for pchannel in self.context.channels:
            saved = state.positions.get(pchannel)
            start = Position.from_json(saved) if saved else None
            last: Position | None = None
            count = 0
            try:
                for event, record in records_after(
                    source, pchannel, start, selected, deadline, MAX_RECORDS
                ):
                    count += 1
                    ts = event.ts if event is not None else (last.ts if last else 0)
                    last = Position(source.backend, pchannel, record.msg_id, ts)
                    if event is None:
                        continue
                    meta = selected[event.collection_id]
                    name = f"{meta.db_name or 'default'}.{meta.name}"
                    self._keep(state, name, changed_keys(event, meta), event.ts)
            except TimeoutError:
                complete = False
            if count >= MAX_RECORDS:
                complete = False
            state.records_read += count
            if last is not None:
                state.positions[pchannel] = last.to_json()
        return complete

    def _keep(self, state: WatchState, name: str, keys: list[Key], ts: int) -> None:
        pending = state.pending.setdefault(name, [])
        room = MAX_PENDING - sum(len(k) for k in state.pending.values())
        if len(keys) > room:
            state.unchecked += len(keys) - max(room, 0)
            keys = keys[: max(room, 0)]
        pending.extend([key, ts] for key in keys)

    # --- judging -----------------------------------------------------------------------------
    def _judge(self, state: WatchState) -> list[str]:
        grown: list[str] = []
        for name, entries in list(state.pending.items()):
            first_ts: dict[Key, int] = {}
            for key, ts in entries:
                first_ts.setdefault(key, ts)
            db, _, collection = name.partition(".")
            try:
                divergence, moving, rows = self._compare(state, db, collection, list(first_ts))
            except Exception as exc:  # noqa: BLE001 - a side not answering: next round
                state.problem = f"{name}: not compared: {type(exc).__name__}: {exc}"
                log.warning("stale-write watch of %s: %s", state.watched, state.problem)
                continue
            state.problem = ""
            state.keys_checked += len(first_ts) - len(moving)
            state.pending[name] = [[k, first_ts[k]] for k in moving]
            if not state.pending[name]:
                del state.pending[name]
            divergence = self._new(state, name, divergence, rows)
            if divergence:
                self._record(state, name, divergence, first_ts)
                grown.append(name)
        return grown

    @staticmethod
    def _new(state: WatchState, name: str, divergence: Divergence, rows: RangeRead) -> Divergence:
        """The part of ``divergence`` not counted before with the same rows."""
        counted: dict[Key, str] = {key: sig for key, sig in state.counted.get(name, [])}  # noqa: C416
        fresh = []
        for key in divergence.keys:
            sig = f"{rows.source.get(key, 0):x}:{rows.target.get(key, 0):x}"
            if counted.get(key) != sig:
                counted[key] = sig
                fresh.append(key)
        if fresh:
            state.counted[name] = [[k, sig] for k, sig in counted.items()][-MAX_COUNTED:]
        return divergence.only(fresh)

    def _client(self, cluster: str, db: str) -> MilvusClient:
        client = self._clients.get((cluster, db))
        if client is None:
            args = client_args(self.settings.cluster(cluster))
            client = MilvusClient(**args, db_name=db, timeout=30)
            self._clients[(cluster, db)] = client
        return client

    def _compare(
        self, state: WatchState, db: str, collection: str, keys: list[Key]
    ) -> tuple[Divergence, frozenset[Key], RangeRead]:
        """(the settled divergence of ``keys`` between b and a, the keys that moved, the read
        it was settled on)."""
        peer, watched = self._client(state.peer, db), self._client(state.watched, db)
        schema = schema_of(peer, collection)
        asked = now_ts()
        before = RangeRead(
            _hashes(peer, collection, schema, keys), _hashes(watched, collection, schema, keys)
        )
        suspects = sorted(before.divergence.keys, key=lambda k: (isinstance(k, str), k))
        if not suspects:
            return Divergence(), frozenset(), before
        if not self._applied_since(asked):
            return Divergence(), frozenset(suspects), before
        after = RangeRead(
            _hashes(peer, collection, schema, suspects),
            _hashes(watched, collection, schema, suspects),
        )
        return (*settled(before, after), after)

    def _applied_since(self, ts: int) -> bool:
        """Wait until the reverse task has applied everything b held at ``ts``."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.applied() < ts:
            if time.monotonic() >= deadline or self.stop.is_set():
                return False
            self.refresh_consistent_ts()
            self.stop.wait(0.25)
        return True

    def _record(
        self, state: WatchState, name: str, divergence: Divergence, first_ts: dict[Key, int]
    ) -> None:
        found = state.stale.setdefault(name, Found())
        for kind in KINDS:
            setattr(found, kind, getattr(found, kind) + len(divergence.of(kind)))
        seen = sorted(first_ts[k] for k in divergence.keys)
        first, last = iso(to_seconds(seen[0])), iso(to_seconds(seen[-1]))
        found.first_seen = min(found.first_seen or first, first)
        found.last_seen = max(found.last_seen, last)
        keys = sorted(divergence.keys, key=lambda k: (isinstance(k, str), k))
        found.sample = (found.sample + keys)[:SAMPLE]
        log.warning(
            "%s holds writes the reverse flow did not make (stale clients?) in %s: "
            "%d extra, %d missing, %d different row(s) against %s, first seen %s; keys %s",
            state.watched,
            name,
            len(divergence.extra),
            len(divergence.missing),
            len(divergence.different),
            state.peer,
            first,
            keys[:SAMPLE],
        )


def _hashes(
    client: MilvusClient, collection: str, schema: Schema, keys: list[Key]
) -> dict[Key, int]:
    return {
        row[schema.pk]: row_hash(row, schema.kinds)
        for row in rows_by_key(client, collection, schema.pk, keys)
    }
