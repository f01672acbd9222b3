"""The random walk's invariants (:mod:`harness.dr_walk`, whose docstring says what each one
holds), checked against the walk's model and the real clusters: a collaborator of the walk,
given what it reads (the model, the clusters, the fleet, a reader of a collection's keys), so a
check can be run on a model with no cluster (``tests/unit/test_dr_walk_checks.py``).

:meth:`Invariants.check` runs them in their order and tells each one's problem ("" when it
held); the keys a broken one named are excused from the checks after it (a walk that goes on
past a failure, ``keep_going``, reports each cause once)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from harness.dr_clusters import fence_at, job_of
from harness.dr_walk_model import ClusterHandle, Failover, Fleet, Flow, Model, WalkResult
from harness.dr_walk_stale_checks import StaleChecks
from harness.dr_walk_writer import FIRST_ROWS, WRITE_TIMEOUT, Ack, sample_keys

FENCE_GRACE = 15.0  # seconds a fence may outlive its job (a recover round lifts an orphan)
CATCH_UP = 120.0  # seconds a replica may take to hold what its primary held


class KeyReader(Protocol):
    def __call__(self, label: str, flow: Flow, ranges: Sequence[range] | None = None) -> set[int]:
        """The keys of ``flow``'s collection on cluster ``label`` (within ``ranges``, default
        every key written so far)."""


class Invariants:
    """The walk's invariants, each a method answering its problem ("" when it holds)."""

    def __init__(
        self,
        *,
        model: Model,
        clusters: dict[str, ClusterHandle],
        fleet: Fleet,
        etcd_endpoint: str,
        keys: KeyReader,
        drop_client: Callable[[str], None],
        stale_checks: StaleChecks,
        result: WalkResult,
    ) -> None:
        self.model = model
        self.clusters = clusters
        self.fleet = fleet
        self.etcd_endpoint = etcd_endpoint
        self.keys = keys
        self.drop_client = drop_client  # a cluster's connection, dropped after a failed read
        self.stale_checks = stale_checks
        self.result = result
        # flow -> keys a recorded failure named (keep_going): not checked again
        self.excused: dict[str, set[int]] = {}
        self.named: dict[str, set[int]] = {}  # flow -> keys the failing check named
        # (flow, lost cluster) -> writes a failover left neither on the target nor in its export:
        # looked for on the lost cluster once it is back (did its queue keep them?)
        self.missed: dict[tuple[str, str], set[int]] = {}

    def check(
        self, only: Sequence[str] = (), wait_checks: bool = False
    ) -> Iterator[tuple[str, str, float]]:
        """Each invariant (``only``: those named), in order: (name, its problem or "", the
        seconds it took). ``wait_checks``: every stale-write check asked must end first (the
        walk's end)."""
        looked: list[tuple[str, str]] = []

        def stale_check(name: str) -> str:
            if not looked:  # the first of the two reads the checks' records (its time counted)
                looked.append(
                    self.stale_checks.look(self.switchover_view, self.acked_on, wait_checks)
                )
            broken, problem = looked[0]
            return problem if broken == name else ""

        for name, check in (
            ("stale_check_ends", lambda: stale_check("stale_check_ends")),
            ("stale_check_truthful", lambda: stale_check("stale_check_truthful")),
            ("one_direction_running", self.one_direction_running),
            ("at_most_two_tasks", self.at_most_two_tasks),
            ("no_ownerless_fence", self.no_ownerless_fence),
            ("acknowledged_on_primary", self.acknowledged_on_primary),
            ("target_plus_export", self.target_plus_export),
            ("export_disjoint_from_target", self.export_disjoint_from_target),
            ("equal_in_sync", self.equal_in_sync),
        ):
            if only and name not in only:
                continue
            began = time.monotonic()
            self.named = {}
            problem = check()
            for flow, keys in self.named.items() if problem else ():
                self.excused.setdefault(flow, set()).update(keys)
            yield name, problem, time.monotonic() - began

    def switchover_view(self, task_id: str) -> dict[str, Any]:
        """``progress.switchover`` of ``task_id`` ({} while no daemon answers)."""
        try:
            return job_of(self.fleet.any(), task_id)
        except Exception:  # noqa: BLE001 - a daemon being started
            return {}

    def acked_on(self, flow: str, cluster: str, after: float) -> int:
        acked = self.model.flows[flow].writer.snapshot().values()
        return sum(1 for a in acked if a.cluster == cluster and a.at > after)

    def flow_tasks(self) -> dict[str, list[dict[str, Any]]]:
        listed = self.fleet.tasks()
        return {
            f.name: [t for t in listed if f.collection in json.dumps(t)]
            for f in self.model.flows.values()
        }

    def one_direction_running(self) -> str:
        for name, tasks in self.flow_tasks().items():
            flow = self.model.flows[name]
            running = sorted(t["task_id"] for t in tasks if t["state"] == "Running")
            expected = flow.may_run()
            if running not in expected:
                states = {t["task_id"]: t["state"] for t in tasks}
                return (
                    f"flow {name} ({flow.state}, primary {flow.primary}): Running {running}, "
                    f"expected {' or '.join(map(str, expected))}; its tasks {states}"
                )
        return ""

    def at_most_two_tasks(self) -> str:
        for name, tasks in self.flow_tasks().items():
            if len(tasks) > 2:
                found = {t["task_id"]: (t["source_cluster"], t["state"]) for t in tasks}
                return f"flow {name} has {len(tasks)} tasks: {found}"
        return ""

    def no_ownerless_fence(self) -> str:
        # no job runs between steps and the walk sets no operator fence: no key may stay
        def fenced() -> list[str]:
            return [
                f"{label} ({c.milvus.etcd_root_path})"
                for label, c in self.clusters.items()
                if fence_at(self.etcd_endpoint, c.milvus.etcd_root_path) is not None
            ]

        found = fenced()
        deadline = time.monotonic() + FENCE_GRACE
        while found and time.monotonic() < deadline:
            time.sleep(1.0)
            found = fenced()
        if found:
            return (
                f"forceDeny set in the etcd of {', '.join(found)} with no job running, "
                f"{FENCE_GRACE:g} s after the step"
            )
        return ""

    def exempt(self, failovers: Sequence[Failover], key_ack: Ack) -> bool:
        """A write the lost cluster acknowledged after its failover's consistent_up_to (until
        the writers left it: a live lost cluster takes writes until they move, and answers a
        batch sent before the move within the write's timeout)."""
        return any(
            key_ack.cluster == f.lost
            and f.consistent < key_ack.at <= max(f.at, f.moved_at + WRITE_TIMEOUT)
            for f in failovers
        )

    def acknowledged_on_primary(self) -> str:
        for flow in self.model.flows.values():
            if not self.clusters[flow.primary].alive:
                continue
            acked = flow.writer.snapshot()
            excused = self.excused.get(flow.name, set())
            required = {k for k, a in acked.items() if not self.exempt(flow.failovers, a)} - excused
            held = self.keys(flow.primary, flow)
            missing = required - held
            if missing:
                self.named[flow.name] = missing
                by: dict[str, int] = {}
                for k in missing:
                    by[acked[k].cluster] = by.get(acked[k].cluster, 0) + 1
                last = max(acked[k].at for k in missing)
                return (
                    f"flow {flow.name}: {len(missing)} of {len(required)} acknowledged writes "
                    f"(not after a failover's consistent_up_to) are not on its primary "
                    f"{flow.primary}: acknowledged by {by}, the last at "
                    f"{time.strftime('%H:%M:%S', time.gmtime(last))}; e.g. {sample_keys(missing)}"
                )
        return ""

    def target_plus_export(self) -> str:
        for flow in self.model.flows.values():
            acked = flow.writer.snapshot()
            since = 0.0  # an earlier failover of the flow accounted for the writes before it
            for n, f in enumerate(flow.failovers):
                window, since = (since, f.at), f.at
                if not self.clusters[f.took_over].alive:
                    continue
                # a live lost cluster's writes after an earlier failover was asked, until the
                # writers left it, are that failover's (exempt), not this one's
                lost_writes = {
                    k
                    for k, a in acked.items()
                    if a.cluster == f.lost
                    and window[0] < a.at <= window[1]
                    and not self.exempt(flow.failovers[:n], a)
                }
                held = self.keys(f.took_over, flow)
                missing = lost_writes - held - f.exported - self.excused.get(flow.name, set())
                if missing:
                    self.named[flow.name] = missing
                    self.missed.setdefault((flow.name, f.lost), set()).update(missing)
                    acks = sorted(acked[k].at for k in missing)
                    return (
                        f"flow {flow.name}, failover of {f.task_id}: {len(missing)} write(s) "
                        f"{f.lost} acknowledged are neither on {f.took_over} nor in the export "
                        f"({len(f.exported)} inserts, complete {f.complete}); acknowledged "
                        f"{acks[0] - f.consistent:+.2f}..{acks[-1] - f.consistent:+.2f} s from "
                        f"the reported consistent_up_to, {f.killed_at - acks[-1]:.2f} s before "
                        f"the kill; e.g. {sample_keys(missing)}"
                    )
        return ""

    def export_disjoint_from_target(self) -> str:
        """No write twice: no acknowledged write both on a failover's target and in its export.

        Read at every check, not only right after the failover: the writers never write a key
        twice once acknowledged, so no later legitimate write puts a key the lost cluster had
        acknowledged on the target; one that arrives there later (a task resumed from before
        the export, a failback that copied the lost cluster's rows back) is the double write
        an operator replaying the file would make."""
        for flow in self.model.flows.values():
            acked = flow.writer.snapshot()
            for f in flow.failovers:
                if f.insert_lines != f.inserts_counted:
                    return (
                        f"flow {flow.name}, failover of {f.task_id}: the export file "
                        f"{f.file or '(none)'} has {f.insert_lines} insert line(s) of "
                        f"{flow.collection}, the answer counted {f.inserts_counted}: its keys "
                        "cannot be compared with the target"
                    )
                if not f.exported or not self.clusters[f.took_over].alive:
                    continue
                # every key of the export is read on the target, within the writer's ranges
                # or not (a full read: never empty, it holds the rows written before the tasks)
                spans = [*flow.writer.key_ranges(), range(min(f.exported), max(f.exported) + 1)]
                held = self.keys(f.took_over, flow, spans)
                both = f.exported & held
                self.result.export_keys_compared += len(f.exported)
                # the writer's own write of the key went elsewhere (a batch the lost cluster
                # did not acknowledge, retried after the failover), or is still under way
                retried = {
                    k
                    for k in both
                    if k >= FIRST_ROWS and (k not in acked or acked[k].cluster != f.lost)
                }
                self.result.export_keys_retried += len(retried)
                self.result.export_keys_in_doubt += len(f.in_doubt)
                self.result.export_keys_in_doubt_on_target += len(both & f.in_doubt)
                twice = both - retried - f.in_doubt - self.excused.get(flow.name, set())
                if twice:
                    self.named[flow.name] = twice
                    late = [acked[k].at - f.consistent for k in twice if k in acked]
                    when = (
                        f"acknowledged {min(late):+.2f}..{max(late):+.2f} s from the reported "
                        "consistent_up_to; "
                        if late and f.consistent
                        else ""
                    )
                    return (
                        f"flow {flow.name}, failover of {f.task_id}: {len(twice)} write(s) "
                        f"{f.lost} acknowledged are both on {f.took_over} and in the export "
                        f"({len(f.exported)} inserts, {len(f.in_doubt)} maybe_on_target, "
                        f"{len(both & f.in_doubt)} of those on the target, {len(retried)} "
                        f"retried by the writer; complete {f.complete}); {when}"
                        f"e.g. {sample_keys(twice)}"
                    )
        return ""

    def equal_in_sync(self) -> str:
        for flow in self.model.replicating():
            replica = flow.replica(self.model.pair)
            if not (self.clusters[flow.primary].alive and self.clusters[replica].alive):
                continue
            spans = flow.writer.key_ranges()
            expected = self.keys(flow.primary, flow, spans)
            excused = self.excused.get(flow.name, set())
            lacking = self.wait_replica_holds(flow, flow.primary, replica, expected - excused)
            if lacking:
                self.named[flow.name] = lacking
                return (
                    f"flow {flow.name}: replica {replica} lacks {len(lacking)} of the "
                    f"{len(expected)} keys its primary {flow.primary} held, {CATCH_UP:g} s on; "
                    f"e.g. {sample_keys(lacking)}"
                )
            extra = self.keys(replica, flow, spans) - self.keys(flow.primary, flow, spans) - excused
            if extra:
                self.named[flow.name] = extra
                return (
                    f"flow {flow.name}: replica {replica} holds {len(extra)} key(s) its primary "
                    f"{flow.primary} does not; e.g. {sample_keys(extra)}"
                )
        return ""

    def wait_replica_holds(
        self, flow: Flow, primary: str, replica: str, expected: set[int] | None = None
    ) -> set[int]:
        """Wait until ``replica`` holds every key of ``expected`` (default: what ``primary``
        holds now); the keys it still lacks after ``CATCH_UP`` seconds."""
        if expected is None:
            expected = self.keys(primary, flow)
        lacking = set(expected)
        deadline = time.monotonic() + CATCH_UP
        while True:
            try:
                lacking = expected - self.keys(replica, flow)
            except Exception:  # noqa: BLE001 - the collection not made there yet, or reconnecting
                self.drop_client(replica)
            if not lacking or time.monotonic() > deadline:
                return lacking
            time.sleep(1.0)
