"""Hugging Face TGI handler spans through `tailscope ingest`.

Format: huggingface/text-generation-inference @db931fcf (3.3.6-dev0): router/src/server.rs (handler
spans generate / generate_stream / completions / chat_completions with fields total_time,
validation_time, queue_time, inference_time, time_per_token, seed recorded as
`format!("{:?}", duration)` on success), router/src/infer/mod.rs (inner `generate_stream` span),
backends/v3/src/queue.rs and backend.rs (per-request `queued` and `infer` spans, one per
batching-loop iteration, and under them a `send_generation` span for each generation sent).
The tracing-opentelemetry layer exports the fields as string attributes; its scope name and extra
attributes are unconfirmed (docs/engines.md).
Fixture: tests/intake/fixtures/engines/tgi.otlp.jsonl.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from intake.engines import normalize
from intake.engines._common import rust_duration_ns
from intake.otlp import decode_json
from tests.intake.engine_fixtures import (
    FIXTURES,
    MS,
    _spans,
    _tgi_handler,
    assert_stages_sum_to_e2e,
    collect_requests,
    files,
    ingest_files,
    requests,
    stage_ms,
    tgi_spans,
)
from tracing.otlp_json import spans_to_json_line
from tracing.rows import SpanBatch

FIXTURE = FIXTURES / "tgi.otlp.jsonl"


@pytest.mark.parametrize(("text", "ns"), [
    ("12.3ms", 12_300_000), ("1.2s", 1_200_000_000), ("850µs", 850_000), ("850μs", 850_000), ("7ns", 7),
    ("1.000000001s", 1_000_000_001), ("0ns", 0), ("120.5s", 120_500_000_000), ("9.94ms", 9_940_000),
])
def test_rust_debug_durations_parse_to_exact_ns(text: str, ns: int) -> None:
    assert rust_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "None", "12.3", "1m", "-1ms", "Some(3)"])
def test_other_strings_are_not_durations(text: str) -> None:
    assert rust_duration_ns(text) is None


def test_fixture_file_is_what_the_builder_makes() -> None:
    assert FIXTURE.read_text() == files()["tgi.otlp.jsonl"]


def test_duration_fields_become_stages_that_sum_to_e2e(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    rows = requests(store)
    # the inner `generate_stream` span of Infer is not a second request, nor are the batch traces
    assert [r["span_name"] for r in rows] == ["generate_stream", "generate", "generate"]
    assert_stages_sum_to_e2e(rows)
    stream, plain, failed = rows
    # validation 1.5 ms, queue 11 ms, inference 298.2 ms split at the end of the first `infer` span (40 ms);
    # streaming holds the 2.3 ms from the end of inference to the span end
    assert stage_ms(stream) == {"preprocess": 1.5, "queue_wait": 11.0, "prefill": 27.5, "decode": 270.7,
                                "streaming": 2.3}
    # no `infer` spans in the trace: inference stays one generation stretch; the rest of the span is other
    assert stage_ms(plain) == {"preprocess": 0.85, "queue_wait": 1200.0, "generation": 2350.0, "other": 1.15}
    assert stage_ms(failed) == {"other": 3.0}


def test_shape_fields(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    stream, plain, failed = requests(store)
    # output tokens = inference_time / time_per_token (298.2 / 9.94, 2350 / 50)
    assert [(r["status"], r["streaming"], r["output_tokens"], r["ttft_ns"]) for r in (stream, plain, failed)] == [
        ("ok", True, 30, 40_000_000), ("ok", False, 47, None), ("error", False, None, None)]
    assert {r["service"] for r in (stream, plain, failed)} == {"text-generation-inference.router"}
    assert {r["replica"] for r in (stream, plain, failed)} == {None}  # TGI's resource names no instance


def test_collect_stores_what_ingest_stores(tmp_path: Path) -> None:
    """`tailscope collect` (OTLP/gRPC, TGI's exporter) stores the same requests as ingest."""
    ingest_files(tmp_path / "ingested", FIXTURE)
    assert collect_requests(tmp_path / "collected", "tgi.otlp.jsonl", "grpc") == requests(tmp_path / "ingested")


def _table(groups: list[list[ReadableSpan]]) -> pa.Table:
    batch = SpanBatch()
    for group in groups:
        decode_json(spans_to_json_line(group), batch)
    return batch.to_table()


def test_inner_spans_without_their_handler_are_not_requests() -> None:
    """router/src/infer/mod.rs: the inner generate/generate_stream spans share the names and the
    text_generation_router namespace; arriving without the handler they are no request at all."""
    table = _table(tgi_spans())
    handler = pc.equal(pc.fill_null(pc.map_lookup(table.column("SpanAttributes"), "code.namespace", "first"), ""),
                       "text_generation_router::server")
    assert pc.sum(handler.cast("int64")).as_py() == 3
    inner_only = normalize(table.filter(pc.invert(handler)))
    assert not any(inner_only.column("IsRequest").to_pylist())


def test_a_stream_the_client_dropped_is_cancelled_and_a_plain_failure_an_error() -> None:
    """A stream whose client went away ends without timing fields and without an error status."""

    def build(tracer: trace.Tracer) -> None:
        _tgi_handler(tracer, "generate_stream", 0, 50 * MS, {}, [(12 * MS, 40 * MS)])
        _tgi_handler(tracer, "generate", 100 * MS, 150 * MS, {}, [])
        _tgi_handler(tracer, "generate_stream", 200 * MS, 250 * MS, {}, [], error=True)

    table = normalize(_table([_spans({"service.name": "text-generation-inference.router"},
                                     "text-generation-inference.router", build, 11)]))
    requests_ = sorted((r for r in table.to_pylist() if r["IsRequest"]), key=lambda r: r["TimestampNs"])
    assert [(r["SpanName"], r["Outcome"]) for r in requests_] == [
        ("generate_stream", "cancelled"), ("generate", "error"), ("generate_stream", "error")]


def test_chunked_prefill_takes_the_first_token_from_the_first_generation_sent() -> None:
    """backend.rs: with chunked prefill the first `infer` iterations hold prefill chunks and send the
    request no generation (flash_causal_lm.py generate_token appends one only once prefill finished);
    the first token is the end of the first `send_generation` span, not the end of the first `infer`."""

    def build(tracer: trace.Tracer) -> None:
        # validation 1 ms, queue 11 ms, inference 288 ms from 12 ms; prefill in two chunks (12-40, 40-95 ms),
        # the first generation sent at 95 ms, then decode iterations
        _tgi_handler(tracer, "generate_stream", 0, 302 * MS, {
            "total_time": "301ms", "validation_time": "1ms", "queue_time": "11ms",
            "inference_time": "288ms", "time_per_token": "9.6ms"},
            [(12 * MS, 40 * MS), (40 * MS, 95 * MS), (95 * MS, 180 * MS), (180 * MS, 300 * MS)],
            sends=[None, 95 * MS, 180 * MS, 300 * MS])

    table = normalize(_table([_spans({"service.name": "text-generation-inference.router"},
                                     "text-generation-inference.router", build, 12)]))
    [req] = [r for r in table.to_pylist() if r["IsRequest"]]
    assert req["TtftNs"] == 95 * MS  # the end of the first `infer` span (40 ms) would be a chunk, too early
    stages = {r["Stage"]: (r["TimestampNs"] - req["TimestampNs"], r["Duration"])
              for r in table.to_pylist() if r["ParentSpanId"] and r["Stage"] in ("prefill", "decode")}
    assert stages == {"prefill": (12 * MS, 83 * MS), "decode": (95 * MS, 205 * MS)}


def test_without_send_generation_spans_the_first_infer_end_is_taken() -> None:
    """Exports that hold `infer` spans but no `send_generation` keep the earlier rule (documented as early)."""

    def build(tracer: trace.Tracer) -> None:
        _tgi_handler(tracer, "generate_stream", 0, 302 * MS, {
            "total_time": "301ms", "validation_time": "1ms", "queue_time": "11ms",
            "inference_time": "288ms", "time_per_token": "9.6ms"},
            [(12 * MS, 40 * MS), (40 * MS, 95 * MS)], sends=[None, None])

    table = normalize(_table([_spans({"service.name": "text-generation-inference.router"},
                                     "text-generation-inference.router", build, 13)]))
    [req] = [r for r in table.to_pylist() if r["IsRequest"]]
    assert req["TtftNs"] == 40 * MS
