"""vLLM (0.33, `--otlp-traces-endpoint`): one SERVER span `llm_request` per finished request.

The span has no children; its float-second `gen_ai.latency.*` attributes are laid on the
request's timeline (see docs/engines.md): the first token at start + time_to_first_token,
prefill ending there, queue before prefill, preprocess (tokenization, frontend → engine-core
hand-off) as the derived residual before the queue, decode after the first token, and
streaming from the first token to start + e2e (it yields to decode, so its critical time is
the derived residual e2e − TTFT − decode). Source: vllm/v1/engine/output_processor.py
`do_tracing`, vllm/tracing/utils.py, vllm/v1/metrics/stats.py.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tracing.engines._common import (
    Row,
    Timeline,
    Trace,
    attrs_of,
    end_of,
    finish_reason_outcome,
    is_native,
    mark_request,
    seconds_ns,
)

NAME = "vllm"
SPAN_NAME = "llm_request"
TTFT = "gen_ai.latency.time_to_first_token"
E2E = "gen_ai.latency.e2e"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
DECODE = "gen_ai.latency.time_in_model_decode"
INFERENCE = "gen_ai.latency.time_in_model_inference"
REQUEST_ID = "gen_ai.request.id"
_MARKERS = (TTFT, E2E, QUEUE, PREFILL, DECODE, INFERENCE, REQUEST_ID)


def candidate_mask(names: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spans that may be vLLM request spans (checked further in `map_trace`)."""
    return pc.equal(names, SPAN_NAME)


def map_trace(trace: Trace) -> list[Row]:
    """Mark every vLLM `llm_request` span of the trace and return its synthetic stage spans."""
    out: list[Row] = []
    for row in trace.spans:
        if row["SpanName"] != SPAN_NAME:
            continue
        attrs = attrs_of(row)
        if is_native(attrs) or not any(k in attrs for k in _MARKERS):
            continue
        out.extend(map_request(row, attrs))
    return out


def map_request(row: Row, attrs: dict[str, str]) -> list[Row]:
    """Lay one `llm_request` span's latency attributes on its timeline."""
    start, end = int(row["TimestampNs"]), end_of(row)
    ttft, e2e = seconds_ns(attrs.get(TTFT)), seconds_ns(attrs.get(E2E))
    queue, prefill, decode = seconds_ns(attrs.get(QUEUE)), seconds_ns(attrs.get(PREFILL)), seconds_ns(attrs.get(DECODE))
    timeline = Timeline(row, NAME)
    if ttft is not None:
        first = min(max(start + ttft, start), end)
        prefill_start = max(start, first - (prefill or 0))
        queue_start = max(start, prefill_start - (queue or 0))
        if queue is not None and prefill is not None:
            timeline.add("preprocess", start, queue_start,
                         f"derived: {TTFT} - {QUEUE} - {PREFILL}")
        timeline.add("queue_wait", queue_start, prefill_start, QUEUE)
        timeline.add("prefill", prefill_start, first, PREFILL)
        if decode is not None:
            timeline.add("decode", first, first + decode, DECODE)
        timeline.add("streaming", first, start + e2e if e2e is not None else end,
                     f"derived: {E2E} - {TTFT} - {DECODE}")
    mark_request(row, NAME, finish_reason_outcome(row["StatusCode"], attrs), ttft_ns=ttft)
    return timeline.rows()
