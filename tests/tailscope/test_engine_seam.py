"""The CLI's engine seam: commands and dashboard pages call a backend, never ask which engine runs.

tailscope.commands.engine.open_backend is the one place the CLI chooses an engine (dashboard.data.open_store
the dashboard's, held by tests/dashboard/test_engine.py); a command that needs a capability asks `can()` and
prints `missing()`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tailscope.cli import app
from tailscope.commands.common import Engine
from tailscope.commands.engine import (
    CAPABILITIES,
    Backend,
    ClickHouseBackend,
    DuckDBBackend,
    open_backend,
)

ROOT = Path(__file__).resolve().parents[2]
#: the seams, where the choice is made (and may be)
SEAMS = {"tailscope/commands/engine.py", "dashboard/data.py"}
#: names of the engines' types and implementations: comparing with one, or isinstance on one, asks which runs
ENGINE_NAMES = ("Engine.", "DuckDBBackend", "ClickHouseBackend", "Workbench", "ClickHouseBench")
ENGINE_WORDS = ("clickhouse", "duckdb")


def engine_checks(source: str) -> list[int]:
    """Lines that test which engine runs: a comparison with an Engine member or an engine's name, an isinstance
    on an engine's type, a `match` on an Engine member."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(name in ast.unparse(p) for p in parts for name in ENGINE_NAMES) or any(
                    isinstance(p, ast.Constant) and p.value in ENGINE_WORDS for p in parts):
                hits.append(node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2
              and any(name in ast.unparse(node.args[1]) for name in ENGINE_NAMES)):
            hits.append(node.lineno)
        elif isinstance(node, ast.match_case) and "Engine." in ast.unparse(node.pattern):
            hits.append(node.pattern.lineno)
    return hits


def test_the_finder_sees_every_spelling() -> None:
    code = ("if engine is Engine.clickhouse: pass\n"
            "if engine == 'duckdb': pass\n"
            "if isinstance(b, ClickHouseBackend): pass\n"
            "match engine:\n    case Engine.duckdb: pass\n"
            "if backend.can('dimensions'): pass\n"
            "def f(engine: EngineOption = Engine.duckdb) -> None: pass\n")
    assert engine_checks(code) == [1, 2, 3, 5]
    # the seam itself is seen: the one choice
    assert len(engine_checks((ROOT / "tailscope/commands/engine.py").read_text())) == 1


def test_no_command_or_page_asks_which_engine_runs() -> None:
    files = [*(ROOT / "tailscope" / "commands").glob("*.py"), *(ROOT / "dashboard" / "app_pages").glob("*.py")]
    found = {str(p.relative_to(ROOT)): engine_checks(p.read_text()) for p in files}
    assert {k: v for k, v in found.items() if v and k not in SEAMS} == {}


def test_both_backends_satisfy_the_protocol(tmp_path: Path) -> None:
    duck = open_backend(Engine.duckdb, tmp_path)
    ch = open_backend(Engine.clickhouse, dsn="chdb:" + str(tmp_path / "ch"), table="otel_traces")
    assert isinstance(duck, DuckDBBackend) and isinstance(ch, ClickHouseBackend)
    assert isinstance(duck, Backend) and isinstance(ch, Backend)
    assert duck.can("dimensions") and not duck.can("mapping_file") and not duck.can("no such capability")
    assert ch.can("mapping_file") and not ch.can("dimensions")
    for backend in (duck, ch):  # every capability either done or said why not, in one line
        for capability in CAPABILITIES:
            assert backend.can(capability) == (backend.missing(capability) == "")
            assert "\n" not in backend.missing(capability)


@pytest.mark.parametrize(("args", "message"), [
    (["report", "--engine", "clickhouse", "--dsn", "chdb:/nowhere", "--dimensions", "k8s.*"],
     "--dimensions and --exclude-dimensions need --engine duckdb: the ClickHouse engine explains by the built-in "
     "dimensions only"),
    (["sql", "SELECT 1", "--mapping", "tailscope-map.json"],
     "--mapping is for --engine clickhouse: a store keeps its mapping (tailscope map --store DIR ...)"),
    (["sql", "SELECT 1", "--engine", "clickhouse"],
     "--engine clickhouse needs --dsn (chdb:PATH or clickhouse://user@host:8123/db)"),
    (["dashboard", "--engine", "clickhouse"],
     "--engine clickhouse needs --dsn (chdb:PATH or clickhouse://user@host:8123/db)"),
])
def test_a_refusal_is_the_backends_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    done = CliRunner().invoke(app, [*args, *(["--store", str(tmp_path)] if "clickhouse" not in args else [])])
    assert done.exit_code == 1
    assert " ".join(done.output.split()) == f"error: {message}"
