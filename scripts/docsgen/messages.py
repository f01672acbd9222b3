"""The catalogue of docs/troubleshooting.md: every error message the code can produce and every
reason it sets on a task, found by reading the code (server/, replicator/, metastore/): each
construction of an exception (``SomeError("...")`` / ``f"..."``, raised or returned), each
``reason=`` given a literal text, and the reasons and warnings a task is given outside an
error (texts returned by a function named or documented for them, or assigned to ``reason``).
A message is shown as its template: ``{...}`` stands for what the code fills in (an
f-string's expression)."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "replicator", "metastore")
BEGIN = "<!-- messages: begin (python scripts/gen_docs.py) -->"
END = "<!-- messages: end -->"
# constructions that are not messages to an operator: the demo's own output, and errors the
# code raises only to catch itself
SKIPPED_KINDS = {"DemoError", "StopIteration", "AssertionError", "NotImplementedError"}


@dataclass(frozen=True, order=True)
class Message:
    kind: str
    template: str
    where: str


def _placeholder(node: ast.expr) -> str:
    """What an f-string fills in, as a reader would name it: ``{task_id}``, else ``{...}``."""
    while isinstance(node, ast.Subscript | ast.Call):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return "..."


def _template(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + _placeholder(value.value) + "}")  # type: ignore[attr-defined]
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is not None or right is not None:
            return (left or "{...}") + (right or "{...}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _template(node.left)
    return None


def _kind(call: ast.Call) -> str | None:
    func = call.func
    name = None
    if isinstance(func, ast.Name):
        name = func.id
    elif isinstance(func, ast.Attribute):
        name = func.attr
    if name and name.endswith(("Error", "Exception")):
        return name
    return None


def _said(node: ast.AST, where: str) -> set[Message]:
    """Texts the code builds as a task's reason or warning outside an exception: returned by a
    function named for them (``unreachable_warning``), or assigned to a ``reason``/``warning``."""
    texts: list[tuple[str, ast.expr]] = []
    doc = (ast.get_docstring(node) or "") if isinstance(node, ast.FunctionDef) else ""
    named = isinstance(node, ast.FunctionDef) and re.search(r"warning|reason", node.name)
    if isinstance(node, ast.FunctionDef) and (named or re.match(r"The (warning|reason)", doc)):
        kind = "task warning" if "warning" in node.name + doc[:12] else "task reason"
        texts = [
            (kind, n.value)
            for n in ast.walk(node)
            if isinstance(n, ast.Return) and n.value is not None
        ]
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
        if name in ("reason", "warning"):
            texts = [("task " + name, node.value)]
    said = set()
    for kind, value in texts:
        text = _template(value) if isinstance(value, ast.JoinedStr | ast.Constant) else None
        if text and text.strip() and " " in text.strip():
            said.add(Message(kind, " ".join(text.split()), where))
    return said


@functools.cache  # one read of the code per process
def scan() -> list[Message]:
    found: set[Message] = set()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "demo" in path.parts:
                continue
            relative = path.relative_to(REPO).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                found.update(_said(node, relative))
                if isinstance(node, ast.Call):
                    kind = _kind(node)
                    if kind and kind not in SKIPPED_KINDS and node.args:
                        text = _template(node.args[0])
                        if text and text.strip():
                            found.add(Message(kind, " ".join(text.split()), relative))
                    for keyword in node.keywords:
                        if keyword.arg == "reason":
                            text = _template(keyword.value)
                            if text and text.strip():
                                found.add(Message("task reason", " ".join(text.split()), relative))
    return sorted(found)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def render_block() -> str:
    messages = scan()
    kinds = sorted({m.kind for m in messages})
    out = [BEGIN, ""]
    for kind in kinds:
        rows = [m for m in messages if m.kind == kind]
        anchor = kind.lower().replace(" ", "-")
        out.append(f"### {kind} messages ({len(rows)})\n")
        out.append(f"Cause and fix: [{kind}](#{anchor}).\n")
        out.append("| message | where |\n|---|---|")
        out.extend(f"| `{_cell(m.template)}` | `{m.where}` |" for m in rows)
        out.append("")
    out.append(END)
    return "\n".join(out)


def kinds() -> set[str]:
    return {m.kind for m in scan()}
