"""A chat API instrumented the way most teams already have it, with an incident: nothing written for tailscope.

Six pods (`k8s.pod.name` on the resource, as OTEL_RESOURCE_ATTRIBUTES sets it) of one service.
Each request is the HTTP SERVER span a web framework's auto-instrumentation opens
(`POST /v1/chat/completions`, with `http.request.method`, `http.route`, `url.path`,
`http.response.status_code` and the OpenTelemetry HTTP status rule: ERROR for 5xx only) and three
INTERNAL spans the team wrote around its own steps: `tokenize`, `generate` and `stream_response`
(the stream starts at the first token and ends after the last, so it overlaps `generate`). No
`tailscope.*` or `gen_ai.*` attribute anywhere. A few requests fail with 500, a few are closed by
the client (499). The incident: one pod's `generate` runs INCIDENT_FACTOR times slower for a few
minutes. The truth (window, stage, pod) is what the simulator did, not what any analysis finds.

Made with the real OpenTelemetry SDK and written as OTLP/JSON lines:

    python -m sample_traces.http_chat OUT.otlp.jsonl [--requests N]
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sample_traces.basic import SeededIds
from tracing.otlp_json import spans_to_json_line

PODS: tuple[str, ...] = tuple(f"chat-api-7d9f8b6c5-{s}" for s in ("2xkqp", "8mzlw", "c4vnh", "hq7rt", "pw3jd", "zt6bs"))
SERVICE = "chat-api"
ROUTE = "/v1/chat/completions"
T0 = 1_764_000_000_000_000_000 - 1_764_000_000_000_000_000 % 3_600_000_000_000  # an hour boundary (2025-11-24)
S = 1_000_000_000
MS = 1_000_000
#: Requests per second, all pods together, and the run's length.
RATE = 6.0
DURATION_S = 1800.0
#: The incident: pod INCIDENT_POD's `generate` runs INCIDENT_FACTOR times slower in [start, end) s of the run.
INCIDENT_POD = 3
INCIDENT_FACTOR = 6.0
INCIDENT_S = (720.0, 1080.0)
ERROR_SHARE = 0.01
CLIENT_CLOSED_SHARE = 0.005


@dataclass(frozen=True)
class Truth:
    """What the simulator did: the incident's window (ns), its stage and its pod; the request count, and how many
    requests failed with 500 and were closed by the client (499)."""

    start_ns: int
    end_ns: int
    stage: str
    pod: str
    requests: int
    errors: int = 0
    cancelled: int = 0


def truth(requests: int, errors: int = 0, cancelled: int = 0) -> Truth:
    """The incident of a run of `requests` requests."""
    duration = requests / RATE
    lo, hi = (x * duration / DURATION_S for x in INCIDENT_S)
    return Truth(T0 + int(lo * S), T0 + int(hi * S), "generation", PODS[INCIDENT_POD], requests, errors, cancelled)


def _request(tracer: trace.Tracer, rng: random.Random, start: int, slow: bool, customer: str) -> int:
    tok = int(rng.uniform(3, 8) * MS)
    gen = int(rng.lognormvariate(math.log(400), 0.3) * MS * (INCIDENT_FACTOR if slow else 1.0))
    first = int(gen * rng.uniform(0.05, 0.15))
    roll = rng.random()
    code = 500 if roll < ERROR_SHARE else 499 if roll < ERROR_SHARE + CLIENT_CLOSED_SHARE else 200
    if code == 499:
        gen = int(gen * rng.uniform(0.2, 0.9))  # the client went away mid-stream
    root = tracer.start_span(f"POST {ROUTE}", kind=trace.SpanKind.SERVER, start_time=start, attributes={
        "http.request.method": "POST", "http.route": ROUTE, "url.path": ROUTE, "url.scheme": "http",
        "server.address": "chat-api", "network.protocol.version": "1.1", "customer.id": customer})
    ctx = trace.set_span_in_context(root)
    t = start + int(rng.uniform(0.2, 0.6) * MS)
    span = tracer.start_span("tokenize", context=ctx, start_time=t, attributes={"prompt.chars": rng.randint(40, 4000)})
    span.end(end_time=t + tok)
    g0 = t + tok + int(rng.uniform(0.1, 0.4) * MS)
    span = tracer.start_span("generate", context=ctx, start_time=g0, attributes={"max_tokens": 512})
    if code == 500:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "CUDA error: an illegal memory access"))
    span.end(end_time=g0 + gen)
    if code != 500:
        span = tracer.start_span("stream_response", context=ctx, start_time=g0 + first)
        span.end(end_time=g0 + gen + int(rng.uniform(1, 4) * MS))
    root.set_attribute("http.response.status_code", code)
    if code >= 500:
        root.set_status(trace.Status(trace.StatusCode.ERROR))
    root.end(end_time=g0 + gen + int(rng.uniform(4, 8) * MS))
    return code


def lines(requests: int = int(RATE * DURATION_S), seed: int = 1, batch: int = 512,
          codes: dict[int, int] | None = None) -> Iterator[str]:
    """OTLP/JSON lines (one export batch of up to `batch` spans each) of a run of `requests` requests; `codes`
    counts the HTTP status codes sent."""
    rng = random.Random(seed)
    duration = requests / RATE
    lo, hi = (x * duration / DURATION_S for x in INCIDENT_S)
    starts = sorted(rng.uniform(0, duration) for _ in range(requests))
    per_pod: list[list[float]] = [[] for _ in PODS]
    for at in starts:
        per_pod[rng.randrange(len(PODS))].append(at)
    customers = [f"cust-{k:03d}" for k in range(40)]
    for n, pod in enumerate(PODS):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource({"service.name": SERVICE, "k8s.pod.name": pod,
                                                     "k8s.namespace.name": "inference",
                                                     "telemetry.sdk.language": "python",
                                                     "telemetry.sdk.name": "opentelemetry"}),
                                  id_generator=SeededIds(seed * 100 + n))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("app.chat")
        for k, at in enumerate(per_pod[n]):
            slow = n == INCIDENT_POD and lo <= at < hi
            code = _request(tracer, rng, T0 + int(at * S), slow, rng.choice(customers))
            if codes is not None:
                codes[code] = codes.get(code, 0) + 1
            if (k + 1) % (batch // 4) == 0:
                yield spans_to_json_line(list(exporter.get_finished_spans())) + "\n"
                exporter.clear()
        finished = list(exporter.get_finished_spans())
        if finished:
            yield spans_to_json_line(finished) + "\n"
        provider.shutdown()


def write(path: Path, requests: int = int(RATE * DURATION_S), seed: int = 1) -> Truth:
    """Write a run to `path` (gzip when it ends in .gz); return its truth."""
    codes: dict[int, int] = {}
    with (gzip.open(path, "wt") if path.suffix == ".gz" else path.open("w")) as out:
        for line in lines(requests, seed, codes=codes):
            out.write(line)
    return truth(requests, codes.get(500, 0), codes.get(499, 0))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=int, default=int(RATE * DURATION_S))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(write(args.out, args.requests, args.seed))
