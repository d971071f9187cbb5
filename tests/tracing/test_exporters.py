"""The store exporter stores exactly what the OTLP path stores; failures are counted, never raised."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState

import tracing
from intake.otlp import decode_protobuf
from tests.tracing.otel_helpers import spans
from tracing import schema as S
from tracing.exporters import BoundedBatchProcessor, GuardedExporter, SegmentStoreExporter, append_span
from tracing.rows import SpanBatch
from tracing.store import segment_files

__all__ = ["spans"]


def _varied_spans(exporter: InMemorySpanExporter) -> Sequence[ReadableSpan]:
    """Requests through every stage, failures with exception events, links, trace state, odd attribute types."""
    for i in range(3):
        with tracing.request(model="llama", model_version="v1", tenant=f"t{i}", input_tokens=10 + i,
                             stream=bool(i % 2), attributes={"floats": (0.1, 2.5), "flags": [True, False],
                                                             "names": ("a", "b"), "ratio": 1 / 3, "big": 2**62}) as req:
            for name in (tracing.NETWORK, tracing.QUEUE_WAIT, tracing.PREPROCESS, tracing.MODEL_LOAD):
                with req.stage(name, shard=i):
                    pass
            with req.stage(tracing.GENERATION):
                with req.stage(tracing.PREFILL):
                    pass
                req.first_token()
                with req.stage(tracing.DECODE):
                    pass
            with tracing.stream(iter("xyz")) as out:
                list(out)
    with pytest.raises(RuntimeError), tracing.request(model="llama") as req, req.stage(tracing.DECODE):
        raise RuntimeError("out of memory: ü")
    tracer = trace.get_tracer("host", "1.2")
    linked = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    parent = trace.set_span_in_context(trace.NonRecordingSpan(linked))
    with tracer.start_as_current_span("remote-child", context=parent, links=[Link(linked, {"why": "retry"})],
                                      kind=trace.SpanKind.CONSUMER) as span:
        span.add_event("tick", {"n": 1, "f": 0.5})
        span.set_status(trace.Status(trace.StatusCode.OK))
    return exporter.get_finished_spans()


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("SpanId", "ascending")])


def test_rows_equal_the_otlp_decode_path(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    finished = _varied_spans(spans)
    assert len(finished) == 3 * 9 + 2 + 1
    direct = SpanBatch()
    for span in finished:
        append_span(direct, span)
    via_otlp = SpanBatch()
    result = decode_protobuf(encode_spans(finished).SerializeToString(), via_otlp, strict=True)
    assert result.accepted == len(finished) and result.rejected == 0
    expected = _sorted(via_otlp.to_table())
    assert _sorted(direct.to_table()).equals(expected)

    exporter = SegmentStoreExporter(tmp_path / "store", flush_rows=7, max_buffer_rows=100)
    assert exporter.export(finished) is SpanExportResult.SUCCESS  # a segment: over flush_rows
    assert exporter.force_flush()
    stored = pa.concat_tables([pq.read_table(p) for p in segment_files(tmp_path / "store")])
    assert _sorted(stored.cast(S.SPAN_SCHEMA)).equals(expected)
    # the promoted columns are what the convention says
    req_rows = [r for r in expected.to_pylist() if r["IsRequest"]]
    assert sorted(r["Outcome"] for r in req_rows) == ["error", "ok", "ok", "ok"]
    assert {r["Replica"] for r in expected.to_pylist()} == {"r0"}
    assert {r["Tenant"] for r in req_rows} == {"t0", "t1", "t2", None}


def test_store_exporter_buffers_then_writes_on_flush(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    finished = _varied_spans(spans)
    exporter = SegmentStoreExporter(tmp_path / "store", flush_interval_s=3600)
    assert exporter.export(finished) is SpanExportResult.SUCCESS
    assert segment_files(tmp_path / "store") == []
    exporter.shutdown()
    assert len(segment_files(tmp_path / "store")) == 1
    assert exporter.writer.spans_written == len(finished)


class _BrokenWriter:
    """A segment writer whose disk is full."""

    store = Path("/nonexistent")

    def write(self, table: pa.Table) -> list[Path]:
        raise OSError(28, "No space left on device")


def test_store_failure_keeps_memory_bounded(spans: InMemorySpanExporter, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    finished = _varied_spans(spans)
    exporter = SegmentStoreExporter(tmp_path / "store", flush_rows=10, max_buffer_rows=40)
    exporter.writer = _BrokenWriter()  # type: ignore[assignment]  # a stand-in writer whose disk is full
    guarded = GuardedExporter(exporter, "store")
    with caplog.at_level(logging.WARNING, logger="tailscope.exporters"):
        for _ in range(10):
            assert guarded.export(finished) is SpanExportResult.FAILURE
    assert len(exporter._batch) < 40 + len(finished)
    assert exporter.dropped_spans > 0 and exporter.failed_writes == 10
    assert guarded.failed_exports == 10 and guarded.failed_spans == 10 * len(finished)
    assert len([r for r in caplog.records if "could not write" in r.getMessage()]) == 1  # rate-limited


class _Raising(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionRefusedError("backend down")


def test_guarded_exporter_never_raises() -> None:
    guarded = GuardedExporter(_Raising())
    assert guarded.export([]) is SpanExportResult.FAILURE
    assert guarded.failed_exports == 1


class _Blocked(SpanExporter):
    """An exporter stuck until released (a backend that hangs)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.seen = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(60)
        self.seen += len(spans)
        return SpanExportResult.SUCCESS


def test_batch_processor_drops_oldest_when_full(spans: InMemorySpanExporter) -> None:
    blocked = _Blocked()
    processor = BoundedBatchProcessor([blocked], max_queue_size=8, schedule_delay_millis=10,
                                      max_export_batch_size=2)
    finished = list(_varied_spans(spans))
    processor.on_end(finished[0])
    processor.on_end(finished[1])
    assert blocked.entered.wait(60)  # the worker is stuck inside export with 2 spans
    for span in finished[2:]:
        processor.on_end(span)
    assert len(processor._queue) == 8
    assert processor.dropped_spans == len(finished) - 2 - 8
    assert list(processor._queue) == finished[-8:]  # the newest are kept
    blocked.release.set()
    processor.shutdown()
    assert blocked.seen == 10


def test_batch_processor_rules() -> None:
    with pytest.raises(ValueError, match="max_export_batch_size must be less than or equal to max_queue_size"):
        BoundedBatchProcessor([], max_queue_size=4, max_export_batch_size=8)
    with pytest.raises(ValueError, match="must be > 0"):
        BoundedBatchProcessor([], max_queue_size=0)
