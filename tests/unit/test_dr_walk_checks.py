"""The walk's invariants (tests/harness/dr_walk_invariants.py) on a model without clusters:
the target's keys are given, the writer's acknowledgements set by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.dr_walk import Walk
from harness.dr_walk_invariants import Invariants
from harness.dr_walk_model import ClusterHandle, Failover, Flow, Model, WalkResult, writers_follow
from harness.dr_walk_stale_checks import StaleChecks
from harness.dr_walk_writer import FIRST_ROWS, WRITE_TIMEOUT, Ack, MovingWriter

COLLECTION = "walk_f1"
KILLED = 1000.0
FIRST = 1_000_000


class FakeWalk(Walk):
    def __init__(self, target_keys: set[int]) -> None:  # no clusters, no fleet
        self.target_keys = target_keys
        self.reads: list[list[range]] = []
        self.result = WalkResult(seed=1)
        self.stale_checks = StaleChecks(seed=1)
        self.clusters = {
            "a": ClusterHandle("a", None),  # type: ignore[arg-type]
            "b": ClusterHandle("b", None),  # type: ignore[arg-type]
        }
        writer = MovingWriter(COLLECTION, {}, "b", first=FIRST)
        writer.next = FIRST + 40
        self.model = Model(pair=("a", "b"))
        self.model.flows["f1"] = Flow(
            "f1", COLLECTION, "a", "b", {"a": "t1"}, writer, "failed_over"
        )
        self.invariants = Invariants(
            model=self.model,
            clusters=self.clusters,
            fleet=None,  # type: ignore[arg-type]
            etcd_endpoint="",
            keys=self.keys,
            drop_client=lambda _label: None,
            stale_checks=self.stale_checks,
            result=self.result,
        )

    def keys(self, label: str, flow: Flow, ranges: Any = None) -> set[int]:
        assert label == "b"
        self.reads.append(list(ranges))
        return {k for k in self.target_keys if any(k in r for r in ranges)}


def export_file(tmp_path: Path, keys: list[int], in_doubt: set[int] = frozenset()) -> str:
    path = tmp_path / "t1-export.jsonl"
    lines = []
    for k in keys:
        source: dict[str, Any] = {"channel": "c0", "position": k}
        if k in in_doubt:
            source["maybe_on_target"] = True
        lines.append(
            json.dumps({"op": "insert", "collection": COLLECTION, "pk": k, "source": source})
        )
    lines.append(json.dumps({"op": "insert", "collection": "other", "pk": FIRST, "source": {}}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def failover(walk: FakeWalk, file: str, counted: int) -> None:
    exported, in_doubt, lines = walk._exported(file, COLLECTION)
    walk.model.flows["f1"].failovers.append(
        Failover(
            task_id="t1",
            lost="a",
            took_over="b",
            killed_at=KILLED,
            at=KILLED + 1,
            consistent=KILLED - 1,
            exported=frozenset(exported),
            complete=True,
            in_doubt=frozenset(in_doubt),
            insert_lines=lines,
            inserts_counted=counted,
            file=file,
        )
    )


def ack(walk: FakeWalk, keys: range, cluster: str, at: float) -> None:
    walk.model.flows["f1"].writer.acked.update(dict.fromkeys(keys, Ack(cluster, at)))


def test_a_key_acknowledged_by_the_lost_cluster_on_the_target_and_in_the_export_breaks_it(
    tmp_path: Path,
) -> None:
    target = set(range(FIRST_ROWS)) | set(range(FIRST, FIRST + 25))
    walk = FakeWalk(target)
    ack(walk, range(FIRST, FIRST + 30), "a", KILLED - 2)
    failover(walk, export_file(tmp_path, list(range(FIRST + 20, FIRST + 30))), counted=10)
    problem = walk.invariants.export_disjoint_from_target()
    assert "5 write(s) a acknowledged are both on b and in the export" in problem, problem
    assert walk.invariants.named == {"f1": set(range(FIRST + 20, FIRST + 25))}
    assert walk.result.export_keys_compared == 10
    # every exported key was within the ranges read
    assert all(any(k in r for r in walk.reads[-1]) for k in range(FIRST + 20, FIRST + 30))


def test_disjoint_exports_hold_and_retries_and_maybe_on_target_lines_are_not_double_writes(
    tmp_path: Path,
) -> None:
    target = (
        set(range(FIRST_ROWS)) | set(range(FIRST, FIRST + 20)) | set(range(FIRST + 25, FIRST + 35))
    )
    walk = FakeWalk(target)
    ack(walk, range(FIRST, FIRST + 25), "a", KILLED - 2)
    # a batch the killed a wrote to its WAL but never acknowledged, retried on b afterwards
    ack(walk, range(FIRST + 25, FIRST + 30), "b", KILLED + 3)
    ack(walk, range(FIRST + 30, FIRST + 35), "b", KILLED + 4)
    exported = [*range(FIRST + 15, FIRST + 30)]
    # a write cut off: may be on the target (it holds the first 5 of these 7)
    in_doubt = set(range(FIRST + 15, FIRST + 22))
    failover(walk, export_file(tmp_path, exported, in_doubt), counted=len(exported))
    assert walk.invariants.export_disjoint_from_target() == ""
    assert walk.result.export_keys_compared == 15
    assert walk.result.export_keys_retried == 5
    # the maybe_on_target lines are counted, and so are those the target does hold
    assert walk.result.export_keys_in_doubt == 7
    assert walk.result.export_keys_in_doubt_on_target == 5


def test_an_export_file_that_does_not_say_what_the_answer_counted_breaks_it(
    tmp_path: Path,
) -> None:
    walk = FakeWalk(set(range(FIRST_ROWS)))
    failover(walk, str(tmp_path / "missing.jsonl"), counted=7)  # nothing read: not vacuous
    problem = walk.invariants.export_disjoint_from_target()
    assert "has 0 insert line(s)" in problem and "the answer counted 7" in problem, problem


def test_a_live_lost_clusters_writes_until_the_writers_moved_are_the_operators() -> None:
    """An operator's failover of a running primary (the boundary search's failover:other at
    failback_released): the old primary acknowledges what the writers send it until they move
    at the answer, after the task that would carry it was paused; those writes are exempt, as
    writes after a kill are, and only those."""
    walk = FakeWalk(set())
    flow = walk.model.flows["f1"]
    flow.failovers.append(
        Failover(
            task_id="t1",
            lost="a",
            took_over="b",
            killed_at=KILLED,
            at=KILLED,
            consistent=KILLED - 1,
            exported=frozenset(),
            complete=True,
            moved_at=KILLED + 1,
        )
    )
    exempt = walk.invariants.exempt
    assert exempt(flow.failovers, Ack("a", KILLED + 0.5))  # after the ask, before the move
    assert exempt(flow.failovers, Ack("a", KILLED + 1 + WRITE_TIMEOUT))  # a batch sent before it
    assert not exempt(flow.failovers, Ack("a", KILLED - 2))  # before the figure: required
    assert not exempt(flow.failovers, Ack("a", KILLED + 2 + WRITE_TIMEOUT))  # sent after the move
    assert not exempt(flow.failovers, Ack("b", KILLED + 0.5))  # the new primary's own


def test_a_live_lost_clusters_writes_after_an_earlier_failover_are_not_the_next_ones() -> None:
    """The boundary search on 1447c5d (failback_flow x kill, after the verbs at fence-unheld):
    an operator's failover of a running a; a acknowledged writes after the ask until the
    writers moved (exempt: a failback's repair removed them from a later); a second failover,
    of a killed a, counted them among its own lost writes. They are the first failover's."""
    walk = FakeWalk(set())
    walk.invariants.keys = lambda label, flow, ranges=None: set()
    flow = walk.model.flows["f1"]
    later = KILLED + 100

    def failed_over(at: float) -> Failover:
        return Failover(
            task_id="t1",
            lost="a",
            took_over="b",
            killed_at=at,
            at=at,
            consistent=at - 1,
            exported=frozenset(),
            complete=True,
            moved_at=at + 1,
        )

    flow.failovers += [failed_over(KILLED), failed_over(later)]
    ack(walk, range(FIRST, FIRST + 5), "a", KILLED + 0.5)  # after the first ask, before the move
    assert walk.invariants.target_plus_export() == ""
    ack(walk, range(FIRST + 5, FIRST + 7), "a", later - 10)  # the second failover's, not on b
    assert "2 write(s) a acknowledged are neither on b" in walk.invariants.target_plus_export()


def test_a_failover_of_a_switchovers_reverse_task_before_the_switchover_is_settled() -> None:
    """The boundary search on 1447c5d (switchover @ released x failover:other): a switchover
    a -> b handed the flow to b (the writers on b), and, before the search settled the job in
    the model (primary still a), an operator failed over its reverse task b -> a. The cluster
    that took over is the task's target a, not the model's replica b (the check then compared
    b's own writes with b: "15 write(s) b acknowledged are both on b and in the export"); the
    switchover's end, settled after, leaves production on a."""
    walk = FakeWalk(set())
    flow = walk.model.flows["f1"]
    flow.state, flow.primary, flow.tasks = "replicating", "a", {"a": "t1"}
    flow.writer.move_to("b")  # writers_may_move_at: the search's mover followed the job
    walk.failed_over(flow, "b", 0.0, KILLED, "t1-rev", {"consistent_up_to": None})
    assert flow.failovers[-1].lost == "b"
    assert flow.failovers[-1].took_over == "a"
    assert (flow.state, flow.primary, flow.writer.at) == ("failed_over", "a", "a")
    done = {"state": "done", "target_cluster": "b", "reverse_task_id": "t1-rev"}
    # the search follows the job to its end: the writers stay where the failover put them
    assert writers_follow(flow, done, walk.model.pair) == ""
    said = walk._settle(flow, done)
    assert "failed over since to a" in said, said
    assert flow.tasks == {"a": "t1", "b": "t1-rev"}
    assert (flow.state, flow.primary, flow.writer.at) == ("failed_over", "a", "a")


def test_a_switchover_settled_done_hands_the_model_to_its_target() -> None:
    walk = FakeWalk(set())
    flow = walk.model.flows["f1"]
    flow.state, flow.primary, flow.tasks = "replicating", "a", {"a": "t1"}
    walk._settle(flow, {"state": "done", "target_cluster": "b", "reverse_task_id": "t1-rev"})
    assert flow.tasks == {"a": "t1", "b": "t1-rev"}
    assert (flow.state, flow.primary, flow.writer.at) == ("replicating", "b", "b")


def test_the_writers_follow_a_switchover_to_its_target_once_they_may_move() -> None:
    walk = FakeWalk(set())
    flow = walk.model.flows["f1"]
    flow.state, flow.primary = "replicating", "a"
    pair = walk.model.pair
    assert writers_follow(flow, {"state": "reversing", "target_cluster": "b"}, pair) == ""
    moving = {"state": "reversing", "target_cluster": "b", "writers_may_move_at": {"ts": 1}}
    assert writers_follow(flow, moving, pair) == "b"
    assert writers_follow(flow, {"state": "done", "target_cluster": "b"}, pair) == "b"


class OneMember:
    def live(self) -> list[object]:
        return [object()]


def test_a_failed_failback_leaves_the_flow_failing_back_with_its_reverse_task_free_to_run() -> None:
    """The walk on 346369d (seed 41, first attempt): a failback whose verify Milvus timed out
    ended failed, the model put the flow back to failed over, and the next check flagged the
    reverse task still Running. Documented (disaster-recovery.md, Failback): the flow stays
    failing back with no job on it, its reverse task may run, and the failback applies again."""
    walk = FakeWalk(set())
    walk.fleet = OneMember()  # type: ignore[assignment]
    flow = walk.model.flows["f1"]
    flow.failovers.append(
        Failover("t1", "a", "b", KILLED, KILLED + 1, KILLED - 1, frozenset(), True)
    )
    said = walk.failed_back(flow, "t1-rev", {"state": "failed", "reason": "DEADLINE_EXCEEDED"})
    assert "stays failing back" in said, said
    assert (flow.state, flow.primary, flow.reverse) == ("failing_back", "b", "t1-rev")
    assert walk.result.jobs_failed and "DEADLINE_EXCEEDED" in walk.result.jobs_failed[0]
    assert walk._moves("failback") == ["f1"]  # asked again
    listed: list[dict[str, str]] = []
    walk.invariants.flow_tasks = lambda: {"f1": listed}  # type: ignore[method-assign]
    for running in ([], ["t1-rev"]):
        listed[:] = [{"task_id": t, "state": "Running"} for t in running]
        listed.append({"task_id": "t1", "state": "Paused"})
        assert walk.invariants.one_direction_running() == ""
    listed[:] = [{"task_id": "t1", "state": "Running"}, {"task_id": "t1-rev", "state": "Paused"}]
    assert "Running ['t1']" in walk.invariants.one_direction_running()
    walk.failed_back(flow, "t1-rev", {"state": "in_sync"})
    assert (flow.state, flow.tasks, flow.reverse) == ("replicating", {"a": "t1", "b": "t1-rev"}, "")
