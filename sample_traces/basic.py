"""A small OTLP/JSON sample made with the real OpenTelemetry SDK: a few hundred LLM requests.

Every request is one trace: a SERVER request span with stage children (queue_wait,
preprocess, optional model_load, generation with prefill and decode, streaming), made
with explicit timestamps from a seeded generator so the file is the same on every run.

    python -m sample_traces.basic [OUT]   # default: sample_traces/data/basic.otlp.jsonl.gz
"""

from __future__ import annotations

import gzip
import random
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.util.types import AttributeValue

from tracing import schema as S
from tracing.otlp_json import spans_to_json_line

DEFAULT_OUT = Path(__file__).parent / "data" / "basic.otlp.jsonl.gz"
START_NS = 1_763_647_200_000_000_000  # 2025-11-20T14:00:00Z
MS = 1_000_000


#: gzip level of the written samples: 9, the committed files' (the smallest); a test that only reads the text back
#: (tests/sample_traces/test_committed_samples.py) sets it lower, as the level changes the bytes but not the text.
GZIP_LEVEL = 9


def write_lines(path: Path, lines: list[str]) -> Path:
    """Write OTLP/JSON lines gzipped, reproducibly (mtime 0, at GZIP_LEVEL), making its directory; return `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", compresslevel=GZIP_LEVEL, mtime=0) as fh:
        fh.write(("\n".join(lines) + "\n").encode())
    return path


class SeededIds(IdGenerator):
    """Deterministic trace and span ids from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


def generate(out: Path = DEFAULT_OUT, requests: int = 400, seed: int = 7) -> Path:
    """Write `requests` traces from 4 replicas to `out` (gzip OTLP/JSON lines)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for replica in range(4):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(
            resource=Resource.create({"service.name": "llm-server",
                                      "service.instance.id": f"replica-{replica:02d}"}),
            id_generator=SeededIds(seed * 100 + replica),
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("sample_traces.basic", "0.1.0")
        for i in range(requests // 4):
            _one_request(tracer, rng, START_NS + (i * 4 + replica) * 150 * MS, replica)
        provider.shutdown()
        spans = list(exporter.get_finished_spans())
        for k in range(0, len(spans), 64):
            lines.append(spans_to_json_line(spans[k:k + 64]))
    return write_lines(out, lines)


def _one_request(tracer: trace.Tracer, rng: random.Random, t0: int, replica: int) -> None:
    input_tokens = int(rng.lognormvariate(6.0, 0.8)) + 1
    output_tokens = int(rng.lognormvariate(5.0, 0.7)) + 2
    queue = int(rng.expovariate(1 / 20) * MS)
    pre = int((1 + input_tokens / 500) * MS)
    load = 2_000 * MS if rng.random() < 0.01 else 0
    prefill = int((15 + input_tokens * 0.05) * MS * (1.6 if replica == 3 else 1.0))
    per_token = int(rng.uniform(18, 24) * MS)
    decode = per_token * (output_tokens - 1)
    tail = int(rng.uniform(1, 4) * MS)
    t_queue = t0 + int(0.5 * MS)
    t_pre = t_queue + queue
    t_load = t_pre + pre
    t_gen = t_load + load
    t_dec = t_gen + prefill
    t_end_gen = t_dec + decode
    t_end = t_end_gen + tail
    attrs: dict[str, AttributeValue] = {
        S.ATTR_REQUEST: True,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "llama-3-8b",
        S.ATTR_MODEL_VERSION: "v1",
        S.ATTR_TENANT: rng.choice(["acme", "globex", "initech"]),
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.request.stream": True,
    }
    root = tracer.start_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER,
                             start_time=t0, attributes=attrs)
    ctx = trace.set_span_in_context(root)

    def stage(name: str, start: int, end: int, parent: trace.Context = ctx) -> trace.Span:
        span = tracer.start_span(name, context=parent, start_time=start, attributes={S.ATTR_STAGE: name})
        span.end(end_time=end)
        return span

    stage("queue_wait", t_queue, t_pre)
    stage("preprocess", t_pre, t_load)
    if load:
        stage("model_load", t_load, t_gen)
    gen = tracer.start_span("generation", context=ctx, start_time=t_gen, attributes={S.ATTR_STAGE: "generation"})
    gen_ctx = trace.set_span_in_context(gen)
    stage("prefill", t_gen, t_dec, gen_ctx)
    stage("decode", t_dec, t_end_gen, gen_ctx)
    gen.end(end_time=t_end_gen)
    stage("streaming", t_dec, t_end)
    failed = rng.random() < 0.01
    if failed:
        root.set_status(trace.Status(trace.StatusCode.ERROR, "worker crashed"))
        root.set_attribute(S.ATTR_ERROR_TYPE, "WorkerCrashed")
    root.end(end_time=t_end)


if __name__ == "__main__":
    print(generate(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT))
