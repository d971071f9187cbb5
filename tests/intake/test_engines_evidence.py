"""Engines claim only traces that are theirs: evidence (scope, service, attribute set, span tree), never a name.

The engine fixtures still map, each with the evidence the recognition line names; traces shaped as
user code writes them, with every engine's span names, are left alone (built with the real
OpenTelemetry SDK); and random span trees with engine-like names claim nothing without the evidence.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from intake.engines import normalize
from intake.otlp import decode_json
from intake.recognition import recognise
from sample_traces import http_chat
from sample_traces.basic import SeededIds
from tests.intake.engine_fixtures import FIXTURES, TRITON_OFFSET, run_cli
from tracing import schema as S
from tracing.otlp_json import spans_to_json_line
from tracing.rows import SpanBatch

T0 = 1_763_647_200_000_000_000
MS = 1_000_000

#: Each fixture file, the engine's request count and the evidence its recognition line names.
EXPECTED: dict[str, str] = {
    "vllm.otlp.jsonl": "4 request(s) recognised among 19 span(s) (vllm 4 by scope vllm.tracing.otel)",
    "vllm_optin.otlp.jsonl": "2 request(s) recognised among 12 span(s) (vllm 2 by scope vllm.llm_engine)",
    "sglang.otlp.jsonl": "2 request(s) recognised among 58 span(s) (sglang 2 by attribute module=sglang::request)",
    "tgi.otlp.jsonl": "3 request(s) recognised among 33 span(s) "
                      "(tgi 3 by code.namespace text_generation_router::server)",
    "triton.otlp.jsonl": "1 request(s) recognised among 9 span(s) (triton 1 by scope triton-server)",
    "triton_trace.json": "2 request(s) recognised among 21 span(s) (triton 2 by scope triton-json-trace)",
}


def test_every_engine_fixture_maps_and_says_why(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("TAILSCOPE_TRITON_CLOCK_OFFSET_NS", str(TRITON_OFFSET))
    for name, line in EXPECTED.items():
        result = run_cli("ingest", "--store", str(tmp_path / name), str(FIXTURES / name))
        assert result.exit_code == 0, result.output
        assert line in " ".join(result.stdout.split()), (name, result.stdout)


def _user_spans() -> list[list[ReadableSpan]]:
    """What application code writes when it names its own spans like an engine's: a server span per request and
    children named generate, generate_stream, completions, chat_completions, llm_request, InferRequest, 'Req ...'."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "my-llm-api", "k8s.pod.name": "api-0"}),
                              id_generator=SeededIds(11))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("myapp.handlers")
    names = ("generate", "generate_stream", "completions", "chat_completions", "llm_request", "InferRequest",
             " Req 9f2c41ab", "chat gpt-4o", "prefill Req 77aa0c1e")
    for k, name in enumerate(names):
        start = T0 + k * 1000 * MS
        for kind in (trace.SpanKind.SERVER, trace.SpanKind.INTERNAL):
            # alone, as a root
            span = tracer.start_span(name, kind=kind, start_time=start, attributes={
                "http.route": "/v1/generate", "rid": "9f2c41ab7d0e", "gen_ai.request.id": "r-1",
                "gen_ai.latency.e2e": 0.4, "total_time": "120ms", "model": "llama"})
            span.end(end_time=start + 400 * MS)
            # under an HTTP server span, with children of engine-like names
            root = tracer.start_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER, start_time=start,
                                     attributes={"http.route": "/v1/chat/completions"})
            ctx = trace.set_span_in_context(root)
            child = tracer.start_span(name, context=ctx, kind=kind, start_time=start + MS)
            inner = trace.set_span_in_context(child)
            for sub in ("infer", "send_generation", "compute", "tokenize", "prefill_forward", "schedule"):
                tracer.start_span(sub, context=inner, start_time=start + 2 * MS).end(end_time=start + 3 * MS)
            child.end(end_time=start + 300 * MS)
            root.end(end_time=start + 400 * MS)
    provider.shutdown()
    return [list(exporter.get_finished_spans())]


def test_user_spans_with_engine_names_are_not_claimed() -> None:
    batch = SpanBatch()
    for group in _user_spans():
        decode_json(spans_to_json_line(group), batch)
    table = batch.to_table()
    out = normalize(table)
    assert out.num_rows == table.num_rows  # no synthetic stage span
    assert not any(out.column("IsRequest").to_pylist())
    assert recognise(out).engines == {}


def test_the_plain_http_scenario_is_claimed_by_no_engine(tmp_path: Path) -> None:
    """The chat API of sample_traces.http_chat: a `generate` span in every request, no engine anywhere."""
    path = tmp_path / "chat.otlp.jsonl"
    http_chat.write(path, requests=300)
    result = run_cli("ingest", "--store", str(tmp_path / "store"), str(path))
    assert result.exit_code == 0, result.output
    spans = int(result.stdout.split(" spans read")[0].split()[-1].replace(",", ""))
    assert spans == 300 * 4 - 4  # 4 requests failed with 500 before they streamed
    assert f"0 request(s) recognised among {spans:,} span(s)\n" in result.stdout
    assert "tailscope map --suggest" in " ".join(result.stderr.split())


#: Names an engine's mapper looks at, and names user code gives its own spans.
_NAMES = ("generate", "generate_stream", "completions", "chat_completions", "llm_request", "InferRequest",
          " Req 9f2c41ab", "Req abc", "decode Req 1", "chat my-model", "infer", "send_generation", "compute",
          "tokenize", "prefill_forward", "decode_forward", "vllm.request.queue", "vllm.request.prefill", "batch",
          "schedule", "queued", "validate", "POST /v1/chat/completions")
#: Attributes user code sets; each alone, or with any other, is no engine's evidence.
_ATTRS = st.dictionaries(st.sampled_from([
    "rid", "http.route", "gen_ai.request.id", "gen_ai.latency.e2e", "total_time", "module", "code.namespace",
    "pid", "gen_ai.usage.prompt_tokens", "request_id"]),
    st.sampled_from(["", "1", "0.25", "12ms", "app", "myapp.handlers", "server", "r-1"]), max_size=4)
_USER = st.sampled_from(["my-llm-api", "chat-api", "gateway", "", "router"])


@st.composite
def _trees(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(min_value=1, max_value=12))
    batch = SpanBatch()
    service = draw(_USER)
    scope = draw(st.sampled_from(["myapp", "opentelemetry.instrumentation.fastapi", "", "app.llm"]))
    for i in range(n):
        parent = draw(st.integers(min_value=0, max_value=i))  # 0: a root, else the span before it
        attrs = draw(_ATTRS)
        if attrs.get("module", "").startswith("sglang"):
            attrs.pop("module")
        start = T0 + draw(st.integers(min_value=0, max_value=1000)) * MS
        events = [{"TimestampNs": start, "Name": draw(st.sampled_from(["REQUEST_START", "exception", "log"])),
                   "Attributes": []}] if draw(st.booleans()) else []
        batch.append(trace_id="ab" * 16, span_id=f"{i + 1:016x}", parent_span_id=f"{parent:016x}" if parent else "",
                     name=draw(st.sampled_from(_NAMES)), kind=draw(st.sampled_from(S.SPAN_KINDS)),
                     start_ns=start, end_ns=start + draw(st.integers(min_value=0, max_value=5000)) * MS,
                     service=service, resource={"service.name": service}, attrs=attrs, scope_name=scope,
                     status_code=draw(st.sampled_from(S.STATUS_CODES)), events=events)
    return batch.to_table()


@settings(max_examples=200, deadline=None)
@given(table=_trees())
def test_random_trees_with_engine_names_claim_nothing_without_evidence(table: pa.Table) -> None:
    out = normalize(table)
    assert out.num_rows == table.num_rows
    assert not any(out.column("IsRequest").to_pylist())
    assert out.column("SpanAttributes").to_pylist() == table.column("SpanAttributes").to_pylist()
