"""Hugging Face TGI (3.3.6-dev0, `--otlp-endpoint`): handler spans with Rust Duration fields.

The handler spans `generate`, `generate_stream`, `completions`, `chat_completions`
(router/src/server.rs) record `validation_time`, `queue_time`, `inference_time`,
`time_per_token`, `total_time` as Rust `Debug` Duration strings ("12.3ms", "1.2s", "850µs")
when the request succeeds. They are laid back to back from the span start: preprocess
(validation), queue_wait, generation (inference). The per-request `infer` spans
(backends/v3/src/queue.rs, backend.rs: one per iteration of the batching loop the entry is in)
split generation: prefill ends, and the first token is, where the earliest `send_generation`
span under them ends (the first generation sent to the request; with chunked prefill the
iterations of the earlier chunks send none). Without `send_generation` spans the end of the
earliest `infer` span is taken, which is early under chunked prefill (docs/engines.md).
Only handler spans of `text_generation_router::server` are requests: the inner spans of the same
names (`text_generation_router::infer`) never are, and a span of a handler's name is claimed only
on evidence (`evidence_of`): user code names its own spans `generate` too. Streaming
(generate_stream only) runs from the first token to the span end and yields to decode.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from intake.engines._common import (
    Row,
    Timeline,
    Trace,
    attrs_of,
    end_of,
    int_or_none,
    is_native,
    mark_not_request,
    mark_request,
    rust_duration_ns,
)
from tracing.rows import outcome_of

NAME = "tgi"
HANDLERS = ("generate", "generate_stream", "completions", "chat_completions")
STREAM_HANDLERS = ("generate_stream",)
FIELDS = ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token")
_NAMESPACE = "text_generation_router"
#: The span backends/v3/src/backend.rs `filter_send_generations` opens under the entry's current `infer`
#: span for each generation it sends to the request (huggingface/text-generation-inference @db931fcf).
#: A request still in chunked prefill gets no generation from the shard in that iteration
#: (server/text_generation_server/models/flash_causal_lm.py `generate_token`: generations are appended
#: only once the request finished prefilling), so the first of these marks its first token.
SEND_GENERATION = "send_generation"
#: The module of the HTTP handlers (router/src/server.rs); the inner `generate` / `generate_stream`
#: spans of text_generation_router::infer share the span names but are not requests.
_HANDLER_NAMESPACE = "text_generation_router::server"


def candidate_mask(names: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spans that may be TGI handler spans (checked further in `map_trace`)."""
    return pc.is_in(names, value_set=pa.array(HANDLERS))


#: TGI's resource service name (router/src/logging.rs init_logging, huggingface/text-generation-inference @db931fcf).
SERVICE_PREFIX = "text-generation-inference"


def evidence_of(trace: Trace, row: Row, attrs: dict[str, str]) -> str | None:
    """Why a handler-named span is a TGI handler span, or None: its `code.namespace` (the handlers' module),
    two or more of its Rust Duration fields, or, from an exporter without code.* fields, TGI's service name
    or scope with TGI's span tree below (`infer` / `send_generation` / `schedule`). A name is no evidence:
    `generate` is the commonest span name in serving code."""
    if row["SpanName"] not in HANDLERS or is_native(attrs):
        return None
    namespace = attrs.get("code.namespace")
    if namespace is not None:
        return f"code.namespace {namespace}" if namespace == _HANDLER_NAMESPACE else None
    if sum(rust_duration_ns(attrs.get(f)) is not None for f in FIELDS) >= 2:
        return "attributes " + ", ".join(f for f in FIELDS if rust_duration_ns(attrs.get(f)) is not None)
    for what, value in (("service", str(row.get("ServiceName") or "")), ("scope", str(row.get("ScopeName") or ""))):
        if value.startswith(SERVICE_PREFIX):
            return f"{what} {value}"
    return None


def map_trace(trace: Trace) -> list[Row]:
    """Mark every TGI handler span of the trace and return its synthetic stage spans."""
    out: list[Row] = []
    # decided before any is marked (a marked span reads as native)
    handlers = [(r, a, why) for r in trace.spans
                if r["SpanName"] in HANDLERS and (why := evidence_of(trace, r, a := attrs_of(r))) is not None]
    handler_ids = {r["SpanId"] for r, _, _ in handlers}
    for row, attrs, why in handlers:
        # completions/chat_completions call the generate path: only the outermost handler is the request
        if any(a["SpanId"] in handler_ids for a in trace.ancestors(row)):
            mark_not_request(row, NAME)
            continue
        out.extend(map_request(trace, row, attrs, why))
    return out


def map_request(trace: Trace, row: Row, attrs: dict[str, str], evidence: str = "") -> list[Row]:
    """Lay one handler span's duration fields on its timeline."""
    start, end = int(row["TimestampNs"]), end_of(row)
    validation = rust_duration_ns(attrs.get("validation_time"))
    queue = rust_duration_ns(attrs.get("queue_time"))
    inference = rust_duration_ns(attrs.get("inference_time"))
    total = rust_duration_ns(attrs.get("total_time"))
    per_token = rust_duration_ns(attrs.get("time_per_token"))
    streaming = row["SpanName"] in STREAM_HANDLERS
    timeline = Timeline(row, NAME)
    first: int | None = None
    if validation is not None and queue is not None and inference is not None:
        gen_start = start + validation + queue
        gen_end = gen_start + inference
        timeline.add("preprocess", start, start + validation, "validation_time")
        timeline.add("queue_wait", start + validation, gen_start, "queue_time")
        below = list(trace.descendants(row["SpanId"]))
        sends = [s for s in below if s["SpanName"] == SEND_GENERATION]
        infers = [s for s in below if s["SpanName"] == "infer"]
        mark = f"the first `{SEND_GENERATION}` span" if sends else "the first `infer` span"
        if sends:  # the first token left for the client when the first generation was sent
            boundary: int | None = min(end_of(s) for s in sends)
        elif infers:  # older exports without send_generation: early under chunked prefill (docs/engines.md)
            boundary = end_of(min(infers, key=lambda s: (s["TimestampNs"], s["SpanId"])))
        else:
            boundary = None
        if boundary is not None and gen_start < boundary < gen_end:
            first = boundary
        if first is not None:
            timeline.add("prefill", gen_start, first, f"inference_time, up to the end of {mark}")
            timeline.add("decode", first, gen_end, f"inference_time, after {mark}")
        else:
            timeline.add("generation", gen_start, gen_end, "inference_time")
        if streaming:
            timeline.add("streaming", first if first is not None else gen_start, end,
                         "derived: span end - first token (yields to decode)")
    outcome = outcome_of(row["StatusCode"], attrs)
    if outcome == "ok" and total is None:
        # TGI records the timing fields only when the response completed. A stream that ends without
        # them and without an error status was dropped by the client (the SSE stream is cancelled
        # when the connection closes, router/src/server.rs generate_stream_internal); a plain
        # request without them failed.
        outcome = "cancelled" if streaming else "error"
    mark_request(row, NAME, outcome, ttft_ns=first - start if first is not None else None,
                 input_tokens=int_or_none(attrs.get("prompt_tokens")),
                 output_tokens=_output_tokens(attrs, inference, per_token), streaming=streaming,
                 evidence=evidence)
    return timeline.rows()


def _output_tokens(attrs: dict[str, str], inference: int | None, per_token: int | None) -> int | None:
    """`generated_tokens` when recorded, else inference_time / time_per_token (TGI divides a
    Duration by the token count, truncating to ns, so the rounded quotient is exact)."""
    recorded = int_or_none(attrs.get("generated_tokens"))
    if recorded is not None:
        return recorded
    if inference is None or not per_token:
        return None
    return round(inference / per_token)
