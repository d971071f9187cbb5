"""The dashboard's report over a store whose last hours are live (not materialized) equals `tailscope report`'s.

Unfiltered (or with a time range only) and with at most data.LIVE_HOURS_IN_PLACE stale hours, the workbench's report
reads the materialized hours in place and the live hours' facts from its own rows (analysis.engine.connect.
live_facts_from) instead of copying every request; the answer must be the one analysis gives on its own connection,
which computes the live hours from their spans, and the one of the copy the workbench made before; the Spike page's
marks, cut from that report, the Overview's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.ipc
import pytest

from analysis.engine.connect import ROW_ID_FILE_SHIFT, connect
from analysis.engine.materialize import remove_hour, snapshot
from analysis.report import build_report, find_spikes
from dashboard import data
from tests.dashboard.incident_store import START_NS, Incident, leave_live, write_incident_store, write_more

SEC = 1_000_000_000


def _store(tmp_path: Path, seed: int) -> tuple[Path, list[int]]:
    """Four hours of requests (a slow replica in the third), a random set of hours materialized and at most two
    left live; (store, the live hours)."""
    store = tmp_path / "store"
    write_incident_store(store, requests=8_000, duration_s=3.5 * 3600, seed=seed,
                         incident=Incident(2.2 * 3600, 2.6 * 3600))
    live = leave_live(store, seed, 1, data.LIVE_HOURS_IN_PLACE)
    return store, live


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reports_with_live_hours_equal_analysis(tmp_path: Path, seed: int) -> None:
    store, live = _store(tmp_path, seed)
    wb = data.Workbench(store)
    wb.refresh()
    assert wb.snap is not None and wb.snap.stale == live and wb.snap.fresh
    key = (wb, str(wb.store), wb.version)
    cli = connect(store)  # analysis on its own: the live hours computed from their spans
    for f in (data.Filters(), data.Filters(START_NS + 1800 * SEC, START_NS + 3 * 3600 * SEC)):
        assert data._report_source(wb, f) is None
        win = data.detection(*key, f)["judged_window_s"]
        ask = {"window_s": win, "since": f.since_ns, "until": f.until_ns, "include_failures": True}
        report = data._report_of(wb, str(store), wb.version, f, "e2e")
        assert report["spikes"] and not report["errors"]
        assert report == build_report(cli, **ask)
        assert data._spike_marks(wb, str(store), wb.version, f, "e2e") == {
            **(marks := find_spikes(cli, **ask)), "spikes": sorted(marks["spikes"], key=lambda s: s["start"])}
        assert data.explained_marks(*key, f) == data._spike_marks(wb, str(store), wb.version, f, "e2e")
        with data._cursor(wb, f) as cur:  # the copy of the workbench's rows, as read before
            assert report == build_report(cur, source="requests", **ask)
    cli.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_live_hours_attribute_values_are_kept_once_and_equal_the_spans(tmp_path: Path, seed: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The workbench keeps each live hour's request attribute maps and resource rows (`keep_live_values`); the
    report reads them instead of the spans, and its attribute pass equals analysis' own (which reads the spans)."""
    from analysis.engine import attribute_values as AV

    store, live = _store(tmp_path, seed)
    wb = data.Workbench(store)
    wb.refresh()
    cli = connect(store)
    hour = 3600 * SEC
    in_live = " OR ".join(f"(TimestampNs >= {h} AND TimestampNs < {h + hour})" for h in live)
    # the reference: every live request span's attribute map, and each replica's resource values, from the spans
    want = {(t, s): dict(a) for t, s, a in cli.execute(
        f"SELECT TraceId, SpanId, SpanAttributes FROM spans WHERE IsRequest AND ({in_live})").fetchall()}
    want_res: dict[tuple[int, str, str], set[str]] = {}
    worker = "Stage IN ('generation', 'prefill', 'decode')"
    for ts, rep, res in cli.execute(f"SELECT TimestampNs, Replica, ResourceAttributes FROM spans WHERE ({in_live}) "
                                    f"AND Replica IS NOT NULL AND (IsRequest OR {worker})").fetchall():
        for k, v in res.items():
            want_res.setdefault((ts // hour * hour, rep, k), set()).add(v)
    with data._cursor(wb) as cur:
        got = {(t, s): dict(a) for t, s, a in cur.execute(
            f"SELECT trace_id, span_id, a FROM {AV.LIVE_VALUES['request']}").fetchall()}
        got_res = {(h, rep, k): set(vs) for h, rep, k, vs in cur.execute(
            f"SELECT hour, replica, k, vs FROM {AV.LIVE_VALUES['resource']}").fetchall()}
        assert cur.execute(f"SELECT count(*) FROM {AV.LIVE_VALUES['stage']}").fetchall() == [(0,)]  # none written
        rid = cur.execute("SELECT rid FROM _request_rows_stored").fetchnumpy()["rid"]
        kept = AV.stored_values(cur, rid, ROW_ID_FILE_SHIFT)
        assert kept is not None and kept.live_kept and kept.live_spans == AV.LIVE_SPANS
    assert got == want and len(got) == wb.live_requests
    assert got_res == want_res
    key = (wb, str(wb.store), wb.version)
    f = data.Filters()
    ask = {"window_s": data.detection(*key, f)["judged_window_s"], "include_failures": True}
    report = data._report_of(wb, str(store), wb.version, f, "e2e")
    assert report["attributes"]["considered"]  # the request attributes are judged, from the kept values
    assert report == build_report(cli, **ask)
    cli.close()
    # every stale hour was computed: their attribute file was written beside the sweep, from the staged values and
    # the keys' own numbering; it is the file written afterwards from the facts table and LIVE_VALUES
    assert wb.live_file is not None and wb.live_file.name.startswith("attributes-live-next-")
    with data._cursor(wb) as cur:
        again = AV.write_live(cur, str(wb.live_facts), tmp_path / "again.arrow")
    assert _arrow_file(wb.live_file).equals(_arrow_file(again), check_metadata=True)
    # a refresh failing after that file is written leaves none behind
    other = data.Workbench(store)

    def failing(*_: object) -> None:
        raise ValueError("facts that fail")

    monkeypatch.setattr(data, "keep_live_facts", failing)
    with pytest.raises(ValueError, match="facts that fail"):
        other.refresh()
    assert other.version == 0 and list(other.scratch.iterdir()) == []


def _arrow_file(path: Path) -> pa.Table:
    """An Arrow IPC file's table (its schema's metadata with it)."""
    with pyarrow.ipc.open_file(str(path)) as reader:
        return reader.read_all()


def test_a_report_cursor_keeps_its_live_facts_across_a_refresh(tmp_path: Path) -> None:
    """The live hours' facts and attribute file are made once per refresh and shared (no copy per report); a cursor
    pinned before a refresh keeps reading the rows it started with, and its report stays analysis' own over the
    store as it was; the replaced table and file are dropped once its last cursor closes; a new cursor's report is
    analysis' own over the store as it is."""
    from analysis.engine import attribute_values as AV
    from analysis.engine.percentiles import request_facts
    from analysis.engine.views import LIVE_REQUESTS_KEPT

    store = tmp_path / "store"
    write_incident_store(store, requests=6_000, duration_s=3.5 * 3600, seed=4,
                         incident=Incident(2.2 * 3600, 2.6 * 3600))
    leave_live(store, 4, 0, 0)
    live = sorted(snapshot(store).fresh)[-2:]
    for hour in live:  # the last two hours live: a segment landing in the last changes no materialized hour
        remove_hour(store, hour)
    wb = data.Workbench(store)
    wb.refresh()
    assert wb.snap is not None and wb.snap.stale == live
    ask = {"window_s": data.detection(wb, str(store), wb.version, data.Filters())["judged_window_s"],
           "include_failures": True}
    cli = connect(store)
    before = build_report(cli, **ask)
    assert before["spikes"] and before["spikes"][0]["stages"]  # the attribute pass and the stage rows are read
    cli.close()
    old_table, old_file = wb.live_facts, wb.live_file
    assert old_table is not None and old_file is not None and old_file.is_file()
    with data._cursor(wb) as cur:
        facts = request_facts(cur)
        assert not cur.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchall()[0][0]  # no copy
        rid = cur.execute(f"SELECT rid FROM {facts}").fetchnumpy()["rid"]
        kept = AV.stored_values(cur, rid, ROW_ID_FILE_SHIFT)
        assert kept is not None and kept.all_stored  # the live rows coded from the live attribute file
        assert cur.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?",
                           [LIVE_REQUESTS_KEPT]).fetchall() == [(1,)]  # stage columns from the kept rows
        n_live = cur.execute(f"SELECT count(*) FROM {facts} WHERE rid < 1::BIGINT << 40").fetchall()
        assert n_live == [(wb.live_requests,)]
        write_more(store, offset=6_000, n=150, requests=6_000, duration_s=3.5 * 3600)  # into the last hour
        _refresh_seen_half_way(wb, n_live[0][0])
        assert wb.live_facts != old_table and wb.live_requests == n_live[0][0] + 150
        assert cur.execute(f"SELECT count(*) FROM {request_facts(cur)} WHERE rid < 1::BIGINT << 40").fetchall() \
            == n_live  # the pinned rows, not the new ones
        assert build_report(cur, **ask) == before
        assert old_file.is_file() and old_table in wb.retired
    assert old_table not in wb.retired and not old_file.exists()  # dropped with its last cursor
    with data._cursor(wb) as cur:
        assert cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [old_table]).fetchall() \
            == [(0,)]
        after = build_report(cur, **ask)
    cli = connect(store)
    assert after == build_report(cli, **ask) and after["requests"] == before["requests"] + 150
    cli.close()


def _live_state(wb: data.Workbench) -> tuple[list[tuple[Any, ...]], ...]:
    """What a new reader of the workbench's connection sees of the live hours: their rows, kept values, facts."""
    from analysis.engine import attribute_values as AV

    cur = wb.cursor()
    try:
        return tuple(cur.execute(sql).fetchall() for sql in (
            "SELECT count(*), sum(e2e_ns), count(*) FILTER (critical_path) FROM req_live",
            f"SELECT hour, count(*) FROM {AV.LIVE_VALUES['request']} GROUP BY hour ORDER BY hour",
            f"SELECT count(*) FROM {AV.LIVE_VALUES['resource']}",
            "SELECT count(*) FROM _request_facts_live"))
    finally:
        cur.close()


def _refresh_seen_half_way(wb: data.Workbench, n_live: int) -> None:
    """Refresh after new spans landed in a live hour, watching the state a new reader sees while the live values are
    computed beside the sweep (data._stage_live_values): a failure there leaves the workbench as it was and nothing
    behind; held once staged (the new hour's values committed on their own cursor), a reader still sees only the old
    rows and values, none of the new hour's; after the commit, the new ones."""
    from analysis.engine import attribute_values as AV

    real = data.keep_live_values
    old = _live_state(wb)
    version = wb.version

    def failing(con: duckdb.DuckDBPyConnection, rows: str, gone: Sequence[int], hours: Sequence[int],
                **kw: Any) -> None:
        if kw.get("into") not in (None, AV.LIVE_VALUES) and "staged" not in kw:
            raise ValueError("a values step that fails")
        real(con, rows, gone, hours, **kw)

    data.keep_live_values = failing
    try:
        with pytest.raises(ValueError, match="a values step that fails"):
            wb.refresh()
    finally:
        data.keep_live_values = real
    assert _live_state(wb) == old and wb.version == version
    cur = wb.cursor()
    assert cur.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_live_values_next_%'"
                       ).fetchall() == [(0,)]  # nothing left behind
    staged, release = threading.Event(), threading.Event()

    def held(con: duckdb.DuckDBPyConnection, rows: str, gone: Sequence[int], hours: Sequence[int],
             **kw: Any) -> None:
        real(con, rows, gone, hours, **kw)
        if kw.get("into") not in (None, AV.LIVE_VALUES) and "staged" not in kw:
            staged.set()
            release.wait(60)

    done: list[bool] = []
    data.keep_live_values = held
    try:
        runner = threading.Thread(target=lambda: done.append(wb.refresh()))
        runner.start()
        assert staged.wait(60)
        staged_rows = cur.execute("SELECT hour, count(*) FROM main._live_values_next_request GROUP BY hour "
                                  "ORDER BY hour").fetchall()
        assert _live_state(wb) == old  # the staged values are nobody's yet
    finally:
        release.set()
        runner.join(120)
        data.keep_live_values = real
        cur.close()
    assert done == [True] and wb.version == version + 1
    new = _live_state(wb)
    assert new[0][0][0] == n_live + 150 and sum(n for _, n in new[1]) == n_live + 150
    last = max(h for h, _ in old[1])
    assert set(staged_rows) <= set(new[1]) and (last, dict(old[1])[last] + 150) in staged_rows  # what was staged
