"""Following a source that moves its WAL to another message queue while running.

Two messages announce it (MILVUS-WIRE.md, "Switching the WAL"): the ``_mq_switch_*`` ManualFlush
(seeds/mq-switch-api.zh.md; a broadcast to every vchannel, so a pchannel may hold several
copies) and released Milvus's AlterWAL (one ``_pcl`` copy per pchannel). Per pchannel, the switch
tick ``T`` is that of its last copy. The reader applies everything with a tick up to ``T`` from
the old backend, saves a position on the new backend that says "from its earliest record, after
tick T", and goes on there; records at or before ``T`` on the new backend are dropped as
already applied (the sequencer's released tick does that).

Positions name their backend (``wal_backend.py``); the task's state keeps how to reach each
switched-to backend. That record is written before the position, so a restart at any point reads
either the old backend (and meets the switch again) or the new one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from replicator.codec.streaming import vchannel_pchannel
from replicator.codec.streaming_events import AlterWAL, MqSwitchAnnounced
from replicator.errors import SourceConfigError, TaskFailedError, UnfollowableSwitchError
from replicator.pipeline.barriers import Barriers
from replicator.pipeline.checkpoint import ChannelCheckpoint
from replicator.pipeline.task_state import RunnerState
from replicator.pipeline.wal_backend import OpenWal, WalSwitch, parse_backend
from replicator.sources.base import WalSource

log = logging.getLogger(__name__)

READABLE_KINDS = ("kafka", "rocksmq", "pulsar")


def requested_switch(
    event: MqSwitchAnnounced | AlterWAL, current_backend: str
) -> tuple[str, dict[str, str]]:
    """(kind, config) the source moves to; an error when it is nothing this daemon reads."""
    kind = (event.target_type if isinstance(event, MqSwitchAnnounced) else event.target_wal).lower()
    if kind not in READABLE_KINDS:
        raise UnfollowableSwitchError(
            f"the source switched its WAL from {current_backend} to {kind!r}, which this daemon "
            f"cannot read (it reads {', '.join(READABLE_KINDS)})"
        )
    return kind, dict(event.config)


def local_copies(event: MqSwitchAnnounced | AlterWAL, pchannel: str) -> frozenset[str]:
    """The vchannels of the switch broadcast that live on ``pchannel``."""
    header = event.meta.broadcast
    if header is None:
        return frozenset({event.meta.vchannel or pchannel})
    return frozenset(v for v in header.vchannels if vchannel_pchannel(v) == pchannel)


def describe_config(config: Mapping[str, str]) -> str:
    """The setting names only: values may be secrets."""
    return ", ".join(sorted(config)) or "none (the daemon's settings for that backend)"


class SwitchFollower:
    """One channel's side of a switch: when its last copy is released, where it goes on."""

    def __init__(
        self, pchannel: str, state: RunnerState, barriers: Barriers, open_wal: OpenWal | None
    ) -> None:
        self.pchannel = pchannel
        self._state = state
        self._barriers = barriers
        self._open_wal = open_wal  # None: this runner cannot follow a switch

    def switch_point(self, event: MqSwitchAnnounced | AlterWAL, backend: str) -> WalSwitch | None:
        """The switch, once this channel's last copy of its broadcast is released; None at
        an earlier copy (the announcement has a copy per vchannel)."""
        try:
            kind, config = requested_switch(event, backend)
        except UnfollowableSwitchError as exc:
            raise UnfollowableSwitchError(f"channel {self.pchannel}: {exc}") from exc
        local = local_copies(event, self.pchannel)
        if not self._barriers.switch_copies_read(event.meta, self.pchannel, local):
            return None
        return WalSwitch(kind, config, event.ts, parse_backend(backend)[1] + 1)

    def follow(
        self, switch: WalSwitch, checkpoint: ChannelCheckpoint, left_behind: bool
    ) -> WalSource:
        """Everything up to the switch tick is applied: record the new WAL, then a position
        at its start; the source to read on. ``left_behind``: records younger than the switch
        were still on the old WAL (they are expected on the new one)."""
        if self._open_wal is None:
            raise TaskFailedError(
                f"channel {self.pchannel}: the source switched its WAL to {switch.kind}; "
                "this runner was built without a way to open another WAL"
            )
        if left_behind:
            log.warning(
                "records younger than the WAL switch at ts %d were still on %s; they are "
                "expected on %s",
                switch.switch_ts,
                checkpoint.backend,
                switch.kind,
            )
        try:
            source = self._open_wal(switch.kind, switch.config)
        except SourceConfigError as exc:
            raise TaskFailedError(
                f"channel {self.pchannel}: the source switched its WAL at ts "
                f"{switch.switch_ts}: {exc}"
            ) from exc
        self._state.record_switch(self.pchannel, switch)
        checkpoint.switch_to(switch.backend, switch.switch_ts)
        log.info(
            "the source switched its WAL at ts %d: reading %s on %s (settings given: %s)",
            switch.switch_ts,
            self.pchannel,
            switch.backend,
            describe_config(switch.config),
        )
        return source
