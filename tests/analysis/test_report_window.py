"""build_report over a given set of requests (`source=`) and explain_window over any window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis import build_report, connect
from analysis.engine.percentiles import iso, request_facts
from analysis.report import explain_window
from tests import samples_cache
from tests.analysis.test_report import SLOW_REPLICA, fleet_store
from tests.factory import T0
from tracing import schema as S
from tracing.store import SegmentWriter, init_store

SEC = 1_000_000_000


@pytest.fixture(scope="module")
def spiky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples_cache.built("fleet-spiky", fleet_store, tmp_path_factory)


def _copy_store(src: Path, dst: Path, where: str) -> Path:
    """A new store holding the spans of the traces whose request matches `where` (SQL on `requests`)."""
    con = connect(src)
    cols = ", ".join(name for name, _, _ in S.SPAN_COLUMNS)
    table = con.sql(f"SELECT {cols} FROM spans WHERE TraceId IN (SELECT trace_id FROM requests WHERE {where})"
                    ).to_arrow_table()
    init_store(dst)
    SegmentWriter(dst, kind="test").write(table.cast(S.SPAN_SCHEMA))
    return dst


def test_a_source_gives_the_report_of_exactly_those_requests(spiky: Path, tmp_path: Path) -> None:
    """The report over a filtered view equals the report over a store holding only those requests."""
    for where, spiky_still in ((f"replica <> '{SLOW_REPLICA}'", False),
                                ("start_ns >= (SELECT min(start_ns) + 60e9 FROM requests)", True)):
        alone = build_report(connect(_copy_store(spiky, tmp_path / str(spiky_still), where)))
        con = connect(spiky)
        con.execute(f"CREATE TEMP VIEW chosen AS SELECT * FROM requests WHERE {where}")
        assert build_report(con, source="chosen") == alone
        assert bool(alone["spikes"]) is spiky_still, where


def test_the_store_facts_as_source_give_the_default_report(spiky: Path) -> None:
    con = connect(spiky)
    default = build_report(con)
    assert default["spikes"]
    for metric in ("e2e", "ttft"):
        con = connect(spiky)
        assert build_report(con, metric=metric, source=request_facts(con, with_ttft=True)) == \
            build_report(connect(spiky), metric=metric)


def test_explaining_a_detected_spike_gives_the_reports_item(spiky: Path) -> None:
    report = build_report(connect(spiky))
    for spike in report["spikes"]:
        got = explain_window(connect(spiky), spike["start"], spike["end"])
        assert got.pop("detected") is True
        assert got == spike


def test_a_window_inside_the_spike_against_the_reports_baseline(spiky: Path) -> None:
    """A window that is not a spike: its own percentiles, and the report's baseline (no baseline window overlaps it)."""
    report = build_report(connect(spiky))
    spike = report["spikes"][0]
    con = connect(spiky)
    start_ns = con.execute("SELECT epoch_ns(?::TIMESTAMPTZ)", [spike["start"]]).fetchall()[0][0]
    a, b = start_ns + 10 * SEC, start_ns + 70 * SEC
    got = explain_window(con, a, b)
    values = np.array([r[0] for r in con.execute(
        "SELECT e2e_ns FROM requests WHERE start_ns >= ? AND start_ns < ?", [a, b]).fetchall()], dtype=float)
    assert got["detected"] is False and got["p_value"] is None
    assert (got["start"], got["end"]) == (iso(a), iso(b))
    assert got["requests"] == values.size
    assert got["p99_ms"] == round(float(np.quantile(values, 0.99)) / 1e6, 3)
    assert got["p50_ms"] == round(float(np.quantile(values, 0.5)) / 1e6, 3)
    assert got["baseline_p99_ms"] == report["baseline_p99_ms"]
    assert got["baseline_p50_ms"] == report["baseline_p50_ms"]
    assert got["stages"][0]["stage"] == "decode"
    assert got["dimensions"][0]["dimension"] == "replica" and got["dimensions"][0]["value"] == SLOW_REPLICA


def test_a_window_over_baseline_windows_leaves_them_out_of_the_baseline(spiky: Path) -> None:
    """Windows 0..1 (quiet) explained: the baseline is the report's baseline windows other than those two."""
    con = connect(spiky)
    report = build_report(con)
    win = report["window_s"] * SEC
    first = con.execute("SELECT min(start_ns) FROM requests").fetchall()[0][0]
    a = (first // win) * win
    got = explain_window(con, a, a + 2 * win)
    spike_wins = set()
    for sp in report["spikes"]:
        s0 = con.execute("SELECT epoch_ns(?::TIMESTAMPTZ)", [sp["start"]]).fetchall()[0][0]
        s1 = con.execute("SELECT epoch_ns(?::TIMESTAMPTZ)", [sp["end"]]).fetchall()[0][0]
        spike_wins |= set(range(s0 // win, s1 // win))
    rows = con.execute("SELECT start_ns, e2e_ns FROM requests").fetchall()
    base = np.array([v for s, v in rows if s // win not in spike_wins and not a <= s < a + 2 * win], dtype=float)
    assert got["baseline_p99_ms"] == round(float(np.quantile(base, 0.99)) / 1e6, 3)
    assert got["windows"] == 2
    assert got["requests"] == sum(1 for s, _ in rows if a <= s < a + 2 * win)


def test_an_empty_window_is_a_message(spiky: Path) -> None:
    got = explain_window(connect(spiky), T0 + 7200 * SEC, T0 + 7300 * SEC)
    assert got["requests"] == 0 and got["stages"] == [] and got["dimensions"] == []
    assert got["errors"] == ["could not explain the window because no request with a value starts in it"]
