"""What the walk (:mod:`harness.dr_walk`) holds: the clusters, the model of each flow (its
primary, its tasks, its writer, what its failovers answered), the fleet of daemons, and the
walk's results with the error a broken invariant raises."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.daemon import Daemon
from harness.dr_clusters import task
from harness.dr_walk_stale_checks import CheckTally
from harness.dr_walk_writer import MovingWriter
from harness.milvus_source import MilvusSource, RestartableMilvus
from harness.services import wait_until

SEED_ENV = "CDC_WALK_SEED"
UNAVAILABLE_RETRY = 15.0  # seconds a list answered 503 (metastore unavailable) is asked again

MakeDaemon = Callable[..., Daemon]


@dataclass
class ClusterHandle:
    """One named cluster of the walk: a Milvus that may be killed (``restartable``) or not."""

    label: str
    milvus: MilvusSource
    restartable: RestartableMilvus | None = None

    @property
    def killable(self) -> bool:
        return self.restartable is not None

    @property
    def alive(self) -> bool:
        return self.restartable is None or self.restartable.alive

    @property
    def uri(self) -> str:
        return self.milvus.uri


# ----------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Failover:
    """What one failover answered."""

    task_id: str
    lost: str  # the cluster killed
    took_over: str  # the failed-over task's target
    killed_at: float  # when the lost cluster was killed
    at: float  # when the failover was asked
    consistent: float  # consistent_up_to, Unix seconds (0: none answered)
    exported: frozenset[int]  # keys inserted by the export's records
    complete: bool
    # keys of export lines marked maybe_on_target (a write cut off: may be on the target too)
    in_doubt: frozenset[int] = frozenset()
    insert_lines: int = 0  # insert lines read from the export file
    inserts_counted: int = 0  # inserts of the flow's collection the answer counted
    file: str = ""
    # when the writers left the lost cluster: a live one (an operator's failover of a running
    # primary) acknowledges the writes sent to it until then, and the failover paused the task
    # that would have carried them (the operator's, as those after a kill are)
    moved_at: float = 0.0


@dataclass
class Flow:
    """One collection replicated between the pair, with a task per direction at most."""

    name: str
    collection: str
    home: str
    primary: str
    tasks: dict[str, str]  # source cluster -> task id
    writer: MovingWriter
    # "replicating", "failed_over", or "failing_back": a failback of it ended failed, which
    # leaves the flow failing back with no job on it (docs/concepts/disaster-recovery.md,
    # Failback): its reverse task may run, a failback again applies
    state: str = "replicating"
    failovers: list[Failover] = field(default_factory=list)
    reverse: str = ""  # the reverse task of a failback that failed (state "failing_back")

    @property
    def active_task(self) -> str | None:
        return self.tasks.get(self.primary) if self.state == "replicating" else None

    def may_run(self) -> list[list[str]]:
        """The sets of this flow's tasks that may be Running between steps."""
        if self.state == "failing_back":
            return [[], [self.reverse]]
        return [[self.active_task] if self.active_task else []]

    def replica(self, pair: Sequence[str]) -> str:
        return next(c for c in pair if c != self.primary)


@dataclass
class Model:
    pair: tuple[str, str]
    flows: dict[str, Flow] = field(default_factory=dict)

    def replicating(self) -> list[Flow]:
        return [f for f in self.flows.values() if f.state == "replicating"]


# ----------------------------------------------------------------------------------------------
# Results


class InvariantError(AssertionError):
    """An invariant broke; the message names the seed, the steps and the check."""

    def __init__(self, check: str, message: str, seed: int, steps: Sequence[StepRecord]) -> None:
        self.check = check
        self.detail = message
        self.seed = seed
        self.steps = list(steps)
        lines = "\n".join(f"  {s.line()}" for s in steps)
        super().__init__(
            f"walk seed {seed}: check {check} failed after step {len(steps)}: {message}\n"
            f"steps:\n{lines}\nreproduce: {SEED_ENV}={seed}"
        )


@dataclass
class StepRecord:
    index: int
    kind: str
    detail: str
    outcome: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.index}. {self.kind} {self.detail}: {self.outcome} ({self.seconds:.1f} s)"


@dataclass
class WalkResult:
    seed: int
    steps: list[StepRecord] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)  # check name -> times it held
    timings: dict[str, list[float]] = field(default_factory=dict)  # verb -> seconds
    failure: InvariantError | None = None  # the first
    failures: list[InvariantError] = field(default_factory=list)  # every one (keep_going)
    # jobs accepted that ended failed with a reason (a failback's verify that Milvus timed out):
    # not an invariant broken, the documented end the model follows, but shown
    jobs_failed: list[str] = field(default_factory=list)
    # export_disjoint_from_target: keys of exports compared with a read of their target (summed
    # over the checks: 0 means no export had an insert), of those the writer retried there, and
    # those marked maybe_on_target (a write cut off when the task stopped) and found on it
    export_keys_compared: int = 0
    export_keys_retried: int = 0
    export_keys_in_doubt: int = 0
    export_keys_in_doubt_on_target: int = 0
    seconds: float = 0.0
    stale_checks: CheckTally = field(default_factory=CheckTally)  # how the checks asked ended


# ----------------------------------------------------------------------------------------------
# The fleet of daemons


class Fleet:
    """Daemons sharing one etcd metastore, as fleet members named after their ``memberId``."""

    def __init__(self, make: MakeDaemon, config: dict[str, Any]) -> None:
        self._make = make
        self._config = config
        self.members: dict[str, Daemon] = {}

    def member(self, name: str) -> Daemon:
        if name not in self.members:
            fleet = {"leaseSeconds": 3.0, "checkSeconds": 0.5, "memberId": name}
            self.members[name] = self._make(name, fleet=fleet, **self._config)
        return self.members[name]

    def live(self) -> list[Daemon]:
        return [d for d in self.members.values() if d.process and d.process.poll() is None]

    def any(self) -> Daemon:
        return self.live()[0]

    def name_of(self, daemon: Daemon) -> str:
        return next(n for n, d in self.members.items() if d is daemon)

    def tasks(self) -> list[dict[str, Any]]:
        """Every task, as ``list`` answers; a 503 (the metastore did not answer: "try again")
        is asked again for up to ``UNAVAILABLE_RETRY`` seconds, as an operator would. A member
        continued after a stall (SIGSTOP past its leases) answers one for its first calls,
        whose connection to etcd lapsed while it was stopped."""
        deadline = time.monotonic() + UNAVAILABLE_RETRY
        while True:
            reply = self.any().call("list")
            if reply.code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert reply.code == 200, reply.message
        listed: list[dict[str, Any]] = reply.data["tasks"]
        return listed

    def owner_of(self, task_id: str, timeout: float = 60) -> Daemon:
        """The live member running ``task_id`` (waiting for the fleet to place it)."""

        def placed() -> Daemon | None:
            owner = task(self.any(), task_id).get("owner")
            daemon = self.members.get(str(owner))
            return daemon if daemon in self.live() else None

        owner = wait_until(placed, timeout, f"a live member running {task_id}", interval=0.5)
        assert owner is not None
        return owner


def writers_may_move(job: dict[str, Any]) -> bool:
    """README: move the writers to the new primary once the job shows ``writers_may_move_at``
    (the reverse flow's start is saved: the point of no return), or is done."""
    return bool(job.get("writers_may_move_at")) or job.get("state") == "done"


def writers_follow(flow: Flow, job: dict[str, Any], pair: Sequence[str]) -> str:
    """Where the writers of ``flow`` go as its switchover ``job`` is followed: its target once
    they may move (:func:`writers_may_move`), while the flow replicates; "" before, and once
    the flow failed over since (a failover of the reverse task after the job handed the flow
    over: the writers are where that failover put them)."""
    if not writers_may_move(job) or flow.state != "replicating":
        return ""
    target = str(job.get("target_cluster") or "")
    return target if target in pair else flow.replica(pair)


def log_size(daemon: Daemon) -> int:
    return daemon.log_path.stat().st_size if daemon.log_path.exists() else 0


def logged_since(daemon: Daemon, offset: int, text: str) -> bool:
    if not daemon.log_path.exists():
        return False
    with open(daemon.log_path, "rb") as log:
        log.seek(offset)
        return text.encode() in log.read()
