"""vLLM (0.33, `--otlp-traces-endpoint`): one SERVER span `llm_request` per finished request.

The span has no children; its float-second `gen_ai.latency.*` attributes are laid on the
request's timeline (see docs/engines.md): the first token at start + time_to_first_token,
prefill ending there, queue before prefill, preprocess (tokenization, frontend → engine-core
hand-off) as the derived residual before the queue, decode after the first token, and
streaming from the first token to start + e2e (it yields to decode, so its critical time is
the derived residual e2e − TTFT − decode). Source: vllm/v1/engine/output_processor.py
`do_tracing`, vllm/tracing/utils.py, vllm/v1/metrics/stats.py.

`normalize_table` is what runs: a vLLM request span stands alone, so whole columns are mapped
at once. `map_trace` / `map_request` lay out one span at a time with the same rules; they are
the readable reference the column-wise path is tested against.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tracing import schema as S
from tracing.engines._common import (
    SCOPE,
    SECONDS_PATTERN,
    Row,
    Timeline,
    Trace,
    attrs_of,
    derived_span_id,
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
    """Mark every vLLM `llm_request` span of the trace and return its synthetic stage spans (reference path)."""
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


# --- the vectorized path (what `normalize` runs): same layout as `map_request`, whole columns at once ---


def _lookup(attrs: pa.Array, key: str) -> pa.Array:
    return pc.map_lookup(attrs, pa.scalar(key), "first")


def _seconds(attrs: pa.Array, key: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(ns, present) of a float-seconds attribute, by the rule of `seconds_ns`."""
    text = _lookup(attrs, key)
    ok = pc.fill_null(pc.match_substring_regex(text, SECONDS_PATTERN), False)
    secs = pc.cast(pc.if_else(ok, text, pa.scalar(None, pa.string())), pa.float64()).to_numpy(zero_copy_only=False)
    scaled = np.where(ok.to_numpy(zero_copy_only=False), secs, np.nan) * 1e9
    present = np.isfinite(scaled)
    return np.where(present, np.rint(np.where(present, scaled, 0.0)), 0).astype(np.int64), present


def _contains(text: pa.Array, *needles: str) -> npt.NDArray[np.bool_]:
    lowered = pc.utf8_lower(pc.fill_null(text, ""))
    hit = np.zeros(len(text), dtype=bool)
    for needle in needles:
        hit |= pc.match_substring(lowered, needle).to_numpy(zero_copy_only=False)
    return hit


def _outcomes(table: pa.Table, attrs: pa.Array) -> pa.Array:
    """`finish_reason_outcome` for every row."""
    declared = _lookup(attrs, S.ATTR_OUTCOME)
    has_declared = pc.is_valid(declared).to_numpy(zero_copy_only=False)
    valid_declared = pc.is_in(declared, value_set=pa.array(S.OUTCOMES)).to_numpy(zero_copy_only=False)
    reasons = _lookup(attrs, "gen_ai.response.finish_reasons")
    err_type = pc.replace_substring(pc.fill_null(_lookup(attrs, S.ATTR_ERROR_TYPE), ""), "_", "")
    status_error = pc.equal(table.column("StatusCode").combine_chunks(), "Error").to_numpy(zero_copy_only=False)
    conditions = [
        has_declared & valid_declared,
        ~has_declared & _contains(reasons, "abort", "cancel"),
        ~has_declared & _contains(reasons, "error"),
        ~status_error,
        _contains(err_type, "timeout", "timedout", "deadline"),
        _contains(err_type, "cancel"),
    ]
    n = len(attrs)
    choices = [np.asarray(declared.to_pylist(), dtype=object),
               *(np.full(n, word, dtype=object) for word in ("cancelled", "error", "ok", "timeout", "cancelled"))]
    picked: npt.NDArray[np.object_] = np.select(conditions, choices, default="error")
    return pa.array(picked.tolist(), pa.string())


def _with_engine(attrs: pa.MapArray) -> pa.Array:
    """`attrs` with (tailscope.engine, vllm) appended to every map."""
    n = len(attrs)
    offsets = np.asarray(attrs.offsets, dtype=np.int64)
    base, stop = int(offsets[0]), int(offsets[-1])
    keys, items = attrs.keys.slice(base, stop - base), attrs.items.slice(base, stop - base)
    lengths = np.diff(offsets)
    flat = stop - base
    src = np.empty(flat + n, dtype=np.int64)
    src[np.arange(flat) + np.repeat(np.arange(n), lengths)] = np.arange(flat)
    src[(offsets[1:] - base) + np.arange(n)] = flat + np.arange(n)
    new_keys = pc.take(pa.concat_arrays([keys, pa.array([S.ATTR_ENGINE] * n, pa.string())]), src)
    new_items = pc.take(pa.concat_arrays([items, pa.array([NAME] * n, pa.string())]), src)
    new_offsets = pa.array((offsets - base) + np.arange(n + 1), pa.int32())
    return pa.MapArray.from_arrays(new_offsets, new_keys, new_items).cast(S.ATTRS)


def normalize_table(table: pa.Table) -> tuple[pa.Table, pa.Table] | None:
    """Split `table` into (other spans, mapped vLLM request spans + their synthetic stage spans).

    None when the table holds no vLLM request span. Same result as `map_request` on every
    `llm_request` row (tests check it), computed column-wise.
    """
    mask = candidate_mask(table.column("SpanName"))
    if not pc.any(mask).as_py():
        return None
    cand = table.filter(mask)
    attrs = cand.column("SpanAttributes").combine_chunks()
    native = np.zeros(cand.num_rows, dtype=bool)
    for key in (S.ATTR_REQUEST, S.ATTR_STAGE, S.ATTR_SYNTHETIC):
        native |= pc.is_valid(_lookup(attrs, key)).to_numpy(zero_copy_only=False)
    marked = np.zeros(cand.num_rows, dtype=bool)
    for key in _MARKERS:
        marked |= pc.is_valid(_lookup(attrs, key)).to_numpy(zero_copy_only=False)
    take = marked & ~native
    if not take.any():
        return None
    full = np.zeros(table.num_rows, dtype=bool)
    full[np.flatnonzero(mask.to_numpy(zero_copy_only=False))[take]] = True
    rest = table.filter(pa.array(~full))
    req = table.filter(pa.array(full))
    attrs = req.column("SpanAttributes").combine_chunks()

    start = req.column("TimestampNs").to_numpy().astype(np.int64)
    end = start + req.column("Duration").to_numpy().astype(np.int64)
    ttft, has_ttft = _seconds(attrs, TTFT)
    e2e, has_e2e = _seconds(attrs, E2E)
    queue, has_queue = _seconds(attrs, QUEUE)
    prefill, has_prefill = _seconds(attrs, PREFILL)
    decode, has_decode = _seconds(attrs, DECODE)
    first = np.minimum(np.maximum(start + ttft, start), end)
    prefill_start = np.maximum(start, first - np.where(has_prefill, prefill, 0))
    queue_start = np.maximum(start, prefill_start - np.where(has_queue, queue, 0))

    def clip(lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64],
             keep: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        lo, hi = np.maximum(lo, start), np.minimum(hi, end)
        return lo, hi, keep & (hi > lo)

    pre = clip(start, queue_start, has_ttft & has_queue & has_prefill)
    que = clip(queue_start, prefill_start, has_ttft)
    pf = clip(prefill_start, first, has_ttft)
    dec = clip(first, first + decode, has_ttft & has_decode)
    stream = clip(first, np.where(has_e2e, start + e2e, end), has_ttft)
    gen_keep = pf[2] | dec[2]
    gen = (np.where(pf[2], pf[0], dec[0]), np.where(dec[2], dec[1], pf[1]), gen_keep)

    trace_ids = req.column("TraceId").to_pylist()
    span_ids = req.column("SpanId").to_pylist()
    gen_ids = [derived_span_id(t, s, "generation") for t, s in zip(trace_ids, span_ids, strict=True)]
    gen_sources = np.where(pf[2] & dec[2], f"span of {PREFILL} + {DECODE}",
                           np.where(pf[2], f"span of {PREFILL}", f"span of {DECODE}"))
    pieces = (
        ("preprocess", pre, None, f"derived: {TTFT} - {QUEUE} - {PREFILL}"),
        ("queue_wait", que, None, QUEUE),
        ("streaming", stream, None, f"derived: {E2E} - {TTFT} - {DECODE}"),
        ("generation", gen, None, None),
        ("prefill", pf, gen_ids, PREFILL),
        ("decode", dec, gen_ids, DECODE),
    )
    synthetic = [_stage_spans(req, stage, lo, hi, keep, parents, source, trace_ids, span_ids, gen_sources)
                 for stage, (lo, hi, keep), parents, source in pieces if keep.any()]

    ttft_col = np.where(has_ttft, ttft, req.column("TtftNs").to_numpy(zero_copy_only=False))
    ttft_valid = has_ttft | pc.is_valid(req.column("TtftNs")).to_numpy(zero_copy_only=False)
    updates = {
        "IsRequest": pa.array(np.ones(req.num_rows, dtype=bool)),
        "Outcome": _outcomes(req, attrs),
        "TtftNs": pa.array(np.where(ttft_valid, ttft_col, 0).astype(np.int64), mask=~ttft_valid),
        "SpanAttributes": _with_engine(attrs),
    }
    for name, column in updates.items():
        req = req.set_column(req.schema.get_field_index(name), name, column)
    return rest, pa.concat_tables([req, *synthetic])


def _stage_spans(req: pa.Table, stage: str, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64],
                 keep: npt.NDArray[np.bool_], parents: list[str] | None, source: str | None,
                 trace_ids: list[str], span_ids: list[str], gen_sources: npt.NDArray[np.str_]) -> pa.Table:
    idx = np.flatnonzero(keep)
    m = idx.size
    taken = pa.array(idx)
    lo_k, hi_k = lo[idx], hi[idx]
    sources = [str(gen_sources[i]) for i in idx] if source is None else [source] * m
    cols: dict[str, pa.Array | pa.ChunkedArray] = {
        "Timestamp": pa.array(lo_k // 1000).cast(pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(lo_k),
        "TraceId": pc.take(req.column("TraceId"), taken),
        "SpanId": pa.array([derived_span_id(trace_ids[i], span_ids[i], stage) for i in idx], pa.string()),
        "ParentSpanId": pa.array([span_ids[i] if parents is None else parents[i] for i in idx], pa.string()),
        "TraceState": pa.array([""] * m, pa.string()),
        "SpanName": pa.array([stage] * m, pa.string()),
        "SpanKind": pa.array(["Internal"] * m, pa.string()),
        "ServiceName": pc.take(req.column("ServiceName"), taken),
        "ResourceAttributes": pc.take(req.column("ResourceAttributes"), taken),
        "ScopeName": pa.array([SCOPE] * m, pa.string()),
        "ScopeVersion": pa.array([""] * m, pa.string()),
        "SpanAttributes": pa.array([[(S.ATTR_STAGE, stage), (S.ATTR_SYNTHETIC, "true"), (S.ATTR_ENGINE, NAME),
                                     (S.ATTR_DERIVED_FROM, src)] for src in sources], S.ATTRS),
        "Duration": pa.array(hi_k - lo_k),
        "StatusCode": pa.array(["Unset"] * m, pa.string()),
        "StatusMessage": pa.array([""] * m, pa.string()),
        "Events": pa.array([[]] * m, pa.list_(S.EVENT)),
        "Links": pa.array([[]] * m, pa.list_(S.LINK)),
        "Stage": pa.array([stage] * m, pa.string()),
        "IsRequest": pa.array(np.zeros(m, dtype=bool)),
        "Outcome": pa.nulls(m, pa.string()),
        "Replica": pc.take(req.column("Replica"), taken),
    }
    for name in ("Model", "ModelVersion", "Tenant"):
        cols[name] = pa.nulls(m, pa.string())
    for name in ("InputTokens", "OutputTokens", "TtftNs"):
        cols[name] = pa.nulls(m, pa.int64())
    return pa.table([cols[name] for name in S.COLUMN_NAMES], schema=S.SPAN_SCHEMA)
