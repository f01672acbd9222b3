"""The boundaries of the disaster-recovery jobs (issue 48, Build item 2), read from the code:
every durable write of a switchover, failover or failback (a job record saved, the pair record's
compare-and-set, a fence key written or deleted, a task's state written, a watch armed) is
followed by a named fault point, and the points the code names are those
``server.dr.flows.BOUNDARIES`` lists (the search in tests/harness/dr_boundaries.py goes over
that list). A new durable write without a point, or a point not in the list, fails here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from server.dr.flows import (
    BOUNDARIES,
    FAULT_ENV,
    InjectedFaultError,
    injected_fault,
    injected_fault_sync,
)

DR = Path(__file__).resolve().parents[2] / "server" / "dr"

# The code of the jobs: module -> class ("" for module functions) -> functions read (None: every
# method but the helpers, whose call sites are the writes).
JOB_CODE: dict[str, dict[str, set[str] | None]] = {
    "switchover.py": {"SwitchoverRun": None},
    "fence_owners.py": {"PairFences": {"acquire", "release", "_lift"}},
    "manager.py": {"DisasterRecovery": {"switchover", "_take_over_switchover", "failover"}},
    "failover.py": {"": {"run_failover"}},
    "failback.py": {"FailbackRun": None},
    "failbacks.py": {"Failbacks": {"ask", "recover"}},
    "stale_check.py": {"": {"check_stale_writes"}},
}
# helpers that write (their call sites are checked, not their bodies)
# (a claim renewed, claim.keep, changes only its time: not a boundary)
HELPERS = {
    "_save",
    "_finish_state",
    "save",
    "_update",
    "_join",
    "start_verify",
    "_arm_watch",
    "mark_failing_back",
}
# the durable writes, by the last two parts of the callee's name (or its only part)
WRITES = {
    "save_job",
    "save_json",
    "replace_record",
    "save_taken_over",
    "arm",
    "self._save",
    "self.save",
    "run.save",
    "self._finish_state",
    "self._update",
    "self._join",
    "self.start_verify",
    "run.start_verify",
    "save_check",
    "self._arm_watch",
    "self.mark_failing_back",
    "run.mark_failing_back",
    "pairs.update",
    "claim.release",
    "pairs.claim",
    "store.update",
    "fence.create",
    "fence.delete_if",
    "sup.pause",
    "sup.resume",
    "sup.create",
    "sup.delete",
    "sup.verify",
    "ops.pause",
    "ops.set_reason",
}
POINT_CALLS = {"injected_fault", "injected_fault_sync"}


@dataclass(frozen=True)
class Write:
    where: str  # module:function:line
    call: str


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return "?"


def _callee(call: ast.Call) -> str:
    """The called function's name, the last two parts; ``asyncio.to_thread(f, ...)`` is f."""
    name = _name(call.func)
    if name.endswith("to_thread") and call.args:
        name = _name(call.args[0])
    return ".".join(name.split(".")[-2:])


def _writes_in(statement: ast.stmt) -> list[str]:
    """The durable writes a simple statement makes (not those of nested blocks)."""
    if isinstance(statement, ast.If | ast.For | ast.While | ast.Try | ast.With | ast.AsyncWith):
        return []
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
        return []
    found = []
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and _callee(node) in WRITES:
            found.append(_callee(node))
    return found


def _points_in(statement: ast.stmt) -> list[str]:
    """The points a statement names (both branches of a conditional name)."""
    names = []
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and _name(node.func).split(".")[-1] in POINT_CALLS:
            first = node.args[0]
            options = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
            for option in options:
                assert isinstance(option, ast.Constant), ast.dump(node)
                names.append(str(option.value))
    return names


def _blocks(node: ast.AST) -> list[list[ast.stmt]]:
    """The blocks of a compound statement; an ``except`` that ends raising is an error path
    (what it undoes ends the attempt), not read."""
    handlers = [h.body for h in getattr(node, "handlers", [])]
    return [
        getattr(node, field)
        for field in ("body", "orelse", "finalbody")
        if isinstance(getattr(node, field, None), list)
    ] + [body for body in handlers if not isinstance(body[-1], ast.Raise)]


def _check_block(
    block: list[ast.stmt], after: list[ast.stmt], where: str, missing: list[Write]
) -> None:
    """Each write of ``block`` followed by a point: the next statement, or (the block's last)
    the statement after the enclosing one (``after``)."""
    for index, statement in enumerate(block):
        rest = block[index + 1 :] + after
        for write in _writes_in(statement):
            follower = next((s for s in rest if not isinstance(s, ast.Break | ast.Continue)), None)
            if isinstance(follower, ast.Raise):
                continue  # an error path: the job's attempt ends with the write
            if follower is None or not _points_in(follower):
                missing.append(Write(f"{where}:{statement.lineno}", write))
        for inner in _blocks(statement):
            _check_block(inner, rest, where, missing)


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for module, classes in JOB_CODE.items():
        tree = ast.parse((DR / module).read_text())
        for owner, wanted in classes.items():
            if owner:
                body = next(
                    n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner
                )
            else:
                body = tree.body
            for node in body:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                chosen = node.name not in HELPERS if wanted is None else node.name in wanted
                if chosen:
                    found.append((f"{module}:{owner + '.' if owner else ''}{node.name}", node))
        for owner, wanted in classes.items():
            for function in wanted or ():
                label = f"{module}:{owner + '.' if owner else ''}{function}"
                assert any(name == label for name, _ in found), f"{label}: gone from the code"
    return found


def _declared() -> set[str]:
    """Every point the jobs' modules name."""
    points: set[str] = set()
    for module in JOB_CODE:
        for node in ast.walk(ast.parse((DR / module).read_text())):
            if isinstance(node, ast.Expr):
                points.update(_points_in(node))
    return points


def test_every_durable_write_of_a_job_is_followed_by_a_fault_point() -> None:
    missing: list[Write] = []
    functions = _functions()
    for where, function in functions:
        _check_block(function.body, [], where, missing)
    assert len(functions) > 30, [w for w, _ in functions]  # the scan found the jobs' code
    assert not missing, "durable writes with no fault point after them:\n" + "\n".join(
        f"  {w.where}: {w.call}" for w in missing
    )


def test_the_points_the_code_names_are_the_listed_boundaries() -> None:
    listed = [p for points in BOUNDARIES.values() for p in points]
    assert len(listed) == len(set(listed)), "a point listed twice"
    assert _declared() == set(listed)


def test_a_durable_write_with_no_point_is_found(tmp_path: Path) -> None:
    """The scan itself: a write with no point after it is named, one with a point is not."""
    code = ast.parse(
        "async def step(self):\n"
        "    await self._save(a)\n"
        "    await injected_fault('x')\n"
        "    for t in ts:\n"
        "        save_json(store, t)\n"
        "    await injected_fault('y')\n"
        "    await self.sup.pause(t)\n"
        "    log.info('paused')\n"
    )
    missing: list[Write] = []
    function = code.body[0]
    assert isinstance(function, ast.AsyncFunctionDef)
    _check_block(function.body, [], "m", missing)
    assert [w.call for w in missing] == ["sup.pause"]


async def test_points_are_inert_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULT_ENV, raising=False)
    await injected_fault("fencing")
    injected_fault_sync("failover_paused", "failover")
    monkeypatch.setenv(FAULT_ENV, "fail:failover_saved")
    injected_fault_sync("failover_paused", "failover")
    with pytest.raises(InjectedFaultError):
        injected_fault_sync("failover_saved", "failover")
    injected_fault_sync("failover_saved", "failover")  # a failure fires once per process
