"""Percentile series: the quantile_cont convention, counts beside every figure, failures, low-sample flags."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from analysis import connect
from analysis.engine.percentiles import (
    auto_window_s,
    iso,
    parse_duration,
    parse_time,
    percentile_series,
    request_facts,
)
from tests.factory import T0, add_request, write
from tracing import schema as S
from tracing.errors import QueryError
from tracing.rows import SpanBatch

MS = 1_000_000
SEC = 1_000_000_000


def _store(tmp_path: Path) -> Path:
    """Window 0: five requests of 10..50 ms (one error, one timeout); window 1: two of 100 / 300 ms."""
    batch = SpanBatch()
    specs = [(0, 10, "Unset", {}), (1, 20, "Unset", {}), (2, 30, "Error", {S.ATTR_ERROR_TYPE: "Boom"}),
             (3, 40, "Error", {S.ATTR_ERROR_TYPE: "TimeoutError"}), (4, 50, "Unset", {})]
    for i, (sec, ms, code, attrs) in enumerate(specs):
        start = sec * SEC
        add_request(batch, f"w0-{i}", start, start + ms * MS, [
            ("queue_wait", start, start + 2 * MS),
            ("generation", start + 2 * MS, start + ms * MS),
            ("prefill", start + 2 * MS, start + 5 * MS, "generation"),
            ("decode", start + 5 * MS, start + ms * MS, "generation"),
        ], attrs={"gen_ai.usage.output_tokens": "6", **attrs}, status_code=code,
            replica="replica-00" if i % 2 == 0 else "replica-01")
    for i, ms in enumerate((100, 300)):
        start = 60 * SEC + i * SEC
        add_request(batch, f"w1-{i}", start, start + ms * MS, [("generation", start, start + ms * MS)],
                    replica="replica-00")
    write(tmp_path, batch)
    return tmp_path


def test_series_follows_quantile_cont_with_counts_and_flags(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    frame = percentile_series(con, "e2e", window_s="1m")
    assert frame.get_column("window_start_ns").to_list() == [T0, T0 + 60 * SEC]
    assert frame.get_column("window_start").to_list()[0] == datetime(2025, 11, 20, 14, 0, tzinfo=UTC)
    first = frame.row(0, named=True)
    # rank h = (n - 1) q over 10, 20, 30, 40, 50 ms
    assert (first["p50_ms"], first["p90_ms"]) == (30.0, 46.0)
    assert first["p99_ms"] == pytest.approx(49.6)
    assert first["p999_ms"] == pytest.approx(49.96)
    assert (first["requests"], first["ok"], first["errors"], first["timeouts"], first["cancelled"], first["n"]) == (
        5, 3, 1, 1, 0, 5)
    assert (first["p50_low_sample"], first["p99_low_sample"]) == (True, True)
    second = frame.row(1, named=True)
    assert (second["p50_ms"], second["requests"]) == (200.0, 2)


def test_failures_are_included_by_default_and_can_be_left_out(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    ok_only = percentile_series(con, "e2e", window_s=60, include_failures=False).row(0, named=True)
    assert (ok_only["n"], ok_only["requests"], ok_only["errors"]) == (3, 5, 1)  # counts still show failures
    assert ok_only["p50_ms"] == 20.0  # 10, 20, 50


def test_group_by_replica_and_stage_and_ttft_metrics(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    by = percentile_series(con, "e2e", window_s=60, by=["replica"], until=T0 + 60 * SEC)
    assert by.select("replica", "requests", "p50_ms").rows() == [("replica-00", 3, 30.0), ("replica-01", 2, 30.0)]
    decode = percentile_series(con, "decode", window_s=60).row(0, named=True)
    assert decode["p50_ms"] == 25.0  # decode = e2e - 5 ms on the critical path: 5, 15, 25, 35, 45
    ttft = percentile_series(con, "ttft", window_s=60).row(0, named=True)
    assert ttft["p50_ms"] == 5.0 and ttft["n"] == 5
    tpot = percentile_series(con, "tpot", window_s=60).row(0, named=True)
    assert tpot["p50_ms"] == 5.0  # (30 - 5) / 5


def test_since_until_and_bad_arguments(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    frame = percentile_series(con, window_s=60, since=iso(T0 + 60 * SEC))
    assert frame.get_column("requests").to_list() == [2]
    with pytest.raises(QueryError, match="unknown metric"):
        percentile_series(con, "nope")
    with pytest.raises(QueryError, match="cannot group by"):
        percentile_series(con, by=["TraceId; DROP TABLE x"])


def test_request_facts_match_the_requests_view(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    cols = "trace_id, start_ns, e2e_ns, status, replica, model, tenant, input_tokens, output_tokens"
    facts = con.execute(f"SELECT {cols} FROM {request_facts(con)} ORDER BY trace_id").fetchall()
    view = con.execute(f"SELECT {cols} FROM requests ORDER BY trace_id").fetchall()
    assert facts == view and len(facts) == 7
    cols += ", ttft_ns, tpot_ns"
    facts = con.execute(f"SELECT {cols} FROM {request_facts(con, with_ttft=True)} ORDER BY trace_id").fetchall()
    assert facts == con.execute(f"SELECT {cols} FROM requests ORDER BY trace_id").fetchall()


def test_durations_times_and_automatic_windows() -> None:
    assert [parse_duration(x) for x in ("5m", "30s", "1h", "250ms", 90)] == [300, 30, 3600, 0.25, 90]
    with pytest.raises(QueryError):
        parse_duration("soon")
    assert parse_time("2025-11-20T14:00:00Z") == T0
    assert parse_time("2025-11-20 14:00:00") == T0
    assert parse_time(T0) == T0 and parse_time(T0 // SEC) == T0
    assert iso(T0) == "2025-11-20T14:00:00Z" and iso(T0 + 1500) == "2025-11-20T14:00:00.000001Z"
    # 36,000 requests an hour: ~2,000 per window -> 5 min
    assert auto_window_s(36_000, 3600) == 300
    # a busy service gets at most 60 windows: 1.4 M requests over 2 h -> 2 min
    assert auto_window_s(1_400_000, 7200) == 120
    # 6,000 requests in 10 min: at least 8 windows -> 1 min
    assert auto_window_s(6_000, 600) == 60


def test_the_one_pass_e2e_series_equals_the_series_over_request_facts(tmp_path: Path) -> None:
    store = _store(tmp_path)
    fast = percentile_series(connect(store), "e2e", window_s=60, by=["tenant", "status"])
    con = connect(store)
    request_facts(con)  # from now on the series reads the facts table
    assert fast.equals(percentile_series(con, "e2e", window_s=60, by=["tenant", "status"]))
    assert percentile_series(connect(store), "e2e").equals(percentile_series(con, "e2e"))  # automatic window


def test_facts_copy_traces_with_several_requests_from_the_view(tmp_path: Path) -> None:
    batch = SpanBatch()
    trace = "ab" * 16
    for k, (a, b) in enumerate(((0, 40), (100, 130))):  # two requests in one trace, on different replicas
        root = f"{k + 1:016x}"
        batch.append(trace_id=trace, span_id=root, parent_span_id="", name="request", kind="Server",
                     start_ns=T0 + a * MS, end_ns=T0 + b * MS, service="llm", resource={"service.instance.id": "gw"},
                     attrs={S.ATTR_REQUEST: "true", "gen_ai.usage.output_tokens": "3"})
        batch.append(trace_id=trace, span_id=f"{k + 11:016x}", parent_span_id=root, name="prefill",
                     kind="Internal", start_ns=T0 + a * MS, end_ns=T0 + (a + 10) * MS, service="llm",
                     resource={"service.instance.id": f"worker-{k}"}, attrs={S.ATTR_STAGE: "prefill"})
    write(tmp_path, batch)
    con = connect(tmp_path)
    cols = "trace_id, start_ns, e2e_ns, status, replica, ttft_ns, tpot_ns"
    facts = con.execute(f"SELECT {cols} FROM {request_facts(con, with_ttft=True)} ORDER BY start_ns").fetchall()
    view = con.execute(f"SELECT {cols} FROM requests ORDER BY start_ns").fetchall()
    assert facts == view
    assert [(r[4], r[5]) for r in facts] == [("worker-0", 10 * MS), ("worker-1", 10 * MS)]


def test_refresh_gives_new_request_facts(tmp_path: Path) -> None:
    from analysis import refresh

    store = _store(tmp_path)
    con = connect(store)
    first = request_facts(con)
    batch = SpanBatch()
    add_request(batch, "late", 120 * SEC, 120 * SEC + 5 * MS)
    write(store, batch)
    refresh(con, store)
    second = request_facts(con)
    assert second != first
    assert con.execute(f"SELECT count(*) FROM {second}").fetchall() == [(8,)]
    assert percentile_series(con, window_s=60).get_column("requests").to_list() == [5, 2, 1]
