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

import gzip
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator

from sample_traces.basic import SeededIds
from sample_traces.fleet import FleetConfig, SimRequest, sim_ns
from tracing import schema as S
from tracing.lean import LeanRecorder, LeanRequest
from tracing.otlp_json import spans_to_json_line
from tracing.store import SegmentWriter

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



def _record(rec: LeanRecorder, cfg: FleetConfig, req: SimRequest, finish: bool = True) -> LeanRequest:
    """Record one simulated request through the lean API, with its explicit timestamps (`finish=False`: not yet
    ended, so not queued; the caller ends it at `sim_ns(req.end_s)` or drops it)."""
    start, end = sim_ns(req.arrival_s), sim_ns(req.end_s)
    attributes: dict[str, str | int] = {ATTR_PRIORITY: req.priority, ATTR_CACHE_READ: req.cached_tokens}
    if req.lora_adapter:
        attributes[ATTR_LORA] = req.lora_adapter
    lean = rec.request(model=cfg.model, model_version=req.version, tenant=req.tenant,
                       input_tokens=req.input_tokens, stream=req.streaming, operation="chat", start_ns=start,
                       attributes=attributes)

    def stage(name: str, s: float, e: float) -> None:
        s_ns = sim_ns(s)
        if s_ns < end or (s_ns == end and name == QUEUE_WAIT):
            lean.record_stage(name, s_ns, max(s_ns, min(sim_ns(e), end)))

    stage(PREPROCESS, req.arrival_s, req.pre_end_s)
    rejected = req.error_type == "InvalidRequestError"
    if not rejected:
        if req.routed_s > req.pre_end_s:  # waited at the gateway for the tenant's concurrency limit
            stage(QUEUE_WAIT, req.pre_end_s, req.routed_s)
        stage(NETWORK, req.routed_s, req.at_replica_s)  # gateway -> replica hop
        slot_wait_from = req.at_replica_s
        if req.load_end_s is not None and req.load_end_s > req.at_replica_s:
            stage(MODEL_LOAD, req.at_replica_s, req.load_end_s)
            slot_wait_from = req.load_end_s
        stage(QUEUE_WAIT, slot_wait_from, max(slot_wait_from, req.gen_start_s))
        if req.gen_start_s < req.end_s:
            gen = lean.start_stage(GENERATION, start_ns=sim_ns(req.gen_start_s))
            stage(PREFILL, req.gen_start_s, req.first_token_s)
            if req.decode_end_s > req.first_token_s:
                stage(DECODE, req.first_token_s, req.decode_end_s)
            lean.end_stage(gen, min(sim_ns(req.decode_end_s), end))
        if req.first_token_s < req.end_s:
            lean.first_token(sim_ns(req.first_token_s))
            if req.streaming and req.stream_end_s is not None:
                stage(STREAMING, req.first_token_s, req.stream_end_s)
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


class _Predrawn(IdGenerator):
    """Ids drawn ahead, in the order the recorder asks for them (each kept request's trace id, then its spans')."""

    def __init__(self) -> None:
        self.traces: deque[int] = deque()
        self.spans: deque[int] = deque()

    def generate_trace_id(self) -> int:
        """The next kept request's trace id."""
        return self.traces.popleft()

    def generate_span_id(self) -> int:
        """The next kept span's id."""
        return self.spans.popleft()


def write_store(store: Path, cfg: FleetConfig, requests: Iterable[SimRequest], seed: int,
                keep: Callable[[int], bool] | None = None) -> Path:
    """Write `requests` straight into a segment store (one segment per replica) and return it, without the OTLP
    round trip, for tests and benchmarks that are not about OTLP: the rows `write_otlp` + `tailscope ingest` store,
    ids included (the same seeded ids, drawn in the same order).

    `keep` (a trace id -> whether it is kept) builds only the requests whose trace id it keeps, as a head sampler
    does: every request's ids are drawn as without it, so the rows are those of the full store's kept traces."""
    writer = SegmentWriter(store, kind="sim")
    for resource, ids, reqs in _by_replica(cfg, requests, seed):
        drawn = _Predrawn() if keep is not None else None
        rec = LeanRecorder(writer=writer, resource=resource, background=False, id_generator=drawn or ids,
                           max_pending=max(1, len(reqs)))
        for req in reqs:
            if drawn is None or keep is None:
                _record(rec, cfg, req)
                continue
            lean = _record(rec, cfg, req, finish=False)
            trace_id = ids.generate_trace_id()
            spans = [ids.generate_span_id() for _ in range(1 + len(lean.stages))]
            if keep(trace_id):
                drawn.traces.append(trace_id)
                drawn.spans.extend(spans)
                lean.finish(sim_ns(req.end_s))
        rec.close()
    return store


def write_otlp(path: Path, cfg: FleetConfig, requests: Iterable[SimRequest], seed: int,
               keep: Callable[[int], bool] | None = None) -> Path:
    """Write gzip OTLP/JSON lines (reproducible: gzip mtime 0) and return the path (`keep`: see emit_lines)."""
    lines = emit_lines(cfg, requests, seed, keep)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as fh:
        fh.write(("\n".join(lines) + "\n").encode())
    return path
