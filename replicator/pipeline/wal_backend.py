"""The WAL backend values: a recorded WAL switch, backend names and how to open a WAL.

Positions name their backend: ``kafka`` is the daemon's configured source; after the n-th switch
of a pchannel it is ``<kind>#<n>`` and the task's state keeps how to reach it (``wal/<pchannel>/
<n>``: kind, connection settings, the switch tick). Following a switch is ``wal_switch.py``; this
module imports nothing of the pipeline so that the task state, the checkpoint and the barriers can
use these values without importing the switch follower.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from replicator.sources.base import WalSource

OpenWal = Callable[[str, Mapping[str, str]], WalSource]


@dataclass(frozen=True)
class WalSwitch:
    """A WAL switch of one pchannel: the backend it moved to and the tick it moved at."""

    kind: str  # "kafka", "rocksmq", "pulsar"
    config: dict[str, str]  # connection settings the message carried (may hold secrets)
    switch_ts: int
    generation: int

    @property
    def backend(self) -> str:
        return backend_name(self.kind, self.generation)


def backend_name(kind: str, generation: int) -> str:
    """The backend name positions carry: ``kind`` at first, ``kind#n`` after the n-th switch."""
    return kind if generation == 0 else f"{kind}#{generation}"


def parse_backend(name: str) -> tuple[str, int]:
    """(kind, generation) of a position's backend name."""
    kind, sep, generation = name.partition("#")
    return kind, int(generation) if sep else 0
