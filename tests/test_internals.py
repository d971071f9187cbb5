"""docs/internals.md stays true: every module is on its map, no module it names is gone, and every
`name` (path:line) reference points at the line that defines `name`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "internals.md"
#: the packages the map covers (benchmarks have docs/benchmarks.md, tests mirror the packages)
PACKAGES = ("tracing", "intake", "analysis", "dashboard", "tailscope", "sample_traces", "examples")


def modules() -> set[str]:
    """Every module of the mapped packages, by dotted name."""
    out = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[-1] != "__main__":
                out.add(".".join(parts))
    return out


def rows(text: str) -> list[list[str]]:
    """The backticked names of each table row, relative ones (`.sglang`) resolved against the row's last full one."""
    found = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        names: list[str] = []
        base = ""
        for tok in re.findall(r"`([A-Za-z_.*][\w.*]*)`", line):
            if tok.startswith(".") and base:
                tok = base.rsplit(".", 1)[0] + tok
            elif "." in tok:
                base = tok
            names.append(tok)
        found.append(names)
    return found


def mapped(module: str, table: list[list[str]]) -> bool:
    """Whether a row names `module`: itself, or its package (or `package.*`) with its last name."""
    parent, _, last = module.rpartition(".")
    for names in table:
        if module in names:
            return True
        if parent and (parent in names or f"{parent}.*" in names) and (last in names or f"{parent}.*" in names):
            return True
    return False


def test_every_module_is_on_the_map() -> None:
    table = rows(DOC.read_text())
    every = modules()
    # a package is mapped by its modules (its __init__ is their face) or by its own name
    missing = sorted(m for m in every if not mapped(m, table)
                     and not any(o.startswith(m + ".") and mapped(o, table) for o in every))
    assert not missing, f"modules docs/internals.md does not map: {missing}"


def test_every_module_the_map_names_exists() -> None:
    known = modules()
    named = {n for names in rows(DOC.read_text()) for n in names
             if n.split(".")[0] in PACKAGES and "*" not in n}
    gone = sorted(n for n in named if n not in known and n.rpartition(".")[0] not in known)
    assert not gone, f"docs/internals.md names modules that do not exist: {gone}"


def test_line_references_point_at_their_definitions() -> None:
    refs = re.findall(r"`(\w+)`(?:\s+\(|,\s+)([\w/]+\.py):(\d+)\)", DOC.read_text())
    assert len(refs) >= 10
    wrong = []
    for name, path, line in refs:
        lines = (ROOT / path).read_text().splitlines()
        at = lines[int(line) - 1] if int(line) <= len(lines) else ""
        if not re.match(rf"\s*(async )?(def|class) {name}\b", at):
            where = [i + 1 for i, text in enumerate(lines) if re.match(rf"\s*(def|class) {name}\b", text)]
            wrong.append(f"`{name}` ({path}:{line}): defined at line(s) {where or 'none'}")
    assert not wrong, "stale references in docs/internals.md:\n" + "\n".join(wrong)


def test_the_map_reader_resolves_relative_names() -> None:
    table = rows("| `intake.engines.vllm`, `.sglang` | x |\n| `analysis.watch` | `rules`, `live` |\n")
    assert table == [["intake.engines.vllm", "intake.engines.sglang"], ["analysis.watch", "rules", "live"]]
    assert mapped("intake.engines.sglang", table) and mapped("analysis.watch.live", table)
    assert not mapped("analysis.watch.state", table) and not mapped("intake.engines.tgi", table)
