"""The engine seam: pages and the cached calls ask an Engine what it can do, never which engine runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dashboard import data
from dashboard.engine import CAPABILITIES, Engine

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"


def _engine_checks(path: Path) -> list[int]:
    """Lines of `path` that test for an engine's type: isinstance(x, ...ClickHouseBench / Workbench)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2
                and any(name in ast.unparse(node.args[1]) for name in ("ClickHouseBench", "Workbench"))):
            hits.append(node.lineno)
    return hits


def test_no_engine_type_checks_outside_the_seam() -> None:
    files = [*DASHBOARD.glob("*.py"), *(DASHBOARD / "app_pages").glob("*.py")]
    found = {str(p.relative_to(DASHBOARD)): _engine_checks(p) for p in files}
    assert {k: v for k, v in found.items() if v} == {}
    for page in (DASHBOARD / "app_pages").glob("*.py"):  # pages reach an engine only through dashboard.data
        assert "clickhouse_data" not in page.read_text(), page.name


def test_the_store_workbench_is_an_engine(incident_store: Path) -> None:
    wb = data.Workbench(incident_store)
    try:
        wb.refresh()
        assert isinstance(wb, Engine)
        assert all(wb.can(c) for c in CAPABILITIES) and not wb.can("no such capability")
        f = data.Filters(replica=("replica-05",))
        assert wb.summary(f)["requests"] == wb.time_bounds(f)[2] > 0
    finally:
        wb.con.close()


def test_a_clickhouse_table_says_what_it_cannot_do() -> None:
    pytest.importorskip("chdb")
    from dashboard.clickhouse_data import NOT_YET_CAN, ClickHouseBench

    bench = ClickHouseBench.__new__(ClickHouseBench)  # `can` reads no connection
    assert not bench.can("alerts") and bench.missing("alerts") == NOT_YET_CAN["alerts"]
    assert {c for c in CAPABILITIES if not bench.can(c)} == set(NOT_YET_CAN)
