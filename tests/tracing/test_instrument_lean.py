"""The lean path stores the same rows as the SDK path for the same request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracing
from analysis.engine.connect import connect
from tests.tracing.otel_helpers import spans
from tracing import schema as S
from tracing.exporters import append_span
from tracing.lean import LeanRecorder, LeanRequest
from tracing.rows import SpanBatch

__all__ = ["spans"]

T0 = 1_800_000_000_000_000_000


def _canonical(table: pa.Table, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Rows with ids replaced by span names (ids are random on both paths), sorted by name."""
    rows = table.to_pylist()
    names = {r["SpanId"]: r["SpanName"] for r in rows}
    for r in rows:
        r["TraceId"] = "trace"
        r["SpanId"] = names[r["SpanId"]]
        r["ParentSpanId"] = names.get(r["ParentSpanId"], r["ParentSpanId"] and "remote")
        for col in drop:
            del r[col]
    return sorted(rows, key=lambda r: r["SpanId"])


def _sdk_request(fail: bool) -> None:
    req = tracing.request(model="llama", model_version="v3", tenant="acme", input_tokens=40, stream=True,
                          operation="chat", start_ns=T0)
    req.record_stage(tracing.NETWORK, T0 + 1, T0 + 10, hop="gateway")
    req.record_stage(tracing.QUEUE_WAIT, T0 + 10, T0 + 100)
    gen = req.start_stage(tracing.GENERATION, start_ns=T0 + 100)
    req.record_stage(tracing.PREFILL, T0 + 100, T0 + 150)
    req.first_token(T0 + 150)
    decode = req.start_stage(tracing.DECODE, start_ns=T0 + 150)
    if fail:
        exc = MemoryError("KV cache exhausted")
        decode.fail(exc)
        decode.end(T0 + 170)
        gen.fail(exc)
        gen.end(T0 + 170)
        req.fail(exc)
    else:
        decode.end(T0 + 400)
        gen.end(T0 + 400)
        req.set(output_tokens=26)
    req.end(T0 + 450)


def _lean_request(rec: LeanRecorder, fail: bool) -> LeanRequest:
    req = rec.request(model="llama", model_version="v3", tenant="acme", input_tokens=40, stream=True,
                      operation="chat", start_ns=T0)
    req.record_stage(tracing.NETWORK, T0 + 1, T0 + 10, hop="gateway")
    req.record_stage(tracing.QUEUE_WAIT, T0 + 10, T0 + 100)
    gen = req.start_stage(tracing.GENERATION, start_ns=T0 + 100)
    req.record_stage(tracing.PREFILL, T0 + 100, T0 + 150)
    req.first_token(T0 + 150)
    decode = req.start_stage(tracing.DECODE, start_ns=T0 + 150)
    if fail:
        exc = MemoryError("KV cache exhausted")
        req.fail_stage(decode, exc)
        req.end_stage(decode, T0 + 170)
        req.fail_stage(gen, exc)
        req.end_stage(gen, T0 + 170)
        req.fail(exc)
    else:
        req.end_stage(decode, T0 + 400)
        req.end_stage(gen, T0 + 400)
        req.set(output_tokens=26)
    req.finish(T0 + 450)
    return req


def _sdk_rows(exporter: InMemorySpanExporter) -> pa.Table:
    batch = SpanBatch()
    for span in exporter.get_finished_spans():
        append_span(batch, span)
    return batch.to_table()


def test_lean_rows_equal_sdk_rows(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)  # the SDK's, which the spans fixture installed
    rec = LeanRecorder(tmp_path / "store", resource=provider.resource, background=False)
    for fail in (False, True):
        spans.clear()
        _sdk_request(fail)
        lean = rec.build([_lean_request(rec, fail)]).to_table()
        rec._pending.clear()
        sdk = _sdk_rows(spans)
        assert len(sdk) == len(lean) == 6
        if fail:  # the SDK path keeps the exception event (stack trace); the lean path does not
            assert _canonical(sdk, ("Events",)) == _canonical(lean, ("Events",))
            assert [r["Outcome"] for r in lean.to_pylist() if r["IsRequest"]] == ["error"]
        else:
            assert _canonical(sdk) == _canonical(lean)
    rec.close()


def test_emitted_spans_equal_direct_rows(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    emitter = LeanRecorder(tracer_provider=provider, resource=provider.resource, background=False)
    direct = LeanRecorder(tmp_path / "store", resource=provider.resource, background=False)
    for fail in (False, True):
        exporter.clear()
        _lean_request(emitter, fail)
        assert emitter.flush() == 6
        rows = direct.build([_lean_request(direct, fail)]).to_table()
        direct._pending.clear()
        assert _canonical(_sdk_rows(exporter)) == _canonical(rows)
    provider.shutdown()


def test_lean_store_gives_request_rows(tmp_path: Path) -> None:
    rec = LeanRecorder(tmp_path / "store", service_name="api", replica_id="replica-2", flush_interval_s=0.05)
    _lean_request(rec, fail=False)
    with rec.request(model="m", tenant="t") as req:
        with req.stage(tracing.QUEUE_WAIT):
            pass
        req.set_outcome("timeout", "DeadlineExceeded")
    rec.close()
    assert rec.written_spans == 8 and rec.dropped_requests == 0
    rows = connect(tmp_path / "store").execute(
        "SELECT status, replica, service, model, e2e_ns, ttft_ns, tpot_ns, network_ns, queue_wait_ns, prefill_ns, "
        "decode_ns, other_ns FROM requests ORDER BY model").fetchall()
    assert rows[0] == ("ok", "replica-2", "api", "llama", 450, 150, round((450 - 150) / 25), 9, 90, 50, 250, 51)
    assert rows[1][:4] == ("timeout", "replica-2", "api", "m")


def test_pending_requests_are_bounded(tmp_path: Path) -> None:
    rec = LeanRecorder(tmp_path / "store", max_pending=5, background=False)
    for i in range(8):
        with rec.request(model="m", tenant=f"t{i}"):
            pass
    assert rec.dropped_requests == 3 and rec.recorded_requests == 8
    assert rec.flush() == 5
    tenants = [r[0] for r in connect(tmp_path / "store").execute("SELECT tenant FROM requests ORDER BY tenant")
               .fetchall()]
    assert tenants == ["t3", "t4", "t5", "t6", "t7"]  # the oldest were dropped


def test_lean_request_continues_a_propagated_trace(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    with tracing.request(model="m") as parent:
        carrier = tracing.inject(request=parent)
    rec = LeanRecorder(tmp_path / "store", background=False)
    with rec.request(model="m", carrier=carrier):
        pass
    (row,) = rec.build(list(rec._pending)).to_table().to_pylist()
    ctx = parent.span.get_span_context()
    assert row["TraceId"] == format(ctx.trace_id, "032x")
    assert row["ParentSpanId"] == format(ctx.span_id, "016x")
    assert row["SpanAttributes"][0] == (S.ATTR_REQUEST, "true")
