"""Turn simulated requests into the spans real instrumentation makes, and write them as OTLP/JSON lines.

Each replica is one `tracing.LeanRecorder` (the library's explicit-timestamp request API)
emitting through its own OpenTelemetry SDK `TracerProvider` (resource `service.name`,
`service.instance.id` = the replica, `cloud.availability_zone`, `k8s.node.name`) with seeded trace and
span ids, so the output is byte-for-byte the same for the same requests. So the spans are
what the instrumentation makes (docs/convention.md): the request span is kind SERVER
with `tailscope.request=true` and the request shape; each stage is an INTERNAL child
named after its stage with `tailscope.stage`; `prefill` and `decode` sit under
`generation`; the request span also carries the request's priority class, LoRA adapter
(when it asks for one) and prefix-cache read tokens (ATTR_PRIORITY, ATTR_LORA, ATTR_CACHE_READ);
the request span carries `tailscope.outcome`, `tailscope.ttft_ns` and the
output tokens, and failures carry status ERROR and `error.type`. (`tracing.request(...)`
would take its tracer from the one process-wide provider; here one process plays dozens
of replicas, each with its own resource.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator

from sample_traces.basic import SeededIds, write_lines
from sample_traces.fleet import NS, START_NS, FleetConfig, SimRequest, sim_ns
from tracing import schema as S
from tracing.lean import LeanRecorder, LeanRequest
from tracing.otlp_json import spans_to_json_line
from tracing.rows import adjusted_count_of, attr_str, replica_of
from tracing.store import SegmentWriter

if TYPE_CHECKING:
    import pyarrow as pa

#: Instrumentation scope of the emitted spans (as `tracing.instrument` names it).
SCOPE_NAME = "tailscope"
SCOPE_VERSION = "0.1.0"
#: Spans per OTLP/JSON line (one export batch).
SPANS_PER_LINE = 256
ATTR_ZONE = "cloud.availability_zone"
ATTR_NODE = "k8s.node.name"
#: Request attributes beside the convention's: the priority class, the LoRA adapter asked for (when one is),
#: and the prompt tokens read from the prefix cache (the OpenTelemetry GenAI key).
ATTR_PRIORITY = "request.priority"
ATTR_LORA = "gen_ai.request.lora_adapter"
ATTR_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"

NETWORK, QUEUE_WAIT, PREPROCESS, MODEL_LOAD, GENERATION, STREAMING = S.STAGES
PREFILL, DECODE = S.GENERATION_PARTS
OK, ERROR, TIMEOUT, _CANCELLED = S.OUTCOMES
_SERVER = trace.SpanKind.SERVER
_INTERNAL = trace.SpanKind.INTERNAL


class _ListExporter(SpanExporter):
    """Keeps finished spans in a list the emitter drains (only those of traces `keep` accepts, when given)."""

    def __init__(self, keep: Callable[[int], bool] | None = None) -> None:
        self.spans: list[ReadableSpan] = []
        self.keep = keep

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append the spans."""
        keep = self.keep
        self.spans.extend(spans if keep is None else
                          [sp for sp in spans if sp.context is not None and keep(sp.context.trace_id)])
        return SpanExportResult.SUCCESS


#: The stage spans a simulated request can have, in the order they are opened (`_opened` says which and when).
#: The gateway's queue wait (for the tenant's concurrency limit) comes before the network hop, the replica's (for a
#: batch slot) after the model load.
_SLOTS = (PREPROCESS, QUEUE_WAIT, NETWORK, MODEL_LOAD, QUEUE_WAIT, GENERATION, PREFILL, DECODE, STREAMING)
#: Columns of `_span_table`'s row matrix (0 is the request span), and `_record`'s loop's slot numbers.
_GEN_SLOT, _PREFILL_SLOT, _DECODE_SLOT, _STREAMING_SLOT = 6, 7, 8, 9
#: The request times the stages are made of, in `_opened`'s order (the last two may be None).
_TIMES = ("arrival_s", "pre_end_s", "routed_s", "at_replica_s", "gen_start_s", "first_token_s", "decode_end_s",
          "end_s", "load_end_s", "stream_end_s")
_times_of, _set_times_of, _optional_times_of = attrgetter(*_TIMES), attrgetter(*_TIMES[:8]), attrgetter(*_TIMES[8:])


def _opened(arrival: Any, pre_end: Any, routed: Any, at_rep: Any, gen_start: Any, first_tok: Any, decode_end: Any,
            end_s: Any, load_end: Any, stream_end: Any, *, served: Any, streaming: Any, every: Any,
            where: Callable[[Any, Any, Any], Any], maximum: Callable[[Any, Any], Any]) -> tuple[Any, Any]:
    """The one description of a simulated request's stage spans: per slot of `_SLOTS`, whether it is opened and its
    start and end (s, before `_kept` and the request's end clip them); and whether a first token came. Elementwise:
    on one request's floats and bools (`_record`, `where` a conditional, `maximum` max) or on arrays of a replica's
    requests (`_span_table`: np.where, np.maximum). A missing time (no load, no stream end) is NaN, which every
    comparison takes as false. `served`: not rejected by validation; `every`: true (as a bool or an array)."""
    has_load = served & (load_end > at_rep)
    slot_from = where(has_load, load_end, at_rep)
    generated = served & (gen_start < end_s)
    first = served & (first_tok < end_s)
    return ((every, arrival, pre_end),
            (served & (routed > pre_end), pre_end, routed),  # waited at the gateway for the tenant's limit
            (served, routed, at_rep),  # gateway -> replica hop
            (has_load, at_rep, load_end),
            (served, slot_from, maximum(slot_from, gen_start)),
            (generated, gen_start, decode_end),
            (generated, gen_start, first_tok),
            (generated & (decode_end > first_tok), first_tok, decode_end),
            (first & streaming & (stream_end == stream_end), first_tok, stream_end)), first


def _kept(opened: Any, name: str, start_ns: Any, end_ns: Any) -> Any:
    """Whether an opened stage (not the generation, which is ended explicitly) is recorded: it starts before the
    request's end, or at it for a queue wait (elementwise, as `_opened`)."""
    return opened & ((start_ns < end_ns) | ((start_ns == end_ns) & (name == QUEUE_WAIT)))


def _record(rec: LeanRecorder, cfg: FleetConfig, req: SimRequest, finish: bool = True) -> LeanRequest:
    """Record one simulated request through the lean API, with its explicit timestamps (`finish=False`: not yet
    ended, so not queued; the caller ends it at `sim_ns(req.end_s)` or drops it). Its stages are `_opened`'s,
    clipped by `_kept`: the rules `_span_table` applies to every request at once."""
    start, end = sim_ns(req.arrival_s), sim_ns(req.end_s)
    attributes: dict[str, str | int] = {ATTR_PRIORITY: req.priority, ATTR_CACHE_READ: req.cached_tokens}
    if req.lora_adapter:
        attributes[ATTR_LORA] = req.lora_adapter
    lean = rec.request(model=cfg.model, model_version=req.version, tenant=req.tenant,
                       input_tokens=req.input_tokens, stream=req.streaming, operation="chat", start_ns=start,
                       attributes=attributes)
    times = [math.nan if v is None else v for v in _times_of(req)]
    opened, first = _opened(*times, served=req.error_type != "InvalidRequestError", streaming=req.streaming,
                            every=True, where=lambda c, a, b: a if c else b, maximum=max)
    gen: Any = None
    gen_end = end
    for j, (name, (has, s, e)) in enumerate(zip(_SLOTS, opened, strict=True), start=1):
        if j == _STREAMING_SLOT:  # the generation ends, and the first token comes, before the stream's stage
            if gen is not None:
                lean.end_stage(gen, gen_end)
            if first:
                lean.first_token(sim_ns(req.first_token_s))
        if not has:
            continue
        s_ns = sim_ns(s)
        if j == _GEN_SLOT:  # started and ended explicitly, its prefill and decode inside
            gen, gen_end = lean.start_stage(GENERATION, start_ns=s_ns), min(sim_ns(e), end)
        elif _kept(True, name, s_ns, end):
            lean.record_stage(name, s_ns, max(s_ns, min(sim_ns(e), end)))
    lean.set(output_tokens=req.output_tokens)
    if req.status != OK:
        lean.set_outcome(req.status, req.error_type)
    if finish:
        lean.finish(end)
    return lean


def _by_replica(cfg: FleetConfig, requests: Iterable[SimRequest], seed: int
                ) -> list[tuple[Resource, SeededIds, list[SimRequest]]]:
    """Per replica (in name order): its resource, its seeded id generator and its requests."""
    by_replica: dict[str, list[SimRequest]] = {}
    for req in requests:
        by_replica.setdefault(req.replica, []).append(req)
    zones = {r.name: r.zone for r in cfg.replicas}
    nodes = {r.name: r.node for r in cfg.replicas if r.node}
    out = []
    for k, replica in enumerate(sorted(by_replica)):
        resource = Resource.create({
            "service.name": cfg.service,
            "service.instance.id": replica,
            ATTR_ZONE: zones.get(replica, ""),
            "cloud.region": "us-east-1",
            **({ATTR_NODE: nodes[replica]} if replica in nodes else {}),
        })
        out.append((resource, SeededIds(seed * 1_000 + k), by_replica[replica]))
    return out


def emit_lines(cfg: FleetConfig, requests: Iterable[SimRequest], seed: int,
               keep: Callable[[int], bool] | None = None) -> list[str]:
    """The OTLP/JSON lines of `requests`: one provider per replica, batches of SPANS_PER_LINE spans.

    `keep` (a trace id -> whether it is kept) drops the other traces' spans before they are written, as a
    head sampler in the exporting process would: ids are drawn as without it, so the kept spans are those
    of the full emission.
    """
    lines: list[str] = []
    for resource, ids, reqs in _by_replica(cfg, requests, seed):
        exporter = _ListExporter(keep)
        provider = TracerProvider(resource=resource, id_generator=ids)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        rec = LeanRecorder(tracer_provider=provider, resource=resource, background=False)
        for req in reqs:
            _record(rec, cfg, req)
            rec.flush()
            if len(exporter.spans) >= SPANS_PER_LINE:
                lines.append(spans_to_json_line(exporter.spans[:SPANS_PER_LINE]))
                del exporter.spans[:SPANS_PER_LINE]
        rec.close()
        provider.shutdown()
        for i in range(0, len(exporter.spans), SPANS_PER_LINE):
            lines.append(spans_to_json_line(exporter.spans[i:i + SPANS_PER_LINE]))
    return lines


def _span_table(cfg: FleetConfig, reqs: Sequence[SimRequest], resource: Resource, ids: IdGenerator,
                keep: Callable[[int], bool] | None, trace_state: str) -> pa.Table:
    """One replica's rows in SPAN_SCHEMA, built column by column: the rows the lean recorder stores for `_record`'s
    requests (each request span, then its stages in `_SLOTS` order; promoted as `SpanBatch.append` promotes),
    ids drawn from `ids` in the same order (each request's trace id, then one span id per row), for every
    request, kept or not."""
    import numpy as np
    import pyarrow as pa

    n = len(reqs)

    def ns(t: Any) -> Any:  # sim_ns, vectorized: both round half to even
        return START_NS + np.rint(np.nan_to_num(t) * NS).astype(np.int64)

    times = [*np.fromiter(chain.from_iterable(map(_set_times_of, reqs)), np.float64, n * 8).reshape(n, 8).T,
             *np.array(list(map(_optional_times_of, reqs)), np.float64).reshape(n, 2).T]  # None as NaN
    arrival, first_tok, end_s = times[0], times[5], times[7]
    status = np.array([r.status for r in reqs], object)
    message = np.array([r.error_type or r.status for r in reqs], object)  # set_outcome's error type and message
    streaming = np.fromiter((r.streaming for r in reqs), bool, n)
    start, end = ns(arrival), ns(end_s)
    served = np.array([r.error_type != "InvalidRequestError" for r in reqs], bool)
    opened, first = _opened(*times, served=served, streaming=streaming, every=np.ones(n, bool), where=np.where,
                            maximum=np.maximum)
    # the row matrix: column 0 the request span, column j its j-th slot; flattened row-major where present, the
    # rows in stored order
    rows = np.zeros((n, 1 + len(_SLOTS)), bool)
    starts = np.zeros(rows.shape, np.int64)
    ends = np.zeros(rows.shape, np.int64)
    rows[:, 0], starts[:, 0], ends[:, 0] = True, start, end
    for j, (name, (has, s, e)) in enumerate(zip(_SLOTS, opened, strict=True), start=1):
        s_ns = ns(s)
        if j == _GEN_SLOT:  # started and ended explicitly
            rows[:, j], starts[:, j], ends[:, j] = has, s_ns, np.minimum(ns(e), end)
        else:
            rows[:, j] = _kept(has, name, s_ns, end)
            starts[:, j], ends[:, j] = s_ns, np.maximum(s_ns, np.minimum(ns(e), end))
    # ids: every request's, in the recorder's order, kept or not
    counts = rows.sum(axis=1)
    new_trace, new_span = ids.generate_trace_id, ids.generate_span_id
    trace_ids: list[int] = []
    span_ids: list[int] = []
    for k in counts.tolist():
        trace_ids.append(new_trace())
        span_ids.extend([new_span() for _ in range(k)])
    kept = np.ones(n, bool) if keep is None else np.array([keep(t) for t in trace_ids], bool)
    span_kept = [format(s, "016x") for s, k in zip(span_ids, np.repeat(kept, counts).tolist(), strict=True) if k]
    # only the kept requests from here on
    idx = np.flatnonzero(kept)
    reqs = [reqs[i] for i in idx.tolist()]
    n = len(reqs)
    rows, starts, ends, start = rows[idx], starts[idx], ends[idx], start[idx]
    status, message, streaming, first, first_tok = status[idx], message[idx], streaming[idx], first[idx], first_tok[idx]
    trace_hex = np.array([format(trace_ids[i], "032x") for i in idx.tolist()], object)
    span_hex = np.full(rows.shape, "", object)
    span_hex[rows] = span_kept
    parents = np.repeat(span_hex[:, :1], rows.shape[1], axis=1)
    parents[:, 0] = ""
    parents[:, [_PREFILL_SLOT, _DECODE_SLOT]] = span_hex[:, [_GEN_SLOT]]

    # the request span's attributes, in the order the recorders set them (tracing.instrument.request_identity,
    # then `_record`'s, then error type, outcome, output tokens and time to first token: LeanRequest.typed_attrs)
    failed = status != OK
    ttft = np.where(first, ns(first_tok) - start, 0)
    lora = np.array([r.lora_adapter for r in reqs], object)
    every = np.ones(n, bool)
    attrs = (
        (S.ATTR_REQUEST, every, "true"), (S.ATTR_OPERATION, every, "chat"), (S.MODEL_KEYS[0], every, cfg.model),
        (S.ATTR_MODEL_VERSION, every, [r.version for r in reqs]), (S.ATTR_TENANT, every, [r.tenant for r in reqs]),
        (S.INPUT_TOKEN_KEYS[0], every, [str(r.input_tokens) for r in reqs]),
        (S.ATTR_STREAMING, every, np.where(streaming, "true", "false").astype(object)),
        (ATTR_PRIORITY, every, [r.priority for r in reqs]),
        (ATTR_CACHE_READ, every, [str(r.cached_tokens) for r in reqs]), (ATTR_LORA, lora != "", lora),
        (S.ATTR_ERROR_TYPE, failed, message), (S.ATTR_OUTCOME, every, status),
        (S.OUTPUT_TOKEN_KEYS[0], every, [str(r.output_tokens) for r in reqs]),
        (S.ATTR_TTFT_NS, first, ttft.astype(str).astype(object)),
    )
    # the attribute cells: per request, its request span's then one per stage row; flattened row-major where
    # present, each row's attributes in row order
    cells = np.zeros((n, len(attrs) + len(_SLOTS)), bool)
    keys = np.empty(cells.shape, object)
    values = np.empty(cells.shape, object)
    for j, (key, has, vals) in enumerate(attrs):
        cells[:, j], keys[:, j], values[:, j] = has, key, vals
    cells[:, len(attrs):] = rows[:, 1:]
    keys[:, len(attrs):] = S.ATTR_STAGE
    values[:, len(attrs):] = _SLOTS
    per_row = rows.astype(np.int32)
    per_row[:, 0] = cells[:, :len(attrs)].sum(axis=1)
    m = int(rows.sum())
    offsets = np.zeros(m + 1, np.int32)
    np.cumsum(per_row[rows], out=offsets[1:])
    span_attrs = pa.MapArray.from_arrays(offsets, pa.array(keys[cells], pa.string()),
                                         pa.array(values[cells], pa.string()))
    res = {k: attr_str(v) for k, v in resource.attributes.items()}
    resource_attrs = pa.MapArray.from_arrays(np.arange(m + 1, dtype=np.int32) * len(res),
                                             pa.array(np.tile(np.array(list(res), object), m), pa.string()),
                                             pa.array(np.tile(np.array(list(res.values()), object), m), pa.string()))

    def per_request(values: Any, stages: Any) -> Any:  # the request's value on its row, `stages` on its stages'
        out = np.empty(rows.shape, object)
        out[:, 0], out[:, 1:] = values, stages
        return out[rows]

    is_req = per_request(True, False).astype(bool)
    shown = per_request(every, False).astype(bool)

    def request_ints(values: Any, has: Any = every) -> pa.Array:
        return pa.array(per_request(np.asarray(values, np.int64), 0).astype(np.int64), pa.int64(),
                        mask=~(shown & per_request(has, False).astype(bool)))

    def request_strs(values: Any) -> pa.Array:  # first_attr: "" is no value
        return pa.array(per_request(np.where(np.asarray(values, object) == "", None, values), None), pa.string())

    start_flat, end_flat = starts[rows], ends[rows]
    names = per_request(f"chat {cfg.model}", _SLOTS)
    empty = pa.array(np.zeros(m + 1, np.int32))
    columns = {
        "Timestamp": pa.array(start_flat // 1000, pa.int64()).view(pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(start_flat, pa.int64()),
        "TraceId": pa.array(per_request(trace_hex, trace_hex[:, None]), pa.string()),
        "SpanId": pa.array(span_hex[rows], pa.string()),
        "ParentSpanId": pa.array(parents[rows], pa.string()),
        "TraceState": pa.array([trace_state] * m, pa.string()),
        "SpanName": pa.array(names, pa.string()),
        "SpanKind": pa.array(per_request(S.SPAN_KINDS[2], S.SPAN_KINDS[1]), pa.string()),
        "ServiceName": pa.array([res.get("service.name", "")] * m, pa.string()),
        "ResourceAttributes": resource_attrs,
        "ScopeName": pa.array([SCOPE_NAME] * m, pa.string()),
        "ScopeVersion": pa.array([SCOPE_VERSION] * m, pa.string()),
        "SpanAttributes": span_attrs,
        "Duration": pa.array(end_flat - start_flat, pa.int64()),
        "StatusCode": pa.array(per_request(np.where(failed, S.STATUS_CODES[2], S.STATUS_CODES[0]), S.STATUS_CODES[0]),
                               pa.string()),
        "StatusMessage": pa.array(per_request(np.where(failed, message, ""), ""), pa.string()),
        "Events": pa.ListArray.from_arrays(empty, pa.array([], S.EVENT)),
        "Links": pa.ListArray.from_arrays(empty, pa.array([], S.LINK)),
        "Stage": pa.array(per_request(None, _SLOTS), pa.string()),
        "IsRequest": pa.array(is_req, pa.bool_()),
        "Outcome": request_strs(status),
        "Replica": pa.array([replica_of(res)] * m, pa.string()),
        "Model": request_strs(np.full(n, cfg.model, object)),
        "ModelVersion": request_strs([r.version for r in reqs]),
        "Tenant": request_strs([r.tenant for r in reqs]),
        "InputTokens": request_ints([r.input_tokens for r in reqs]),
        "OutputTokens": request_ints([r.output_tokens for r in reqs]),
        "TtftNs": request_ints(ttft, first),
        "AdjustedCount": pa.array(np.full(m, adjusted_count_of(trace_state, {})), pa.float64()),
    }
    return pa.Table.from_pydict(columns, schema=S.SPAN_SCHEMA)


def span_tables(cfg: FleetConfig, requests: Iterable[SimRequest], seed: int,
                keep: Callable[[int], bool] | None = None, trace_state: str = "") -> list[pa.Table]:
    """The rows `write_otlp` + `tailscope ingest` store for `requests`, one table per replica (in name order), ids
    included (the same seeded ids, drawn in the same order), built column by column, without the OTLP round trip.

    `keep` (a trace id -> whether it is kept) builds only the requests whose trace id it keeps, as a head sampler
    does: every request's ids are drawn as without it, so the rows are those of the full store's kept traces.
    `trace_state` is every span's W3C tracestate (`ot=th:c`: kept by a sampler at that threshold), the adjusted
    count read from it as ingest reads it."""
    return [_span_table(cfg, reqs, resource, ids, keep, trace_state)
            for resource, ids, reqs in _by_replica(cfg, requests, seed)]


def write_store(store: Path, cfg: FleetConfig, requests: Iterable[SimRequest], seed: int,
                keep: Callable[[int], bool] | None = None, trace_state: str = "") -> Path:
    """Write `requests` straight into a segment store and return it, for tests and benchmarks that are not about
    OTLP: `span_tables`' rows (`keep`, `trace_state`: see there), every replica's in one segment per hour (a
    store's cost grows with its segments: each is a file to open and a Parquet footer to read)."""
    import pyarrow as pa

    writer = SegmentWriter(store, kind="sim")
    tables = span_tables(cfg, requests, seed, keep, trace_state)
    if tables:
        writer.write(pa.concat_tables(tables))
    return store


def write_otlp(path: Path, cfg: FleetConfig, requests: Iterable[SimRequest], seed: int,
               keep: Callable[[int], bool] | None = None) -> Path:
    """Write gzip OTLP/JSON lines (`basic.write_lines`: reproducible) and return the path (`keep`: see emit_lines)."""
    return write_lines(path, emit_lines(cfg, requests, seed, keep))
