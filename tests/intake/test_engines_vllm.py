"""vLLM 0.33.0 `llm_request` spans through `tailscope ingest`.

Format: vllm-0.33.0 wheel, vllm/v1/engine/output_processor.py `do_tracing` (one SERVER span
`llm_request` per finished request, start = arrival_time, no children), vllm/tracing/utils.py
(attribute keys), vllm/v1/metrics/stats.py (float-second latency formulas); `finish_reasons`
as a JSON string from the main branch (vllm-project/vllm output_processor.py @d0782260).
Fixture: tests/intake/fixtures/engines/vllm.otlp.jsonl, made with the OpenTelemetry SDK by
tests/intake/engine_fixtures.py.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from intake.engines import normalize, vllm
from intake.engines._common import Trace
from intake.otlp import decode_json
from tests.intake import vllm_reference
from tests.intake.engine_fixtures import (
    FIXTURES,
    assert_stages_sum_to_e2e,
    collect_requests,
    files,
    ingest_files,
    requests,
    sql,
    stage_ms,
)
from tracing import schema as S
from tracing.rows import SpanBatch

FIXTURE = FIXTURES / "vllm.otlp.jsonl"
BASIC = Path(__file__).parents[2] / "sample_traces" / "data" / "basic.otlp.jsonl.gz"
INCIDENT = Path(__file__).parents[2] / "sample_traces" / "data" / "engines" / "vllm_slow_replica.otlp.jsonl.gz"


def _by_request_id(store: Path) -> dict[str, dict[str, object]]:
    rows = sql(store, "SELECT r.*, s.SpanAttributes['gen_ai.request.id'] AS rid FROM requests r "
                      "JOIN spans s ON s.TraceId = r.trace_id AND s.SpanId = r.span_id")
    return {str(r["rid"]): r for r in rows}


def test_fixture_file_is_what_the_builder_makes() -> None:
    assert FIXTURE.read_text() == files()["vllm.otlp.jsonl"]


def test_latency_attributes_are_laid_on_the_timeline_and_sum_to_e2e(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    rows = _by_request_id(store)
    assert sorted(rows) == ["cmpl-a", "cmpl-b", "cmpl-c", "cmpl-d"]
    assert_stages_sum_to_e2e(list(rows.values()))
    # A: preprocess = TTFT − queue − prefill = 120 − 30 − 80; streaming = e2e − TTFT − decode = 1020 − 120 − 880;
    # the 0.5 ms between e2e and span.end() is `other`
    assert stage_ms(rows["cmpl-a"]) == {"preprocess": 10.0, "queue_wait": 30.0, "prefill": 80.0, "decode": 880.0,
                                        "streaming": 20.0, "other": 0.5}
    assert rows["cmpl-a"]["e2e_ns"] == 1_020_500_000
    assert rows["cmpl-a"]["ttft_ns"] == 120_000_000
    # B: queue + prefill (70 ms, engine-core clock) exceed TTFT (50 ms, frontend clock): the queue is clipped
    # at the request start and preprocess is 0
    assert stage_ms(rows["cmpl-b"]) == {"queue_wait": 20.0, "prefill": 30.0, "decode": 50.0}
    # C: aborted before the first token: no TTFT, so nothing can be laid out; it is counted, as cancelled
    assert stage_ms(rows["cmpl-c"]) == {"other": 200.0}
    assert rows["cmpl-c"]["status"] == "cancelled"
    assert rows["cmpl-c"]["ttft_ns"] is None
    assert stage_ms(rows["cmpl-d"]) == {"prefill": 100.0, "decode": 400.0}


def test_shape_fields_tokens_replica_status(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    rows = _by_request_id(store)
    shape = {k: (r["input_tokens"], r["output_tokens"], r["replica"], r["status"], r["service"])
             for k, r in rows.items()}
    assert shape == {
        # vLLM's resource (Resource.create in init_otel_tracer) holds the SDK's random service.instance.id,
        # passed over for vllm.process_id; service.name is the instrumenting module name
        "cmpl-a": (512, 45, "4242", "ok", "vllm.llm_engine"),
        "cmpl-b": (8, 3, "4242", "ok", "vllm.llm_engine"),
        "cmpl-c": (100, 0, "4242", "cancelled", "vllm.llm_engine"),
        # service.instance.id (e.g. from OTEL_RESOURCE_ATTRIBUTES) wins over vllm.process_id
        "cmpl-d": (20, 10, "gpu-node-3", "ok", "vllm"),
    }
    assert all(r["model"] is None for r in rows.values())  # 0.33 sets no model attribute
    assert rows["cmpl-a"]["tpot_ns"] == round((1_020_500_000 - 120_000_000) / 44)


def test_synthetic_spans_are_marked_and_reingest_adds_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_files(store, FIXTURE)
    spans = sql(store, "SELECT SpanName, ParentSpanId, Stage, ScopeName, "
                       f"SpanAttributes['{S.ATTR_SYNTHETIC}'] AS synthetic, "
                       f"SpanAttributes['{S.ATTR_DERIVED_FROM}'] AS source, "
                       f"SpanAttributes['{S.ATTR_ENGINE}'] AS engine FROM spans")
    native = [s for s in spans if s["SpanName"] == "llm_request"]
    synthetic = [s for s in spans if s["synthetic"] == "true"]
    assert len(native) == 4 and all(s["engine"] == "vllm" and s["ParentSpanId"] == "" for s in native)
    assert len(spans) == len(native) + len(synthetic)
    assert all(s["ScopeName"] == "tailscope.engines" and s["engine"] == "vllm" for s in synthetic)
    assert {s["source"] for s in synthetic if s["Stage"] == "queue_wait"} == {"gen_ai.latency.time_in_queue"}
    # A: preprocess, queue_wait, generation, prefill, decode, streaming; B: queue_wait, generation, prefill,
    # decode, streaming (preprocess clipped to 0); C: none (no TTFT); D: generation, prefill, decode, streaming
    stages = sorted(s["Stage"] for s in synthetic)
    assert stages.count("generation") == 3 and stages.count("preprocess") == 1 and stages.count("queue_wait") == 2
    ingest_files(store, FIXTURE)  # same ids again: the deterministic synthetic ids dedupe too
    assert len(sql(store, "SELECT SpanId FROM spans")) == len(spans)


def test_native_spans_pass_through_untouched_and_share_a_store(tmp_path: Path) -> None:
    batch = SpanBatch()
    for line in gzip.decompress(BASIC.read_bytes()).splitlines()[:5]:
        decode_json(line, batch)
    native = batch.to_table()
    assert normalize(native) is native

    alone, mixed = tmp_path / "alone", tmp_path / "mixed"
    ingest_files(alone, BASIC)
    ingest_files(mixed, BASIC, FIXTURE)
    before = requests(alone)
    after = [r for r in requests(mixed) if r["span_name"] != "llm_request"]
    assert before == after
    assert len(requests(mixed)) == len(before) + 4


def test_normalize_works_on_one_collect_batch() -> None:
    """`tailscope collect` normalizes each received batch: one OTLP/JSON line is enough for vLLM."""
    batch = SpanBatch()
    decode_json(FIXTURE.read_text().splitlines()[1], batch)
    table = normalize(batch.to_table())
    assert isinstance(table, pa.Table)
    requests_ = [r for r in table.to_pylist() if r["IsRequest"]]
    assert [(r["Replica"], r["TtftNs"], r["Outcome"]) for r in requests_] == [("gpu-node-3", 100_000_000, "ok")]
    # streaming (first token → e2e) is laid even when decode covers it all: it yields, so it holds 0 here
    assert sorted(r["Stage"] for r in table.to_pylist() if r["Stage"]) == ["decode", "generation", "prefill",
                                                                             "streaming"]


def test_collect_stores_what_ingest_stores(tmp_path: Path) -> None:
    """`tailscope collect` (OTLP/HTTP, as vLLM exports with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf) stores
    the same requests as `tailscope ingest` of the file."""
    ingest_files(tmp_path / "ingested", FIXTURE)
    assert collect_requests(tmp_path / "collected", "vllm.otlp.jsonl", "http") == requests(tmp_path / "ingested")


_SECONDS = st.one_of(st.none(), st.floats(min_value=0, max_value=5, allow_nan=False),
                     st.sampled_from(["", "nan", "-1.0", "x", "1e-9", "1.0000000005", "0.1234567895"]))


@settings(max_examples=150, deadline=None)
@given(ttft=_SECONDS, e2e=_SECONDS, queue=_SECONDS, prefill=_SECONDS, decode=_SECONDS,
       duration_ms=st.integers(min_value=0, max_value=6000))
def test_any_latency_attributes_give_stage_spans_inside_the_request(
        ttft: object, e2e: object, queue: object, prefill: object, decode: object, duration_ms: int) -> None:
    """Missing, inconsistent (mixed clocks) or malformed values never break the mapping or leave the request."""
    attrs = {"gen_ai.request.id": "r"}
    for key, value in (("time_to_first_token", ttft), ("e2e", e2e), ("time_in_queue", queue),
                       ("time_in_model_prefill", prefill), ("time_in_model_decode", decode)):
        if value is not None:
            attrs[f"gen_ai.latency.{key}"] = value if isinstance(value, str) else repr(value)
    batch = SpanBatch()
    start = 1_763_647_200_000_000_000
    batch.append(trace_id="ab" * 16, span_id="cd" * 8, parent_span_id="", name="llm_request", kind="Server",
                 start_ns=start, end_ns=start + duration_ms * 1_000_000, service="vllm", resource={}, attrs=attrs)
    table = batch.to_table()
    assert vllm_reference.mapped(normalize(table).to_pylist()) == _reference(table)
    rows = normalize(table).to_pylist()
    [request] = [r for r in rows if r["IsRequest"]]
    end = start + request["Duration"]
    by_id = {r["SpanId"]: r for r in rows}
    for row in rows:
        if row is request:
            continue
        assert row["Stage"] in S.ALL_STAGES and row["Duration"] > 0
        assert start <= row["TimestampNs"] and row["TimestampNs"] + row["Duration"] <= end
        parent = by_id[row["ParentSpanId"]]
        if row["Stage"] in S.STAGE_PARENT:
            assert parent["Stage"] == "generation"
            assert parent["TimestampNs"] <= row["TimestampNs"]
            assert row["TimestampNs"] + row["Duration"] <= parent["TimestampNs"] + parent["Duration"]
        else:
            assert parent is request
    assert len({r["SpanId"] for r in rows}) == len(rows)


def _reference(table: pa.Table) -> dict[tuple[str, str], tuple[str, int | None, vllm_reference.Layout]]:
    """What each `llm_request` row of `table` must become by the documented format (tests/intake/vllm_reference.py)."""
    return {(r["TraceId"], r["SpanId"]): vllm_reference.expected(r) for r in table.to_pylist()
            if r["SpanName"] == "llm_request"}


def _row_wise(table: pa.Table) -> pa.Table:
    """The row-at-a-time mapping (`vllm.map_trace`) of every row."""
    rows = table.to_pylist()
    synthetic = [s for row in rows for s in vllm.map_trace(Trace([row]))]
    out = rows + synthetic
    for row in out:
        row["Timestamp"] = row["TimestampNs"] // 1000
    return pa.Table.from_pylist(out, schema=S.SPAN_SCHEMA)


def _sorted_rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda r: (r["TraceId"], r["SpanId"]))


def test_mapping_equals_the_documented_format_on_the_fixture_and_the_incident() -> None:
    batch = SpanBatch()
    for path in (FIXTURE, INCIDENT):
        data = path.read_bytes()
        for line in (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).splitlines():
            decode_json(line, batch)
    table = batch.to_table()
    assert table.num_rows > 5000
    assert vllm_reference.mapped(normalize(table).to_pylist()) == _reference(table)
    # the row-at-a-time path (`vllm.map_trace`) lays out the same spans as the column-wise one
    assert _sorted_rows(normalize(table)) == _sorted_rows(_row_wise(table))


def test_one_file_mixing_native_and_every_engine(tmp_path: Path) -> None:
    """One table holding native, vLLM, SGLang, TGI and Triton spans maps each as it would alone."""
    names = ["vllm.otlp.jsonl", "sglang.otlp.jsonl", "tgi.otlp.jsonl", "triton.otlp.jsonl"]
    native = gzip.decompress(BASIC.read_bytes()).decode()
    mixed = tmp_path / "mixed.otlp.jsonl"
    mixed.write_text(native + "".join((FIXTURES / n).read_text() for n in names))
    ingest_files(tmp_path / "mixed", mixed)
    for n in names:
        ingest_files(tmp_path / "separate", FIXTURES / n)
    ingest_files(tmp_path / "separate", BASIC)
    assert requests(tmp_path / "mixed") == requests(tmp_path / "separate")
