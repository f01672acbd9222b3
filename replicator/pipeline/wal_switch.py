"""Following a source that moves its WAL to another message queue while running.

Two messages announce it (MILVUS-WIRE.md, "Switching the WAL"): the ``_mq_switch_*`` ManualFlush
(seeds/mq-switch-api.zh.md; a broadcast to every vchannel, so a pchannel may hold several
copies) and released Milvus's AlterWAL (one ``_pcl`` copy per pchannel). Per pchannel, the switch
tick ``T`` is that of its last copy. The reader applies everything with a tick up to ``T`` from
the old backend, saves a position on the new backend that says "from its earliest record, after
tick T", and goes on there; records at or before ``T`` on the new backend are dropped as
already applied (the sequencer's released tick does that).

Positions name their backend: ``kafka`` is the daemon's configured source; after the n-th switch
of a pchannel it is ``<kind>#<n>`` and the task's state keeps how to reach it (``wal/<pchannel>/
<n>``: kind, connection settings, the switch tick). That record is written before the position,
so a restart at any point reads either the old backend (and meets the switch again) or the new
one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from metastore import MetaStore
from replicator.codec.streaming import vchannel_pchannel
from replicator.codec.streaming_events import AlterWAL, MqSwitchAnnounced

log = logging.getLogger(__name__)

READABLE_KINDS = ("kafka", "rocksmq", "pulsar")


class UnfollowableSwitchError(Exception):
    """The source moved its WAL somewhere this daemon cannot read."""


@dataclass(frozen=True)
class WalSwitch:
    kind: str  # "kafka", "rocksmq", "pulsar"
    config: dict[str, str]  # connection settings the message carried (may hold secrets)
    switch_ts: int
    generation: int

    @property
    def backend(self) -> str:
        return backend_name(self.kind, self.generation)


def backend_name(kind: str, generation: int) -> str:
    return kind if generation == 0 else f"{kind}#{generation}"


def parse_backend(name: str) -> tuple[str, int]:
    """(kind, generation) of a position's backend name."""
    kind, sep, generation = name.partition("#")
    return kind, int(generation) if sep else 0


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


def _wal_key(pchannel: str, generation: int) -> str:
    return f"wal/{pchannel}/{generation}"


def record_switch(store: MetaStore, task_id: str, pchannel: str, switch: WalSwitch) -> None:
    record = {"kind": switch.kind, "config": switch.config, "switch_ts": switch.switch_ts}
    store.put_state(task_id, _wal_key(pchannel, switch.generation), json.dumps(record).encode())


def recorded_switch(store: MetaStore, task_id: str, pchannel: str, backend: str) -> WalSwitch:
    """How to reach the backend a saved position names."""
    generation = parse_backend(backend)[1]
    raw = store.get_state(task_id, _wal_key(pchannel, generation))
    if raw is None:
        raise UnfollowableSwitchError(
            f"channel {pchannel}: the saved position is on {backend}, but the task's state has "
            "no record of that WAL switch"
        )
    record = json.loads(raw)
    return WalSwitch(record["kind"], dict(record["config"]), int(record["switch_ts"]), generation)


def describe_config(config: Mapping[str, str]) -> str:
    """The setting names only: values may be secrets."""
    return ", ".join(sorted(config)) or "none (the daemon's settings for that backend)"
