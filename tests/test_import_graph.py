"""The package's import graph has no cycles: each module can be read (and imported) on its own.

Edges come from each module's `import` and `from` statements, parsed, not run. Module-level
ones, those under `if TYPE_CHECKING:` included (mypy follows them), must form no cycle at all.
Imports inside functions run late and cannot break an import, but a cycle through one still
ties two modules together: the few there are are listed, and a new one fails as well.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import imaging_ai

ROOT = Path(imaging_ai.__file__).parent

# Cycles closed only by an import inside a function, each a sorted tuple of its modules.
KNOWN_LAZY_CYCLES = {
    # run draws each case with report, report reads run's CaseResult (dev code, not shipped).
    ("imaging_ai.evaluate.report", "imaging_ai.evaluate.run"),
}

Graph = dict[str, set[str]]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements run at import: the body, and the bodies of its `if` and `try` blocks."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If):
            todo += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            todo += [*node.body, *node.orelse, *node.finalbody]
            todo += [s for handler in node.handlers for s in handler.body]


def _imported(node: ast.AST) -> list[str]:
    """The package's modules that one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        # `from pkg import sub` imports the submodule; `from pkg.mod import name`, the module.
        subs = [f"{node.module}.{alias.name}" for alias in node.names]
        names = [s for s in subs if s in MODULES] or [node.module]
    else:
        return []
    found = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != "imaging_ai":
            found.append(name)
    return found


def import_graph(lazy: bool) -> Graph:
    """Each module's imports of the package; with `lazy`, those inside functions too."""
    graph: Graph = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        nodes = ast.walk(tree) if lazy else _module_level(tree)
        graph[name] = {m for node in nodes for m in _imported(node) if m != name}
    return graph


def cycles(graph: Graph) -> set[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_package() -> None:
    graph = import_graph(lazy=False)
    assert "imaging_ai.receive" in graph["imaging_ai.receive_pool"]
    assert "imaging_ai.pipeline" in import_graph(lazy=True)["imaging_ai.cli"]


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == {("a", "b", "c")}


def test_no_module_level_import_cycle() -> None:
    assert cycles(import_graph(lazy=False)) == set()


def test_no_new_cycle_through_a_lazy_import() -> None:
    assert cycles(import_graph(lazy=True)) == KNOWN_LAZY_CYCLES
