"""NVIDIA Triton traces (JSON trace file and OpenTelemetry mode) through `tailscope ingest`.

Format: triton-inference-server/server @e1db8a60 (2.73.0dev), src/tracer.cc: JSON mode writes
`[` first, then per trace `{"id","model_name","model_version","request_id"?,"parent_id"?}` and one
`{"id","timestamps":[{"name","ns"}]}` element per activity, steady-clock ns, `]` only at
shutdown; OpenTelemetry mode `ReportToOpenTelemetry`: root `InferRequest` (frontend timestamps
as events), a span named after the model (triton.model_name / triton.model_version /
triton.trace_id / triton.trace_parent_id; REQUEST_START, QUEUE_START, REQUEST_END events) and a
`compute` span (COMPUTE_* events). Intervals as in qa/common/trace_summary.py; docs/user_guide/
trace.md. Fixtures: tests/intake/fixtures/engines/triton.otlp.jsonl, triton_trace*.json.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from opentelemetry import trace

from intake.engines.triton import ENV_CLOCK_OFFSET
from tests.intake.engine_fixtures import (
    FIXTURES,
    MS,
    T0,
    TRITON_MONO0,
    TRITON_OFFSET,
    _child,
    _spans,
    assert_stages_sum_to_e2e,
    collect_requests,
    files,
    ingest_files,
    requests,
    run_cli,
    stage_ms,
)
from tracing.otlp_json import spans_to_json_line

assert ENV_CLOCK_OFFSET is not None  # the offset is settable from the environment
CLOCK_ENV: str = ENV_CLOCK_OFFSET

OTEL = FIXTURES / "triton.otlp.jsonl"
CLOSED = FIXTURES / "triton_trace.json"
LIVE = FIXTURES / "triton_trace_live.json"


@pytest.mark.parametrize("name", ["triton.otlp.jsonl", "triton_trace.json", "triton_trace_live.json"])
def test_fixture_files_are_what_the_builder_makes(name: str) -> None:
    assert (FIXTURES / name).read_text() == files()[name]


def test_opentelemetry_mode_events_become_stages(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, OTEL)
    [row] = requests(store)
    assert_stages_sum_to_e2e([row])
    # network = HTTP receive 1 + send 2; preprocess = REQUEST_START→QUEUE_START 0.3 + COMPUTE_START→INPUT_END
    # 0.5; queue = QUEUE_START→COMPUTE_START 2; generation = INPUT_END→OUTPUT_START 18; other = output copy,
    # request end and the hand-off to the frontend
    assert stage_ms(row) == {"network": 3.0, "preprocess": 0.8, "queue_wait": 2.0, "generation": 18.0,
                             "other": 2.2}
    # Triton's resource is service.name alone (src/tracer.cc): no replica unless collect records the peer
    assert (row["model"], row["model_version"], row["replica"], row["status"], row["e2e_ns"]) == (
        "llama_trtllm", "1", None, "ok", 26 * MS)


def test_json_trace_file_with_a_clock_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLOCK_ENV, str(TRITON_OFFSET))
    store = tmp_path / "store"
    ingest_files(store, CLOSED)
    simple, ens = requests(store)
    assert_stages_sum_to_e2e([simple, ens])
    assert simple["start_ns"] == T0 and simple["e2e_ns"] == 10_900_000  # HTTP_RECV_START → HTTP_SEND_END
    assert stage_ms(simple) == {"network": 0.8, "preprocess": 0.3, "queue_wait": 1.0, "generation": 8.0,
                                "other": 0.8}
    assert (simple["model"], simple["model_version"], simple["status"]) == ("simple", "1", "ok")
    # ensemble: its own span has no compute, so the composing models' compute spans give the generation
    # stretch (first COMPUTE_INPUT_END → last COMPUTE_OUTPUT_START); gRPC wait-read and send are network
    assert stage_ms(ens) == {"network": 0.7, "preprocess": 0.1, "queue_wait": 0.25, "generation": 7.85,
                             "other": 0.6}
    assert ens["model"] == "ens" and ens["start_ns"] == T0 + 100 * MS


def test_live_file_without_closing_bracket_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLOCK_ENV, str(TRITON_OFFSET))
    closed, live = tmp_path / "closed", tmp_path / "live"
    ingest_files(closed, CLOSED)
    result = run_cli("ingest", "--store", str(live), str(LIVE))  # not --skip-bad: a cut last element is normal
    assert result.exit_code == 0, result.output
    assert requests(live) == requests(closed)


def test_without_an_offset_the_file_mtime_anchors_the_latest_timestamp(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLOCK_ENV, raising=False)
    path = shutil.copy(CLOSED, tmp_path / "trace.json")
    latest = TRITON_MONO0 + 109_500_000  # the ensemble's GRPC_SEND_END
    mtime = T0 + 3_600 * 1_000_000_000
    os.utime(path, ns=(mtime, mtime))
    store = tmp_path / "store"
    ingest_files(store, Path(path))
    simple, _ = requests(store)
    assert simple["start_ns"] == TRITON_MONO0 + (mtime - latest)


def test_bad_element_in_the_middle_fails_the_file_or_is_skipped(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLOCK_ENV, str(TRITON_OFFSET))
    text = CLOSED.read_text()
    cut = text.index('{"id":2,"model_name"')
    bad = tmp_path / "bad.json"
    bad.write_text(text[:cut] + '{"id":2,"model_name":oops},\n' + text[cut:])
    store = tmp_path / "store"
    result = run_cli("ingest", "--quiet", "--store", str(store), str(bad))
    assert result.exit_code != 0
    assert f"{bad}:1: bad Triton trace element" in result.output
    ingest_files(store, bad, skip_bad=True)
    assert [r["model"] for r in requests(store)] == ["simple", "ens"]


def test_collect_stores_what_ingest_stores(tmp_path: Path) -> None:
    """`tailscope collect` (OTLP/HTTP, Triton's OpenTelemetry mode) stores the same requests as ingest."""
    ingest_files(tmp_path / "ingested", OTEL)
    assert collect_requests(tmp_path / "collected", "triton.otlp.jsonl", "http") == requests(tmp_path / "ingested")


def test_a_file_cut_anywhere_reads_without_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton may be mid-write when the file is read: every prefix of a trace file is readable and mapped."""
    from intake.engines import normalize, read_json_array
    from intake.ingest import IngestReport

    monkeypatch.setenv(CLOCK_ENV, str(TRITON_OFFSET))
    data = CLOSED.read_bytes()
    counts = []
    for cut in range(1, len(data) + 1, 5):
        report = IngestReport()
        tables = read_json_array(CLOSED, data[:cut], skip_bad=False, report=report)
        spans = sum(normalize(t).num_rows for t in tables)
        counts.append(spans)
        assert report.bad_lines == 0
    assert counts[0] == 0 and counts == sorted(counts)  # more of the file never gives fewer spans


def test_a_decoupled_llm_backend_generates_up_to_infer_response_complete(tmp_path: Path) -> None:
    """execute() of a decoupled model only schedules the request (compute 1-2 ms); the responses
    stream until the root's INFER_RESPONSE_COMPLETE, and that time is generation, not other."""

    def build(tracer: trace.Tracer) -> None:
        root = tracer.start_span("InferRequest", kind=trace.SpanKind.SERVER, start_time=T0)
        root.add_event("HTTP_RECV_START", timestamp=T0)
        root.add_event("HTTP_RECV_END", timestamp=T0 + 1 * MS)
        model = _child(tracer, root, "tensorrt_llm_bls", 1 * MS, kind=trace.SpanKind.SERVER,
                       attrs={"triton.model_name": "tensorrt_llm_bls", "triton.model_version": 1})
        model.add_event("REQUEST_START", timestamp=T0 + 1 * MS)
        model.add_event("QUEUE_START", timestamp=T0 + 2 * MS)
        compute = _child(tracer, model, "compute", 3 * MS, kind=trace.SpanKind.SERVER)
        for name, at in (("COMPUTE_START", 3), ("COMPUTE_INPUT_END", 4), ("COMPUTE_OUTPUT_START", 4.5),
                         ("COMPUTE_END", 5)):
            compute.add_event(name, timestamp=T0 + int(at * MS))
        compute.end(end_time=T0 + 5 * MS)
        model.add_event("REQUEST_END", timestamp=T0 + 6 * MS)
        model.end(end_time=T0 + 6 * MS)
        root.add_event("INFER_RESPONSE_COMPLETE", timestamp=T0 + 480 * MS)
        root.add_event("HTTP_SEND_START", timestamp=T0 + 481 * MS)
        root.add_event("HTTP_SEND_END", timestamp=T0 + 482 * MS)
        root.end(end_time=T0 + 482 * MS)

    path = tmp_path / "decoupled.otlp.jsonl"
    path.write_text("".join(spans_to_json_line(g) + "\n"
                            for g in [_spans({"service.name": "triton-inference-server"}, "triton-server", build, 12)]))
    store = tmp_path / "store"
    ingest_files(store, path)
    [row] = requests(store)
    assert_stages_sum_to_e2e([row])
    # network 1 + 1; preprocess 1 + 1; queue 1; generation 0.5 (compute) + 475 (COMPUTE_END→COMPLETE);
    # other: output copy 0.5 and INFER_RESPONSE_COMPLETE→HTTP_SEND_START 1
    assert stage_ms(row) == {"network": 2.0, "preprocess": 2.0, "queue_wait": 1.0, "generation": 475.5,
                             "other": 1.5}
