"""The request model: critical-path stage columns, TTFT/TPOT, status, and the long `stages` view."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import connect
from analysis.engine.views import REQUEST_STAGE_COLUMNS
from tests.factory import add_request, write
from tracing import schema as S
from tracing.errors import StoreError
from tracing.rows import SpanBatch


def _stage_row(store: Path, trace_id: str) -> dict[str, int]:
    con = connect(store)
    cols = ", ".join(REQUEST_STAGE_COLUMNS)
    row = con.execute(f"SELECT e2e_ns, {cols} FROM requests WHERE trace_id = ?", [trace_id]).fetchone()
    assert row is not None
    names = ["e2e_ns", *REQUEST_STAGE_COLUMNS]
    return dict(zip(names, row, strict=True))


def test_overlapping_stages_follow_the_critical_path(tmp_path: Path) -> None:
    batch = SpanBatch()
    trace, _ = add_request(batch, "overlap", 0, 100, [
        ("queue_wait", 5, 20),
        ("preprocess", 15, 30),          # overlaps the queue: the later-ending span owns 15..20
        ("generation", 30, 90),
        ("prefill", 30, 40, "generation"),
        ("decode", 40, 90, "generation"),
        ("streaming", 40, 98),           # overlaps decode: streaming owns only 90..98
    ], attrs={"gen_ai.usage.output_tokens": "11"})
    write(tmp_path, batch)
    row = _stage_row(tmp_path, trace)
    assert row == {
        "e2e_ns": 100, "network_ns": 0, "queue_wait_ns": 10, "preprocess_ns": 15, "model_load_ns": 0,
        "generation_ns": 0, "prefill_ns": 10, "decode_ns": 50, "streaming_ns": 8, "other_ns": 7,
    }


def test_gaps_go_to_other_and_spans_are_clipped_to_the_request(tmp_path: Path) -> None:
    batch = SpanBatch()
    trace, _ = add_request(batch, "gaps", 0, 100, [
        ("preprocess", -5, 10),          # starts before the request: clipped to 0..10
        ("queue_wait", 20, 30),
        ("generation", 40, 80),          # no prefill/decode children: generation keeps its time
        ("streaming", 95, 130),          # ends after the request: clipped to 95..100
    ])
    write(tmp_path, batch)
    row = _stage_row(tmp_path, trace)
    assert row["preprocess_ns"] == 10
    assert row["queue_wait_ns"] == 10
    assert row["generation_ns"] == 40
    assert row["streaming_ns"] == 5
    assert row["other_ns"] == 35         # 10..20, 30..40, 80..95


def test_repeated_stage_spans_add_up_and_generation_keeps_uncovered_time(tmp_path: Path) -> None:
    batch = SpanBatch()
    trace, _ = add_request(batch, "chunks", 0, 1000, [
        ("generation", 100, 900),
        ("prefill", 100, 200, "generation"),
        ("decode", 250, 500, "generation"),
        ("decode", 500, 850, "generation"),
        ("model_load", 0, 100),
    ])
    write(tmp_path, batch)
    row = _stage_row(tmp_path, trace)
    assert row["decode_ns"] == 600
    assert row["prefill_ns"] == 100
    assert row["generation_ns"] == 100   # 200..250 and 850..900 inside generation, no child
    assert row["model_load_ns"] == 100
    assert row["other_ns"] == 100


def test_ttft_tpot_status_and_shape(tmp_path: Path) -> None:
    batch = SpanBatch()
    attrs = {"gen_ai.request.model": "llama", S.ATTR_MODEL_VERSION: "v2", S.ATTR_TENANT: "acme",
             "gen_ai.usage.prompt_tokens": "12", "gen_ai.usage.completion_tokens": "11"}
    derived, _ = add_request(batch, "derived", 0, 100, [
        ("generation", 10, 100), ("prefill", 10, 40, "generation"), ("decode", 40, 100, "generation"),
    ], attrs=attrs)
    stated, _ = add_request(batch, "stated", 0, 100, [("generation", 10, 100)],
                            attrs={**attrs, S.ATTR_TTFT_NS: "25"})
    failed, _ = add_request(batch, "failed", 0, 50, [], status_code="Error",
                            attrs={S.ATTR_ERROR_TYPE: "TimeoutError"})
    cancelled, _ = add_request(batch, "cancelled", 0, 50, [], attrs={S.ATTR_OUTCOME: "cancelled"})
    write(tmp_path, batch)
    con = connect(tmp_path)
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT trace_id, ttft_ns, tpot_ns, status, model, model_version, tenant, input_tokens, output_tokens, "
        "replica FROM requests").fetchall()}
    assert rows[derived] == (40, 6, "ok", "llama", "v2", "acme", 12, 11, "replica-00")
    assert rows[stated][:2] == (25, 8)   # (100 - 25) / 10 = 7.5 rounds to 8
    assert rows[failed][2] == "timeout"
    assert rows[cancelled][2] == "cancelled"


def test_stages_view_is_one_row_per_request_and_stage(tmp_path: Path) -> None:
    batch = SpanBatch()
    trace, _ = add_request(batch, "long", 0, 100, [("queue_wait", 0, 30), ("generation", 30, 100)])
    write(tmp_path, batch)
    con = connect(tmp_path)
    rows = dict(con.execute("SELECT stage, critical_ns FROM stages WHERE trace_id = ?", [trace]).fetchall())
    assert set(rows) == set(S.CRITICAL_PATH_COLUMNS)
    assert rows["queue_wait"] == 30 and rows["generation"] == 70 and rows["other"] == 0


def test_empty_store_gives_empty_views_and_missing_store_a_clear_error(tmp_path: Path) -> None:
    from tracing.store import init_store

    init_store(tmp_path / "empty")
    con = connect(tmp_path / "empty")
    for view in ("spans", "requests", "stages"):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,)
    with pytest.raises(StoreError, match="no store there"):
        connect(tmp_path / "missing")


def test_sandboxed_connection_reads_only_the_store(tmp_path: Path) -> None:
    batch = SpanBatch()
    add_request(batch, "one", 0, 10, [])
    write(tmp_path, batch)
    con = connect(tmp_path, sandbox=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (1,)
    import duckdb

    with pytest.raises(duckdb.Error):
        con.execute("SELECT * FROM read_csv('/etc/passwd')").fetchall()
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")


def test_client_span_parent_gives_the_derived_network_time(tmp_path: Path) -> None:
    from tests.factory import T0, hex_id

    batch = SpanBatch()
    trace, root = add_request(batch, "client", 10, 90, [("generation", 10, 90)])
    plain, _ = add_request(batch, "plain", 0, 50, [])
    # re-parent the first request under a CLIENT span of the same trace covering 0..100
    table = batch.to_table().to_pylist()
    client_id = hex_id("span", "client", "caller")
    for row in table:
        if row["SpanId"] == root:
            row["ParentSpanId"] = client_id
    fixed = SpanBatch()
    for row in table:
        fixed.append(trace_id=row["TraceId"], span_id=row["SpanId"], parent_span_id=row["ParentSpanId"],
                     name=row["SpanName"], kind=row["SpanKind"], start_ns=row["TimestampNs"],
                     end_ns=row["TimestampNs"] + row["Duration"], service=row["ServiceName"],
                     resource=dict(row["ResourceAttributes"]), attrs=dict(row["SpanAttributes"]))
    fixed.append(trace_id=trace, span_id=client_id, parent_span_id="", name="POST /v1/completions", kind="Client",
                 start_ns=T0, end_ns=T0 + 100, service="caller", resource={}, attrs={})
    write(tmp_path, fixed)
    con = connect(tmp_path)
    rows = dict(((t, (c, n)) for t, c, n in con.execute(
        "SELECT trace_id, client_e2e_ns, client_network_ns FROM requests").fetchall()))
    assert rows == {trace: (100, 20), plain: (None, None)}
