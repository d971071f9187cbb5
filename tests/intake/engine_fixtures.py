"""Builders of the engine trace fixtures in tests/intake/fixtures/engines/.

Each fixture is what the engine writes, rebuilt from its source: the OTLP ones with the real
OpenTelemetry SDK (span names, kinds, attribute keys and value types, parent links as the
engine's tracing code sets them), Triton's JSON trace file byte-shaped as src/tracer.cc
writes it. Times are exact offsets from T0 so the tests can assert exact stage values.

    python -m tests.intake.engine_fixtures   # rewrite the committed fixture files
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AttributeValue

from sample_traces.basic import SeededIds
from tracing.otlp_json import spans_to_json_line

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
T0 = 1_763_647_200_000_000_000  # 2025-11-20T14:00:00Z
MS = 1_000_000
US = 1_000
#: Monotonic base of the Triton JSON fixture and the wall offset the tests set for it.
TRITON_MONO0 = 5_000_000_000_000
TRITON_OFFSET = T0 - TRITON_MONO0

Build = Callable[[trace.Tracer], None]


#: The OpenTelemetry Python SDK version the SDK-default resources are written with.
SDK_VERSION = "1.45.2"


def sdk_resource(attrs: Mapping[str, AttributeValue], seed: int) -> dict[str, AttributeValue]:
    """What `Resource.create(attrs)` gives in a process without OTEL_* variables: the SDK's keys and a
    random UUID v4 service.instance.id (seeded here, so the files are the same at every build)."""
    instance = str(uuid.UUID(int=random.Random(seed).getrandbits(128), version=4))
    return {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
            "telemetry.sdk.version": SDK_VERSION, "service.instance.id": instance, **attrs}


def _spans(resource: Mapping[str, AttributeValue], scope: str, build: Build, seed: int) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    # Resource(...) rather than Resource.create(...): the SDK's defaults (a random service.instance.id
    # in 1.45, its own version) would make the files differ on every build
    provider = TracerProvider(resource=Resource(dict(resource)), id_generator=SeededIds(seed))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer(scope))
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _child(tracer: trace.Tracer, parent: trace.Span, name: str, start: float, end: float | None = None,
           attrs: Mapping[str, AttributeValue] | None = None,
           kind: trace.SpanKind = trace.SpanKind.INTERNAL) -> trace.Span:
    span = tracer.start_span(name, context=trace.set_span_in_context(parent), kind=kind,
                             start_time=T0 + int(start), attributes=dict(attrs or {}))
    if end is not None:
        span.end(end_time=T0 + int(end))
    return span


# --- vLLM 0.33.0: vllm/v1/engine/output_processor.py do_tracing, vllm/tracing/utils.py ---------


def _vllm_request(tracer: trace.Tracer, start: int, end: int, attrs: Mapping[str, AttributeValue],
                  error: bool = False) -> None:
    span = tracer.start_span("llm_request", kind=trace.SpanKind.SERVER, start_time=T0 + start,
                             attributes=dict(attrs))
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "request aborted"))
    span.end(end_time=T0 + end)


def vllm_spans() -> list[list[ReadableSpan]]:
    """Three `llm_request` spans (default resource) and one from a replica with service.instance.id."""

    def build(tracer: trace.Tracer) -> None:
        # A: all attributes as 0.33 sets them; ends 0.5 ms after e2e (span.end() at emit)
        _vllm_request(tracer, 0, 1020 * MS + 500 * US, {
            "gen_ai.request.id": "cmpl-a", "gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 0.9, "gen_ai.usage.prompt_tokens": 512, "gen_ai.usage.completion_tokens": 45,
            "gen_ai.latency.time_in_queue": 0.03, "gen_ai.latency.time_to_first_token": 0.12,
            "gen_ai.latency.e2e": 1.02, "gen_ai.latency.time_in_model_prefill": 0.08,
            "gen_ai.latency.time_in_model_decode": 0.88, "gen_ai.latency.time_in_model_inference": 0.96})
        # B: mixed clocks: queue + prefill (engine-core monotonic) exceed TTFT (frontend wall)
        _vllm_request(tracer, 2000 * MS, 2100 * MS, {
            "gen_ai.request.id": "cmpl-b", "gen_ai.usage.prompt_tokens": 8, "gen_ai.usage.completion_tokens": 3,
            "gen_ai.latency.time_in_queue": 0.04, "gen_ai.latency.time_to_first_token": 0.05,
            "gen_ai.latency.e2e": 0.1, "gen_ai.latency.time_in_model_prefill": 0.03,
            "gen_ai.latency.time_in_model_decode": 0.05, "gen_ai.latency.time_in_model_inference": 0.08})
        # C: aborted (main branch adds finish_reasons as a JSON string and an error status)
        _vllm_request(tracer, 3000 * MS, 3200 * MS, {
            "gen_ai.request.id": "cmpl-c", "gen_ai.usage.prompt_tokens": 100, "gen_ai.usage.completion_tokens": 0,
            "gen_ai.response.finish_reasons": '["abort"]', "gen_ai.latency.time_in_queue": 0.2,
            "gen_ai.latency.e2e": 0.2})

    def build_replica(tracer: trace.Tracer) -> None:
        _vllm_request(tracer, 4000 * MS, 4500 * MS, {
            "gen_ai.request.id": "cmpl-d", "gen_ai.usage.prompt_tokens": 20, "gen_ai.usage.completion_tokens": 10,
            "gen_ai.latency.time_in_queue": 0.0, "gen_ai.latency.time_to_first_token": 0.1,
            "gen_ai.latency.e2e": 0.5, "gen_ai.latency.time_in_model_prefill": 0.1,
            "gen_ai.latency.time_in_model_decode": 0.4, "gen_ai.latency.time_in_model_inference": 0.5})

    # vllm-project/vllm vllm/tracing/otel.py init_otel_tracer @40eeb0c: Resource.create with service.name,
    # vllm.instrumenting_module_name and vllm.process_id = str(os.getpid())
    default = sdk_resource({"service.name": "vllm.llm_engine", "vllm.instrumenting_module_name": "vllm.llm_engine",
                            "vllm.process_id": "4242"}, 1)
    # OTEL_RESOURCE_ATTRIBUTES=service.instance.id=gpu-node-3 wins over the SDK's UUID
    named = {**sdk_resource({"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": "77"}, 2),
             "service.name": "vllm", "service.instance.id": "gpu-node-3"}
    return [_spans(default, "vllm.tracing.otel", build, 1), _spans(named, "vllm.tracing.otel", build_replica, 2)]


# --- SGLang 0.5.23: sglang/srt/observability/trace.py, req_time_stats.py ----------------------


def sglang_spans() -> list[list[ReadableSpan]]:
    """One unified-mode request: root, Tokenizer and Scheduler thread spans, stage slices."""

    def build(tracer: trace.Tracer) -> None:
        root = tracer.start_span(" Req 9f2c41ab", start_time=T0,
                                 attributes={"rid": "9f2c41ab7d0e4c55", "module": "sglang::request"})
        tok = _child(tracer, root, "Tokenizer (host:abcd1234 | pid:1001)", 0,
                     attrs={"host_id": "abcd1234ef", "pid": 1001, "thread_label": "Tokenizer"})
        _child(tracer, tok, "tokenize", 0, 5 * MS)
        _child(tracer, tok, "dispatch", 5 * MS, 6 * MS)
        tok.end(end_time=T0 + 6 * MS)
        sch = _child(tracer, root, "Scheduler [TP 0] (host:abcd1234 | pid:2002)", 7 * MS,
                     attrs={"tp_rank": 0, "host_id": "abcd1234ef", "pid": 2002, "thread_label": "Scheduler"})
        _child(tracer, sch, "request_process", 7 * MS, 8 * MS)
        _child(tracer, sch, "prefill_waiting", 8 * MS, 20 * MS)
        fwd = _child(tracer, sch, "prefill_forward", 20 * MS)
        _child(tracer, fwd, "chunked_prefill", 20 * MS, 40 * MS)
        _child(tracer, fwd, "chunked_prefill", 40 * MS, 60 * MS)
        fwd.end(end_time=T0 + 60 * MS)
        _child(tracer, sch, "decode_waiting", 60 * MS, 62 * MS)
        dec = _child(tracer, sch, "decode_forward", 62 * MS)
        for k in range(4):
            _child(tracer, dec, "decode_loop", (62 + k * 59.5) * MS, (62 + (k + 1) * 59.5) * MS, {"decode_ct": k})
        dec.end(end_time=T0 + 300 * MS)
        sch.end(end_time=T0 + 300 * MS)
        root.set_attributes({
            "gen_ai.latency.time_to_first_token": 0.061, "gen_ai.latency.e2e": 0.31,
            "gen_ai.latency.time_in_model_decode": 0.249, "gen_ai.latency.time_in_model_prefill": 0.055,
            "gen_ai.latency.time_in_model_inference": 0.304, "gen_ai.usage.prompt_tokens": 128,
            "gen_ai.usage.completion_tokens": 40, "gen_ai.usage.cached_tokens": 0,
            "gen_ai.request.id": "9f2c41ab7d0e4c55", "gen_ai.request.max_tokens": 64,
            "gen_ai.response.model": "Qwen/Qwen2.5-7B-Instruct", "gen_ai.response.finish_reasons": '["stop"]'})
        root.end(end_time=T0 + 310 * MS)

    def build_pd(tracer: trace.Tracer) -> None:
        """Prefill/decode disaggregation: both nodes' roots under the router's span (same rid, one trace).

        Each node is its own server (tokenizer and scheduler processes on its host). Thread labels as
        sglang sets them with --disaggregation-mode (sgl-project/sglang @9c0549b7): the tokenizer's is
        "Prefill" / "Decode" + "Tokenizer" (python/sglang/srt/entrypoints/http_server.py `lifespan`),
        the scheduler's "Prefill Scheduler" / "Decode Scheduler" (the scheduler process entry), and the
        thread span is named label + " [TP n] " + "(host:… | pid:…)" (observability/trace.py)."""
        T = 10_000 * MS  # noqa: N806
        router = tracer.start_span("POST /generate", kind=trace.SpanKind.CLIENT, start_time=T0 + T)
        roots = {}
        for role, pid in (("prefill", 2102), ("decode", 3003)):
            root = _child(tracer, router, f"{role} Req 77aa0c1e", T, attrs={
                "rid": "77aa0c1e5b5b4f0a", "module": "sglang::request", "bootstrap_room": "0x2a"})
            host = "eeee0000aa" if role == "prefill" else "dddd0000bb"
            label = role.capitalize()
            tok = _child(tracer, root, f"{label}Tokenizer (host:{host[:8]} | pid:{pid - 1})", T,
                         attrs={"host_id": host, "pid": pid - 1, "thread_label": f"{label}Tokenizer"})
            _child(tracer, tok, "tokenize", T, T + 4 * MS)
            tok.end(end_time=T0 + T + 4 * MS)
            sch = _child(tracer, root, f"{label} Scheduler [TP 0] (host:{host[:8]} | pid:{pid})", T + 5 * MS,
                         attrs={"tp_rank": 0, "host_id": host, "pid": pid, "thread_label": f"{label} Scheduler"})
            if role == "prefill":
                for name, a, b in (("prefill_prepare", 5, 6), ("prefill_bootstrap", 6, 15),
                                   ("prefill_waiting", 15, 25), ("prefill_forward", 25, 70),
                                   ("prefill_transfer_kv_cache", 70, 90)):
                    _child(tracer, sch, name, T + a * MS, T + b * MS)
                sch.end(end_time=T0 + T + 90 * MS)
                root.end(end_time=T0 + T + 92 * MS)
            else:
                for name, a, b in (("decode_prepare", 5, 6), ("decode_bootstrap", 6, 20),
                                   ("decode_transferred", 20, 91), ("decode_waiting", 91, 93),
                                   ("decode_forward", 93, 400)):
                    _child(tracer, sch, name, T + a * MS, T + b * MS)
                sch.end(end_time=T0 + T + 400 * MS)
                roots[role] = root
        decode = roots["decode"]
        decode.set_attributes({
            "gen_ai.latency.time_to_first_token": 0.095, "gen_ai.latency.e2e": 0.41,
            "gen_ai.latency.time_in_model_decode": 0.315, "gen_ai.usage.prompt_tokens": 2048,
            "gen_ai.usage.completion_tokens": 120, "gen_ai.response.model": "Qwen/Qwen2.5-7B-Instruct",
            "gen_ai.response.finish_reasons": '["stop"]'})
        decode.end(end_time=T0 + T + 410 * MS)
        router.end(end_time=T0 + T + 411 * MS)

    # each SGLang process builds its resource with Resource.create (a random service.instance.id per process)
    return [_spans(sdk_resource({"service.name": "sglang"}, 3), "sglang server", build, 3),
            _spans(sdk_resource({"service.name": "sglang"}, 6), "sglang server", build_pd, 6)]


# --- TGI 3.3.6-dev0: router/src/server.rs, backends/v3/src/{queue,backend}.rs ------------------


#: What backend.rs records on `send_generation` (`generation = ?generation`), cut short.
TGI_GENERATION = "Generation { request_id: 0, prefill_tokens: None, tokens: Some(Tokens { ids: [450], ..."


def _tgi_handler(tracer: trace.Tracer, name: str, start: int, end: int, fields: Mapping[str, str],
                 infers: list[tuple[int, int]], error: bool = False,
                 sends: Sequence[int | None] | None = None) -> None:
    """One TGI request: handler, inner span, `validate`, `schedule` with `queued` and one `infer` span per
    batching-loop iteration. `sends[k]` is when iteration k's `send_generation` span ends (None: that
    iteration sent the request no generation, a chunk of its prefill); by default each one sends at its end."""
    code = {"code.namespace": "text_generation_router::server", "code.filepath": "router/src/server.rs",
            "thread.name": "tokio-runtime-worker"}
    handler = tracer.start_span(name, start_time=T0 + start, attributes=code)
    inner = _child(tracer, handler, name, start, attrs={**code, "code.namespace": "text_generation_router::infer"})
    _child(tracer, inner, "validate", start, start + 1 * MS,
           {"code.namespace": "text_generation_router::validation"})
    schedule = _child(tracer, inner, "schedule", start, attrs={"code.namespace": "text_generation_backends_v3"})
    for k, (s0, s1) in enumerate(infers):
        if k == 0:
            _child(tracer, schedule, "queued", start + 1 * MS, s0)
        infer = _child(tracer, schedule, "infer", s0)
        sent = s1 if sends is None else sends[k]
        if sent is not None:
            _child(tracer, infer, "send_generation", sent - 10 * US, sent,
                   {"code.namespace": "text_generation_router_v3::backend", "generation": TGI_GENERATION})
        infer.end(end_time=T0 + s1)
    schedule.end(end_time=T0 + end - 1 * MS)
    inner.end(end_time=T0 + end - 1 * MS)
    handler.set_attributes(dict(fields))
    if error:
        handler.set_status(trace.Status(trace.StatusCode.ERROR))
    handler.end(end_time=T0 + end)


def tgi_spans() -> list[list[ReadableSpan]]:
    """A streaming request with per-batch `infer` spans, a plain one, and a failed one."""

    def build(tracer: trace.Tracer) -> None:
        _tgi_handler(tracer, "generate_stream", 0, 313 * MS, {
            "total_time": "312.5ms", "validation_time": "1.5ms", "queue_time": "11ms",
            "inference_time": "298.2ms", "time_per_token": "9.94ms", "seed": "None"},
            [(12500 * US, 40 * MS), (40 * MS, 200 * MS), (200 * MS, 310700 * US)])
        _tgi_handler(tracer, "generate", 1000 * MS, 1000 * MS + 3552 * MS, {
            "total_time": "3.55085s", "validation_time": "850µs", "queue_time": "1.2s",
            "inference_time": "2.35s", "time_per_token": "50ms", "seed": "Some(42)"}, [])
        _tgi_handler(tracer, "generate", 5000 * MS, 5003 * MS, {}, [], error=True)
        # the batch side (backend.rs): `batch` spans with no parent, the instrumented `prefill` / `decode`
        # calls in them, and the Python shard's SERVER spans (server/text_generation_server/tracing.py)
        batch = tracer.start_span("batch", start_time=T0 + 12500 * US, attributes={"batch_size": 1})
        prefill = _child(tracer, batch, "prefill", 12500 * US, attrs={"code.namespace": "text_generation_backends_v3"})
        _child(tracer, prefill, "/generate.v3.TextGenerationService/Prefill", 13 * MS, 39 * MS,
               kind=trace.SpanKind.SERVER, attrs={"rpc.system": "grpc"})
        prefill.end(end_time=T0 + 40 * MS)
        batch.end(end_time=T0 + 40 * MS)
        batch = tracer.start_span("batch", start_time=T0 + 40 * MS, attributes={"batch_size": 1})
        _child(tracer, batch, "decode", 40 * MS, 200 * MS, attrs={"code.namespace": "text_generation_backends_v3"})
        batch.end(end_time=T0 + 200 * MS)

    return [_spans({"service.name": "text-generation-inference.router"}, "text-generation-inference.router", build, 4)]


# --- Triton 2.73.0dev OpenTelemetry mode: src/tracer.cc ----------------------------------------


def triton_otel_spans() -> list[list[ReadableSpan]]:
    """One HTTP request: InferRequest root with frontend events, model span, compute span."""

    def build(tracer: trace.Tracer) -> None:
        root = tracer.start_span("InferRequest", kind=trace.SpanKind.SERVER, start_time=T0)
        root.add_event("HTTP_RECV_START", timestamp=T0)
        root.add_event("HTTP_RECV_END", timestamp=T0 + 1 * MS)
        model = _child(tracer, root, "llama_trtllm", 1200 * US, kind=trace.SpanKind.SERVER, attrs={
            "triton.model_name": "llama_trtllm", "triton.model_version": 1, "triton.trace_id": 1,
            "triton.trace_parent_id": 0})
        model.add_event("REQUEST_START", timestamp=T0 + 1200 * US)
        model.add_event("QUEUE_START", timestamp=T0 + 1500 * US)
        compute = _child(tracer, model, "compute", 3500 * US, kind=trace.SpanKind.SERVER)
        for name, at in (("COMPUTE_START", 3500), ("COMPUTE_INPUT_END", 4000), ("COMPUTE_OUTPUT_START", 22000),
                         ("COMPUTE_END", 23000)):
            compute.add_event(name, timestamp=T0 + at * US)
        compute.end(end_time=T0 + 23 * MS)
        model.add_event("REQUEST_END", timestamp=T0 + 23500 * US)
        model.end(end_time=T0 + 23500 * US)
        root.add_event("HTTP_SEND_START", timestamp=T0 + 24 * MS)
        root.add_event("HTTP_SEND_END", timestamp=T0 + 26 * MS)
        root.end(end_time=T0 + 26 * MS)

    # src/tracer.cc builds its resource from service.name alone; no service.instance.id is ever sent
    # (the C++ SDK's telemetry.sdk.* keys are left out here: nothing reads them)
    return [_spans({"service.name": "triton-inference-server"}, "triton-server", build, 5)]


# --- Triton 2.73.0dev JSON trace file: src/tracer.cc TraceActivity, docs/user_guide/trace.md ---


def _triton_elements(tid: int, model: str, stamps: Sequence[tuple[str, float]], parent: int | None = None,
                     request_id: str = "") -> list[str]:
    head = f'{{"id":{tid},"model_name":"{model}","model_version":1'
    if request_id:
        head += f',"request_id":"{request_id}"'
    if parent is not None:
        head += f',"parent_id":{parent}'
    out = [head + "}"]
    for name, at_us in stamps:
        ns = TRITON_MONO0 + int(at_us * US)
        out.append(f'{{"id":{tid},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}')
    return out


def triton_json(closed: bool) -> str:
    """A plain HTTP request, an ensemble with two composing models, and (when live) a cut element."""
    one = [("HTTP_RECV_START", 0), ("HTTP_RECV_END", 400), ("REQUEST_START", 500), ("QUEUE_START", 600),
           ("COMPUTE_START", 1600), ("COMPUTE_INPUT_END", 1800), ("COMPUTE_OUTPUT_START", 9800),
           ("COMPUTE_END", 10000), ("REQUEST_END", 10200), ("HTTP_SEND_START", 10500), ("HTTP_SEND_END", 10900)]
    base = 100_000
    ens = [("GRPC_WAITREAD_START", base), ("GRPC_WAITREAD_END", base + 300), ("REQUEST_START", base + 400),
           ("QUEUE_START", base + 450), ("REQUEST_END", base + 9000), ("GRPC_SEND_START", base + 9100),
           ("GRPC_SEND_END", base + 9500)]
    pre = [("REQUEST_START", base + 500), ("QUEUE_START", base + 550), ("COMPUTE_START", base + 700),
           ("COMPUTE_INPUT_END", base + 750), ("COMPUTE_OUTPUT_START", base + 1700), ("COMPUTE_END", base + 1750),
           ("REQUEST_END", base + 1800)]
    llm = [("REQUEST_START", base + 1900), ("QUEUE_START", base + 1950), ("COMPUTE_START", base + 2500),
           ("COMPUTE_INPUT_END", base + 2600), ("COMPUTE_OUTPUT_START", base + 8600), ("COMPUTE_END", base + 8700),
           ("REQUEST_END", base + 8800)]
    elements = (_triton_elements(1, "simple", one, request_id="r-1") + _triton_elements(2, "ens", ens)
                + _triton_elements(3, "preprocess", pre, parent=2) + _triton_elements(4, "llm", llm, parent=2))
    text = "[" + ",".join(elements)
    if closed:
        return text + "]"
    return text + ',{"id":5,"model_name":"simple","model_version":1},{"id":5,"timestamps":[{"name":"REQUEST_ST'


def vllm_optin_spans() -> list[list[ReadableSpan]]:
    """Newer vLLM: OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental names the request span
    "{operation} {model}"; stage child spans; stats logging off (arrival_time_ns = 0)."""
    model = "facebook/opt-125m"
    genai = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}

    def build(tracer: trace.Tracer) -> None:
        base = 6000 * MS
        # E: named "chat <model>", latency attributes and the vllm.request.* children (which win)
        req = tracer.start_span(f"chat {model}", kind=trace.SpanKind.SERVER, start_time=T0 + base, attributes={
            **genai, "gen_ai.request.id": "cmpl-e", "gen_ai.usage.prompt_tokens": 30,
            "gen_ai.usage.completion_tokens": 12, "gen_ai.latency.time_in_queue": 0.019,
            "gen_ai.latency.time_to_first_token": 0.06, "gen_ai.latency.e2e": 0.3,
            "gen_ai.latency.time_in_model_prefill": 0.034, "gen_ai.latency.time_in_model_decode": 0.24})
        for name, a, b in (("vllm.request.queue", 5, 25), ("vllm.request.prefill", 25, 60),
                           ("vllm.request.decode", 60, 300)):
            _child(tracer, req, name, base + a * MS, base + b * MS)
        req.end(end_time=T0 + base + 300 * MS)
        # F: stats logging off: arrival_time_ns = 0 and no latency attribute; G: start 0 but e2e known
        span = tracer.start_span(f"chat {model}", kind=trace.SpanKind.SERVER, start_time=0,
                                 attributes={**genai, "gen_ai.request.id": "cmpl-f"})
        span.end(end_time=T0 + 7000 * MS)
        span = tracer.start_span(f"chat {model}", kind=trace.SpanKind.SERVER, start_time=0,
                                 attributes={**genai, "gen_ai.request.id": "cmpl-g", "gen_ai.latency.e2e": 0.2})
        span.end(end_time=T0 + 8000 * MS)

    resource = sdk_resource({"service.name": "vllm.llm_engine", "vllm.instrumenting_module_name": "vllm.llm_engine",
                             "vllm.process_id": "5151"}, 7)
    return [_spans(resource, "vllm.llm_engine", build, 7)]


#: OTLP fixture file name → the span groups (one export batch each) it holds.
SPANS: dict[str, Callable[[], list[list[ReadableSpan]]]] = {
    "vllm.otlp.jsonl": vllm_spans,
    "vllm_optin.otlp.jsonl": vllm_optin_spans,
    "sglang.otlp.jsonl": sglang_spans,
    "tgi.otlp.jsonl": tgi_spans,
    "triton.otlp.jsonl": triton_otel_spans,
}


def files() -> dict[str, str]:
    """Fixture file name → content."""
    otlp = {name: "".join(spans_to_json_line(group) + "\n" for group in build()) for name, build in SPANS.items()}
    return {
        **otlp,
        "triton_trace.json": triton_json(closed=True),
        "triton_trace_live.json": triton_json(closed=False),
    }


def write_all(target: Path = FIXTURES) -> list[Path]:
    """Write every fixture file under `target`."""
    target.mkdir(parents=True, exist_ok=True)
    out = []
    for name, content in files().items():
        path = target / name
        path.write_text(content)
        out.append(path)
    return out


if __name__ == "__main__":
    for written in write_all():
        print(written)


# --- helpers for the engine tests: the real `tailscope ingest` / `tailscope sql` commands ------

STAGE_COLUMNS = ("network_ns", "queue_wait_ns", "preprocess_ns", "model_load_ns", "generation_ns", "prefill_ns",
                 "decode_ns", "streaming_ns", "other_ns")


def run_cli(*args: str) -> Any:
    """Invoke the `tailscope` app in-process; returns the click Result."""
    from typer.testing import CliRunner

    from tailscope.cli import app

    return CliRunner().invoke(app, list(args))


def ingest_files(store: Path, *paths: Path, skip_bad: bool = False) -> Any:
    """`tailscope ingest --quiet --store STORE PATHS...`, asserting success."""
    args = ["ingest", "--quiet", "--store", str(store), *map(str, paths)]
    result = run_cli(*args, *(["--skip-bad"] if skip_bad else []))
    assert result.exit_code == 0, result.output
    return result


def sql(store: Path, query: str) -> list[dict[str, Any]]:
    """`tailscope sql --format json` rows."""
    result = run_cli("sql", query, "--store", str(store), "--format", "json")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def requests(store: Path) -> list[dict[str, Any]]:
    """Every row of the `requests` view, in start order."""
    return sql(store, "SELECT * FROM requests ORDER BY start_ns, span_id")


def stage_ms(row: Mapping[str, Any]) -> dict[str, float]:
    """The non-zero stage columns of a request row, in ms (rounded to the ns)."""
    return {c.removesuffix("_ns"): round(row[c] / MS, 6) for c in STAGE_COLUMNS if row[c]}


def assert_stages_sum_to_e2e(rows: list[dict[str, Any]]) -> None:
    """Every request's stage columns sum exactly to its e2e_ns, and none is negative."""
    for row in rows:
        assert all(row[c] >= 0 for c in STAGE_COLUMNS), row
        assert sum(row[c] for c in STAGE_COLUMNS) == row["e2e_ns"], row


def collect_requests(store: Path, name: str, protocol: str = "http") -> list[dict[str, Any]]:
    """Send an OTLP fixture's span groups to a running `tailscope collect` receiver with the official
    OTLP exporter (one export per group, as a BatchSpanProcessor would) and return the `requests` rows."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from tests.intake.collect_helpers import running

    # the peer address (tailscope.peer) would name replicas that ingest leaves to the resource: off here,
    # tests/intake/test_engines_replica.py covers it
    with running(store, record_peer=False) as receiver:
        for group in SPANS[name]():
            exporter: HttpExporter | GrpcExporter
            if protocol == "grpc":
                exporter = GrpcExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True)
            else:
                exporter = HttpExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces")
            assert exporter.export(group) is SpanExportResult.SUCCESS
            exporter.shutdown()
    return requests(store)
