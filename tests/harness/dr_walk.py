"""A seeded random walk over disaster recovery (issue 41, Build item 6): two real Milvus 2.3.5
clusters ``a`` and ``b``, a fleet of daemons on one etcd metastore, flows of one cluster pair
(one collection each, a task per direction) under a writer per flow, and steps chosen at random
among those the model says apply. After every step the invariants are checked against the real
clusters, each by name.

The model (:class:`Model`) holds what should be true: which cluster is each flow's primary,
which task carries production, every write the writers had acknowledged (by which cluster, at
what time) and what each failover answered (``consistent_up_to``, the export file). The steps:

==========================  ===================================================================
switchover                  the active task switched over (either way), the writer moved when
                            the job says writers may move (``writers_may_move_at``, README)
switchover_home             the same, of a flow whose primary is not its home cluster
switchover_daemon_killed    the daemon restarted with the job held at a random fault point
                            (``hold:<point>``, ``WALK_POINTS``), ``kill -9`` there, started again
failover                    ``kill -9`` of a flow's primary Milvus (a restartable one) under the
                            writer, then a failover of every flow it was the primary of
restart_lost                the lost cluster started again on its data, etcd root and queue
failback                    a failed-over flow's lost cluster re-seeded until ``in_sync``
switchover_both             both flows of the pair switched over at once
fleet_takeover              a second daemon joins (held at a fault point), the first is killed
                            and comes back, the second is killed mid-switchover: the first
                            finishes or rolls the job back
==========================  ===================================================================

The invariants (:mod:`harness.dr_walk_invariants`), each failing with a message that says what
broke:

- ``acknowledged_on_primary``: every write a writer had acknowledged is on the flow's primary,
  except those the lost cluster acknowledged after the ``consistent_up_to`` its failover
  reported (every write acknowledged at or before it is there);
- ``target_plus_export``: for every failover, each write the lost cluster acknowledged since
  the flow's previous failover (that one accounts for those before, and for a live lost
  cluster's writes after it was asked, until the writers left) is on the cluster that took
  over or in the failover's export;
- ``export_disjoint_from_target``: no write twice: for every failover, no write the lost cluster
  acknowledged by then (nor a row written before the tasks) is both on the cluster that took
  over and an insert of the failover's export, except the lines the export marks
  ``maybe_on_target`` (a write cut off when the task stopped, README). A key of the export the
  writer itself wrote again elsewhere (a batch the lost cluster did not acknowledge, retried on
  the new primary) is the writer's, not a double write, and is only counted. The export's
  insert lines must be as many as the failover answered (``unreplicated.by_collection``), so
  the check compares the keys it was told of, not an empty or unread file;
- ``one_direction_running``: exactly one task of a replicating flow is Running, and it reads
  the primary; none of a failed-over flow; of a flow failing back (its failback ended failed,
  which the walk follows as documented and lists in the result), none or its reverse task;
- ``no_ownerless_fence``: no ``forceDeny`` key in either cluster's etcd once no job runs (the
  walk sets no operator fence), after ``FENCE_GRACE`` seconds;
- ``at_most_two_tasks``: never more than two tasks of one flow;
- ``equal_in_sync``: a replicating flow's replica catches up with every key its primary held,
  and holds no key the primary does not;
- ``verb_accepted``: a verb the model says applies is not refused, and its job ends;
- ``step_completed``: every wait of a step ends (a job's state, a task placed on a member).
- ``stale_check_ends``, ``stale_check_truthful``: every switchover asks a stale-write check
  after 0, 1 or 15 s (drawn); each one asked ends with a result or a reason whatever the steps
  after it did, and one that found divergent rows had a writer to find
  (:mod:`harness.dr_walk_stale_checks`). The walk's end waits for the checks still running.

A failing walk raises :class:`InvariantError`, whose message names the seed, the steps so far and
the check; ``CDC_WALK_SEED=<seed>`` makes the suite's walk take that seed.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pymilvus import MilvusClient

from harness.daemon import Daemon
from harness.dr_clusters import (
    POINTS,
    cluster,
    consistent_known,
    create_source_collection,
    create_task,
    job_of,
    row,
    seconds_of,
    task,
)
from harness.dr_walk_invariants import Invariants
from harness.dr_walk_model import (
    SEED_ENV,
    ClusterHandle,
    Failover,
    Fleet,
    Flow,
    InvariantError,
    MakeDaemon,
    Model,
    StepRecord,
    WalkResult,
    log_size,
    logged_since,
    writers_may_move,
)
from harness.dr_walk_stale_checks import StaleChecks
from harness.dr_walk_writer import (
    FIRST_ROWS,
    MovingWriter,
    primary_keys,
)
from harness.milvus_source import MilvusSource, restartable_milvus
from harness.services import ServiceStartError, wait_until
from replicator.config.connections import SourceSettings
from server.dr.fence import EtcdQuotaFence, wait_in_effect
from server.dr.flows import FAULT_ENV

WALK_POINTS = (*POINTS, "moving")  # where a switchover job is held before its daemon is killed
JOB_TIMEOUT = 300.0
FAILBACK_TIMEOUT = 900.0


# ----------------------------------------------------------------------------------------------
# The walk


class Walk:
    """Set up with :meth:`setup`, then :meth:`run` a number of steps; :meth:`close` at the end."""

    KINDS: dict[str, int] = {  # kind -> weight when it applies
        "switchover": 3,
        "switchover_home": 2,
        "switchover_daemon_killed": 2,
        "failover": 2,
        "restart_lost": 4,
        "failback": 3,
        "switchover_both": 1,
        "fleet_takeover": 1,
    }

    def __init__(
        self,
        *,
        seed: int,
        clusters: dict[str, ClusterHandle],
        etcd_endpoint: str,
        make_daemon: MakeDaemon,
        workdir: Path,
        say: Callable[[str], None] = print,
        keep_going: bool = False,
    ) -> None:
        """``keep_going``: a broken invariant is recorded (``result.failures``) and the walk goes
        on, the keys it named excused from the checks after it."""
        self.seed = seed
        self.keep_going = keep_going
        self.rng = random.Random(seed)
        self.clusters = clusters
        self.etcd_endpoint = etcd_endpoint
        self.workdir = workdir
        self.say = say
        pair = tuple(sorted(clusters))
        assert len(pair) == 2, pair
        self.model = Model(pair=(pair[0], pair[1]))
        self.result = WalkResult(seed=seed)
        self.stale_checks = StaleChecks(seed)
        self.result.stale_checks = self.stale_checks.tally
        self._clients: dict[str, MilvusClient] = {}
        self._loaded: set[tuple[str, str]] = set()  # (cluster, collection) loaded here
        # the daemons' ``clusters`` settings
        self.cluster_settings = {
            label: cluster(c.milvus, etcd_endpoint) for label, c in clusters.items()
        }
        self.fleet = Fleet(
            make_daemon,
            {
                "clusters": self.cluster_settings,
                "verify": {"settleSeconds": 20},
                "metaStoreConfig": {
                    "storeType": "etcd",
                    "etcd": {"address": [etcd_endpoint]},
                    "rootPath": f"walk-{seed}-{uuid.uuid4().hex[:6]}",
                },
                "secrets": {"keyFile": str(workdir / "fleet.key")},
            },
        )
        self.invariants = Invariants(
            model=self.model,
            clusters=clusters,
            fleet=self.fleet,
            etcd_endpoint=etcd_endpoint,
            keys=self.keys,
            drop_client=self._drop_client,
            stale_checks=self.stale_checks,
            result=self.result,
        )
        self._started = time.monotonic()

    # --- set up ----------------------------------------------------------------------------
    def setup(self, home: str, flows: int = 2) -> None:
        """``flows`` collections on ``home`` (disjoint, one pair), a task each to the other
        cluster, replicated and under a writer each; one fleet member."""
        self.fleet.member("m1").start()
        other = next(c for c in self.model.pair if c != home)
        tag = uuid.uuid4().hex[:6]
        for n in range(1, flows + 1):
            name = f"f{n}"
            collection = f"walk{self.seed % 100000}_{name}_{tag}"
            client = self.client(home)
            create_source_collection(client, collection)
            client.insert(collection, [row(k) for k in range(FIRST_ROWS)])
            task_id = f"w{name}-{tag}"
            create_task(self.fleet.any(), task_id, home, other, collection)
            uris = {label: c.uri for label, c in self.clusters.items()}
            writer = MovingWriter(collection, uris, home, first=1_000_000 * n)
            self.model.flows[name] = Flow(name, collection, home, home, {home: task_id}, writer)
        for flow in self.model.flows.values():
            self.invariants.wait_replica_holds(flow, flow.primary, other)
            consistent_known(self.fleet.any(), flow.tasks[home])
            flow.writer.start()
        self.say(f"walk seed {self.seed}: flows {list(self.model.flows)} on {home}, tasks running")

    def client(self, label: str) -> MilvusClient:
        if label not in self._clients:
            self._clients[label] = MilvusClient(uri=self.clusters[label].uri, dedicated=True)
        return self._clients[label]

    def _drop_client(self, label: str) -> None:
        self._loaded = {(c, name) for c, name in self._loaded if c != label}
        client = self._clients.pop(label, None)
        if client is not None:
            client.close()

    def keys(self, label: str, flow: Flow, ranges: Sequence[range] | None = None) -> set[int]:
        """The keys of ``flow``'s collection on ``label`` (within ``ranges``, default every key
        written so far), waiting for a cluster that reconnects or loads."""
        spans = ranges or flow.writer.key_ranges()

        def read() -> set[int] | None:
            try:
                if (label, flow.collection) not in self._loaded:
                    self.client(label).load_collection(flow.collection, timeout=60)
                    self._loaded.add((label, flow.collection))
                return primary_keys(self.client(label), flow.collection, spans) or None
            except Exception:
                self._drop_client(label)  # a restarted cluster: a new connection
                raise

        keys = wait_until(read, 60, f"the keys of {flow.collection} on {label}", interval=1.0)
        assert keys is not None
        return keys

    # --- the walk ----------------------------------------------------------------------------
    def run(
        self,
        steps: int,
        kinds: Sequence[str] | None = None,
        script: Sequence[tuple[str, str, str]] = (),
    ) -> WalkResult:
        """``steps`` steps: first the ``script``'s (kind, move, point) in their order, each of
        which must apply, then steps chosen among ``kinds`` (all by default); the invariants
        after each. Raises InvariantError at the first that breaks (also kept in the
        result)."""
        allowed = list(kinds or self.KINDS)
        try:
            self.check_invariants()
            for index in range(1, steps + 1):
                if self.result.failure is not None and not self.keep_going:
                    break
                if index <= len(script):
                    kind, move, point = script[index - 1]
                    if move not in self._moves(kind):
                        self.fail("step_applies", f"scripted step {index}: {kind} {move}")
                else:
                    moves = {k: self._moves(k) for k in allowed}
                    moves = {k: m for k, m in moves.items() if m}
                    if not moves:
                        self.say("no step applies: the walk ends")
                        break
                    names = sorted(moves)
                    kind = self.rng.choices(names, weights=[self.KINDS[k] for k in names])[0]
                    move = self.rng.choice(moves[kind])
                    point = self.rng.choice(WALK_POINTS)
                record = StepRecord(index, kind, self._describe(kind, move, point))
                self.result.steps.append(record)
                self.say(f"step {index}: {kind} {record.detail}")
                began = time.monotonic()
                try:
                    record.outcome = getattr(self, f"_step_{kind}")(move, point)
                except InvariantError as failure:
                    record.outcome = f"refused: {failure.detail[:200]}"
                    self._record(failure)
                except ServiceStartError as exc:  # a wait of the step that never ended
                    record.outcome = f"did not complete: {str(exc)[:200]}"
                    self._record(
                        InvariantError("step_completed", str(exc), self.seed, self.result.steps)
                    )
                record.seconds = time.monotonic() - began
                self.say(f"step {record.line()}")
                self.check_invariants()
            if self.stale_checks.pending():
                self.say(f"waiting for {len(self.stale_checks.pending())} stale-write check(s)")
                self.check_invariants(("stale_check_ends", "stale_check_truthful"), True)
            tally = self.stale_checks.tally
            self.say(
                f"stale-write checks: {tally.asked} asked, ended {tally.ended}, "
                f"{tally.superseded} superseded, {tally.stale_found} found a slow writer's rows"
            )
        except InvariantError as failure:
            self.result.failure = self.result.failure or failure
            raise
        finally:
            self.result.seconds = time.monotonic() - self._started
        return self.result

    def _describe(self, kind: str, move: str, point: str) -> str:
        where = f"flow {move}" if move in self.model.flows else move
        if kind in ("switchover_daemon_killed", "fleet_takeover"):
            return f"{where} at {point}"
        return where

    def fail(self, check: str, message: str) -> NoReturn:
        raise InvariantError(check, message, self.seed, self.result.steps)

    def _record(self, failure: InvariantError) -> None:
        """A broken invariant: raised, or (``keep_going``) kept and the walk goes on."""
        self.result.failure = self.result.failure or failure
        self.result.failures.append(failure)
        self.say(str(failure).split("\nsteps:")[0])
        if not self.keep_going:
            raise failure

    def timed(self, verb: str, seconds: float) -> None:
        self.result.timings.setdefault(verb, []).append(seconds)

    # --- which moves apply ---------------------------------------------------------------------
    def _all_alive(self) -> bool:
        return all(c.alive for c in self.clusters.values())

    def _moves(self, kind: str) -> list[str]:
        flows = self.model.flows.values()
        replicating = self.model.replicating()
        single = len(self.fleet.live()) == 1
        ready = self._all_alive() and single
        if kind == "switchover" or kind == "switchover_daemon_killed" or kind == "fleet_takeover":
            return [f.name for f in replicating] if ready else []
        if kind == "switchover_home":
            return (
                [f.name for f in self.model.replicating() if f.primary != f.home] if ready else []
            )
        if kind == "switchover_both":
            primaries = {f.primary for f in replicating}
            both = (
                len(self.model.replicating()) == len(self.model.flows) >= 2 and len(primaries) == 1
            )
            return ["both flows"] if ready and both else []
        if kind == "failover":
            # a primary that may be killed, every flow it is the primary of still replicating
            candidates = []
            for label, handle in self.clusters.items():
                mine = [f for f in flows if f.primary == label]
                if (
                    handle.killable
                    and self._all_alive()
                    and mine
                    and all(f.state == "replicating" for f in mine)
                ):
                    candidates.append(label)
            return candidates
        if kind == "restart_lost":
            return [label for label, c in self.clusters.items() if not c.alive]
        if kind == "failback":
            return [
                f.name
                for f in flows
                if f.state in ("failed_over", "failing_back")
                and self.clusters[f.failovers[-1].lost].alive
            ]
        raise ValueError(kind)

    # --- steps -----------------------------------------------------------------------------------
    def _ask_switchover(self, daemon: Daemon, task_id: str, flow: Flow) -> str:
        """Ask a switchover of ``task_id`` (``flow``'s active task), with a stale-write check
        drawn (:mod:`harness.dr_walk_stale_checks`); its job id. A lag or consistent-up-to
        refusal is asked again (the task catches up); any other refusal fails
        ``verb_accepted``."""
        consistent_known(daemon, task_id)
        check = self.stale_checks.draw()
        body = {"max_lag_seconds": 30, "timeout_seconds": 240, "stale_check_seconds": check}
        deadline = time.monotonic() + 90
        while True:
            status, _, answer = daemon.request(
                "POST", f"/v1/tasks/{task_id}/switchover", body, timeout=60
            )
            if status == 202:
                self.stale_checks.asked(task_id, str(answer["job_id"]), check, flow.name)
                return str(answer["job_id"])
            detail = str((answer or {}).get("detail", answer))
            transient = "max_lag_seconds" in detail or "not known yet" in detail
            if not transient or time.monotonic() > deadline:
                self.fail("verb_accepted", f"switchover of {task_id} refused: {status} {detail}")
            time.sleep(2)

    def _follow(
        self,
        daemon: Daemon,
        asked: dict[str, tuple[Flow, str]],
        until: Callable[[], bool] | None = None,
        timeout: float = JOB_TIMEOUT,
    ) -> dict[str, dict[str, Any]]:
        """Watch switchover jobs (task id -> (flow, job id)) on ``daemon`` until each ends (or
        ``until`` holds), moving each flow's writer once its job says writers may move; the
        jobs as last seen."""
        seen: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while True:
            for task_id, (flow, job_id) in asked.items():
                try:
                    job = job_of(daemon, task_id)
                except Exception:  # noqa: BLE001 - a daemon being killed or started
                    continue
                if job.get("job_id") != job_id:
                    continue
                seen[task_id] = job
                target = flow.replica(self.model.pair)
                if writers_may_move(job) and flow.writer.at != target:
                    flow.writer.move_to(target)
                    self.say(f"  writer of {flow.name} moved to {target} ({job['state']})")
            if until is not None and until():
                return seen
            ended = [j for j in seen.values() if j.get("state") in ("done", "failed")]
            if until is None and len(ended) == len(asked):
                return seen
            if time.monotonic() > deadline:
                states = {t: j.get("state") for t, j in seen.items()}
                self.fail("verb_accepted", f"switchover jobs not ended in {timeout:g} s: {states}")
            time.sleep(0.3)

    def _settle(self, flow: Flow, job: dict[str, Any]) -> str:
        """The model after a switchover job of ``flow`` ended as ``job`` says; a done job whose
        reverse task failed over since (an operator's failover once the job handed the flow
        over, settled here after it) leaves production where that failover put it."""
        self.stale_checks.job_ended(job)
        if job.get("state") == "done":
            new = str(job.get("target_cluster") or "")
            new = new if new in self.model.pair else flow.replica(self.model.pair)
            reverse = str(job["reverse_task_id"])
            flow.tasks[new] = reverse
            if flow.state == "failed_over" and flow.failovers[-1].task_id == reverse:
                return (
                    f"done: {flow.name} handed to {new} (task {reverse}), failed over since "
                    f"to {flow.primary}"
                )
            flow.primary = new
            flow.writer.move_to(new)
            return f"done: {flow.name} primary {new} (task {flow.tasks[new]})"
        if flow.writer.at != flow.primary:
            self.say(f"  writer of {flow.name} moved back to {flow.primary} (job failed)")
            flow.writer.move_to(flow.primary)
        return f"failed ({job.get('reason', '')[:160]}); rolled_back {job.get('rolled_back')}"

    def _switchover(self, names: Sequence[str]) -> str:
        flows = [self.model.flows[n] for n in names]
        daemon = self.fleet.any()
        began = time.monotonic()
        asked = {}
        for flow in flows:
            active = flow.active_task
            assert active is not None
            asked[active] = (flow, self._ask_switchover(daemon, active, flow))
        jobs = self._follow(daemon, asked)
        self.timed("switchover", time.monotonic() - began)
        return "; ".join(self._settle(flow, jobs[t]) for t, (flow, _) in asked.items())

    def _step_switchover(self, name: str, point: str) -> str:
        return self._switchover([name])

    def _step_switchover_home(self, name: str, point: str) -> str:
        return self._switchover([name])

    def _step_switchover_both(self, move: str, point: str) -> str:
        return self._switchover(list(self.model.flows))

    def _held_then_killed(
        self,
        daemon: Daemon,
        flow: Flow,
        point: str,
        before_kill: Callable[[], object] = lambda: None,
    ) -> dict[str, Any]:
        """Ask a switchover on ``daemon`` (started with the job held at ``point``), wait for the
        hold, call ``before_kill``, kill the daemon; the task and job ids."""
        active = flow.active_task
        assert active is not None
        offset = log_size(daemon)
        job_id = self._ask_switchover(daemon, active, flow)
        held = f"switchover held at {point}"
        self._follow(
            daemon,
            {active: (flow, job_id)},
            until=lambda: logged_since(daemon, offset, held),
            timeout=180,
        )
        before_kill()
        daemon.kill()
        daemon.env.pop(FAULT_ENV, None)
        self.say(f"  daemon {self.fleet.name_of(daemon)} killed at {point}")
        return {"task_id": active, "job_id": job_id}

    def _step_switchover_daemon_killed(self, name: str, point: str) -> str:
        flow = self.model.flows[name]
        daemon = self.fleet.any()
        began = time.monotonic()
        daemon.stop()
        daemon.env[FAULT_ENV] = f"hold:{point}:120"
        daemon.start()
        self.timed("daemon_restart", time.monotonic() - began)
        asked = self._held_then_killed(daemon, flow, point)
        began = time.monotonic()
        daemon.start()
        self.timed("daemon_restart", time.monotonic() - began)
        jobs = self._follow(daemon, {asked["task_id"]: (flow, asked["job_id"])})
        self.timed("switchover_after_kill", time.monotonic() - began)
        return self._settle(flow, jobs[asked["task_id"]])

    def _step_fleet_takeover(self, name: str, point: str) -> str:
        flow = self.model.flows[name]
        first = self.fleet.any()
        first_name = self.fleet.name_of(first)
        spare_name = "m2" if first_name == "m1" else "m1"
        spare = self.fleet.member(spare_name)
        spare.env[FAULT_ENV] = f"hold:{point}:120"
        spare.start()
        began = time.monotonic()
        first.kill()  # the spare takes every task over once the first's lease lapses
        active = flow.active_task
        assert active is not None
        wait_until(
            lambda: task(spare, active).get("owner") == spare_name,
            120,
            f"{spare_name} running {active}",
            interval=0.5,
        )
        self.timed("fleet_task_takeover", time.monotonic() - began)
        # the first comes back while the job is held, and takes it over once the spare is gone
        asked = self._held_then_killed(spare, flow, point, before_kill=first.start)
        began = time.monotonic()
        jobs = self._follow(first, {asked["task_id"]: (flow, asked["job_id"])})
        self.timed("fleet_job_takeover", time.monotonic() - began)
        job = jobs[asked["task_id"]]
        return f"{self._settle(flow, job)}; the job ended on {job.get('member')}"

    def _step_failover(self, label: str, point: str) -> str:
        handle = self.clusters[label]
        assert handle.restartable is not None
        mine = [f for f in self.model.flows.values() if f.primary == label]
        killed_at = time.time()
        handle.restartable.kill()
        self._drop_client(label)
        self.say(f"  {label} killed (kill -9)")
        time.sleep(1.0)
        outcomes = []
        for flow in mine:
            active = flow.active_task
            assert active is not None
            daemon = self.fleet.owner_of(active)
            began = time.monotonic()
            at = time.time()
            status, _, answer = daemon.request(
                "POST", f"/v1/tasks/{active}/failover", {"export_seconds": 30}, timeout=120
            )
            self.timed("failover", time.monotonic() - began)
            if status != 200:
                self.fail("verb_accepted", f"failover of {active} refused: {status} {answer}")
            outcomes.append(self.failed_over(flow, label, killed_at, at, active, answer))
        return "; ".join(outcomes)

    def failed_over(
        self, flow: Flow, label: str, killed_at: float, at: float, active: str, answer: Any
    ) -> str:
        """The model after the failover of ``flow``'s task ``active`` (asked at ``at``, its
        primary ``label`` lost at ``killed_at``) answered ``answer``: the writer moved to the
        replica, the failover's figure and export kept for the invariants. The cluster that
        takes over is the failed-over task's target, the pair's other cluster than ``label``
        (not the model's replica: a failover of a switchover's reverse task, asked once the
        switchover handed the flow over but before the search settled it, finds the model's
        primary still the switchover's source)."""
        took_over = next(c for c in self.model.pair if c != label)
        flow.writer.move_to(took_over)
        moved_at = time.time()
        export = answer.get("unreplicated") or {}
        file = str(export.get("file") or "")
        exported, in_doubt, lines = self._exported(file, flow.collection)
        counted = sum(
            int(kinds.get("insert", 0))
            for name, kinds in (export.get("by_collection") or {}).items()
            if name.split(".", 1)[-1] == flow.collection
        )
        failover = Failover(
            task_id=active,
            lost=label,
            took_over=took_over,
            killed_at=killed_at,
            at=at,
            consistent=seconds_of(answer.get("consistent_up_to")),
            exported=frozenset(exported),
            complete=bool(export.get("complete")),
            in_doubt=frozenset(in_doubt),
            insert_lines=lines,
            inserts_counted=counted,
            file=file,
            moved_at=moved_at,
        )
        flow.failovers.append(failover)
        flow.state = "failed_over"
        flow.primary = took_over
        lag = at - failover.consistent if failover.consistent else None
        return (
            f"{flow.name}: consistent_up_to {lag:.2f} s before the failover, "
            f"{len(exported)} exported insert(s), complete {failover.complete}"
            if lag is not None
            else f"{flow.name}: no consistent_up_to"
        )

    def _exported(self, file: str, collection: str) -> tuple[set[int], set[int], int]:
        """The keys the export ``file`` inserts into ``collection``, those of them on lines
        marked ``maybe_on_target``, and how many insert lines it has for the collection (no
        file: none; ``export_disjoint_from_target`` holds that count to the answer's)."""
        keys: set[int] = set()
        in_doubt: set[int] = set()
        lines = 0
        if not file or not Path(file).exists():
            return keys, in_doubt, lines
        for line in Path(file).read_text().splitlines():
            record = json.loads(line)
            if record.get("op") != "insert" or record.get("collection") != collection:
                continue
            lines += 1
            keys.add(int(record["pk"]))
            if (record.get("source") or {}).get("maybe_on_target"):
                in_doubt.add(int(record["pk"]))
        return keys, in_doubt, lines

    def _step_restart_lost(self, label: str, point: str) -> str:
        handle = self.clusters[label]
        assert handle.restartable is not None
        began = time.monotonic()
        handle.restartable.start()
        self._drop_client(label)
        seconds = time.monotonic() - began
        self.timed("restart_cluster", seconds)
        outcome = f"{label} serving again after {seconds:.1f} s"
        for (name, lost), missed in sorted(self.invariants.missed.items()):
            if lost == label and missed:
                held = missed & self.keys(label, self.model.flows[name])
                outcome += (
                    f"; {len(held)} of the {len(missed)} write(s) of {name} its failover missed "
                    f"are on the restarted {label}"
                )
                self.invariants.missed[(name, lost)] = set()
        return outcome

    def _step_failback(self, name: str, point: str) -> str:
        flow = self.model.flows[name]
        failover = flow.failovers[-1]
        daemon = self.fleet.any()  # the failed-over task is Paused: no member runs it
        began = time.monotonic()
        status, _, answer = daemon.request("POST", f"/v1/tasks/{failover.task_id}/failback", {})
        if status != 202:
            self.fail(
                "verb_accepted",
                f"failback of {failover.task_id} (flow {name}, the failed-over task) refused: "
                f"{status} {(answer or {}).get('detail', answer)}",
            )
        reverse = str(answer["reverse_task_id"])

        def ended() -> dict[str, Any] | None:
            job = job_of(daemon, failover.task_id, "failback")
            return job if job.get("state") in ("in_sync", "failed") else None

        job = wait_until(
            ended, FAILBACK_TIMEOUT, f"the failback of {failover.task_id}", interval=1.0
        )
        self.timed("failback", time.monotonic() - began)
        assert job is not None
        return self.failed_back(flow, reverse, job)

    def failed_back(self, flow: Flow, reverse: str, job: dict[str, Any]) -> str:
        """The model after a failback of ``flow`` ended as ``job`` says: in sync, the flow
        replicates again by ``reverse``; failed, it stays failing back with no job on it (the
        documented end: the reverse task may run, the failback may be asked again), and the
        result names the failed job."""
        lost = flow.failovers[-1].lost
        if job["state"] != "in_sync":
            reason = str(job.get("reason", ""))
            flow.state, flow.reverse = "failing_back", reverse
            self.result.jobs_failed.append(
                f"failback of {flow.failovers[-1].task_id} (flow {flow.name}): {reason[:300]}"
            )
            return f"failed ({reason[:160]}): {flow.name} stays failing back, {reverse} may run"
        flow.tasks[flow.primary] = reverse
        flow.state, flow.reverse = "replicating", ""
        return f"in_sync: {flow.name} replicated {flow.primary} -> {lost} by {reverse}"

    # --- invariants ---------------------------------------------------------------------
    def check_invariants(self, only: Sequence[str] = (), wait_checks: bool = False) -> None:
        """Every invariant (``only``: those named) against the model and the clusters; a
        broken one is recorded (raised unless ``keep_going``). ``wait_checks``: every
        stale-write check asked must end first (the walk's end)."""
        for name, problem, seconds in self.invariants.check(only, wait_checks):
            self.timed(f"check {name}", seconds)
            if problem:
                self._record(InvariantError(name, problem, self.seed, self.result.steps))
            else:
                self.result.checks[name] = self.result.checks.get(name, 0) + 1

    # --- the end ------------------------------------------------------------------------
    def close(self) -> None:
        for flow in self.model.flows.values():
            flow.writer.stop.set()
        for flow in self.model.flows.values():
            if flow.writer.is_alive():
                flow.writer.join(30)
        for label in list(self._clients):
            self._drop_client(label)
        for daemon in self.fleet.live():
            daemon.stop()


@contextlib.contextmanager
def suite_walk(
    seed: int,
    *,
    make_daemon: MakeDaemon,
    rocksmq: MilvusSource,
    etcd_endpoint: str,
    kafka_bootstrap: str,
    workdir: Path,
    keep_going: bool = False,
) -> Iterator[Walk]:
    """A walk (not set up) as the suite runs one: cluster ``a`` a Milvus 2.3.5 of its own on
    the Kafka mock (restartable), ``b`` the session's RocksMQ Milvus (never killed). At the end
    the walk is closed and a fence it left on b (which serves the rest of the session) lifted."""
    with restartable_milvus(
        workdir / "milvus-a",
        etcd_endpoint,
        kafka_bootstrap=kafka_bootstrap,
        root_path=f"walk-a-{uuid.uuid4().hex[:8]}",
    ) as lost:
        walk = Walk(
            seed=seed,
            clusters={"a": ClusterHandle("a", lost.source, lost), "b": ClusterHandle("b", rocksmq)},
            etcd_endpoint=etcd_endpoint,
            make_daemon=make_daemon,
            workdir=workdir,
            keep_going=keep_going,
        )
        try:
            yield walk
        finally:
            walk.close()
            fence = EtcdQuotaFence("b", SourceSettings(**walk.cluster_settings["b"]))
            if fence.is_set():
                fence.lift()
            wait_in_effect(fence, 60, lambda: False, effect=False)


def walk_seed(default: int) -> int:
    """The seed ``CDC_WALK_SEED`` names, else ``default``."""
    import os

    value = os.environ.get(SEED_ENV, "").strip()
    return int(value) if value else default


def iter_steps(result: WalkResult) -> Iterator[str]:
    for step in result.steps:
        yield step.line()
