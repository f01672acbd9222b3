"""A fleet of daemons sharing one metastore: who runs which Running task.

Each daemon is a member: it renews a heartbeat every ``fleet.checkSeconds``, which keeps its
registration and every task lease it holds alive for ``fleet.leaseSeconds`` (the store's
business: etcd leases, or rows with an expiry on the database's clock; ``metastore/base.py``).
Each round, a member compares what it runs with what the store says (:func:`plan_round`):

- it stops the runners of tasks that are no longer Running (paused, failed or deleted through
  any daemon) or whose lease it no longer holds, and releases the leases of tasks not Running;
- it takes free Running tasks (no live lease: new, resumed, or of a member that died) up to its
  share, ``ceil(running / members)``, and hands over what it holds above it (a new member gets
  its share; a member leaving with SIGTERM drops its leases at once);
- it starts a runner for every lease it holds without one.

Safety does not depend on these rounds being timely. Every store write of a runner carries its
lease, refused by the store once the lease is gone; and a member stops writing at all, target
included, once two thirds of the lease time have passed since the last heartbeat the store
acknowledged (``metastore.fenced.LeaseClock``), before any other member can take its tasks.
"""

from __future__ import annotations

import hashlib
import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from metastore import Lease, TaskState
from metastore.fenced import LeaseClock
from replicator.config.daemon import FleetSettings

# the part of the lease time a member writes after its last acknowledged heartbeat
SAFE_FRACTION = 2 / 3


def default_member_id(port: int) -> str:
    """The host's name and the API's port: stable across restarts (a daemon restarted at once
    finds its leases still its own), and apart for two daemons of one host (two ports)."""
    return f"{socket.gethostname()}:{port}"


@dataclass
class Membership:
    """This daemon in the fleet: its id and how long its leases are surely live."""

    settings: FleetSettings
    port: int
    member_id: str = ""
    clock: LeaseClock = field(default_factory=LeaseClock)

    def __post_init__(self) -> None:
        self.member_id = self.member_id or self.settings.memberId or default_member_id(self.port)

    @property
    def lease_seconds(self) -> float:
        return self.settings.leaseSeconds

    @property
    def safe_seconds(self) -> float:
        return self.settings.leaseSeconds * SAFE_FRACTION

    def renewed(self, sent_at: float, acknowledged_at: float | None = None) -> None:
        self.clock.renewed(sent_at, self.safe_seconds, self.lease_seconds, acknowledged_at)


@dataclass(frozen=True)
class Round:
    """What one member does in one round."""

    stop: list[str]  # runners to stop (task not Running, or its lease lost)
    release: list[Lease]  # leases to give up (their runners stopped first)
    start: list[Lease]  # leases held with no runner
    take: list[str]  # free Running tasks to try to take, best first
    share: int  # how many Running tasks this member should hold


def plan_round(
    member_id: str,
    states: Mapping[str, TaskState],
    leases: Mapping[str, Lease],
    members: int,
    running_here: Mapping[str, Lease],
) -> Round:
    """``states``: every task's stored state; ``leases``: every live lease; ``members``: how
    many members are registered; ``running_here``: this member's runners, by task, with the
    lease each runs under."""
    running = {task_id for task_id, state in states.items() if state is TaskState.RUNNING}
    mine = {task_id: lease for task_id, lease in leases.items() if lease.owner == member_id}
    share = math.ceil(len(running) / max(1, members))

    stop = [
        task_id
        for task_id, lease in running_here.items()
        if task_id not in running or mine.get(task_id) != lease
    ]
    release = [lease for task_id, lease in mine.items() if task_id not in running]
    # above the share: hand over the ones whose order for this member comes last
    kept = sorted((t for t in mine if t in running), key=lambda t: _order(member_id, t))
    release += [mine[task_id] for task_id in kept[share:]]
    stop += [task_id for task_id in kept[share:] if task_id in running_here]
    kept = kept[:share]
    start = [
        mine[task_id]
        for task_id in kept
        if task_id not in running_here or running_here[task_id] != mine[task_id]
    ]
    free = [task_id for task_id in running if task_id not in leases]
    free.sort(key=lambda task_id: _order(member_id, task_id))
    take = free[: max(0, share - len(kept))]
    return Round(stop=stop, release=release, start=start, take=take, share=share)


def _order(member_id: str, task_id: str) -> bytes:
    """A per-member order of tasks, so that members taking free tasks at once mostly try
    different ones (the store decides every race anyway)."""
    return hashlib.blake2b(f"{member_id}/{task_id}".encode(), digest_size=8).digest()
