"""The operator verbs of one boundary judged in one held world (issue 48, Build item 2).

A verb the daemon refuses (409 naming the state, 404 for a task not there) leaves the world as
it was, so the verbs of one boundary need not each hold a job of their own: the job is held at
the point once, and every verb fault of that point asked there one after another. After each
refusal the cheap invariants are checked at once: never both directions Running, no fence
without an owner, and the world unchanged (the pair record but its claim's renewal time, each
task's state, the job's record). The first verb that is accepted (2xx, or not answered at all:
it may have acted) goes on as a case of its own (the hold released, the job's end, the walk's
invariants, the flow driven home by verbs alone, every invariant again); the verbs left are
asked in a fresh held world (the job run to the point again).

Each verb keeps its own row. Its seconds: its own ask and checks, plus an even share of its
world's reaching (the job run to the point) among the rows judged in that world, plus the
world's end (release, settle, drive home) when it was the verb accepted there, else an even
share of it among the refused rows of that world. The rows' seconds add up to the wall time.
An invariant that breaks at a world's end counts against the accepted verb's row, or, when
every verb of the world was refused, against each of them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from harness.dr_clusters import fence_at
from harness.dr_walk_model import InvariantError

if TYPE_CHECKING:
    from harness.dr_boundaries import BoundarySearch, Case, CaseResult


def run_verbs(search: BoundarySearch, cases: list[Case]) -> list[CaseResult]:
    """The verb cases of one job and point (``cases``), in as few held worlds as they allow."""
    pending = list(cases)
    done: list[CaseResult] = []
    world = 0
    while pending:
        world += 1
        done.extend(_one_world(search, pending, world))
    return done


def _one_world(search: BoundarySearch, pending: list[Case], world: int) -> list[CaseResult]:
    """One held world: the pending verbs asked until one is accepted (removed from
    ``pending`` as they are judged); their rows."""
    from harness.dr_boundaries import CaseResult

    first = pending[0]
    search.say(f"held world {world} of {first.job} @ {first.point}: {len(pending)} verb(s) left")
    began = time.monotonic()
    failures = search.walk.result.failures
    probe = CaseResult(first)
    rows: list[CaseResult] = []
    accepted: CaseResult | None = None
    own_seconds: dict[int, float] = {}
    row_failures: dict[int, list[Any]] = {}
    reach_seconds = end_seconds = 0.0
    end_from = len(failures)
    try:
        try:
            reached = search.reach(first, probe)
        finally:
            reach_seconds = time.monotonic() - began
        if reached is None or not probe.held:
            # the point not reached: every verb left shares the one try (as a case alone did)
            for case in list(pending):
                rows.append(CaseResult(case, held=False, outcome=probe.outcome))
                pending.remove(case)
            if reached is not None:
                end_from = len(failures)
                ended = time.monotonic()
                try:
                    search.end(first, probe, *reached)
                finally:
                    end_seconds = time.monotonic() - ended
                for row in rows:
                    row.outcome = probe.outcome
            return rows
        own, previous, asked = reached
        before = len(failures)
        try:
            for case in list(pending):
                row = CaseResult(case, held=True)
                started, before = time.monotonic(), len(failures)
                pending.remove(case)
                rows.append(row)
                snapshot = _snapshot(search, first.job, own)
                if case.fault.startswith("delete"):
                    search.note_failover(first.job, own)
                changed = search.apply_verb(case, own, row)
                if changed:
                    accepted = row
                    own_seconds[id(row)] = time.monotonic() - started
                    break
                if "not asked" not in row.outcome:
                    _cheap_checks(search, snapshot, first.job, own, row)
                    row.outcome += f"; refused in held world {world}, the world unchanged"
                row_failures[id(row)] = failures[before:]
                own_seconds[id(row)] = time.monotonic() - started
        except Exception as exc:  # noqa: BLE001 - counted against the verb judged, then the end
            if not isinstance(exc, InvariantError):
                search.step_failed(exc)
            if rows and rows[-1] is not accepted:
                row_failures[id(rows[-1])] = failures[before:]
        end_from = len(failures)
        ended = time.monotonic()
        end_case = accepted.case if accepted is not None else first
        end_result = accepted if accepted is not None else CaseResult(first, held=True)
        try:
            search.end(end_case, end_result, own, previous, asked)
        finally:
            end_seconds = time.monotonic() - ended
        if accepted is None:
            for row in rows:
                row.outcome += f"; the world's end: {end_result.outcome}"
    except InvariantError:
        pass  # recorded by the walk (keep_going) or by the search
    except Exception as exc:  # noqa: BLE001 - a wait that never ended is a result
        search.step_failed(exc)
    finally:
        search.clean_up()
        if not rows:  # nothing judged (the world could not be made): each verb left says so
            for case in list(pending):
                rows.append(CaseResult(case, outcome=probe.outcome or "the world not made"))
                pending.remove(case)
    ending = failures[end_from:]
    for row in rows:
        mine = list(row_failures.get(id(row), []))
        if accepted is None or row is accepted:
            mine += ending
        row.broke = [f"{f.check}: {f.detail[:400]}" for f in mine]
    _share_time(rows, accepted, own_seconds, reach_seconds, end_seconds, began)
    for row in rows:
        search.say(
            f"  {row.case.fault} -> {row.outcome[:300]}; broke {row.broke or 'nothing'} "
            f"({row.seconds:.1f} s)"
        )
    return rows


def _share_time(
    rows: list[CaseResult],
    accepted: CaseResult | None,
    own: dict[int, float],
    reach: float,
    end: float,
    began: float,
) -> None:
    """Each row's seconds: its own, a share of the reach, the end (see the module's text)."""
    if not rows:
        return
    total = time.monotonic() - began
    spent = reach + end + sum(own.values())
    rest = max(total - spent, 0.0)  # the clean-up after the world: shared like the reach
    for row in rows:
        row.seconds = own.get(id(row), 0.0) + (reach + rest) / len(rows)
        if accepted is None:
            row.seconds += end / len(rows)
        elif row is accepted:
            row.seconds += end


# the points where the held job's key is in etcd with no record by design: it found its hold
# given up (another daemon rolled the job back) and deletes the key next
KEY_WITHOUT_RECORD = ("fence-unheld",)


def _ownerless_fences(search: BoundarySearch, point: str) -> str:
    """A fence key in a cluster's etcd that no live job owns, while a job is held (the walk's
    own check asks for no key at all: it runs between jobs): the pair records the key's fence
    with an owner, or the operator's, or being lifted by the job that holds the flow."""
    if point in KEY_WITHOUT_RECORD:
        return ""
    pair = search.pairs.get(*search.walk.model.pair)
    live = {f.job.job_id for f in pair.flows.values() if f.job is not None and not f.job.expired()}
    found = []
    for label, cluster in search.walk.clusters.items():
        if not cluster.alive:
            continue
        if fence_at(search.walk.etcd_endpoint, cluster.milvus.etcd_root_path) is None:
            continue
        hold = pair.fences.get(label)
        owned = hold is not None and (
            hold.operator or bool(set(hold.owners) & live) or (hold.lifting and bool(live))
        )
        if not owned:
            found.append(f"forceDeny on {label} held by {hold} with live jobs {sorted(live)}")
    return "; ".join(found)


# a job whose record says it ended: a recover round may apply its effects on the pair (hand
# the flow over, release the claim) while it is held, without any verb
ENDED = ("done", "failed", "in_sync")


def _snapshot(search: BoundarySearch, job: str, own: str) -> dict[str, Any]:
    """What a refused verb must leave as it was ({} when no daemon answers: not compared)."""
    try:
        tasks = {task_id: view["state"] for task_id, view in search.tasks().items()}
    except OSError:  # the only daemon held in the recover round of its start
        return {}
    pair = search.pairs.get(*search.walk.model.pair)
    record = {k: v for k, v in search.view(job, own).items() if k != "renewed_at"}
    # a fence its last owner left (ownerless, being lifted) is lifted by whichever comes first,
    # the job or any recover round (server/dr/fence_owners.py): gone or not, not the verb's doing
    fences = {
        label: hold
        for label, hold in pair.fences.items()
        if hold.owners or hold.operator or not hold.lifting
    }
    snapshot: dict[str, Any] = {"fences": fences, "tasks": tasks, "job": record}
    if record.get("state") not in ENDED:
        snapshot["flows"] = {
            key: replace(flow, job=replace(flow.job, renewed_at=0.0) if flow.job else None)
            for key, flow in pair.flows.items()
        }
    return snapshot


def _differences(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What changed, field by field."""
    said = []
    for key in sorted(before.keys() & after.keys()):
        old, new = before[key], after[key]
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            for name in sorted(old.keys() | new.keys(), key=str):
                if old.get(name) != new.get(name):
                    said.append(f"{key}[{name}]: {old.get(name)} -> {new.get(name)}")
        else:
            said.append(f"{key}: {old} -> {new}")
    return "; ".join(said)


def _cheap_checks(
    search: BoundarySearch, before: dict[str, Any], job: str, own: str, row: CaseResult
) -> None:
    """After a refusal: never both directions, no ownerless fence, the world unchanged."""
    try:
        search._never_both_directions()
    except OSError:  # no daemon serving (held in the recover round of its start)
        return
    ownerless = _ownerless_fences(search, row.case.point)
    if ownerless:
        search._broke("no_ownerless_fence", f"{row.outcome[:200]}: {ownerless}")
    after = _snapshot(search, job, own)
    detail = _differences(before, after) if before and after else ""
    if detail:
        search._broke("refused_verb_changed_nothing", f"{row.outcome[:200]}: {detail[:1800]}")
