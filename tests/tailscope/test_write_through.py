"""`report` and `sql` materialize settled hours on their own (write-through), unless told not to."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from analysis.engine.materialize import HOUR_NS, snapshot
from tailscope.cli import app
from tests.factory import add_request, write
from tracing.rows import SpanBatch


def _store(store: Path) -> None:
    batch = SpanBatch()
    for k in range(40):
        start = (k % 2) * HOUR_NS + k * 1_000_000
        add_request(batch, ("w", k), start, start + 500_000 + 7_000 * k,
                    [("queue_wait", start, start + 100_000), ("generation", start + 100_000, start + 400_000)])
    write(store, batch)


def _run(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_report_materializes_settled_hours_and_reports_the_same(tmp_path: Path) -> None:
    _store(tmp_path)
    assert len(snapshot(tmp_path).stale) == 2
    on_the_fly = json.loads(_run("report", "--store", str(tmp_path), "--json", "--no-materialize"))
    assert len(snapshot(tmp_path).stale) == 2  # --no-materialize writes nothing
    first = json.loads(_run("report", "--store", str(tmp_path), "--json"))
    snap = snapshot(tmp_path)
    assert snap.stale == [] and len(snap.fresh) == 2
    assert first == on_the_fly == json.loads(_run("report", "--store", str(tmp_path), "--json"))
    assert on_the_fly["requests"] == 40


def test_sql_materializes_only_for_queries_over_requests(tmp_path: Path) -> None:
    _store(tmp_path)
    assert _run("sql", "SELECT count(*) AS n FROM spans", "--store", str(tmp_path), "-f", "csv") == "n\n120\n"
    assert len(snapshot(tmp_path).stale) == 2
    query = "SELECT count(*) AS n, sum(generation_ns) AS g FROM requests"
    plain = _run("sql", query, "--store", str(tmp_path), "-f", "csv", "--no-materialize")
    assert len(snapshot(tmp_path).stale) == 2
    assert _run("sql", query, "--store", str(tmp_path), "-f", "csv") == plain == "n,g\n40,12000000\n"
    assert snapshot(tmp_path).stale == []


def test_a_store_that_cannot_take_the_files_is_read_as_it_is(tmp_path: Path) -> None:
    _store(tmp_path)
    (tmp_path / "requests").write_text("not a directory")  # the partition directories cannot be made
    result = CliRunner().invoke(app, ["report", "--store", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == 40
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: requests not materialized")]
    assert len(notes) == 1 and notes[0].endswith("computing them on the fly")
