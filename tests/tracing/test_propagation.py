"""Propagation through a queue: an API process and a real worker process make one trace."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import tracing
from analysis.engine.connect import connect
from tests.tracing.otel_helpers import reset_globals, span_id, spans, trace_id
from tracing import schema as S

__all__ = ["spans"]

HOLD_S = 0.2  # the worker leaves each message in the queue at least this long


def worker_main(jobs: Any, results: Any) -> None:
    """The worker process: its own provider, resume each job's request, send spans back."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    while True:
        job = jobs.get()
        if job is None:
            break
        time.sleep(max(0.0, HOLD_S - (time.time_ns() - int(job["headers"][tracing.propagation.ENQUEUED_NS_KEY])) / 1e9))
        dequeued = time.time_ns()
        error = None
        req = tracing.resume(job["headers"], dequeued_ns=dequeued)
        try:
            with req:
                with req.stage(tracing.PREPROCESS):
                    tokens = job["prompt"].split()
                with req.stage(tracing.GENERATION):
                    with req.stage(tracing.PREFILL):
                        time.sleep(0.01)
                    req.first_token()
                    with req.stage(tracing.DECODE):
                        if job.get("fail"):
                            raise RuntimeError("decode failed")
                        time.sleep(0.01)
                req.set(output_tokens=len(tokens))
        except RuntimeError as exc:
            error = str(exc)
        finished = [
            {"name": s.name, "trace": s.context.trace_id, "id": s.context.span_id,
             "parent": s.parent.span_id if s.parent else None, "start": s.start_time, "end": s.end_time,
             "attrs": dict(s.attributes or {}), "status": s.status.status_code.name}
            for s in exporter.get_finished_spans()
        ]
        exporter.clear()
        results.put({"telemetry": req.report(), "spans": finished, "dequeued": dequeued, "error": error})


def test_inject_extract_roundtrip(spans: InMemorySpanExporter) -> None:
    with tracing.request(model="m") as req:
        carrier = tracing.inject(request=req, enqueued_ns=123)
    assert carrier[tracing.propagation.ENQUEUED_NS_KEY] == "123"
    assert carrier["traceparent"].split("-")[1] == format(req.span.get_span_context().trace_id, "032x")
    ctx = tracing.extract({k.upper(): v for k, v in carrier.items()})
    from opentelemetry import trace

    assert trace.get_current_span(ctx).get_span_context().span_id == req.span.get_span_context().span_id


@pytest.mark.parametrize("fail", [False, True])
def test_cross_process_queue_is_one_trace(spans: InMemorySpanExporter, fail: bool) -> None:
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=worker_main, args=(jobs, results), daemon=True)
    proc.start()
    try:
        with tracing.request(model="m", tenant="acme", stream=False) as req:
            headers = tracing.inject(request=req)
            enqueued = int(headers[tracing.propagation.ENQUEUED_NS_KEY])
            jobs.put({"prompt": "one two three four", "headers": dict(headers), "fail": fail})
            reply = results.get(timeout=120)
            tracing.apply_report(req, reply["telemetry"])
    finally:
        jobs.put(None)
        proc.join(timeout=60)
        if proc.is_alive():  # stuck: ended, not left running after the test
            proc.kill()
            proc.join(timeout=30)
    assert proc.exitcode == 0
    (root,) = spans.get_finished_spans()
    worker = {s["name"]: s for s in reply["spans"]}
    assert set(worker) == {"queue_wait", "preprocess", "generation", "prefill", "decode"}
    for s in worker.values():
        assert s["trace"] == trace_id(root)
        assert s["attrs"][S.ATTR_STAGE] == s["name"]
    for name in ("queue_wait", "preprocess", "generation"):
        assert worker[name]["parent"] == span_id(root)
    assert worker["prefill"]["parent"] == worker["generation"]["id"]
    assert worker["decode"]["parent"] == worker["generation"]["id"]
    qw = worker["queue_wait"]
    assert (qw["start"], qw["end"]) == (enqueued, reply["dequeued"])
    assert qw["end"] - qw["start"] >= HOLD_S * 1e9
    assert root.start_time <= qw["start"] and worker["decode"]["end"] <= root.end_time
    attrs = root.attributes or {}
    ttft = attrs[S.ATTR_TTFT_NS]
    assert worker["prefill"]["end"] - root.start_time <= ttft <= worker["decode"]["start"] - root.start_time
    if fail:
        assert reply["error"] == "decode failed"
        assert worker["decode"]["status"] == "ERROR" and worker["generation"]["status"] == "ERROR"
        assert attrs[S.ATTR_OUTCOME] == "error" and attrs[S.ATTR_ERROR_TYPE] == "RuntimeError"
        assert root.status.status_code is StatusCode.ERROR
    else:
        assert attrs[S.ATTR_OUTCOME] == "ok" and attrs[S.OUTPUT_TOKEN_KEYS[0]] == 4
        assert root.status.status_code is StatusCode.UNSET


def store_worker_main(store: str, jobs: Any, results: Any) -> None:
    """A worker process writing its stage spans to the shared store as replica worker-0."""
    telemetry = tracing.configure("worker", replica_id="worker-0", store=store)
    while (job := jobs.get()) is not None:
        time.sleep(HOLD_S)
        with tracing.resume(job) as req:
            with req.stage(tracing.PREPROCESS):
                pass
            with req.stage(tracing.GENERATION):
                with req.stage(tracing.PREFILL):
                    time.sleep(0.01)
                req.first_token()
                with req.stage(tracing.DECODE):
                    time.sleep(0.02)
            req.set(output_tokens=8)
            results.put(req.report())
    telemetry.shutdown()


def test_cross_process_queue_in_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    reset_globals()
    telemetry = tracing.configure("api", replica_id="api-0", store=store)
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=store_worker_main, args=(str(store), jobs, results), daemon=True)
    proc.start()
    try:
        for _ in range(3):
            with tracing.request(model="m", tenant="acme") as req:
                jobs.put(dict(tracing.inject(request=req)))
                tracing.apply_report(req, results.get(timeout=120))
    finally:
        jobs.put(None)
        proc.join(timeout=60)
        if proc.is_alive():  # stuck: ended, not left running after the test
            proc.kill()
            proc.join(timeout=30)
        telemetry.shutdown()
        reset_globals()
    assert proc.exitcode == 0
    rows = connect(store).execute(
        "SELECT replica, status, output_tokens, queue_wait_ns, prefill_ns, decode_ns, ttft_ns, e2e_ns FROM requests"
    ).fetchall()
    assert len(rows) == 3
    for replica, status, output_tokens, queue_wait, prefill, decode, ttft, e2e in rows:
        assert (replica, status, output_tokens) == ("worker-0", "ok", 8)  # served by the worker
        assert HOLD_S * 1e9 <= queue_wait < e2e
        assert prefill >= 0.01e9 and decode >= 0.02e9
        assert queue_wait + prefill <= ttft < e2e
