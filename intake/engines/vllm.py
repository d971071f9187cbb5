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

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from intake.engines._common import (
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
from tracing import schema as S

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
#: Scope names of vLLM's tracers start so: init_tracer("vllm.llm_engine") and the module tracers of
#: vllm/tracing/otel.py (_get_tracer(__name__)), vllm-project/vllm @40eeb0c.
SCOPE_PREFIX = "vllm"
#: Per-stage child spans of the request span (newer vLLM) and the stage each one is.
CHILD_STAGES: dict[str, str] = {"vllm.request.queue": "queue_wait", "vllm.request.prefill": "prefill",
                                "vllm.request.decode": "decode"}
#: Request starts before this (2001-09-09) are vLLM's arrival_time_ns = 0 (stats logging off).
SANE_START_NS = 1_000_000_000 * 1_000_000_000
#: Attribute set on a vLLM request span that cannot be placed in time (no arrival time, no e2e).
ATTR_UNMAPPED = "tailscope.unmapped"
UNPLACED_REASON = "vllm: arrival_time_ns is 0 and no gen_ai.latency.e2e (stats logging off): start unknown"


def candidate_mask(names: pa.ChunkedArray, scopes: pa.ChunkedArray | None = None) -> pa.ChunkedArray:
    """Spans that may be vLLM request spans (checked further by their attributes).

    `llm_request` (the default naming), or, with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental,
    any span of a vLLM scope named "{operation} {model}" (e.g. "chat facebook/opt-125m"); the
    `vllm.request.*` stage children are never request spans.
    """
    by_name = pc.equal(names, SPAN_NAME)
    if scopes is None:
        return by_name
    opt_in = pc.and_(pc.starts_with(scopes, SCOPE_PREFIX),
                     pc.and_(pc.invert(pc.starts_with(names, "vllm.request.")), pc.match_substring(names, " ")))
    return pc.or_(by_name, opt_in)


#: The latency attributes vLLM sets together on a request span (vllm/tracing/utils.py SpanAttributes): two
#: of them on one span is vLLM's attribute set, which user code does not write by accident.
LATENCY_SET: tuple[str, ...] = (TTFT, E2E, QUEUE, PREFILL, DECODE, INFERENCE)
#: The resource key vLLM's init_otel_tracer adds (vllm/tracing/otel.py @40eeb0c).
RESOURCE_KEY = "vllm.instrumenting_module_name"


def evidence_of(row: Row, attrs: dict[str, str]) -> str | None:
    """Why a request-shaped span is vLLM's (its scope, its resource, its service name, its attribute set), or
    None: a name is no evidence. The rule `normalize_table` applies column-wise."""
    scope = str(row.get("ScopeName") or "")
    if scope.startswith(SCOPE_PREFIX):
        return f"scope {scope}"
    if RESOURCE_KEY in dict(row.get("ResourceAttributes") or ()):
        return f"resource {RESOURCE_KEY}"
    service = str(row.get("ServiceName") or "")
    if service.startswith(SCOPE_PREFIX):
        return f"service {service}"
    if sum(k in attrs for k in LATENCY_SET) >= 2:
        return "attributes gen_ai.latency.*"
    return None


def _evidence(picked: pa.Table, cand: _Attrs) -> pa.Array:
    """`evidence_of` for every row of `picked` (null where there is none)."""
    n = cand.n
    scope = pc.fill_null(picked.column("ScopeName").combine_chunks(), "")
    by_scope = pc.starts_with(scope, SCOPE_PREFIX).to_numpy(zero_copy_only=False)
    by_resource = _Attrs(picked.column("ResourceAttributes").combine_chunks()).present(RESOURCE_KEY)
    count = np.zeros(n, dtype=np.int64)
    for key in LATENCY_SET:
        count += cand.present(key)
    by_attrs = count >= 2
    service = pc.fill_null(picked.column("ServiceName").combine_chunks(), "")
    by_service = pc.starts_with(service, SCOPE_PREFIX)
    out = pc.if_else(pa.array(by_scope), pc.binary_join_element_wise("scope", scope, " "), pc.if_else(
        pa.array(by_resource), pa.scalar(f"resource {RESOURCE_KEY}"), pc.if_else(
            by_service, pc.binary_join_element_wise("service", service, " "),
            pa.array(["attributes gen_ai.latency.*"] * n, pa.string(), mask=~by_attrs))))
    return out if isinstance(out, pa.Array) else out.combine_chunks()


def map_trace(trace: Trace) -> list[Row]:
    """Mark every vLLM `llm_request` span of the trace and return its synthetic stage spans (reference path)."""
    out: list[Row] = []
    for row in trace.spans:
        if row["SpanName"] != SPAN_NAME:
            continue
        attrs = attrs_of(row)
        if is_native(attrs) or not any(k in attrs for k in _MARKERS):
            continue
        why = evidence_of(row, attrs)
        if why is None:
            continue
        out.extend(map_request(row, attrs, why))
    return out


def map_request(row: Row, attrs: dict[str, str], evidence: str = "") -> list[Row]:
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
    mark_request(row, NAME, finish_reason_outcome(row["StatusCode"], attrs), ttft_ns=ttft, evidence=evidence)
    return timeline.rows()


# --- the vectorized path (what `normalize` runs): same layout as `map_request`, whole columns at once ---


class _Attrs:
    """A map column flattened once, for fast lookups of a few keys in every row."""

    def __init__(self, attrs: pa.MapArray) -> None:
        self.n = len(attrs)
        offsets = np.asarray(attrs.offsets, dtype=np.int64)
        base, stop = int(offsets[0]), int(offsets[-1])
        self.offsets = offsets - base
        self.keys = attrs.keys.slice(base, stop - base)
        self.items = attrs.items.slice(base, stop - base)
        self.row_of_item = np.repeat(np.arange(self.n), np.diff(self.offsets))

    def get(self, key: str) -> pa.Array:
        """The first value of `key` in each row (null where absent), like map_lookup(..., "first")."""
        positions = np.flatnonzero(pc.equal(self.keys, key).to_numpy(zero_copy_only=False))
        index = np.full(self.n, -1, dtype=np.int64)
        rows, first = np.unique(self.row_of_item[positions], return_index=True)
        index[rows] = positions[first]
        return pc.take(self.items, pa.array(index, mask=index < 0))

    def present(self, key: str) -> npt.NDArray[np.bool_]:
        """Rows holding `key`."""
        hit = np.zeros(self.n, dtype=bool)
        hit[self.row_of_item[np.flatnonzero(pc.equal(self.keys, key).to_numpy(zero_copy_only=False))]] = True
        return hit

    def with_updates(self, updates: list[tuple[str, pa.Array]]) -> pa.Array:
        """Every map with `key` set to `values[i]` in each row i where that value is not null, as
        `dict.update` does it: a present key keeps its place, a new one is appended (in `updates` order)."""
        n, flat = self.n, len(self.keys)
        src = np.arange(flat, dtype=np.int64)  # where each old entry's value comes from in `pool`
        pool: list[pa.Array] = [self.items]
        base = flat
        rows_new: list[npt.NDArray[np.int64]] = []
        keys_new: list[pa.Array] = []
        for key, values in updates:
            values = values.cast(pa.string())
            valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
            pos = np.flatnonzero(pc.equal(self.keys, key).to_numpy(zero_copy_only=False))
            owner = self.row_of_item[pos]
            hit = valid[owner]
            src[pos[hit]] = base + owner[hit]
            has = np.zeros(n, dtype=bool)
            has[owner] = True
            add = np.flatnonzero(valid & ~has)
            src_add = base + add
            rows_new.append(add)
            keys_new.append(pa.array([key] * add.size, pa.string()))
            src = np.concatenate([src, src_add])
            pool.append(values)
            base += n
        rows = np.concatenate([self.row_of_item, *rows_new])
        seq = np.concatenate([np.zeros(flat, dtype=np.int64),
                              *(np.full(r.size, j + 1, dtype=np.int64) for j, r in enumerate(rows_new))])
        order = np.lexsort((seq, rows))
        keys = pc.take(pa.concat_arrays([self.keys, *keys_new]), pa.array(order))
        items = pc.take(pa.concat_arrays(pool), pa.array(src[order]))
        offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items).cast(S.ATTRS)


def _seconds(attrs: _Attrs, key: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(ns, present) of a float-seconds attribute, by the rule of `seconds_ns`."""
    text = attrs.get(key)
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


def _outcomes(table: pa.Table, attrs: _Attrs) -> pa.Array:
    """`finish_reason_outcome` for every row."""
    declared = attrs.get(S.ATTR_OUTCOME)
    has_declared = pc.is_valid(declared).to_numpy(zero_copy_only=False)
    valid_declared = pc.is_in(declared, value_set=pa.array(S.OUTCOMES)).to_numpy(zero_copy_only=False)
    reasons = attrs.get(S.ATTR_FINISH_REASONS)
    err_type = pc.replace_substring(pc.fill_null(attrs.get(S.ATTR_ERROR_TYPE), ""), "_", "")
    status_error = pc.equal(table.column("StatusCode").combine_chunks(), "Error").to_numpy(zero_copy_only=False)
    conditions = [
        has_declared & valid_declared,
        ~has_declared & _contains(reasons, "abort", "cancel"),
        ~has_declared & _contains(reasons, "error"),
        ~status_error,
        _contains(err_type, "timeout", "timedout", "deadline"),
        _contains(err_type, "cancel"),
    ]
    n = attrs.n
    choices = [np.asarray(declared.to_pylist(), dtype=object),
               *(np.full(n, word, dtype=object) for word in ("cancelled", "error", "ok", "timeout", "cancelled"))]
    picked: npt.NDArray[np.object_] = np.select(conditions, choices, default="error")
    return pa.array(picked.tolist(), pa.string())


Stretch = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]


def normalize_table(table: pa.Table) -> tuple[pa.Table, pa.Table] | None:
    """Split `table` into (other spans, mapped vLLM request spans + their synthetic stage spans).

    None when the table holds no vLLM request span. Same result as `map_request` on every
    `llm_request` row (tests check it), computed column-wise.
    """
    mask = candidate_mask(table.column("SpanName"), table.column("ScopeName"))
    if not pc.any(mask).as_py():
        return None
    picked = table.filter(mask)
    cand = _Attrs(picked.column("SpanAttributes").combine_chunks())
    native = cand.present(S.ATTR_REQUEST) | cand.present(S.ATTR_STAGE) | cand.present(S.ATTR_SYNTHETIC)
    marked = np.zeros(cand.n, dtype=bool)
    for key in _MARKERS:
        marked |= cand.present(key)
    opt_in = pc.not_equal(picked.column("SpanName"), SPAN_NAME).to_numpy(zero_copy_only=False)
    marked &= ~opt_in | cand.present(S.ATTR_OPERATION)
    why = _evidence(picked, cand)
    take = marked & ~native & pc.is_valid(why).to_numpy(zero_copy_only=False)
    if not take.any():
        return None
    full = np.zeros(table.num_rows, dtype=bool)
    full[np.flatnonzero(mask.to_numpy(zero_copy_only=False))[take]] = True
    rest = table.filter(pa.array(~full))
    req = table.filter(pa.array(full))
    attrs = _Attrs(req.column("SpanAttributes").combine_chunks())
    evidence = why.filter(pa.array(take))

    start = req.column("TimestampNs").to_numpy().astype(np.int64)
    end = start + req.column("Duration").to_numpy().astype(np.int64)
    ttft, has_ttft = _seconds(attrs, TTFT)
    e2e, has_e2e = _seconds(attrs, E2E)
    queue, has_queue = _seconds(attrs, QUEUE)
    prefill, has_prefill = _seconds(attrs, PREFILL)
    decode, has_decode = _seconds(attrs, DECODE)
    children = _child_stretches(rest, req.column("SpanId").to_pylist())
    # arrival_time_ns = 0 (stats logging off): the span starts in 1970. Start it at end - e2e, else at
    # its first stage child; with neither it cannot be placed and is kept, but not as a request.
    lost = start < SANE_START_NS
    fixed = np.where(has_e2e, end - e2e, np.minimum(end, children["first"]))
    start = np.where(lost, np.where(has_e2e | (children["first"] < end), fixed, end), start)
    unplaced = lost & ~has_e2e & ~(children["first"] < end)
    first = np.minimum(np.maximum(start + ttft, start), end)
    prefill_start = np.maximum(start, first - np.where(has_prefill, prefill, 0))
    queue_start = np.maximum(start, prefill_start - np.where(has_queue, queue, 0))

    def clip(lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], keep: npt.NDArray[np.bool_]) -> Stretch:
        lo, hi = np.maximum(lo, start), np.minimum(hi, end)
        return lo, hi, keep & (hi > lo)

    pre = clip(start, queue_start, has_ttft & has_queue & has_prefill)
    que = clip(queue_start, prefill_start, has_ttft)
    pf = clip(prefill_start, first, has_ttft)
    dec = clip(first, first + decode, has_ttft & has_decode)
    # the stage child spans (vllm.request.queue/prefill/decode), where present, are the measured
    # stretches: they replace the ones laid from the latency attributes
    first_child = np.stack([start, np.where(children["first"] < end, children["first"], -1)], axis=1)
    first_child[:, 0] = np.where(first_child[:, 1] >= 0, start, -1)
    pre = _override(pre, first_child, clip)  # preprocess: the request start up to its first stage child
    que = _override(que, children["queue_wait"], clip)
    pf = _override(pf, children["prefill"], clip)
    dec = _override(dec, children["decode"], clip)
    stream = clip(first, np.where(has_e2e, start + e2e, end), has_ttft)
    gen: Stretch = (np.where(pf[2], pf[0], dec[0]), np.where(dec[2], dec[1], pf[1]), pf[2] | dec[2])
    gen_source = np.where(pf[2] & dec[2], f"span of {PREFILL} + {DECODE}",
                          np.where(pf[2], f"span of {PREFILL}", f"span of {DECODE}")).astype(object)
    n = req.num_rows
    pieces: tuple[tuple[str, Stretch, npt.NDArray[np.object_]], ...] = (
        ("preprocess", pre, np.full(n, f"derived: {TTFT} - {QUEUE} - {PREFILL}", dtype=object)),
        ("queue_wait", que, np.full(n, QUEUE, dtype=object)),
        ("streaming", stream, np.full(n, f"derived: {E2E} - {TTFT} - {DECODE}", dtype=object)),
        ("generation", gen, gen_source),
        ("prefill", pf, np.full(n, PREFILL, dtype=object)),
        ("decode", dec, np.full(n, DECODE, dtype=object)),
    )
    synthetic = _stage_spans(req, pieces)

    outcome = pc.if_else(pa.array(unplaced), pa.scalar(None, pa.string()), _outcomes(req, attrs))
    ttft_text = pc.cast(pa.array(ttft, mask=~has_ttft), pa.string())
    ttft_col = np.where(has_ttft, ttft, req.column("TtftNs").to_numpy(zero_copy_only=False))
    ttft_valid = has_ttft | pc.is_valid(req.column("TtftNs")).to_numpy(zero_copy_only=False)
    updates = {
        "Timestamp": pa.array(start // 1000).cast(pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(start),
        "Duration": pa.array(end - start),
        "IsRequest": pa.array(~unplaced),
        "Outcome": outcome,
        "TtftNs": pa.array(np.where(ttft_valid, ttft_col, 0).astype(np.int64), mask=~ttft_valid),
        # the promoted facts as attributes too (`_common.fact_attrs`), so they survive without these columns
        "SpanAttributes": attrs.with_updates([
            (S.ATTR_ENGINE, pa.array([NAME] * n, pa.string())),
            (S.ATTR_ENGINE_EVIDENCE, evidence),
            (ATTR_UNMAPPED, pa.array([UNPLACED_REASON] * n, pa.string(), mask=~unplaced)),
            (S.ATTR_REQUEST, pa.array(np.where(unplaced, "false", "true"), pa.string())),
            (S.ATTR_OUTCOME, outcome),
            (S.ATTR_TTFT_NS, pc.if_else(pc.equal(ttft_text, attrs.get(S.ATTR_TTFT_NS)).fill_null(False),
                                        pa.scalar(None, pa.string()), ttft_text)),
        ]),
    }
    for name, column in updates.items():
        req = req.set_column(req.schema.get_field_index(name), name, column)
    return rest, pa.concat_tables([req, synthetic])


def _child_stretches(rest: pa.Table, request_ids: list[str]) -> dict[str, npt.NDArray[np.int64]]:
    """Per request (in `request_ids` order): start/end of its vllm.request.* stage children, and the
    first child start (int64 max where none). Keys: each stage → shape (n, 2) with -1 where absent."""
    n = len(request_ids)
    out: dict[str, npt.NDArray[np.int64]] = {stage: np.full((n, 2), -1, dtype=np.int64)
                                             for stage in CHILD_STAGES.values()}
    out["first"] = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    hit = pc.is_in(rest.column("SpanName"), value_set=pa.array(list(CHILD_STAGES)))
    if not pc.any(hit).as_py():
        return out
    index = {span_id: i for i, span_id in enumerate(request_ids)}
    kids = rest.filter(hit).select(["ParentSpanId", "SpanName", "TimestampNs", "Duration"]).to_pylist()
    for kid in kids:
        i = index.get(kid["ParentSpanId"])
        if i is None:
            continue
        lo, hi = int(kid["TimestampNs"]), int(kid["TimestampNs"]) + int(kid["Duration"])
        out[CHILD_STAGES[kid["SpanName"]]][i] = (lo, hi)
        out["first"][i] = min(out["first"][i], lo)
    return out


Clip = Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]], Stretch]


def _override(stretch: Stretch, child: npt.NDArray[np.int64], clip: Clip) -> Stretch:
    """`stretch`, replaced by the child span's [start, end) in the rows that have one."""
    has = child[:, 0] >= 0
    if not has.any():
        return stretch
    lo, hi, keep = clip(child[:, 0], child[:, 1], has)
    return np.where(has, lo, stretch[0]), np.where(has, hi, stretch[1]), np.where(has, keep, stretch[2])


def _stage_spans(req: pa.Table, pieces: tuple[tuple[str, Stretch, npt.NDArray[np.object_]], ...]) -> pa.Table:
    """All synthetic spans of all requests, one column at a time."""
    trace_ids = req.column("TraceId").to_pylist()
    span_ids = req.column("SpanId").to_pylist()
    gen_ids = {i: derived_span_id(trace_ids[i], span_ids[i], "generation") for i in np.flatnonzero(pieces[3][1][2])}
    idx_parts: list[npt.NDArray[np.intp]] = []
    lo_parts: list[npt.NDArray[np.int64]] = []
    hi_parts: list[npt.NDArray[np.int64]] = []
    stages: list[str] = []
    sources: list[str] = []
    ids: list[str] = []
    parents: list[str] = []
    for stage, (lo, hi, keep), source in pieces:
        idx = np.flatnonzero(keep)
        idx_parts.append(idx)
        lo_parts.append(lo[idx])
        hi_parts.append(hi[idx])
        stages.extend([stage] * idx.size)
        sources.extend(source[idx].tolist())
        ids.extend(derived_span_id(trace_ids[i], span_ids[i], stage) for i in idx)
        nested = stage in S.STAGE_PARENT
        parents.extend(gen_ids[i] if nested else span_ids[i] for i in idx)
    idx_all = pa.array(np.concatenate(idx_parts))
    lo_all, hi_all = np.concatenate(lo_parts), np.concatenate(hi_parts)
    m = len(stages)
    stage_col = pa.array(stages, pa.string())
    keys = pa.array([S.ATTR_STAGE, S.ATTR_SYNTHETIC, S.ATTR_ENGINE, S.ATTR_DERIVED_FROM] * m, pa.string())
    items = np.empty(4 * m, dtype=object)
    items[0::4], items[1::4], items[2::4], items[3::4] = stages, "true", NAME, sources
    span_attrs = pa.MapArray.from_arrays(pa.array(np.arange(0, 4 * m + 1, 4), pa.int32()), keys,
                                         pa.array(items, pa.string())).cast(S.ATTRS)
    cols: dict[str, pa.Array | pa.ChunkedArray] = {
        "Timestamp": pa.array(lo_all // 1000).cast(pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(lo_all),
        "TraceId": pc.take(req.column("TraceId"), idx_all),
        "SpanId": pa.array(ids, pa.string()),
        "ParentSpanId": pa.array(parents, pa.string()),
        "TraceState": pa.array([""] * m, pa.string()),
        "SpanName": stage_col,
        "SpanKind": pa.array(["Internal"] * m, pa.string()),
        "ServiceName": pc.take(req.column("ServiceName"), idx_all),
        "ResourceAttributes": pc.take(req.column("ResourceAttributes"), idx_all),
        "ScopeName": pa.array([SCOPE] * m, pa.string()),
        "ScopeVersion": pa.array([""] * m, pa.string()),
        "SpanAttributes": span_attrs,
        "Duration": pa.array(hi_all - lo_all),
        "StatusCode": pa.array(["Unset"] * m, pa.string()),
        "StatusMessage": pa.array([""] * m, pa.string()),
        "Events": pa.array([[]] * m, pa.list_(S.EVENT)),
        "Links": pa.array([[]] * m, pa.list_(S.LINK)),
        "Stage": stage_col,
        "IsRequest": pa.array(np.zeros(m, dtype=bool)),
        "Outcome": pa.nulls(m, pa.string()),
        "Replica": pc.take(req.column("Replica"), idx_all),
    }
    for name in ("Model", "ModelVersion", "Tenant"):
        cols[name] = pa.nulls(m, pa.string())
    for name in ("InputTokens", "OutputTokens", "TtftNs"):
        cols[name] = pa.nulls(m, pa.int64())
    cols["AdjustedCount"] = pc.fill_null(pc.take(req.column("AdjustedCount"), idx_all), 1.0)
    return pa.table([cols[name] for name in S.COLUMN_NAMES], schema=S.SPAN_SCHEMA)
