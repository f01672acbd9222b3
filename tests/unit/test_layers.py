"""The layers point one way and no import circle hides anywhere (ARCHITECTURE.md, "Layers").

Every import of every module under ``server/``, ``replicator/`` and ``metastore/`` is read from
its AST: at module level, under ``if TYPE_CHECKING:`` and inside functions alike, so a circle
cannot be hidden by moving one of its imports out of sight. The test fails on

- a circle between modules (a strongly connected set of two or more);
- an arrow up the layers: ``metastore`` -> ``replicator`` or ``server``, ``replicator`` ->
  ``server``;
- inside ``server/``, a concern importing the composition root (``server.app``,
  ``server.daemon``, ``server.__main__``; only the entry points may), or the task lifecycle
  (``server.tasks``) importing disaster recovery, the HTTP layer, the CLI or the scheduled
  jobs that drive it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("metastore", "replicator", "server")
LAYER = {"metastore": 0, "replicator": 1, "server": 2}
ROOT_MODULES = ("server.app", "server.daemon", "server.__main__")
# the entry points that start the composition root: ``milvus-cdc serve`` (server.cli.serve),
# ``python -m server``
ENTRY_POINTS = (*ROOT_MODULES, "server.cli.serve")
# packages the task lifecycle must not import: they drive it, it does not know them
ABOVE_TASKS = ("server.dr", "server.http", "server.cli", "server.runtime", "server.demo")


def module_files() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """The dotted names a module imports anywhere in its body, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names.add(origin)
            names.update(f"{origin}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolves to its longest module)."""
    files = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for name in imported_names(module, path):
            target = resolve(name)
            if target is None:
                continue
            # importing a.b.c runs the __init__ of a and of a.b first: arrows to them too
            parts = target.split(".")
            targets.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        # a module's own packages run before it anyway: not arrows
        graph[module] = {
            t for t in targets if t in files and t != module and not module.startswith(t + ".")
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up the layers, or into the composition root, or from the task
    lifecycle into what drives it."""
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            top, target_top = module.split(".")[0], target.split(".")[0]
            if LAYER[target_top] > LAYER[top]:
                wrong.append(f"{module} -> {target} (the engine imports the daemon)")
            elif target in ROOT_MODULES and module not in ENTRY_POINTS:
                wrong.append(f"{module} -> {target} (into the composition root)")
            elif module.startswith("server.tasks") and target.startswith(ABOVE_TASKS):
                wrong.append(f"{module} -> {target} (the task lifecycle imports what drives it)")
    return wrong


def test_a_package_init_that_imports_its_importer_is_a_circle():
    """``server.app_state`` imports ``server.http.auth``, which runs ``server/http/__init__``
    first: had that re-exported a route module importing ``server.app_state``, the daemon
    would not start. The graph has the arrow to the package, so the circle is seen."""
    graph = import_graph()
    assert "server.http" in graph["server.app_state"]


def test_the_import_graph_is_read_from_every_module():
    graph = import_graph()
    # a sample the reader must see: known arrows, one of them inside a function body
    assert "server.tasks.supervisor" in graph["server.app"]
    assert "metastore" in graph["replicator.pipeline.runner"]
    assert len(graph) > 150


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_layers_point_one_way():
    assert upward_arrows(import_graph()) == []


def test_the_checks_catch_what_they_look_for():
    """The checks themselves, on a made-up graph: a circle through a hidden import and an
    arrow from the engine up to the daemon are found."""
    graph = {
        "replicator.a": {"replicator.b"},
        "replicator.b": {"replicator.c"},
        "replicator.c": {"replicator.a", "server.x"},
        "server.x": set(),
        "server.tasks.y": {"server.dr.z"},
        "server.dr.z": set(),
    }
    assert circles(graph) == [["replicator.a", "replicator.b", "replicator.c"]]
    assert upward_arrows(graph) == [
        "replicator.c -> server.x (the engine imports the daemon)",
        "server.tasks.y -> server.dr.z (the task lifecycle imports what drives it)",
    ]


def test_an_import_inside_a_function_or_under_type_checking_counts(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from server.tasks import supervisor\n"
        "def f():\n    from server.dr.manager import DisasterRecovery\n"
    )
    names = imported_names("replicator.m", source)
    assert {"server.tasks.supervisor", "server.dr.manager.DisasterRecovery"} <= names
