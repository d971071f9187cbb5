"""Exporters and the batch processor that `tracing.configure` wires together.

- `SegmentStoreExporter` turns finished SDK spans into stored rows (`tracing.rows.SpanBatch`)
  and writes them as segments of a store (`tracing.store.SegmentWriter`). The rows are
  exactly those the OTLP path would store (`otlp.decode_protobuf(encode_spans(spans))`).
- `GuardedExporter` wraps any exporter so that a failure is logged (rate-limited) and
  counted, never raised into the host.
- `BoundedBatchProcessor` queues spans in one bounded deque per exporter (the oldest is
  dropped and counted when that backend is down) and exports each from its own thread.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracing import schema as S
from tracing.rows import SpanBatch, attr_str, replica_of

__all__ = [
    "BoundedBatchProcessor",
    "GuardedExporter",
    "SegmentStoreExporter",
    "append_span",
]

_log = logging.getLogger("tailscope.exporters")
#: Seconds between two log lines about the same recurring telemetry problem.
LOG_EVERY_S = 60.0


class _RateLimitedLog:
    """Logs the first occurrence of a problem, then at most once per LOG_EVERY_S with a count."""

    def __init__(self) -> None:
        self._last = 0.0
        self._since = 0

    def __call__(self, msg: str, *args: Any, exc_info: bool = False) -> None:
        self._since += 1
        now = time.monotonic()
        if self._last == 0.0 or now - self._last >= LOG_EVERY_S:
            _log.warning(msg + " (%d time(s) since last report)", *args, self._since, exc_info=exc_info)
            self._last = now
            self._since = 0


# --- rows from SDK spans ------------------------------------------------------------------

_RESOURCE_CACHE: dict[int, tuple[Resource, dict[str, str], str, str | None]] = {}


def _resource_row(resource: Resource) -> tuple[dict[str, str], str, str | None]:
    cached = _RESOURCE_CACHE.get(id(resource))
    if cached is not None and cached[0] is resource:
        return cached[1], cached[2], cached[3]
    attrs = {k: attr_str(v) for k, v in resource.attributes.items()}
    service = attrs.get("service.name", "")
    replica = replica_of(attrs)
    if len(_RESOURCE_CACHE) > 64:
        _RESOURCE_CACHE.clear()
    _RESOURCE_CACHE[id(resource)] = (resource, attrs, service, replica)
    return attrs, service, replica


def _attrs(values: Any) -> dict[str, str]:
    if not values:
        return {}
    return {k: attr_str(v) for k, v in values.items()}


def append_span(batch: SpanBatch, span: ReadableSpan) -> None:
    """Append one finished SDK span to `batch` as the row the OTLP decode path would produce."""
    ctx = span.context
    assert ctx is not None
    resource, service, replica = _resource_row(span.resource)
    parent = span.parent
    scope = span.instrumentation_scope
    trace_state = ctx.trace_state
    batch.append(
        trace_id=format(ctx.trace_id, "032x"),
        span_id=format(ctx.span_id, "016x"),
        parent_span_id=format(parent.span_id, "016x") if parent is not None else "",
        name=span.name,
        kind=S.SPAN_KINDS[span.kind.value + 1],
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        service=service,
        resource=resource,
        attrs=_attrs(span.attributes),
        status_code=S.STATUS_CODES[span.status.status_code.value],
        status_message=span.status.description or "",
        trace_state=",".join(f"{k}={v}" for k, v in trace_state.items()) if trace_state else "",
        scope_name=scope.name if scope is not None else "",
        scope_version=(scope.version or "") if scope is not None else "",
        events=[{"TimestampNs": ev.timestamp, "Name": ev.name, "Attributes": list(_attrs(ev.attributes).items())}
                for ev in span.events],
        links=[{"TraceId": format(ln.context.trace_id, "032x"), "SpanId": format(ln.context.span_id, "016x"),
                "TraceState": "", "Attributes": list(_attrs(ln.attributes).items())}
               for ln in span.links],
        replica=replica,
    )


class SegmentStoreExporter(SpanExporter):
    """Writes spans into a segment store, buffering rows into segments of a useful size.

    A segment is written when `flush_rows` rows are buffered, when the oldest buffered row
    is `flush_interval_s` old (checked on each export and `tick`), and on `force_flush` /
    `shutdown`. If writing fails the rows stay buffered up to `max_buffer_rows`, then the
    buffer is dropped and counted in `dropped_spans`: memory stays bounded.
    """

    def __init__(self, store: Path | str, *, flush_rows: int = 20_000, flush_interval_s: float = 5.0,
                 max_buffer_rows: int = 200_000, durable: bool = False, writer: str | None = None) -> None:
        if flush_rows <= 0 or max_buffer_rows < flush_rows:
            raise ValueError("flush_rows must be > 0 and max_buffer_rows must be >= flush_rows")
        from tracing.store import SegmentWriter

        self.writer = SegmentWriter(Path(store), kind="sdk", durable=durable, writer=writer)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_buffer_rows = max_buffer_rows
        self._batch = SpanBatch()
        self._oldest = 0.0
        self._lock = threading.Lock()
        self._log = _RateLimitedLog()
        self.failed_writes = 0
        self.dropped_spans = 0

    @property
    def store(self) -> Path:
        """The store directory this exporter writes to."""
        return self.writer.store

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Buffer the spans as rows; write a segment when the buffer is big or old enough."""
        with self._lock:
            if spans and not len(self._batch):
                self._oldest = time.monotonic()
            for span in spans:
                append_span(self._batch, span)
            due = len(self._batch) >= self.flush_rows or (
                len(self._batch) > 0 and time.monotonic() - self._oldest >= self.flush_interval_s)
            return self._write_locked() if due else SpanExportResult.SUCCESS

    def tick(self) -> None:
        """Write the buffer if its oldest row has waited `flush_interval_s` (called by the processor)."""
        with self._lock:
            if len(self._batch) and time.monotonic() - self._oldest >= self.flush_interval_s:
                self._write_locked()

    def _write_locked(self) -> SpanExportResult:
        if not len(self._batch):
            return SpanExportResult.SUCCESS
        try:
            self.writer.write(self._batch.to_table())
        except Exception:
            self.failed_writes += 1
            self._log("tailscope: could not write %d spans to %s; keeping them for the next try",
                      len(self._batch), self.store, exc_info=True)
            if len(self._batch) >= self.max_buffer_rows:
                self.dropped_spans += len(self._batch)
                self._batch.clear()
            return SpanExportResult.FAILURE
        self._batch.clear()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write every buffered row now; False if the write failed."""
        with self._lock:
            return self._write_locked() is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Write what is buffered; the exporter is still usable afterwards."""
        self.force_flush()


class GuardedExporter(SpanExporter):
    """Wraps an exporter: exceptions and failures are logged (rate-limited) and counted, never raised."""

    def __init__(self, inner: SpanExporter, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or type(inner).__name__
        self.exported_spans = 0
        self.failed_spans = 0
        self.failed_exports = 0
        self._log = _RateLimitedLog()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the inner exporter; a failure becomes a count and a log line."""
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
            self._log("tailscope: exporter %s raised while exporting %d spans", self.name, len(spans),
                      exc_info=True)
        else:
            if result is not SpanExportResult.SUCCESS:
                self._log("tailscope: exporter %s failed to export %d spans", self.name, len(spans))
        if result is SpanExportResult.SUCCESS:
            self.exported_spans += len(spans)
        else:
            self.failed_exports += 1
            self.failed_spans += len(spans)
        return result

    def tick(self) -> None:
        """Pass the processor's periodic wake-up on to the inner exporter, if it wants one."""
        tick = getattr(self.inner, "tick", None)
        if tick is not None:
            try:
                tick()
            except Exception:
                self._log("tailscope: exporter %s failed in tick", self.name, exc_info=True)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the inner exporter; False (not an exception) when it fails."""
        try:
            return bool(self.inner.force_flush(timeout_millis))
        except Exception:
            self._log("tailscope: exporter %s failed to flush", self.name, exc_info=True)
            return False

    def shutdown(self) -> None:
        """Shut the inner exporter down, logging a failure."""
        try:
            self.inner.shutdown()
        except Exception:
            self._log("tailscope: exporter %s failed to shut down", self.name, exc_info=True)


class _Lane:
    """One exporter's bounded queue and worker thread: a slow or hung exporter stalls only itself."""

    def __init__(self, exporter: SpanExporter, owner: BoundedBatchProcessor) -> None:
        self.exporter = exporter
        self.name = getattr(exporter, "name", None) or type(exporter).__name__
        self.owner = owner
        self.queue: collections.deque[ReadableSpan] = collections.deque()
        self.wake = threading.Event()
        self.export_lock = threading.Lock()
        self.dropped_spans = 0
        self.count_lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name=f"tailscope-export-{self.name}", daemon=True)
        self.thread.start()

    def put(self, span: ReadableSpan) -> None:
        queue = self.queue
        owner = self.owner
        if len(queue) >= owner.max_queue_size:
            try:
                queue.popleft()
            except IndexError:  # the worker took the queue meanwhile: nothing was dropped
                pass
            else:
                with self.count_lock:  # several host threads may drop at once; `+=` alone can lose a count
                    self.dropped_spans += 1
                owner._log("tailscope: span queue of exporter %s full (%d spans); dropping the oldest - "
                           "is its backend down?", self.name, owner.max_queue_size)
        queue.append(span)
        if len(queue) >= owner.max_export_batch_size and not self.wake.is_set():
            self.wake.set()

    def drain(self) -> int:
        """Empty the queue (its spans are not exported); how many spans it held."""
        n = 0
        while True:
            try:
                self.queue.popleft()
            except IndexError:
                return n
            n += 1

    def _work(self) -> None:
        owner = self.owner
        while not owner._shutdown:
            self.wake.wait(owner._delay)
            self.wake.clear()
            if owner._shutdown:
                break
            self.export_all()
            tick = getattr(self.exporter, "tick", None)
            if tick is not None:
                try:
                    tick()
                except Exception:
                    owner._log("tailscope: exporter %s failed in tick", self.name, exc_info=True)
        # shut down: what is still queued goes out on this thread, so a hung exporter keeps only its own lane
        # (and shutdown stops waiting for it at its deadline)
        self.export_all()

    def export_all(self, deadline: float | None = None) -> bool:
        """Export everything queued; False when `deadline` (monotonic) passed while waiting for the worker."""
        timeout = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self.export_lock.acquire(timeout=timeout):
            return False
        try:
            token = otel_context.attach(otel_context.set_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY, True))
            try:
                queue = self.queue
                while queue:
                    batch = []
                    for _ in range(min(self.owner.max_export_batch_size, len(queue))):
                        try:
                            batch.append(queue.popleft())
                        except IndexError:
                            break
                    try:
                        self.exporter.export(batch)
                    except Exception:
                        self.owner._log("tailscope: exporter %s raised", self.name, exc_info=True)
            finally:
                otel_context.detach(token)
        finally:
            self.export_lock.release()
        return True


#: How long `BoundedBatchProcessor.shutdown` waits for the exporters' last exports, all lanes at once (the host's
#: exit waits for it, so a hung backend must not hold it for the exporter's own timeout and retries).
SHUTDOWN_TIMEOUT_MS: Final = 5_000


class BoundedBatchProcessor(SpanProcessor):
    """Batches finished spans to exporters, each with its own bounded queue and background thread.

    When an exporter's queue holds `max_queue_size` spans its oldest is dropped and counted
    (`dropped_spans`), so a dead backend costs bounded memory and never blocks the host, and
    a slow one (an OTLP endpoint that hangs until its timeout) delays only its own exports:
    the store exporter keeps writing.
    """

    def __init__(self, exporters: Sequence[SpanExporter], *, max_queue_size: int = 8192,
                 schedule_delay_millis: float = 1000, max_export_batch_size: int = 512) -> None:
        if max_queue_size <= 0 or schedule_delay_millis <= 0 or max_export_batch_size <= 0:
            raise ValueError("max_queue_size, schedule_delay_millis and max_export_batch_size must be > 0")
        if max_export_batch_size > max_queue_size:
            raise ValueError("max_export_batch_size must be less than or equal to max_queue_size")
        self.exporters = list(exporters)
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self._delay = schedule_delay_millis / 1e3
        self._log = _RateLimitedLog()
        self._start_worker()
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._start_worker)

            def _after_fork() -> None:
                method = ref()
                if method is not None:
                    method()

            os.register_at_fork(after_in_child=_after_fork)

    def _start_worker(self) -> None:
        self._shutdown = False
        self._lanes = [_Lane(exporter, self) for exporter in self.exporters]

    @property
    def dropped_spans(self) -> int:
        """Spans dropped by full queues, summed over the exporters."""
        return sum(lane.dropped_spans for lane in self._lanes)

    @property
    def queued_spans(self) -> int:
        """Spans waiting in the fullest exporter queue."""
        return max((len(lane.queue) for lane in self._lanes), default=0)

    @property
    def _queue(self) -> collections.deque[ReadableSpan]:
        """The first exporter's queue (the only one with a single exporter)."""
        return self._lanes[0].queue if self._lanes else collections.deque()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a finished span for every exporter (dropping the oldest when full); never blocks."""
        if self._shutdown or not span.context.trace_flags.sampled:  # type: ignore[union-attr]
            return
        for lane in self._lanes:
            lane.put(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued and flush the exporters; False if one could not flush in time."""
        deadline = time.monotonic() + timeout_millis / 1e3
        ok = True
        for lane in self._lanes:
            ok = lane.export_all(deadline) and ok
        for exporter in self.exporters:
            try:
                left = max(0, int((deadline - time.monotonic()) * 1e3))
                ok = bool(exporter.force_flush(left)) and ok
            except Exception:
                ok = False
        return ok

    def shutdown(self, timeout_millis: int = SHUTDOWN_TIMEOUT_MS) -> None:
        """Stop the workers, export what is queued, and shut the exporters down, within `timeout_millis` in all.

        Each lane exports its last spans on its own thread and every lane is waited for at once, so an exporter
        stuck on a hung backend neither delays the others nor holds the host's exit past the deadline: its lane
        (a daemon thread) is left behind and its queued spans are counted as dropped.
        """
        if self._shutdown:
            return
        self._shutdown = True
        deadline = time.monotonic() + timeout_millis / 1e3
        for lane in self._lanes:
            lane.wake.set()
        pending = list(self._lanes)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            pending[0].thread.join(timeout=min(left, 0.05))
            pending = [lane for lane in pending if lane.thread.is_alive()]
        for lane in pending:
            # taken out of the queue, so the lane's thread cannot export later what is counted here as dropped
            dropped = lane.drain()
            with lane.count_lock:
                lane.dropped_spans += dropped
            self._log("tailscope: exporter %s still busy at shutdown after %d ms; %d queued span(s) dropped",
                      lane.name, timeout_millis, dropped)
        for exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception:
                self._log("tailscope: exporter %s failed to shut down", type(exporter).__name__, exc_info=True)
