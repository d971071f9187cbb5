"""No import cycle among our modules, counting imports inside functions (they must not hide one)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("tracing", "analysis", "dashboard", "sample_traces")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, known: set[str]) -> set[str]:
    """Our modules imported anywhere in `tree` except under `if TYPE_CHECKING:`."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                visit(other)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    """module -> our modules it imports (a package's import of its own submodules excluded)."""
    paths = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    known = set(paths)
    graph = {}
    for name, path in paths.items():
        deps = _imports(ast.parse(path.read_text()), known) - {name}
        if path.name == "__init__.py":  # a package re-exporting its submodules is not a cycle
            deps = {d for d in deps if not d.startswith(name + ".")}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by depth-first search (each reported once, from its smallest module)."""
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str], seen: set[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt == start:
                found.add(tuple(path))
            elif nxt > start and nxt not in seen:
                seen.add(nxt)
                walk(start, nxt, [*path, nxt], seen)
                seen.discard(nxt)

    for start in sorted(graph):
        walk(start, start, [start], {start})
    return [list(c) for c in sorted(found)]


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert "tracing.lean" in graph and "tracing.instrument" in graph["tracing.lean"]
    assert cycles(graph) == []
