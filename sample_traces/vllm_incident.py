"""A slow-replica incident expressed in vLLM's own trace format, for the accuracy suite.

The fleet simulator (sample_traces/fleet.py) runs the catalogue's `slow_replica` incident (one
of 32 replicas' GPU throttled 6x in minutes 5 to 8); each request that reached a replica is
then written as vLLM 0.33 writes it with `--otlp-traces-endpoint`: one SERVER span
`llm_request` (tracer `vllm.tracing.otel`) from arrival at the vLLM frontend to emit, with the
float-second `gen_ai.latency.*` attributes, token counts and request id, no children, from a
TracerProvider per replica whose resource carries `service.instance.id` (as set through
OTEL_RESOURCE_ATTRIBUTES) and `vllm.process_id`. Requests the client abandoned become aborted
requests (`gen_ai.response.finish_reasons = '["abort"]'`), engine failures '["error"]', both with
an error status; gateway rejections never reach vLLM and are left out. The truth file states
the window, the stage (decode), the dimension (replica) and its value, and the p50/p99 effect
measured on vLLM's own e2e (arrival at the replica → last token).

    python -m sample_traces.vllm_incident [OUT_DIR]   # default: sample_traces/data/engines/
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import AttributeValue

from sample_traces.basic import SeededIds, write_lines
from sample_traces.fleet import SimRequest, sim_ns
from sample_traces.generate import DURATION_S, RATE  # the same run length and rate as the native incidents
from sample_traces.incidents import SLOW_REPLICA, run, write_truth
from sample_traces.quantile import quantile
from tracing.otlp_json import spans_to_json_line

NAME = "vllm_slow_replica"
OUT_DIR = Path(__file__).parent / "data" / "engines"
SEED = 1
#: Spans per OTLP/JSON line (the BatchSpanProcessor's default max_export_batch_size).
BATCH = 512


def traces_path(out_dir: Path = OUT_DIR) -> Path:
    """Where the vLLM-format traces go."""
    return out_dir / f"{NAME}.otlp.jsonl.gz"


def truth_path(out_dir: Path = OUT_DIR) -> Path:
    """Where the truth file goes."""
    return out_dir / f"{NAME}.truth.json"



def reached_vllm(req: SimRequest) -> bool:
    """True for requests that arrived at a replica (gateway rejections never reach vLLM)."""
    return (bool(req.replica) and 0 < req.at_replica_s < req.end_s
            and req.error_type != "InvalidRequestError")


def vllm_times(req: SimRequest, rng: random.Random) -> tuple[int, int, dict[str, AttributeValue], bool]:
    """(start ns, end ns, attributes, aborted) of the `llm_request` span vLLM emits for `req`."""
    start_s = req.at_replica_s
    done_s = min(req.decode_end_s, req.end_s) if req.status == "ok" else req.end_s
    aborted = req.status != "ok"
    attrs: dict[str, AttributeValue] = {
        "gen_ai.request.id": f"chatcmpl-{req.index:06d}",
        "gen_ai.request.max_tokens": 2048,
        "gen_ai.usage.prompt_tokens": req.input_tokens,
        "gen_ai.usage.completion_tokens": 0 if aborted and req.first_token_s >= req.end_s else req.output_tokens,
        "gen_ai.latency.e2e": done_s - start_s,
    }
    if rng.random() < 0.5:
        attrs["gen_ai.request.temperature"] = 0.7
    if start_s <= req.gen_start_s < done_s:
        attrs["gen_ai.latency.time_in_queue"] = req.gen_start_s - start_s
    if req.gen_start_s >= start_s and req.gen_start_s <= req.first_token_s <= done_s:
        attrs["gen_ai.latency.time_to_first_token"] = req.first_token_s - start_s
        attrs["gen_ai.latency.time_in_model_prefill"] = req.first_token_s - req.gen_start_s
        last = min(req.decode_end_s, done_s)
        attrs["gen_ai.latency.time_in_model_decode"] = max(0.0, last - req.first_token_s)
        attrs["gen_ai.latency.time_in_model_inference"] = max(0.0, last - req.gen_start_s)
    if aborted:  # the client gave up (vLLM sees an abort) or the engine died
        attrs["gen_ai.response.finish_reasons"] = '["abort"]' if req.status == "timeout" else '["error"]'
    emit_delay_s = rng.uniform(0.0002, 0.0012)  # span.end() runs after the final output is processed
    return sim_ns(start_s), sim_ns(done_s + emit_delay_s), attrs, aborted


#: Writes one request's spans: (tracer, request, its number on the replica from 1, the shared rng).
Emit = Callable[[trace.Tracer, SimRequest, int, random.Random], None]
#: The resource of replica number k (sorted by name) named `replica`, drawing from the shared rng.
ResourceOf = Callable[[int, str, random.Random], Mapping[str, AttributeValue]]


def replica_lines(requests: Sequence[SimRequest], seed: int, *, resource: ResourceOf, scope: str, id_base: int,
                  emit: Emit) -> list[list[str]]:
    """Per replica (sorted by name), the OTLP/JSON lines its engine exports: one OpenTelemetry SDK
    provider per replica, spans in end order, in batches of BATCH as a BatchSpanProcessor sends them."""
    rng = random.Random(seed)
    by_replica: dict[str, list[SimRequest]] = {}
    for req in requests:
        if reached_vllm(req):
            by_replica.setdefault(req.replica, []).append(req)
    out: list[list[str]] = []
    for k, replica in enumerate(sorted(by_replica)):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource(dict(resource(k, replica, rng))),
                                  id_generator=SeededIds(seed * id_base + k))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer(scope)
        for n, req in enumerate(by_replica[replica], start=1):
            emit(tracer, req, n, rng)
        provider.shutdown()
        spans = sorted(exporter.get_finished_spans(), key=lambda s: s.end_time or 0)
        out.append([spans_to_json_line(spans[i:i + BATCH]) for i in range(0, len(spans), BATCH)])
    return out


def _emit(tracer: trace.Tracer, req: SimRequest, _n: int, rng: random.Random) -> None:
    start, end, attrs, aborted = vllm_times(req, rng)
    span = tracer.start_span("llm_request", kind=trace.SpanKind.SERVER, start_time=start, attributes=attrs)
    if aborted:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "request aborted"))
    span.end(end_time=end)


def lines(requests: Sequence[SimRequest], seed: int = SEED) -> list[str]:
    """OTLP/JSON lines of every replica's `llm_request` spans, made with the OpenTelemetry SDK."""
    def resource(k: int, replica: str, _rng: random.Random) -> dict[str, AttributeValue]:
        return {"service.name": "vllm", "service.instance.id": replica,
                "vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": 1000 + k}

    per = replica_lines(requests, seed, resource=resource, scope="vllm.tracing.otel", id_base=1000, emit=_emit)
    return [line for replica in per for line in replica]


def _effect(requests: Sequence[SimRequest], t0: float, t1: float) -> dict[str, float]:
    e2e = [(min(r.decode_end_s, r.end_s) - r.at_replica_s) * 1000 for r in requests
           if reached_vllm(r) and r.status == "ok" and t0 <= r.at_replica_s < t1]
    return {"requests": len(e2e), "p50_ms": round(quantile(e2e, 0.5), 1), "p99_ms": round(quantile(e2e, 0.99), 1)}


def write_incident(name: str, lines_of: Callable[[Sequence[SimRequest], int], list[str]], *, title: str,
                   fmt: str, out_dir: Path, seed: int, duration_s: float, rate: float) -> tuple[Path, Path]:
    """Simulate the slow-replica incident, write it as `lines_of` renders it (`basic.write_lines`) and its
    truth file into `out_dir/name.*`; returns both paths."""
    scenario = run("slow_replica", seed, duration_s, rate)
    clean = run("clean", seed, duration_s, rate).requests
    traces = write_lines(out_dir / f"{name}.otlp.jsonl.gz", lines_of(scenario.requests, seed))
    truth: dict[str, Any] = scenario.truth(clean)
    t0, t1 = truth["window"]["start_s"], truth["window"]["end_s"]
    truth.update(
        scenario=name,
        title=title,
        format=fmt,
        requests=sum(1 for r in scenario.requests if reached_vllm(r)),
        effect={"incident": _effect(scenario.requests, t0, t1), "clean": _effect(clean, t0, t1)},
    )
    assert truth["dimension"] == "replica" and truth["value"] == SLOW_REPLICA
    return traces, write_truth(out_dir / f"{name}.truth.json", truth)


def generate(out_dir: Path = OUT_DIR, seed: int = SEED, duration_s: float = DURATION_S,
             rate: float = RATE) -> tuple[Path, Path]:
    """Simulate the incident, write the vLLM-format traces and the truth file; returns both paths."""
    return write_incident(NAME, lines, title="Slow replica (throttled GPU), in vLLM's trace format",
                          fmt="vLLM 0.33 llm_request spans (OTLP/JSON lines)", out_dir=out_dir, seed=seed,
                          duration_s=duration_s, rate=rate)


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(path)
