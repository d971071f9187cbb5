"""The floors of the house hold: no package imports from a floor above it, and no import cycle.

Every module of every package is parsed (ast), counting every import statement wherever it
sits: at module level, inside a function, under `if TYPE_CHECKING:`. ARCHITECTURE.md draws
the floors; this test is their enforcement, so the two must change together.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: package -> (floor, the packages of ours it may import besides itself)
FLOORS: dict[str, tuple[int, frozenset[str]]] = {
    "tracing": (1, frozenset()),
    "intake": (2, frozenset({"tracing"})),
    "sample_traces": (2, frozenset({"tracing"})),
    "examples": (2, frozenset({"tracing"})),
    "analysis": (3, frozenset({"tracing"})),
    "dashboard": (4, frozenset({"analysis", "tracing"})),
    "tailscope": (5, frozenset({"tracing", "intake", "analysis", "dashboard", "sample_traces"})),
    "benchmarks": (6, frozenset({"tracing", "intake", "analysis", "dashboard", "tailscope", "sample_traces",
                                 "examples", "tests"})),
}

#: third-party top-level modules the serving side may import; pyarrow only in the store's modules
SERVING_THIRD_PARTY = frozenset({"opentelemetry", "google"})
PYARROW_MODULES = frozenset({"tracing.schema", "tracing.rows", "tracing.store"})  # schema: lazily, on first use


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """Every module of every package in FLOORS, by dotted name."""
    found: dict[str, Path] = {}
    for package in FLOORS:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per session (the rules below all walk the same ~190 files)."""
    return ast.parse(path.read_text(), str(path))


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the file, wherever it is; `from p import m` names p.m."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in known else base


@functools.cache
def graph() -> tuple[dict[str, Path], dict[str, list[tuple[int, str]]]]:
    """Every module, and the imports of each (computed once: three rules read it, none changes it)."""
    modules = all_modules()
    known = set(modules)
    edges = {name: list(imports_of(name, path, known)) for name, path in modules.items()}
    return modules, edges


def test_every_package_is_on_a_floor() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(FLOORS), "a new top-level package needs a floor here and in ARCHITECTURE.md"


def test_no_import_from_a_higher_floor() -> None:
    modules, edges = graph()
    bad = []
    for name, targets in edges.items():
        package = name.split(".")[0]
        floor, allowed = FLOORS[package]
        for line, target in targets:
            top = target.split(".")[0]
            if top == package or (top not in FLOORS and top != "tests"):
                continue
            if top not in allowed:
                where = modules[name].relative_to(ROOT)
                bad.append(f"{where}:{line} imports {target}: {package} (floor {floor}) may import only "
                           f"{', '.join(sorted(allowed)) or 'itself'}")
    assert not bad, "\n".join(bad)


def test_serving_side_needs_only_opentelemetry() -> None:
    """`pip install tailscope` (no extra) must be enough for every tracing module but the store's."""
    modules, edges = graph()
    bad = []
    for name, targets in edges.items():
        if not name.startswith("tracing"):
            continue
        for line, target in targets:
            top = target.split(".")[0]
            if top in FLOORS or top in sys.stdlib_module_names or top == "__future__" or top in SERVING_THIRD_PARTY:
                continue
            if top == "pyarrow" and name in PYARROW_MODULES:
                continue
            bad.append(f"{modules[name].relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    found = []
    for component in components:
        start = min(component)
        path, seen = [start], {start}
        while True:  # walk inside the component until a module repeats: that closes a cycle
            nxt = min(w for w in edges[path[-1]] if w in component)
            if nxt in seen:
                found.append([*path[path.index(nxt):], nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return found


def test_cycle_finder_finds_a_known_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"a"}}) == [["a", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    modules, edges = graph()
    ours = {name: {t for _, t in targets if t in modules and t != name} for name, targets in edges.items()}
    found = cycles(ours)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def is_extension(module: str, package: str) -> bool:
    """Whether `module` is a C extension of `package` (its .c source beside the package's modules)."""
    return module.split(".")[0] == package and ROOT.joinpath(*module.split(".")).with_suffix(".c").is_file()


def private_uses(name: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, what) for each private name of another module of ours this file takes: `from m import _x`, or
    `alias._x` where `alias` is bound to a module of ours by an import. A private module of the file's own
    package (`from intake import _otlpx`, a C extension) is the package's business and not counted."""
    package = name.split(".")[0]
    aliases: dict[str, str] = {}
    tree = parsed(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FLOORS:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in known:
                    aliases[alias.asname or alias.name] = sub
                    if alias.name.startswith("_") and sub.split(".")[0] != package:
                        yield node.lineno, f"the private module {sub}"
                elif (alias.name.startswith("_") and not alias.name.startswith("__") and node.module != name
                      and not is_extension(sub, package)):
                    yield node.lineno, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and aliases[node.value.id] != name):
            yield node.lineno, f"{aliases[node.value.id]}.{node.attr}"


def test_no_private_name_crosses_modules() -> None:
    """A module's `_names` are its own: another module that needs one needs a public name (or a test of it
    lives in tests/, which this rule does not read)."""
    modules = all_modules()
    known = set(modules)
    bad = [f"{path.relative_to(ROOT)}:{line} uses {what}"
           for name, path in modules.items() for line, what in private_uses(name, path, known)]
    assert not bad, "\n".join(sorted(set(bad)))


def test_private_use_finder_sees_both_spellings(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from analysis.report import _header\nfrom analysis import report as RP\nRP._ms(1)\n"
                   "from intake import _otlpx\nRP.build_report\n")
    found = list(private_uses("tailscope.m", src, {"analysis.report", "intake._otlpx"}))
    assert found == [(1, "analysis.report._header"), (4, "the private module intake._otlpx"),
                     (3, "analysis.report._ms")]


def test_reading_a_store_does_not_load_the_report() -> None:
    """`analysis`'s public names are imported on first use: a process that only opens a store (`tailscope sql`,
    `store`, `ingest`, a receiver's hour builds) loads neither the report nor polars; the names still resolve, and
    `analysis.whatif` stays the function after its submodule is imported (one fresh interpreter)."""
    code = ("import sys, analysis.engine.connect; print(sorted(m for m in ('analysis.report', 'polars') "
            "if m in sys.modules)); import analysis.whatif, analysis; "
            "print(analysis.whatif.__name__, callable(analysis.whatif), analysis.build_report.__module__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["[]", "whatif True analysis.report", ""]
