"""Each exporter has its own queue and worker: a hung OTLP backend does not stall the store."""

from __future__ import annotations

import collections
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from analysis.engine.connect import connect
from tracing.exporters import BoundedBatchProcessor, GuardedExporter, SegmentStoreExporter

OTLP_TIMEOUT_S = 30


class _Watch(SpanExporter):
    """Wraps the OTLP exporter to record when an export began and whether it returned."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.returned = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        try:
            return self.inner.export(spans)
        finally:
            self.returned.set()

    def shutdown(self) -> None:
        self.inner.shutdown()


def test_a_hung_otlp_endpoint_does_not_stall_the_store(tmp_path: Path) -> None:
    # a loopback socket that accepts connections (the kernel does) and never answers
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    otlp = _Watch(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{hung.getsockname()[1]}/v1/traces",
                                   timeout=OTLP_TIMEOUT_S))
    store_exporter = SegmentStoreExporter(tmp_path / "store", flush_rows=100, flush_interval_s=0.05)
    store = GuardedExporter(store_exporter, "store")
    processor = BoundedBatchProcessor([GuardedExporter(otlp, "otlp"), store], max_queue_size=10_000,
                                      schedule_delay_millis=20, max_export_batch_size=64)
    provider = TracerProvider(resource=Resource.create({"service.name": "lanes"}))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    total = 0
    try:
        for _ in range(10):  # spans keep coming while the OTLP export hangs
            for _ in range(100):
                tracer.start_span("work").end()
                total += 1
            time.sleep(0.05)
        assert otlp.entered.wait(OTLP_TIMEOUT_S)
        for _ in range(600):  # bounded wait for the store's worker (it needs no OTLP answer)
            if store.exported_spans == total:
                break
            time.sleep(0.05)
        hung_still = not otlp.returned.is_set()
        assert store.exported_spans == total
        assert hung_still, "the OTLP export returned before the store had every span: the test proved nothing"
        assert store_exporter.force_flush()
        con = connect(tmp_path / "store")
        assert con.execute("SELECT count(*) FROM spans WHERE ServiceName = 'lanes'").fetchone() == (total,)
        con.close()
        # shutting down (the host exiting) with the OTLP export still hung: the store's lane finishes, the OTLP
        # lane is left behind at the deadline with its queued spans counted, and shutdown returns although the
        # hung export has not (the old shutdown waited for it: its timeout, then its retries)
        for _ in range(200):
            tracer.start_span("late").end()
        queued_otlp = len(processor._lanes[0].queue)
        dropped_before = processor.dropped_spans
        processor.shutdown(timeout_millis=2000)  # long enough for the store's lane on a busy machine
        assert not otlp.returned.is_set(), "the OTLP export returned before shutdown did: the test proved nothing"
        assert processor._lanes[0].thread.is_alive() and not processor._lanes[1].thread.is_alive()
        assert processor.dropped_spans == dropped_before + queued_otlp and queued_otlp > 0
        assert not processor._lanes[0].queue  # what was counted dropped is gone: the hung lane cannot export it later
        con = connect(tmp_path / "store")
        assert con.execute("SELECT count(*) FROM spans WHERE ServiceName = 'lanes'").fetchone() == (total + 200,)
        con.close()
    finally:
        hung.close()


class _Null(SpanExporter):
    """An exporter that takes every span."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _TakenMeanwhile(collections.deque):
    """A queue whose oldest span the lane's worker has just taken: popleft finds it empty."""

    def popleft(self) -> ReadableSpan:
        raise IndexError("pop from an empty deque")


def test_a_full_queue_counts_only_the_spans_it_really_dropped() -> None:
    """When the worker empties a full queue between the host's length check and its drop, nothing was dropped and
    nothing is counted (a span counted both dropped and exported or failed would break dropped + failed = sent)."""
    processor = BoundedBatchProcessor([GuardedExporter(_Null())], max_queue_size=4,
                                      schedule_delay_millis=60_000, max_export_batch_size=4)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    lane = processor._lanes[0]
    lane.export_lock.acquire()  # the worker waits here: the queue holds what the test puts in it
    for _ in range(4):
        tracer.start_span("s").end()
    assert len(lane.queue) == 4 and processor.dropped_spans == 0
    tracer.start_span("s").end()  # full: the oldest is dropped and counted
    assert len(lane.queue) == 4 and processor.dropped_spans == 1
    lane.queue = _TakenMeanwhile(lane.queue)
    tracer.start_span("s").end()  # full by its length, but the oldest is gone when the host drops it
    assert processor.dropped_spans == 1 and len(lane.queue) == 5
    lane.queue = collections.deque(lane.queue)
    lane.export_lock.release()
    processor.shutdown()
    # 6 spans sent: 1 dropped, 5 exported, none counted twice
    assert isinstance(lane.exporter, GuardedExporter)
    assert lane.exporter.exported_spans == 5 and processor.dropped_spans == 1
    provider.shutdown()
