"""dashboard.data: the materialized requests equal the view, refresh picks up new segments, the SQL console."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from analysis.attribute_filters import AttributeFilter
from analysis.engine.connect import connect
from analysis.engine.materialize import REQUESTS_DIR
from dashboard import data
from tests.dashboard.conftest import APP
from tests.dashboard.incident_store import START_NS, Incident, _chunk
from tracing.store import SegmentWriter, init_store

HOUR_S = 3600


def _write(store: Path, offset: int, n: int, duration_s: float, total: int) -> None:
    import numpy as np

    SegmentWriter(store, kind="test").write(
        _chunk(np.random.default_rng(offset), offset, n, duration_s, total, Incident(1e9, 1e9 + 1)))


def _analysis_rows(store: Path) -> tuple[str, list[tuple[Any, ...]]]:
    """The `requests` columns (a select list) and rows of analysis.engine.connect on `store`, in a fixed order."""
    con = connect(store)
    try:
        cols = ", ".join(c[0] for c in con.execute("DESCRIBE requests").fetchall())
        return cols, con.execute(f"SELECT {cols} FROM requests ORDER BY trace_id, span_id").fetchall()
    finally:
        con.close()


def test_materialized_requests_equal_the_view(incident_store: Path) -> None:
    wb = data.Workbench(incident_store)
    assert wb.refresh() is True
    assert wb.refresh() is False
    cols, view = _analysis_rows(incident_store)
    assert wb.con.execute(f"SELECT {cols} FROM req ORDER BY trace_id, span_id").fetchall() == view


def test_a_large_load_shows_facts_first_then_exact_rows(incident_store: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "QUICK_LOAD_BYTES", 0)  # treat the fixture as a big store
    # a copy without materialized hours (another test's report may have written them into the shared fixture)
    store = tmp_path / "store"
    shutil.copytree(incident_store, store, ignore=shutil.ignore_patterns(REQUESTS_DIR))
    wb = data.Workbench(store)
    assert wb.refresh() is True
    facts = wb.con.execute("SELECT count(*), count(*) FILTER (WHERE critical_path) FROM req").fetchone()
    assert facts is not None and facts[0] == 20_000
    assert wb.worker is not None
    wb.worker.join()
    assert not wb.pending and wb.loading_note() is None
    cols, view = _analysis_rows(store)
    assert wb.con.execute(f"SELECT {cols} FROM req ORDER BY trace_id, span_id").fetchall() == view
    assert wb.con.execute("SELECT bool_and(critical_path) FROM req").fetchone() == (True,)


def test_materialized_hours_are_read_from_their_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hours the store holds materialized load exact at once; only the others wait for the background."""
    from analysis.engine.materialize import build_hour, materialize, snapshot

    store = init_store(tmp_path / "store")
    _write(store, 0, 600, 3 * HOUR_S, 600)
    snap = snapshot(store)
    assert len(snap.stale) >= 3
    build_hour(snap, snap.stale[1])
    monkeypatch.setattr(data, "QUICK_LOAD_BYTES", 0)  # the other hours: facts first
    con = connect(store)
    try:
        cols = ", ".join(c[0] for c in con.execute("DESCRIBE requests").fetchall())
        view = con.execute(f"SELECT {cols} FROM requests ORDER BY trace_id, span_id").fetchall()
    finally:
        con.close()
    wb = data.Workbench(store)
    assert wb.refresh() is True
    assert snap.stale[1] not in wb.pending and wb.pending == set(snap.stale) - {snap.stale[1]}
    exact = wb.con.execute("SELECT DISTINCT (start_ns // ?) * ? FROM req WHERE critical_path",
                           [data.HOUR_NS, data.HOUR_NS]).fetchall()
    assert exact == [(snap.stale[1],)]
    assert wb.worker is not None
    wb.worker.join()
    assert wb.con.execute(f"SELECT {cols} FROM req ORDER BY trace_id, span_id").fetchall() == view
    materialize(store)
    full = data.Workbench(store)
    assert full.refresh() is True and not full.pending and full.worker is None
    assert full.con.execute(f"SELECT {cols} FROM req ORDER BY trace_id, span_id").fetchall() == view


def test_refresh_reads_only_new_segments_and_counts_them(tmp_path: Path) -> None:
    store = init_store(tmp_path / "live")
    wb = data.Workbench(store)
    assert wb.refresh() is True  # empty store: first load
    assert wb.con.execute("SELECT count(*) FROM req").fetchone() == (0,)
    # 100 requests in the first hour, then 50 more in the same hour, then 30 in the next hour
    _write(store, 0, 100, 1000.0, 100)
    assert wb.refresh() is True
    assert wb.con.execute("SELECT count(*) FROM req").fetchone() == (100,)
    assert wb.refresh() is False
    _write(store, 1000, 50, 1000.0, 1000)
    _write(store, 7000, 30, 600.0, 1000)  # starts at START + 4200 s: the next hour
    assert wb.refresh() is True
    assert wb.con.execute("SELECT count(*) FROM req").fetchone() == (180,)
    hours = wb.con.execute("SELECT DISTINCT start_ns // 3600000000000 FROM req ORDER BY 1").fetchall()
    assert [h[0] for h in hours] == [START_NS // 3_600_000_000_000, START_NS // 3_600_000_000_000 + 1]
    # the documented views on the workbench connection see the new data too
    assert wb.con.execute("SELECT count(*) FROM requests").fetchone() == (180,)
    assert wb.con.execute("SELECT count(*) FROM spans WHERE IsRequest").fetchone() == (180,)


def test_refresh_button_shows_new_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = init_store(tmp_path / "live-app")
    _write(store, 0, 40, 1000.0, 100)
    monkeypatch.setenv("TAILSCOPE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert [m.value for m in at.metric if m.label == "requests"] == ["40"]
    _write(store, 500, 25, 1000.0, 1000)
    at.run()
    assert [m.value for m in at.metric if m.label == "requests"] == ["40"], "no refresh asked: same data"
    at.button(key="refresh").click().run()
    assert not at.exception
    assert [m.value for m in at.metric if m.label == "requests"] == ["65"]


def test_filters_where_inlines_parameters_safely() -> None:
    f = data.Filters(since_ns=5, until_ns=9, replica=("r'1",), tenant=("a", "b"))
    cond, params = f.where()
    assert cond == "true AND start_ns >= ? AND start_ns < ? AND replica IN (?) AND tenant IN (?, ?)"
    assert params == [5, 9, "r'1", "a", "b"]
    assert data._inline(cond, params) == ("true AND start_ns >= 5 AND start_ns < 9 AND replica IN ('r''1') "
                                          "AND tenant IN ('a', 'b')")


@pytest.mark.parametrize("query", ["", "SELECT 1; SELECT 2", "COPY (SELECT 1) TO 'x.csv'", "ATTACH 'x.db'",
                                   "INSTALL httpfs", "LOAD httpfs", "SET enable_external_access = true",
                                   "PRAGMA version", "CREATE TABLE t AS SELECT 1", "DROP VIEW requests",
                                   "EXPORT DATABASE 'x'"])
def test_console_refuses_anything_but_one_select(query: str) -> None:
    with pytest.raises(data.RefusedQuery):
        data.check_read_only(query)


@pytest.mark.parametrize("query", ["SELECT 1", "with a AS (SELECT 1) SELECT * FROM a", "FROM requests LIMIT 1",
                                   "(SELECT 1)", "SELECT 1;"])
def test_console_accepts_selects(query: str) -> None:
    assert data.check_read_only(query)


@pytest.mark.parametrize("statement", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "COPY (SELECT 1) TO '/tmp/tailscope-sandbox-escape.csv'",
    "ATTACH '/tmp/tailscope-sandbox-escape.db'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET allowed_directories = ['/']",
])
def test_the_sandbox_itself_blocks_file_access(incident_store: Path, statement: str) -> None:
    """Even a statement that got past the SELECT check cannot leave the store."""
    con = data.sandbox(str(incident_store)).cursor()
    try:
        with pytest.raises(duckdb.Error):
            con.execute(statement).fetchall()
    finally:
        con.close()
    assert not Path("/tmp/tailscope-sandbox-escape.csv").exists()
    assert not Path("/tmp/tailscope-sandbox-escape.db").exists()


def test_console_reads_the_store(incident_store: Path) -> None:
    df, truncated = data.run_sql(str(incident_store), "SELECT count(*) AS n FROM spans WHERE IsRequest")
    assert df["n"].tolist() == [20_000]
    assert truncated is False
    df, truncated = data.run_sql(str(incident_store), "SELECT * FROM range(10)", limit=4)
    assert df["range"].tolist() == [0, 1, 2, 3] and truncated is True


def test_a_long_query_is_interrupted(incident_store: Path) -> None:
    with pytest.raises(TimeoutError, match="interrupted"):
        data.run_sql(str(incident_store),
                     "SELECT count(*) FROM range(10000000000) a, range(1000) b WHERE a.range * b.range = 7",
                     timeout_s=0.5)
    # the sandbox still answers afterwards
    assert data.run_sql(str(incident_store), "SELECT 42 AS x")[0]["x"].tolist() == [42]


def test_waterfall_stretches_sum_to_the_stage_columns(incident_store: Path) -> None:
    """The critical-path stretches drawn per span add up, per stage, to the `requests` view's columns."""
    wb = data.Workbench(incident_store)
    wb.refresh()
    rows = wb.con.execute("(SELECT * FROM req ORDER BY e2e_ns DESC LIMIT 3) "
                          "UNION ALL (SELECT * FROM req ORDER BY e2e_ns LIMIT 3)").df()
    for r in rows.itertuples():
        spans = data.trace_spans(wb, str(incident_store), wb.version, r.trace_id, int(r.start_ns))
        got = spans[spans["stage"].notna()].groupby("stage")["critical_ms"].sum()
        for stage, ms in got.items():
            assert round(ms * 1e6) == getattr(r, f"{stage}_ns"), (r.trace_id, stage)
        assert round(sum(got) * 1e6) + r.other_ns == r.e2e_ns


def test_shape_cells_cover_every_request_in_the_reports_buckets(incident_store: Path) -> None:
    from analysis.stats.explain import bucket_bounds

    wb = data.Workbench(incident_store)
    wb.refresh()
    grid = data.shape(wb, str(incident_store), wb.version, data.Filters())
    assert int(grid["requests"].sum()) == 20_000
    assert set(grid["input_tokens_lo"]) <= {2 ** k for k in range(20)}
    assert all(label == "{}-{}".format(*bucket_bounds(lo)) for label, lo in
               zip(grid["input_tokens_bucket"], grid["input_tokens_lo"], strict=True))


@pytest.mark.parametrize("materialized", [False, True])
def test_refresh_recomputes_every_hour_a_late_span_can_change(tmp_path: Path, materialized: bool) -> None:
    """A request reads spans of its own hour and one on each side (analysis.engine.materialize.hours_read): a
    segment landing in one hour changes the requests of both neighbours, and the workbench's rows
    stay equal to analysis.engine.connect's `requests` row for row."""
    from analysis.engine.materialize import HOUR_NS, materialize
    from tests.factory import T0, add_request, hex_id, write
    from tracing.rows import SpanBatch

    store = init_store(tmp_path / "store")
    h = HOUR_NS  # offsets from T0: hour 1 is the middle one
    first = SpanBatch()
    skewed, skewed_root = add_request(first, "skewed", h + 10_000, h + 90_000, [("queue_wait", h + 10_000, h + 20_000)])
    crossing, crossing_root = add_request(first, "crossing", h - 5_000, h + 60_000,
                                          [("queue_wait", h - 5_000, h - 1_000)])
    add_request(first, "before", 500, 900, [("generation", 500, 900)])
    add_request(first, "after", 2 * h + 500, 2 * h + 900, [("generation", 2 * h + 500, 2 * h + 900)])
    write(store, first)
    if materialized:
        assert len(materialize(store)) == 3
    wb = data.Workbench(store)
    assert wb.refresh() is True

    def same_as_analysis() -> list[tuple[Any, ...]]:
        cols, want = _analysis_rows(store)
        assert wb.con.execute(f"SELECT {cols} FROM req ORDER BY trace_id, span_id").fetchall() == want
        assert len(want) == 4
        return want

    same_as_analysis()
    # the worker's generation span, its clock behind the gateway's, starts in the hour before its
    # request and lands in a later segment of that hour
    late = SpanBatch()
    late.append(trace_id=skewed, span_id=hex_id("late", 1), parent_span_id=skewed_root, name="generation",
                kind="Internal", start_ns=T0 + h - 3_000, end_ns=T0 + h + 80_000, service="llm",
                resource={"service.name": "llm"}, attrs={"tailscope.stage": "generation"})
    [segment] = write(store, late)
    assert segment.parent.name == "hr=14"  # T0's hour: the hour before the request's
    assert wb.refresh() is True
    rows = {r[0]: r for r in same_as_analysis()}
    gen = wb.con.execute("SELECT generation_ns FROM req WHERE trace_id = ?", [skewed]).fetchone()
    assert gen == (70_000,)  # clipped to the request; it outlasts the queue wait, so owns the overlap
    assert skewed in rows
    spans = data.trace_spans(wb, str(store), wb.version, skewed, T0 + h + 10_000)
    assert "generation" in set(spans["stage"].dropna())
    # the other request's decode span lands in the next hour
    later = SpanBatch()
    later.append(trace_id=crossing, span_id=hex_id("late", 2), parent_span_id=crossing_root, name="decode",
                 kind="Internal", start_ns=T0 + h + 1_000, end_ns=T0 + h + 50_000, service="llm",
                 resource={"service.name": "llm"}, attrs={"tailscope.stage": "decode"})
    write(store, later)
    assert wb.refresh() is True
    same_as_analysis()
    assert wb.con.execute("SELECT decode_ns FROM req WHERE trace_id = ?", [crossing]).fetchone() == (49_000,)
    assert wb.refresh() is False


def test_a_swept_file_makes_the_workbench_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workbench reads materialized files in place; one superseded and swept is noticed, not read."""
    from analysis.engine import materialize as MZ
    from tests.factory import add_request, write
    from tracing.rows import SpanBatch

    store = init_store(tmp_path / "store")
    batch = SpanBatch()
    for k in range(5):
        add_request(batch, ("r", k), k * 1000, k * 1000 + 500, [("generation", k * 1000, k * 1000 + 500)])
    write(store, batch)
    [old] = MZ.materialize(store)
    wb = data.Workbench(store)
    assert wb.refresh() is True and wb.refresh_if_gone() is False
    late = SpanBatch()
    add_request(late, "late", 7000, 7500, [])
    write(store, late)
    [new] = MZ.materialize(store)
    monkeypatch.setattr(MZ, "GRACE_S", 0.0)
    MZ._sweep(new.parent, keep=new)
    assert not old.exists()
    with pytest.raises(duckdb.Error):
        wb.con.execute("SELECT count(*) FROM req").fetchall()
    assert wb.refresh_if_gone() is True
    assert wb.con.execute("SELECT count(*) FROM req").fetchone() == (6,)


def test_replicas_is_computed_once_whether_the_metric_is_passed_or_left_out(
        incident_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidebar calls replicas() without the metric, the replicas page with it: one computation for both."""
    wb = data.Workbench(incident_store)
    wb.refresh()
    calls: list[str] = []
    real = data.B.replicas

    def counted(cur: Any, metric: str, *args: Any) -> Any:
        calls.append(metric)
        return real(cur, metric, *args)

    monkeypatch.setattr(data.B, "replicas", counted)
    data._replicas.clear()
    key = (wb, str(wb.store), wb.version)
    f = data.Filters()
    a = data.replicas(*key, f)
    b = data.replicas(*key, f, "e2e")
    c = data.replicas(*key, f, metric="e2e")
    assert calls == ["e2e"]
    assert a.equals(b) and a.equals(c)
    data.replicas(*key, f, "ttft")
    assert calls == ["e2e", "ttft"]


def test_the_overview_is_warm_before_the_full_report(incident_store: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up says the Overview's numbers are in (what a server waits for before it answers: dashboard/server.py)
    while the full spike report is still being computed, with the marks, summary, series and choices cached by then;
    it says it is over only once the report is done."""
    import threading

    store = tmp_path / "store"  # a path of its own: a workbench (cache_resource) not opened by another test
    shutil.copytree(incident_store, store)
    gate, reporting = threading.Event(), threading.Event()
    real_report = data.build_report

    def held(*args: Any, **kw: Any) -> Any:
        reporting.set()
        assert gate.wait(300)
        return real_report(*args, **kw)

    monkeypatch.setattr(data, "build_report", held)
    try:
        wb = data.workbench(str(store.resolve()))
        assert wb.overview_warmed.wait(300)
        assert reporting.wait(300) and not wb.warmed.is_set()  # the report is held: the warm-up is not over
        computed: list[str] = []
        for module, name in ((data, "find_spikes"), (data, "percentile_series"), (data.B, "summary"),
                             (data.B, "dimension_values")):
            monkeypatch.setattr(module, name, lambda *a, name=name, **k: computed.append(name))
        key, f = (wb, str(wb.store), wb.version), data.Filters()
        data.spike_marks(*key, f), data.summary(*key, f), data.over_time(*key, f), data.choices(*key)
        assert computed == []  # each read from the cache the warm-up filled
    finally:
        gate.set()
    assert wb.warmed.wait(300)


def test_a_store_opened_ready_warms_the_overview_which_computes_nothing_twice(
        incident_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a store whose rows are ready starts the warm-up thread: the spike detection, then the full
    report, and only then says it is warm. The Overview then reads both caches (no detection or report of its
    own), and its spikes are the report's, cut to their windows and percentiles."""
    store = tmp_path / "store"  # a path of its own: a workbench (cache_resource) not opened by another test
    shutil.copytree(incident_store, store)
    calls: list[str] = []
    real_find, real_report = data.find_spikes, data.build_report

    def find(*args: Any, **kw: Any) -> Any:
        calls.append("find_spikes")
        return real_find(*args, **kw)

    def report(*args: Any, **kw: Any) -> Any:
        calls.append("build_report")
        return real_report(*args, **kw)

    monkeypatch.setattr(data, "find_spikes", find)
    monkeypatch.setattr(data, "build_report", report)
    wb = data.workbench(str(store.resolve()))
    assert wb.warmer is not None and not wb.pending
    assert wb.warmed.wait(300)  # the whole warm-up (a server answers once the Overview's numbers are in: below)
    assert wb.overview_warmed.is_set()
    assert calls == ["find_spikes", "build_report"]
    monkeypatch.setenv("TAILSCOPE_STORE", str(store.resolve()))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert data.workbench(str(store.resolve())) is wb and calls == ["find_spikes", "build_report"]
    key = (wb, str(wb.store), wb.version)
    full = data.report_of(*key, data.Filters())
    marks = data.spike_marks(*key, data.Filters())
    assert full["spikes"] and len(marks["spikes"]) == len(full["spikes"])
    for mine, item in zip(marks["spikes"], data.spikes(*key, data.Filters()), strict=True):
        assert mine == {k: item[k] for k in mine} and "stages" not in mine
    assert [m.value for m in at.metric if m.label == "spikes"] == [str(len(full["spikes"]))]


def test_unfiltered_reports_read_the_stored_hours_as_the_cli_does(incident_store: Path, tmp_path: Path) -> None:
    """Without an attribute filter (dimension values reach the report as its `only`) on a store with at most
    LIVE_HOURS_IN_PLACE stale hours, the report calls read the store's own request facts (no copy); with an
    attribute filter or more stale hours, the filtered view of `req`. Both give the same report (with live hours:
    tests/dashboard/test_live_hours.py; dimension filters: tests/dashboard/test_filtered_report.py)."""
    from analysis.engine.materialize import materialize
    from analysis.report import build_report, find_spikes

    store = tmp_path / "store"
    shutil.copytree(incident_store, store, ignore=shutil.ignore_patterns(REQUESTS_DIR))
    materialize(store)
    wb = data.Workbench(store)
    wb.refresh()
    assert wb.snap is not None and not wb.snap.stale and wb.snap.fresh
    some = data.Filters(replica=("replica-05",))
    assert data._report_source(wb, data.Filters()) is None and data._report_source(wb, some) is None
    assert data._report_only(some, None) == {"replica": ("replica-05",)} and data._report_only(some, "requests") is None
    attr = data.Filters(attributes=(AttributeFilter("llm.tier", "request", ("gold",)),))
    assert data._report_source(wb, attr) == "requests"
    assert data._report_source(wb, data.Filters(since_ns=1, until_ns=2)) is None
    snap, hour = wb.snap, next(iter(wb.snap.fresh))
    wb.snap = dataclasses.replace(snap, stale=[hour] * data.LIVE_HOURS_IN_PLACE)  # live hours: read in place
    assert data._report_source(wb, data.Filters()) is None
    wb.snap = dataclasses.replace(snap, stale=[hour] * (data.LIVE_HOURS_IN_PLACE + 1))  # more: the copy
    assert data._report_source(wb, data.Filters()) == "requests"
    wb.snap = snap
    report = data._report_of(wb, str(store), wb.version, data.Filters(), "e2e")
    marks = data._spike_marks(wb, str(store), wb.version, data.Filters(), "e2e")
    assert report["spikes"] and not report["errors"]
    with data._cursor(wb, data.Filters()) as cur:
        assert report == build_report(cur, include_failures=True, source="requests")
        assert marks == find_spikes(cur, include_failures=True, source="requests")


@pytest.mark.parametrize("filters", [
    data.Filters(), data.Filters(tenant=("acme",)), data.Filters(replica=("replica-05",)),
    data.Filters(START_NS + 300_000_000_000, START_NS + 1_500_000_000_000, model=("mistral-7b",))])
def test_the_spike_pages_marks_are_the_overviews(incident_store: Path, filters: data.Filters) -> None:
    """The Spike page reads its marks from the full report it explains (one detection): the same marks and verdict
    as the Overview's find_spikes, judged or not, under filters and a time range."""
    wb = data.Workbench(incident_store)
    wb.refresh()
    key = (wb, str(wb.store), wb.version)
    assert data.explained_marks(*key, filters) == data.spike_marks(*key, filters)
    assert data.spike_verdict(*key, filters, explained=True) == data.spike_verdict(*key, filters)


def test_console_and_workbench_survive_a_merge_whose_inputs_are_deleted(tmp_path: Path) -> None:
    """The SQL console's sandbox and the workbench list files: once compaction deleted the segments they had
    listed, they list again instead of failing on a missing file."""
    import random

    from intake.compact.merge import Compactor, Policy
    from tests.intake.compact_helpers import write_segments

    write_segments(tmp_path, random.Random(9), 12)
    n = data.run_sql(str(tmp_path), "SELECT count(*) AS n FROM spans")[0]["n"].tolist()
    wb = data.Workbench(tmp_path)
    wb.refresh()
    with Compactor(tmp_path, Policy(quiet_s=0, grace_s=0, durable=False)) as c:
        c.run_once()
        assert c.run_once().deleted == 12
    assert data.run_sql(str(tmp_path), "SELECT count(*) AS n FROM spans")[0]["n"].tolist() == n
    assert wb.refresh_if_gone() is True
    assert wb.con.execute("SELECT count(*) FROM spans").fetchone() == (n[0],)
