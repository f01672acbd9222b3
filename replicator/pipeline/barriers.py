"""Coordination between the channel workers of one task: every rule that makes one channel wait
for, or leave something to, another.

- **DDL lock.** One DDL at a time, across the task's channels (a collection's creation and its
  drop read on two channels must not interleave on the target).
- **2.3 drop barriers.** A DropCollection (or DropPartition) has a copy on every channel of the
  collection. It is applied when the last channel reaches its copy, so rows a slower channel
  still holds before the drop reach the target first.
- **2.6 broadcast turns.** A broadcast DDL has one copy per vchannel (``meta.broadcast``). A
  create or alter applies at the first copy; a drop or truncate (``barrier``) at the last. A
  channel that reaches the copy of a truncate or partition drop early *waits* there: the
  collection lives on, and what it writes next would be wiped when the last channel got there.
- **WAL switch copies.** The ``_mq_switch_*`` announcement is a broadcast; a pchannel that holds
  several of its vchannels switches at its last local copy.

What has reached a barrier is kept in the task's state (:class:`RunnerState`), so a restart
between two copies neither forgets the first nor applies anything twice.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from typing import Any

from replicator.codec.streaming_events import StreamMeta
from replicator.pipeline.registry import CollectionRegistry
from replicator.pipeline.task_state import RunnerState

log = logging.getLogger(__name__)


class Barriers:
    def __init__(
        self,
        state: RunnerState,
        registry: CollectionRegistry,
        ddl_lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        """``ddl_lock``: one shared by the processes of a task's channel groups (their barrier
        sets are in the metastore, read and written under it); a lock of its own otherwise."""
        self._state = state
        self._registry = registry
        self.ddl_lock: AbstractContextManager[Any] = ddl_lock or threading.Lock()
        self._applied = threading.Condition()
        self._done: set[int] = set()  # broadcasts applied by this runner

    # --- 2.3 drops ---------------------------------------------------------------------------
    def drop_reached(self, collection_id: int, pchannel: str) -> bool:
        """``pchannel`` read the collection's DropCollection: has every channel of it now?"""
        arrived = self._state.arrive_at_drop(collection_id, pchannel)
        return self._all_of(collection_id, pchannel, arrived)

    def partition_drop_reached(self, collection_id: int, partition: str, pchannel: str) -> bool:
        arrived = self._state.arrive_at_partition_drop(collection_id, partition, pchannel)
        return self._all_of(collection_id, pchannel, arrived)

    def _all_of(self, collection_id: int, pchannel: str, arrived: frozenset[str]) -> bool:
        return (self._registry.pchannels(collection_id) or {pchannel}) <= arrived

    # --- 2.6 broadcasts ----------------------------------------------------------------------
    def turn(self, meta: StreamMeta, barrier: bool) -> bool:
        """Is this copy the one that applies its broadcast? Call under the DDL lock."""
        header = meta.broadcast
        if header is None:
            return True  # a message for one vchannel
        progress = self._state.broadcast(header.broadcast_id)
        if progress.done:
            return False
        if not barrier:
            return True
        arrived = progress.arrived | {meta.vchannel}
        if set(header.vchannels) <= arrived:
            return True
        log.info(
            "%s %d: %d of %d vchannels have reached it",
            meta.type_name,
            header.broadcast_id,
            len(arrived & set(header.vchannels)),
            len(header.vchannels),
        )
        self._state.broadcast_arrived(header.broadcast_id, arrived)
        return False

    def applied(self, meta: StreamMeta) -> None:
        """The broadcast was applied: recorded, and channels waiting at it go on."""
        if meta.broadcast is None:
            return
        broadcast_id = meta.broadcast.broadcast_id
        self._state.broadcast_done(broadcast_id)
        with self._applied:
            self._done.add(broadcast_id)
            self._applied.notify_all()

    def wait_applied(self, meta: StreamMeta, stop: threading.Event) -> None:
        """Wait at a copy until its broadcast was applied (by the last channel to reach it,
        possibly before a restart), or until ``stop``."""
        assert meta.broadcast is not None
        broadcast_id = meta.broadcast.broadcast_id
        log.info("waiting at %s %d for the other vchannels", meta.type_name, broadcast_id)
        with self._applied:
            while not stop.is_set():
                if broadcast_id in self._done or self._state.broadcast(broadcast_id).done:
                    return
                self._applied.wait(1.0)

    # --- WAL switch copies -------------------------------------------------------------------
    def switch_copies_read(
        self, meta: StreamMeta, pchannel: str, local_vchannels: frozenset[str]
    ) -> bool:
        """Has ``pchannel`` read its last copy of a switch broadcast (this one included)?"""
        if meta.broadcast is None or len(local_vchannels) <= 1:
            return True
        arrived = self._state.arrive_at_switch(meta.broadcast.broadcast_id, pchannel, meta.vchannel)
        return local_vchannels <= arrived
