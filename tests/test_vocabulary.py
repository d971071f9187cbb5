"""The stage vocabulary has one owner, tracing/schema.py: analysis, the dashboard and the CLI spell a stage
through its constants (S.DECODE, S.CRITICAL_PATH_COLUMNS, ...), never as a string literal, in Python or in SQL.

Docstrings are prose and not read. `streaming` is also the name of a request column (the streaming flag);
those few uses are listed below by file and reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tracing import schema as S

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "dashboard", "tailscope")
WORDS = set(S.CRITICAL_PATH_COLUMNS)
#: (file, literal) -> why the word is not a stage there
ALLOWED = {
    ("analysis/engine/model.py", "streaming"): "the requests column `streaming` (the request's streaming flag)",
    ("analysis/clickhouse/requests.py", "streaming"): "the requests column `streaming` (the streaming flag)",
}


def stage_literals(path: Path) -> list[tuple[int, str]]:
    """(line, stage name) for every string constant of `path` that is a stage name or quotes one in SQL."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in WORDS:
                found.append((node.lineno, node.value))
            found += [(node.lineno, w) for w in re.findall(r"'([a-z_]+)'", node.value) if w in WORDS]
    return sorted(found)


def test_no_stage_name_is_spelt_outside_the_schema() -> None:
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            bad += [f"{rel}:{line} spells {word!r}" for line, word in stage_literals(path)
                    if (rel, word) not in ALLOWED]
    assert not bad, "use tracing.schema's constants:\n" + "\n".join(bad)


def test_the_finder_sees_python_and_sql_literals(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('"""decode is prose here."""\nX = ("decode", 1)\nQ = "WHERE Stage = \'prefill\'"\nY = "decoded"\n')
    assert stage_literals(src) == [(2, "decode"), (3, "prefill")]
