"""The sandbox connection refuses, by itself, everything but reading the store's views."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analysis.engine.connect import connect
from analysis.engine.sandbox import SANDBOX_THREADS, RefusedStatement, SandboxConnection
from tests.factory import add_request, write
from tracing.rows import SpanBatch
from tracing.store import segment_files


@pytest.fixture
def store(tmp_path: Path) -> Path:
    batch = SpanBatch()
    add_request(batch, "one", 0, 10, [("prefill", 1, 4), ("decode", 4, 9)])
    write(tmp_path / "store", batch)
    return tmp_path / "store"


def _statements(store: Path, outside: Path) -> dict[str, str]:
    segment = segment_files(store)[0]
    return {
        "copy onto a segment": f"COPY (SELECT 1 AS a) TO '{segment}' (FORMAT csv, USE_TMP_FILE false)",
        "copy into the store": f"COPY (SELECT 1 AS a) TO '{store}/spans/planted.parquet'",
        "copy outside": f"COPY (SELECT 1 AS a) TO '{outside}/escape.csv'",
        "replace a view": "CREATE OR REPLACE VIEW spans AS SELECT 1 AS x",
        "drop a view": "DROP VIEW requests",
        "create a table": "CREATE TABLE t AS SELECT 1 AS x",
        "temp view": "CREATE TEMP VIEW spans AS SELECT 1 AS x",
        "macro": "CREATE MACRO m(x) AS x",
        "attach memory": "ATTACH ':memory:' AS m",
        "attach a file": f"ATTACH '{outside}/escape.duckdb' AS e",
        "install": "INSTALL httpfs",
        "load": "LOAD httpfs",
        "set threads": "SET threads = 64",
        "set access": "SET enable_external_access = true",
        "set directories": "SET allowed_directories = ['/']",
        "reset": "RESET memory_limit",
        "pragma": "PRAGMA threads = 64",
        "export": f"EXPORT DATABASE '{outside}/export'",
        "read a file": "SELECT * FROM read_csv('/etc/passwd')",
        "read text": "SELECT * FROM read_text('/etc/hostname')",
    }


def test_each_statement_is_refused(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    before = {p: p.read_bytes() for p in segment_files(store)}
    con = connect(store, sandbox=True)
    assert isinstance(con, SandboxConnection)
    for what, sql in _statements(store, outside).items():
        for target in (con, con.cursor()):
            with pytest.raises(duckdb.Error):
                target.execute(sql).fetchall()
            assert what  # the name says which statement failed the raises above
    # the store, the views and the settings are as they were
    assert {p: p.read_bytes() for p in segment_files(store)} == before
    assert sorted(p.name for p in (store / "spans").iterdir()) == sorted(
        p.name for p in (store / "spans").iterdir() if p.name.startswith("dt="))
    assert list(outside.iterdir()) == []
    assert con.execute("SELECT count(*) FROM requests").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(3,)]


def test_duckdb_itself_refuses_all_but_the_two_holes_the_gate_closes(store: Path, tmp_path: Path) -> None:
    """Under the statement gate: DuckDB's own settings refuse every statement except COPY onto an
    allowed segment path in place and TEMP objects (connection-local), which only the gate stops."""
    outside = tmp_path / "outside"
    outside.mkdir()
    con = connect(store, sandbox=True)
    raw = con._con  # the DuckDB connection under the gate
    holes = {"copy onto a segment", "temp view"}
    for what, sql in _statements(store, outside).items():
        if what in holes:
            with pytest.raises(RefusedStatement):
                con.execute(sql)
            continue
        with pytest.raises(duckdb.Error):
            raw.execute(sql).fetchall()
    assert list(outside.iterdir()) == []


def test_own_limits_and_no_directory_beyond_the_store(store: Path) -> None:
    con = connect(store, sandbox=True, memory_limit="512MB")
    settings = dict(con.execute(
        "SELECT name, value FROM duckdb_settings() WHERE name IN ('threads', 'memory_limit', "
        "'allowed_directories', 'allowed_paths', 'temp_directory', 'enable_external_access', "
        "'lock_configuration')").fetchall())
    assert settings["threads"] == str(SANDBOX_THREADS)
    assert settings["memory_limit"] in ("488.2 MiB", "488.2MiB")
    assert settings["allowed_directories"] == "[]"
    assert settings["temp_directory"] == ""
    assert settings["enable_external_access"] == "false"
    assert settings["lock_configuration"] == "true"
    allowed = [p.strip("'") for p in settings["allowed_paths"].strip("[]").split(", ")]
    segments = {str(p) for p in segment_files(store)}
    assert segments <= set(allowed)
    # beside the segments, DuckDB lists the views database's own files: in a directory that was
    # removed once the database was open, so nothing can be written there
    others = [Path(p) for p in allowed if p not in segments]
    assert others and all(p.name.startswith("views.duckdb") and not p.parent.exists() for p in others), others


def test_explain_and_parameters_work(store: Path) -> None:
    con = connect(store, sandbox=True)
    assert con.execute("SELECT count(*) FROM spans WHERE SpanName = ?", ["prefill"]).fetchall() == [(1,)]
    plan = con.execute("EXPLAIN SELECT count(*) FROM spans").fetchall()
    assert plan and "physical_plan" in str(plan[0][0])
    cur = con.cursor()
    assert cur.execute("SELECT 1 AS a, 2 AS b").fetchone() == (1, 2)
    assert [d[0] for d in cur.description] == ["a", "b"]
    cur.close()


def test_an_empty_store_has_empty_views(tmp_path: Path) -> None:
    from tracing.store import init_store

    init_store(tmp_path / "empty")
    con = connect(tmp_path / "empty", sandbox=True)
    assert con.execute("SELECT count(*) FROM requests").fetchall() == [(0,)]
    with pytest.raises(duckdb.Error):
        con.execute("SELECT * FROM read_parquet('/etc/passwd')").fetchall()
