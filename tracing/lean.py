"""The lean path: record a request's timestamps cheaply, build its stored rows later, off the request.

    lean = tracing.LeanRecorder(store, service_name="api", replica_id="replica-0")
    with lean.request(model="m", tenant="acme", input_tokens=412) as req:
        with req.stage("queue_wait"): ...
        with req.stage("generation"):
            with req.stage("prefill"): ...
            req.first_token()
            with req.stage("decode"): ...
        req.set(output_tokens=128)

On the request's thread only `time.time_ns()` calls and a few list appends happen; the
finished request is queued (bounded: the oldest is dropped and counted when full). A
background thread (or `flush()`) turns queued requests into rows with `SpanBatch.append`
(the one place promotion happens) and writes them as segments with a `SegmentWriter`, or,
with `tracer_provider=`, emits them as SDK spans with explicit times (e.g. for OTLP).
The rows are the ones the SDK path (`tracing.request` + `SegmentStoreExporter`) stores for
the same request, except that exception events (stack traces) are not kept.
"""

from __future__ import annotations

import atexit
import collections
import gc
import logging
import random
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from tracing import schema as S
from tracing._context import SCOPE_NAME, SCOPE_VERSION, extract
from tracing.instrument import RequestAPI, check_stage, error_type_of, request_identity
from tracing.rows import SpanBatch, attr_str, replica_of
from tracing.settings import SERVING
from tracing.store import SegmentWriter

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = ["LeanRecorder", "LeanRequest"]

_log = logging.getLogger("tailscope.lean")
_now = time.time_ns
_OK = S.OUTCOMES[0]
_GEN_PARTS: Final = frozenset(S.GENERATION_PARTS)
_GENERATION: Final = S.STAGE_PARENT[S.GENERATION_PARTS[0]]
_ATTR_OUTPUT_TOKENS: Final = S.OUTPUT_TOKEN_KEYS[0]
_SERVER_KIND: Final = S.SPAN_KINDS[2]
_INTERNAL_KIND: Final = S.SPAN_KINDS[1]
_UNSET, _ERROR_STATUS = S.STATUS_CODES[0], S.STATUS_CODES[2]
_randbits = random.getrandbits

# A stage entry: [name, start_ns, end_ns, attrs or None, parent index (-1 = request), error type, message]
_Entry = list


class _LeanStage:
    """Context manager for one stage of a lean request (its handle is the stage's index)."""

    __slots__ = ("_attrs", "_idx", "_name", "_req")

    def __init__(self, req: LeanRequest, name: str, attrs: dict[str, Any] | None) -> None:
        self._req = req
        self._name = name
        self._attrs = attrs
        self._idx = -1

    def __enter__(self) -> int:
        self._idx = self._req._open(self._name, self._attrs, None)  # the name was checked by LeanRequest.stage
        return self._idx

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self._req.fail_stage(self._idx, exc)
        self._req.end_stage(self._idx)

    async def __aenter__(self) -> int:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class LeanRequest(RequestAPI[int]):
    """One request on the lean path: timestamps and shape, turned into rows after it ends.

    The API is `tracing.Request`'s (`RequestAPI`); an open stage's handle is its index.
    `finish` is another name of `end`.
    """

    __slots__ = ("_gen", "_message", "_rec", "_set", "attrs", "end_ns", "name", "parent", "stages")

    def __init__(self, rec: LeanRecorder, name: str, attrs: dict[str, Any], start_ns: int,
                 parent: tuple[int, int, str] | None) -> None:
        # RequestAPI's fields, set here rather than by a super().__init__ call (5% of the lean path)
        self.start_ns = start_ns
        self.ttft_ns: int | None = None
        self.output_tokens: int | None = None
        self._outcome: str | None = None
        self._error_type: str | None = None
        self._rec = rec
        self.name = name
        self.attrs = attrs
        self.end_ns = 0
        self.parent = parent
        self.stages: list[_Entry] = []
        self._gen = -1
        self._set: dict[str, Any] | None = None
        self._message = ""

    def stage(self, name: str, **attributes: AttributeValue) -> _LeanStage:
        """A stage as a context manager (sync or async)."""
        return _LeanStage(self, check_stage(name), attributes or None)

    def _open(self, name: str, attributes: Mapping[str, AttributeValue] | None, start_ns: int | None) -> int:
        stages = self.stages
        idx = len(stages)
        parent = self._gen if name in _GEN_PARTS else -1
        stages.append([name, start_ns if start_ns is not None else _now(), 0, attributes, parent, None, ""])
        if name == _GENERATION:
            self._gen = idx
        return idx

    def end_stage(self, stage: int, end_ns: int | None = None) -> None:
        """Close the stage with index `stage` now or at `end_ns`."""
        entry = self.stages[stage]
        entry[2] = end_ns if end_ns is not None else _now()
        if stage == self._gen:
            self._gen = -1

    def fail_stage(self, stage: int, exc: BaseException) -> None:
        """Mark the stage with index `stage` failed by `exc`."""
        entry = self.stages[stage]
        entry[5] = error_type_of(exc)
        entry[6] = str(exc) or entry[5]

    def _add_attributes(self, attrs: dict[str, AttributeValue]) -> None:
        if self._set is None:
            self._set = attrs
        else:
            self._set.update(attrs)

    def _mark_failed(self, exc: BaseException) -> None:
        self._message = str(exc) or self._error_type or ""

    def set_outcome(self, outcome: str, error_type: str | None = None) -> None:
        """Declare the outcome (ok, error, timeout, cancelled); failures get `error.type`."""
        super().set_outcome(outcome, error_type)
        if outcome != _OK:
            self._message = self._message or self._error_type or outcome

    def end(self, end_ns: int | None = None) -> None:
        """End the request now or at `end_ns` and queue it for the writer (idempotent)."""
        if self.end_ns:
            return
        self.end_ns = end_ns if end_ns is not None else _now()
        self._rec._queue(self)

    finish = end

    # --- rows -----------------------------------------------------------------------------

    def request_attrs(self) -> dict[str, str]:
        """The request span's stored attributes, in the order the SDK path sets them."""
        return {k: attr_str(v) for k, v in self.typed_attrs().items()}

    def typed_attrs(self) -> dict[str, Any]:
        """The request span's attributes with their types (bool, int, str), in SDK-path order."""
        attrs = dict(self.attrs)
        if self._set:
            attrs.update(self._set)
        outcome = self._outcome or _OK
        if outcome != _OK:
            attrs[S.ATTR_ERROR_TYPE] = self._error_type or outcome
        attrs[S.ATTR_OUTCOME] = outcome
        if self.output_tokens is not None:
            attrs[_ATTR_OUTPUT_TOKENS] = self.output_tokens
        if self.ttft_ns is not None:
            attrs[S.ATTR_TTFT_NS] = self.ttft_ns
        return attrs


def _new_id(bits: int) -> int:
    value = _randbits(bits)
    while value == 0:
        value = _randbits(bits)
    return value


class LeanRecorder:
    """Collects lean requests and writes their rows to a store (or emits SDK spans) in the background.

    `resource` is an SDK Resource (e.g. `Telemetry.resource`) or a mapping of resource
    attributes; by default `service.name` / `service.instance.id` come from `service_name` /
    `replica_id`, else their environment variables, else the defaults: the SERVING settings
    `configure` reads too. At most `max_pending` finished requests wait for the
    writer; beyond that the oldest is dropped and counted in `dropped_requests`.
    `id_generator` (an SDK IdGenerator) draws the trace and span ids of the rows written, in the order the SDK path
    draws them (trace, request span, each stage), so a seeded one stores the ids an SDK provider with it would emit.
    """

    def __init__(self, store: Path | str | None = None, *, writer: SegmentWriter | None = None,
                 tracer_provider: TracerProvider | None = None, resource: Resource | Mapping[str, Any] | None = None,
                 service_name: str | None = None, replica_id: str | None = None, flush_interval_s: float = 1.0,
                 max_pending: int = 100_000, background: bool = True, id_generator: IdGenerator | None = None
                 ) -> None:
        if store is None and writer is None and tracer_provider is None:
            raise ValueError("LeanRecorder needs a store, a writer or a tracer_provider to send rows to")
        if max_pending <= 0:
            raise ValueError("max_pending must be > 0")
        if writer is None and store is not None:
            writer = SegmentWriter(Path(store), kind="lean")
        self.writer = writer
        self.tracer_provider = tracer_provider
        if resource is None:
            resource = {"service.name": SERVING.service_name.resolve(service_name or None),
                        "service.instance.id": SERVING.replica_id.resolve(replica_id or None)}
        raw = resource.attributes if hasattr(resource, "attributes") else resource
        self.resource: dict[str, str] = {k: attr_str(v) for k, v in raw.items()}
        self.service = self.resource.get("service.name", "")
        self.replica = replica_of(self.resource)
        self.max_pending = max_pending
        self.id_generator = id_generator
        self._pending: collections.deque[LeanRequest] = collections.deque()
        self._flush_lock = threading.Lock()
        self.recorded_requests = 0
        self.dropped_requests = 0
        self.written_spans = 0
        self.failed_writes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._work, args=(flush_interval_s,), name="tailscope-lean",
                                            daemon=True)
            self._thread.start()
            ref = weakref.ref(self)

            def _at_exit() -> None:
                rec = ref()
                if rec is not None:
                    rec.close()

            atexit.register(_at_exit)

    def request(self, name: str | None = None, *, model: str | None = None, model_version: str | None = None,
                tenant: str | None = None, input_tokens: int | None = None, stream: bool | None = None,
                operation: str | None = None, attributes: Mapping[str, Any] | None = None,
                carrier: Mapping[str, str] | None = None, start_ns: int | None = None) -> LeanRequest:
        """Start one request (as `tracing.request`, same attributes and span name)."""
        name, attrs = request_identity(name, model=model, model_version=model_version, tenant=tenant,
                                       input_tokens=input_tokens, stream=stream, operation=operation,
                                       attributes=attributes)
        parent = None
        if carrier is not None:
            sc = trace.get_current_span(extract(carrier)).get_span_context()
            if sc.is_valid:
                state = ",".join(f"{k}={v}" for k, v in sc.trace_state.items()) if sc.trace_state else ""
                parent = (sc.trace_id, sc.span_id, state)
        return LeanRequest(self, name, attrs, start_ns if start_ns is not None else _now(), parent)

    def _queue(self, req: LeanRequest) -> None:
        pending = self._pending
        if len(pending) >= self.max_pending:
            try:
                pending.popleft()
                self.dropped_requests += 1
            except IndexError:
                pass
        pending.append(req)
        self.recorded_requests += 1

    def _work(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:
                _log.warning("tailscope: lean flush failed", exc_info=True)

    def build(self, requests: list[LeanRequest], batch: SpanBatch | None = None) -> SpanBatch:
        """The stored rows of `requests` (request span + stage spans each), through `SpanBatch.append`."""
        batch = batch if batch is not None else SpanBatch()
        resource, service, replica = self.resource, self.service, self.replica
        append = batch.append
        ids_from = self.id_generator
        new_trace = ids_from.generate_trace_id if ids_from is not None else lambda: _new_id(128)
        new_span = ids_from.generate_span_id if ids_from is not None else lambda: _new_id(64)
        for req in requests:
            if req.parent is not None:
                trace_int, parent_int, state = req.parent
                parent_hex = format(parent_int, "016x")
            else:
                trace_int, parent_hex, state = new_trace(), "", ""
            trace_hex = format(trace_int, "032x")
            req_id = format(new_span(), "016x")
            failed = (req._outcome or _OK) != _OK
            append(trace_id=trace_hex, span_id=req_id, parent_span_id=parent_hex, name=req.name,
                   kind=_SERVER_KIND, start_ns=req.start_ns, end_ns=req.end_ns, service=service,
                   resource=resource, attrs=req.request_attrs(),
                   status_code=_ERROR_STATUS if failed else _UNSET,
                   status_message=req._message if failed else "", trace_state=state,
                   scope_name=SCOPE_NAME, scope_version=SCOPE_VERSION, replica=replica)
            ids: list[str] = []
            for name, start, end, attrs, parent, err, msg in req.stages:
                span_id = format(new_span(), "016x")
                ids.append(span_id)
                stored = {S.ATTR_STAGE: name}
                if attrs:
                    stored.update({k: attr_str(v) for k, v in attrs.items()})
                if err is not None:
                    stored[S.ATTR_ERROR_TYPE] = err
                append(trace_id=trace_hex, span_id=span_id, parent_span_id=ids[parent] if parent >= 0 else req_id,
                       name=name, kind=_INTERNAL_KIND, start_ns=start, end_ns=end or req.end_ns,
                       service=service, resource=resource, attrs=stored,
                       status_code=_ERROR_STATUS if err is not None else _UNSET,
                       status_message=msg if err is not None else "", trace_state=state,
                       scope_name=SCOPE_NAME, scope_version=SCOPE_VERSION, replica=replica)
        return batch

    def _emit_spans(self, requests: list[LeanRequest]) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        assert self.tracer_provider is not None
        tracer = self.tracer_provider.get_tracer(SCOPE_NAME, SCOPE_VERSION)
        for req in requests:
            ctx = None
            if req.parent is not None:
                from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

                sc = SpanContext(req.parent[0], req.parent[1], is_remote=True, trace_flags=TraceFlags(1))
                ctx = trace.set_span_in_context(NonRecordingSpan(sc))
            root = tracer.start_span(req.name, ctx, SpanKind.SERVER, req.typed_attrs(), start_time=req.start_ns)
            root_ctx = trace.set_span_in_context(root, ctx)
            spans: list[Any] = []
            for name, start, _end, sattrs, parent, err, msg in req.stages:
                parent_ctx = trace.set_span_in_context(spans[parent], ctx) if parent >= 0 else root_ctx
                stored: dict[str, Any] = {S.ATTR_STAGE: name, **(sattrs or {})}
                span = tracer.start_span(name, parent_ctx, SpanKind.INTERNAL, stored, start_time=start)
                if err is not None:
                    span.set_attribute(S.ATTR_ERROR_TYPE, err)
                    span.set_status(Status(StatusCode.ERROR, msg))
                spans.append(span)
            for span, entry in zip(spans, req.stages, strict=True):
                span.end(entry[2] or req.end_ns)
            if (req._outcome or _OK) != _OK:
                root.set_status(Status(StatusCode.ERROR, req._message))
            root.end(req.end_ns)

    def flush(self) -> int:
        """Turn every queued request into rows (or spans) and write them; returns spans written."""
        with self._flush_lock:
            pending = self._pending
            taken: list[LeanRequest] = []
            while pending:
                try:
                    taken.append(pending.popleft())
                except IndexError:
                    break
            if not taken:
                return 0
            if self.writer is None:
                self._emit_spans(taken)
                n = sum(1 + len(r.stages) for r in taken)
                self.written_spans += n
                return n
            # the rows are acyclic: pausing the cyclic GC while building them avoids collections
            # triggered by the burst of allocations (the largest part of the cost otherwise)
            paused = gc.isenabled()
            if paused:
                gc.disable()
            try:
                batch = self.build(taken)
                table = batch.to_table()
            finally:
                if paused:
                    gc.enable()
            try:
                self.writer.write(table)
            except Exception:
                self.failed_writes += 1
                self.dropped_requests += len(taken)
                _log.warning("tailscope: lean path could not write %d spans; dropped", len(batch), exc_info=True)
                return 0
            self.written_spans += len(batch)
            return len(batch)

    def close(self) -> None:
        """Stop the background thread and write what is queued."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.flush()
