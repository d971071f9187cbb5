"""The slow-replica incident written as Hugging Face TGI writes it, for the accuracy suite.

Same run as sample_traces/vllm_incident.py (the catalogue's `slow_replica`). Each request that
reached a replica becomes what TGI's router exports for it (router/src/server.rs,
router/src/infer/mod.rs, backends/v3/src/queue.rs): the `generate_stream` handler span of
`text_generation_router::server` whose fields `validation_time`, `queue_time`,
`inference_time`, `time_per_token`, `total_time` are Rust `Debug` Duration strings recorded
when the response completed; the inner `generate_stream` span of `text_generation_router::infer`;
and the first `infer` span (the prefill iteration, ending at the first token). The resource is
TGI's: `service.name` alone, so nothing in the data names a replica. The test sends each
replica's spans to `tailscope collect` from its own loopback address: the replica the report
names is that address (`tailscope.peer`), as an operator sees TGI pods by IP.

Nothing is committed: the test builds the spans from the seed at run time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from opentelemetry import trace

from sample_traces.fleet import NS, SimRequest, sim_ns
from sample_traces.vllm_incident import Emit, reached_vllm, replica_lines

SEED = 1
SERVICE = "text-generation-inference.router"
_UNITS = ((NS, "s"), (1_000_000, "ms"), (1_000, "µs"), (1, "ns"))


def rust_debug(ns: int) -> str:
    """A Duration as Rust's `{:?}` prints it: the largest unit below it, exact decimals ('12.5ms', '850µs')."""
    for unit, name in _UNITS:
        if ns >= unit or unit == 1:
            whole, rest = divmod(ns, unit)
            frac = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0") if unit > 1 else ""
            return f"{whole}.{frac}{name}" if frac else f"{whole}{name}"
    raise AssertionError("unreachable")



def address(k: int) -> str:
    """The loopback address replica number `k` (in sorted replica order) sends from."""
    return f"127.0.0.{10 + k}"


def _request(tracer: trace.Tracer, req: SimRequest, rng: random.Random) -> None:
    code = {"code.namespace": "text_generation_router::server", "code.filepath": "router/src/server.rs"}
    start, end = sim_ns(req.at_replica_s), sim_ns(req.end_s)
    handler = tracer.start_span("generate_stream", start_time=start, attributes=code)
    ctx = trace.set_span_in_context(handler)
    inner = tracer.start_span("generate_stream", context=ctx, start_time=start,
                              attributes={**code, "code.namespace": "text_generation_router::infer"})
    gen, first = sim_ns(req.gen_start_s), sim_ns(req.first_token_s)
    if req.status == "ok" and start <= gen <= first <= end:
        infer = tracer.start_span("infer", context=trace.set_span_in_context(inner), start_time=gen,
                                  attributes={"code.namespace": "text_generation_backends_v3::queue"})
        infer.end(end_time=first)
        last = min(sim_ns(req.decode_end_s), end)
        validation = min(gen - start, round(rng.uniform(0.0003, 0.0009) * NS))
        inference = last - gen
        handler.set_attributes({
            "validation_time": rust_debug(validation), "queue_time": rust_debug(gen - start - validation),
            "inference_time": rust_debug(inference), "total_time": rust_debug(last - start),
            "time_per_token": rust_debug(inference // max(req.output_tokens, 1)), "seed": "None"})
    elif req.status == "error":
        handler.set_status(trace.Status(trace.StatusCode.ERROR))
    # a client that gave up (timeout) leaves neither the fields nor an error: TGI's stream is dropped
    inner.end(end_time=end)
    handler.end(end_time=end)


def lines_per_replica(requests: Sequence[SimRequest], seed: int, *, service: str, scope: str, id_base: int,
                      emit: Emit) -> dict[str, list[str]]:
    """Loopback address → the OTLP/JSON lines one replica of an engine with a bare resource
    (`service.name` only: TGI, Triton) exports."""
    per = replica_lines(requests, seed, resource=lambda _k, _replica, _rng: {"service.name": service}, scope=scope,
                        id_base=id_base, emit=emit)
    return {address(k): replica for k, replica in enumerate(per)}


def lines_by_address(requests: Sequence[SimRequest], seed: int = SEED) -> dict[str, list[str]]:
    """Loopback address → the OTLP/JSON lines that replica's router exports (TGI's resource)."""
    return lines_per_replica(requests, seed, service=SERVICE, scope=SERVICE, id_base=3000,
                             emit=lambda tracer, req, _n, rng: _request(tracer, req, rng))


def replica_addresses(requests: Sequence[SimRequest]) -> dict[str, str]:
    """Simulated replica name → the address it sends from."""
    names = sorted({r.replica for r in requests if reached_vllm(r)})
    return {name: address(k) for k, name in enumerate(names)}
