"""The slow-replica incident written as Triton's OpenTelemetry trace mode writes it.

Same run as sample_traces/vllm_incident.py (the catalogue's `slow_replica`). Each request that
reached a replica becomes the three spans src/tracer.cc writes for an HTTP request to a
non-decoupled model (one response per request, so `execute()` covers the generation): the
`InferRequest` root with the frontend's HTTP_RECV_* / HTTP_SEND_* events, the model span
(`triton.model_name`, `triton.model_version`, REQUEST_START / QUEUE_START / REQUEST_END events)
and the `compute` span (COMPUTE_START / COMPUTE_INPUT_END / COMPUTE_OUTPUT_START / COMPUTE_END).
Triton sets no span status, so failed and abandoned requests read ok, as they would in real
data. The resource is Triton's: `service.name` alone; the test sends each replica's spans to
`tailscope collect` from its own loopback address, which names the replica (`tailscope.peer`).
Triton does not split prefill from decode: the slow replica shows in `generation`.

Nothing is committed: the test builds the spans from the seed at run time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from opentelemetry import trace

from sample_traces.fleet import SimRequest, sim_ns
from sample_traces.tgi_incident import lines_per_replica

SEED = 1
SERVICE = "triton-inference-server"
MODEL = "llama_trtllm"
US = 1_000



def _request(tracer: trace.Tracer, req: SimRequest, trace_id: int, rng: random.Random) -> None:
    start = sim_ns(req.at_replica_s)
    ok = req.status == "ok"
    done = sim_ns(min(req.decode_end_s, req.end_s)) if ok else sim_ns(req.end_s)
    root = tracer.start_span("InferRequest", kind=trace.SpanKind.SERVER, start_time=start)
    root.add_event("HTTP_RECV_START", timestamp=start)
    root.add_event("HTTP_RECV_END", timestamp=start + 200 * US)
    model_start = start + 300 * US
    model = tracer.start_span(MODEL, context=trace.set_span_in_context(root), kind=trace.SpanKind.SERVER,
                              start_time=model_start, attributes={
                                  "triton.model_name": MODEL, "triton.model_version": 1,
                                  "triton.trace_id": trace_id, "triton.trace_parent_id": 0})
    model.add_event("REQUEST_START", timestamp=model_start)
    model.add_event("QUEUE_START", timestamp=model_start + 100 * US)
    gen = max(sim_ns(req.gen_start_s), model_start + 100 * US)
    out = max(done - 400 * US, gen + 600 * US)
    compute = tracer.start_span("compute", context=trace.set_span_in_context(model), kind=trace.SpanKind.SERVER,
                                start_time=gen)
    stamps = (("COMPUTE_START", gen), ("COMPUTE_INPUT_END", gen + 500 * US), ("COMPUTE_OUTPUT_START", out),
              ("COMPUTE_END", out + 200 * US))
    for name, at in stamps:
        compute.add_event(name, timestamp=at)
    compute.end(end_time=out + 200 * US)
    model.add_event("REQUEST_END", timestamp=out + 300 * US)
    model.end(end_time=out + 300 * US)
    send = out + 300 * US + round(rng.uniform(50, 150)) * US
    root.add_event("HTTP_SEND_START", timestamp=send)
    root.add_event("HTTP_SEND_END", timestamp=send + 200 * US)
    root.end(end_time=send + 200 * US)


def lines_by_address(requests: Sequence[SimRequest], seed: int = SEED) -> dict[str, list[str]]:
    """Loopback address → the OTLP/JSON lines that replica's Triton exports (its resource: service.name)."""
    return lines_per_replica(requests, seed, service=SERVICE, scope="triton-server", id_base=4000, emit=_request)
