"""Instrumentation cost per request: bare OpenTelemetry SDK code vs tailscope's path vs the lean path.

One request = a request span + 6 stage spans (network, queue_wait, preprocess, generation
with prefill and decode) with ~6 attributes each. The paths are measured side by side in
one run, in interleaved rounds (the order rotates each round; each path's queue is drained
between rounds, untimed, so no path pays for another's backlog); the median is reported.

- bare SDK: `start_as_current_span` for every span, BatchSpanProcessor, discarding exporter
- tailscope: `tracing.request` / `req.stage` on the provider `tracing.configure` builds
  (its bounded batch processor, a discarding exporter)
- tailscope API on the SDK's BatchSpanProcessor (to separate API cost from processor cost)
- lean: `LeanRecorder` on the request thread; the row building and segment write it defers
  to a background thread are measured too, per request, and reported separately
- for the same stored rows through the SDK: tailscope's path with the store exporter, on the
  request thread and including the exporter's row build and segment write (the bare SDK
  line discards its spans, so it includes no export work at all)

    python -m benchmarks.bench_instrumentation [--requests 300] [--rounds 30] [--cpu-time]

`--cpu-time` times with the request thread's CPU clock instead of the wall clock: steadier on
a loaded machine, but it leaves out work handed to other threads (so the flush lines, which
wait for the exporter's thread, are only meaningful on the wall clock).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once
from opentelemetry.util.types import AttributeValue

import tracing
from tracing import schema as S
from tracing.lean import LeanRecorder
from tracing.store import SegmentWriter

STAGE_ATTRS: dict[str, AttributeValue] = {"replica.slot": 3, "gen_ai.request.max_tokens": 256, "batch.size": 8,
                                          "gpu.id": "0", "kv.blocks": 112}
REQUEST_ATTRS: dict[str, AttributeValue] = {S.MODEL_KEYS[0]: "llama-3-8b", S.ATTR_MODEL_VERSION: "v7",
                                            S.ATTR_TENANT: "acme", S.INPUT_TOKEN_KEYS[0]: 412, S.ATTR_STREAMING: True}
FLAT = (tracing.NETWORK, tracing.QUEUE_WAIT, tracing.PREPROCESS)


class Discard(SpanExporter):
    """Drops every span (the cost measured is the instrumentation's, not a backend's)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Accept and forget."""
        return SpanExportResult.SUCCESS


def _install(provider: TracerProvider) -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace.set_tracer_provider(provider)


def bare_sdk(tracer: trace.Tracer) -> Callable[[], None]:
    """One request written the way plain OpenTelemetry code writes it."""
    stage_attrs: list[dict[str, AttributeValue]] = [{S.ATTR_STAGE: name, **STAGE_ATTRS} for name in S.ALL_STAGES]
    by_name = dict(zip(S.ALL_STAGES, stage_attrs, strict=True))
    root_attrs: dict[str, AttributeValue] = {S.ATTR_REQUEST: True, **REQUEST_ATTRS}

    def one() -> None:
        with tracer.start_as_current_span("inference llama-3-8b", kind=SpanKind.SERVER, attributes=root_attrs) as root:
            for name in FLAT:
                with tracer.start_as_current_span(name, attributes=by_name[name]):
                    pass
            with tracer.start_as_current_span(tracing.GENERATION, attributes=by_name[tracing.GENERATION]):
                with tracer.start_as_current_span(tracing.PREFILL, attributes=by_name[tracing.PREFILL]):
                    pass
                with tracer.start_as_current_span(tracing.DECODE, attributes=by_name[tracing.DECODE]):
                    pass
            root.set_attributes({S.ATTR_OUTCOME: "ok", S.OUTPUT_TOKEN_KEYS[0]: 128, S.ATTR_TTFT_NS: 1_000})

    return one


def _one_request(entry: Any) -> None:
    """One request with every stage through `entry.request` (the tracing module or a lean recorder)."""
    with entry.request(model="llama-3-8b", model_version="v7", tenant="acme", input_tokens=412,
                       stream=True) as req:
        for name in FLAT:
            with req.stage(name, **STAGE_ATTRS):
                pass
        with req.stage(tracing.GENERATION, **STAGE_ATTRS):
            with req.stage(tracing.PREFILL, **STAGE_ATTRS):
                pass
            req.first_token()
            with req.stage(tracing.DECODE, **STAGE_ATTRS):
                pass
        req.set(output_tokens=128)


def tailscope_path() -> None:
    """One request through tracing.request / req.stage."""
    _one_request(tracing)


def lean_path(rec: LeanRecorder) -> Callable[[], None]:
    """One request through the lean recorder."""
    return lambda: _one_request(rec)


_clock: Callable[[], float] = time.perf_counter


def _per_request_us(fn: Callable[[], None], n: int) -> float:
    start = _clock()
    for _ in range(n):
        fn()
    return (_clock() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per path per round")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cpu-time", action="store_true", help="time with the request thread's CPU clock")
    args = parser.parse_args(argv)
    global _clock
    _clock = time.thread_time if args.cpu_time else time.perf_counter
    n = args.requests
    resource = Resource.create({"service.name": "bench", "service.instance.id": "replica-0"})

    bare_provider = TracerProvider(resource=resource)
    bare_provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 16))
    bare = bare_sdk(bare_provider.get_tracer("bench"))

    sdk_bsp_provider = TracerProvider(resource=resource)
    sdk_bsp_provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 16))

    telemetry = tracing.configure("bench", replica_id="replica-0", exporters="none", extra_exporters=[Discard()],
                                  set_global=False, max_queue_size=1 << 16)

    tmp = Path(tempfile.mkdtemp(prefix="tailscope-bench-"))
    stored = tracing.configure("bench", replica_id="replica-0", exporters="store", store=tmp / "sdk-store",
                               set_global=False, store_flush_s=3600, max_queue_size=1 << 20)
    rec = LeanRecorder(writer=SegmentWriter(tmp / "store", kind="bench"), resource=resource, background=False)
    lean = lean_path(rec)

    results: dict[str, list[float]] = {"bare": [], "tailscope": [], "tailscope_sdk_bsp": [], "lean": [],
                                       "lean_rows": [], "stored": [], "stored_rows": []}
    def run_bare() -> float:
        us = _per_request_us(bare, n)
        bare_provider.force_flush()
        return us

    def run_tailscope() -> float:
        _install(telemetry.provider)
        us = _per_request_us(tailscope_path, n)
        telemetry.flush()
        return us

    def run_tailscope_bsp() -> float:
        _install(sdk_bsp_provider)
        us = _per_request_us(tailscope_path, n)
        sdk_bsp_provider.force_flush()
        return us

    def run_lean() -> float:
        us = _per_request_us(lean, n)
        start = _clock()
        rec.flush()
        results["lean_rows"].append((_clock() - start) / n * 1e6)
        return us

    def run_stored() -> float:
        _install(stored.provider)
        us = _per_request_us(tailscope_path, n)
        start = _clock()
        stored.flush()
        results["stored_rows"].append((_clock() - start) / n * 1e6)
        return us

    paths = [("bare", run_bare), ("tailscope", run_tailscope), ("tailscope_sdk_bsp", run_tailscope_bsp),
             ("lean", run_lean), ("stored", run_stored)]
    for round_no in range(args.rounds + 1):  # round 0 warms up; the order rotates every round
        for key, fn in paths[round_no % len(paths):] + paths[:round_no % len(paths)]:
            gc.collect()
            value = fn()
            if round_no:
                results[key].append(value)
            elif key in ("lean", "stored"):
                results[f"{key}_rows"].pop()
    med = {k: statistics.median(v) for k, v in results.items()}
    low = {k: min(v) for k, v in results.items()}
    base = med["bare"]
    print(f"per request (root + 6 stage spans, ~6 attributes each); median of {args.rounds} rounds x {n} requests")
    print(f"{'path':<56}{'median us':>10}{'ratio':>7}{'min us':>9}{'ratio':>7}")
    lines = [
        ("bare OpenTelemetry SDK (start_as_current_span, BSP)", ("bare",)),
        ("tailscope path (tracing.request + configure)", ("tailscope",)),
        ("tailscope API on the SDK's BatchSpanProcessor", ("tailscope_sdk_bsp",)),
        ("lean path, on the request thread", ("lean",)),
        ("lean path, deferred row build + segment write", ("lean_rows",)),
        ("lean path, total", ("lean", "lean_rows")),
        ("tailscope path + store exporter, on the request thread", ("stored",)),
        ("  + its row build + segment write (flush)", ("stored_rows",)),
        ("tailscope path + store exporter, total", ("stored", "stored_rows")),
    ]
    for label, keys in lines:
        m = sum(med[k] for k in keys)
        lo = sum(low[k] for k in keys)
        print(f"{label:<56}{m:>10.1f}{m / base:>7.2f}{lo:>9.1f}{lo / low['bare']:>7.2f}")
    print(f"medians: tailscope / bare = {med['tailscope'] / base:.2f} (target <= 1.00); "
          f"lean / bare = {med['lean'] / base:.2f} (target <= 0.25); "
          f"lean total / bare = {(med['lean'] + med['lean_rows']) / base:.2f}")
    rec.close()
    telemetry.shutdown()
    stored.shutdown()
    bare_provider.shutdown()
    sdk_bsp_provider.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
