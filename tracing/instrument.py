"""The request / stage API: one trace per inference request, one child span per stage.

    with tracing.request(model="llama-3-8b", tenant="acme", input_tokens=412) as req:
        with req.stage("queue_wait"): ...
        with req.stage("generation"):
            with req.stage("prefill"): ...
            with req.stage("decode"): ...
        req.set(output_tokens=128)

The request span is kind SERVER with `tailscope.request=true` and the request shape;
stage spans are children of the request span (prefill / decode of the open generation
span) named after their stage. An exception marks the stage and the request as errors
(`error.type`, status ERROR) and is re-raised; `TimeoutError` gives outcome `timeout`,
cancellation or a client that went away gives `cancelled`. The current request travels in
the OpenTelemetry context, so sync code, asyncio tasks and threads (pass `req` or copy the
context) each see their own. Only the OpenTelemetry API is used here: spans go wherever the
global tracer provider sends them (see `tracing.configure`).

`RequestAPI` is the request API with its rules written once; two recorders implement it:
`Request` here (OpenTelemetry spans through the SDK) and `tracing.lean.LeanRequest`
(timestamps on the request thread, rows built in the background).
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Final, Generic, Self, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from tracing import schema as S
from tracing._context import REQUEST_KEY, SCOPE_NAME, SCOPE_VERSION, extract, tracer

__all__ = [
    "DECODE",
    "GENERATION",
    "MODEL_LOAD",
    "NETWORK",
    "PREFILL",
    "PREPROCESS",
    "QUEUE_WAIT",
    "SCOPE_NAME",
    "SCOPE_VERSION",
    "STREAMING",
    "ClientDisconnected",
    "Request",
    "RequestAPI",
    "Stage",
    "StageSpan",
    "current_request",
    "error_type_of",
    "outcome_of_exception",
    "request",
    "request_identity",
    "stage",
    "traced_request",
]

#: Attribute keys of the request shape (GenAI semantic conventions where one exists).
ATTR_MODEL: Final = S.MODEL_KEYS[0]
ATTR_INPUT_TOKENS: Final = S.INPUT_TOKEN_KEYS[0]
ATTR_OUTPUT_TOKENS: Final = S.OUTPUT_TOKEN_KEYS[0]

#: The stage names, one constant each (unpacked from the schema, so a renamed stage fails here loudly).
NETWORK, QUEUE_WAIT, PREPROCESS, MODEL_LOAD, GENERATION, STREAMING = S.STAGES
PREFILL, DECODE = S.GENERATION_PARTS

_STAGE_SET: Final = frozenset(S.ALL_STAGES)
_STAGE_ATTRS: Final[dict[str, Mapping[str, AttributeValue]]] = {name: {S.ATTR_STAGE: name} for name in S.ALL_STAGES}
_GEN_PARTS: Final = frozenset(S.GENERATION_PARTS)
_GENERATION: Final = S.STAGE_PARENT[PREFILL]
_OUTCOME_SET: Final = frozenset(S.OUTCOMES)
_OK, _ERROR, _TIMEOUT, _CANCELLED = S.OUTCOMES
#: `error_type_of` an asyncio cancellation (asyncio is imported only by code that uses it: no cancellation
#: can arise before, and importing it here would cost every user of the package, the CLI included)
_CANCELLED_TYPE: Final = "asyncio.exceptions.CancelledError"
_SERVER = SpanKind.SERVER
_INTERNAL = SpanKind.INTERNAL
_ERROR_STATUS = StatusCode.ERROR
_now = time.time_ns

F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H")


class ClientDisconnected(ConnectionError):
    """The client went away before the response was complete (the request ends `cancelled`)."""


def error_type_of(exc: BaseException) -> str:
    """The `error.type` of an exception: its class name, module-qualified unless built in."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def outcome_of_exception(exc: BaseException, *, streaming: bool = False) -> str:
    """The outcome an exception gives a request: timeout, cancelled or error.

    Connection errors count as a client disconnect (`cancelled`) only while streaming to it.
    """
    if isinstance(exc, TimeoutError):
        return _TIMEOUT
    if isinstance(exc, (ClientDisconnected, GeneratorExit, KeyboardInterrupt)) or _is_asyncio_cancellation(exc):
        return _CANCELLED
    if streaming and isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
        return _CANCELLED
    return _ERROR


def _is_asyncio_cancellation(exc: BaseException) -> bool:
    """Whether `exc` is asyncio's CancelledError, without importing asyncio (not imported: it cannot be one)."""
    aio = sys.modules.get("asyncio")
    return aio is not None and isinstance(exc, aio.CancelledError)


def check_stage(name: str) -> str:
    """`name` if it is a stage of the request model; ValueError otherwise."""
    if name not in _STAGE_SET:
        raise ValueError(f"stage must be one of {', '.join(S.ALL_STAGES)}, got {name!r}")
    return name


def _mark_failed(span: Span, exc: BaseException | None, error_type: str, record: bool) -> None:
    span.set_attribute(S.ATTR_ERROR_TYPE, error_type)
    span.set_status(Status(_ERROR_STATUS, str(exc) if exc is not None and str(exc) else error_type))
    if record and exc is not None and span.is_recording():
        span.record_exception(exc)


def current_request() -> Request | None:
    """The request open in the current context (task, thread), or None."""
    value = otel_context.get_value(REQUEST_KEY)
    return value if isinstance(value, Request) else None


class RequestAPI(ABC, Generic[H]):
    """The request API of both recorders: `tracing.request` (SDK spans) and `LeanRecorder.request` (timestamps).

    The shared rules are written once here: the request shape (`set`), the outcome (`set_outcome`,
    `fail`), the time to first token, stage validation and `record_stage`, the context-manager
    protocol. A recorder says how a stage opens, ends and fails (`_open`, `end_stage`,
    `fail_stage`; `H` is its handle of an open stage), where late attributes go
    (`_add_attributes`), what a failure marks (`_mark_failed`) and how the request ends (`end`).
    """

    __slots__ = ("_error_type", "_outcome", "output_tokens", "start_ns", "ttft_ns")

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.ttft_ns: int | None = None
        self.output_tokens: int | None = None
        self._outcome: str | None = None
        self._error_type: str | None = None

    # --- what a recorder supplies ---------------------------------------------------------

    @abstractmethod
    def _open(self, name: str, attributes: Mapping[str, AttributeValue] | None, start_ns: int | None) -> H:
        """Open stage `name` now or at `start_ns` and return the recorder's handle of it."""

    @abstractmethod
    def end_stage(self, stage: H, end_ns: int | None = None) -> None:
        """End the open stage `stage` now or at `end_ns`."""

    @abstractmethod
    def fail_stage(self, stage: H, exc: BaseException) -> None:
        """Mark the open stage `stage` failed by `exc`."""

    @abstractmethod
    def _add_attributes(self, attrs: dict[str, AttributeValue]) -> None:
        """Put request attributes set after the start where this recorder keeps them."""

    @abstractmethod
    def _mark_failed(self, exc: BaseException) -> None:
        """Mark the request itself failed by `exc` (status, error type)."""

    def _streaming(self) -> bool:
        return False

    @abstractmethod
    def stage(self, name: str, **attributes: AttributeValue) -> AbstractContextManager[H]:
        """A stage of this request as a context manager (`with req.stage("decode"):`)."""

    @abstractmethod
    def end(self, end_ns: int | None = None) -> None:
        """End the request now or at `end_ns` with its outcome, output tokens and TTFT (idempotent)."""

    # --- request shape and outcome ------------------------------------------------------

    @property
    def outcome(self) -> str | None:
        """The outcome set so far (None until set or until the request ends ok)."""
        return self._outcome

    def set(self, *, output_tokens: int | None = None, input_tokens: int | None = None,
            model: str | None = None, model_version: str | None = None, tenant: str | None = None,
            stream: bool | None = None, **attributes: AttributeValue) -> None:
        """Add request shape learned after the request started (tokens, model, tenant, ...)."""
        if output_tokens is not None:
            self.output_tokens = output_tokens
        attrs = _shape(model, model_version, tenant, input_tokens, stream)
        if attributes:
            attrs.update(attributes)
        if attrs:
            self._add_attributes(attrs)

    def first_token(self, at_ns: int | None = None) -> None:
        """Record the time to first token (once; later calls are ignored)."""
        if self.ttft_ns is None:
            self.ttft_ns = (at_ns if at_ns is not None else _now()) - self.start_ns

    def set_outcome(self, outcome: str, error_type: str | None = None) -> None:
        """Declare the outcome (ok, error, timeout, cancelled); failures get `error.type`."""
        if outcome not in _OUTCOME_SET:
            raise ValueError(f"outcome must be one of {', '.join(S.OUTCOMES)}, got {outcome!r}")
        self._outcome = outcome
        if outcome != _OK:
            self._error_type = error_type or self._error_type or outcome

    def fail(self, exc: BaseException, *, streaming: bool | None = None) -> None:
        """Mark the request failed by `exc` (outcome from its type) without raising."""
        # a timeout arrives as a cancellation first (asyncio.timeout), then as TimeoutError
        if self._outcome in (None, _OK) or (isinstance(exc, TimeoutError) and self._error_type == _CANCELLED_TYPE):
            self._outcome = outcome_of_exception(exc, streaming=self._streaming() if streaming is None else streaming)
            self._error_type = error_type_of(exc)
            self._mark_failed(exc)

    # --- stages -------------------------------------------------------------------------

    def start_stage(self, name: str, *, start_ns: int | None = None,
                    attributes: Mapping[str, AttributeValue] | None = None) -> H:
        """Start a stage now or at `start_ns`; end it with `end_stage` (for stages timed elsewhere)."""
        return self._open(check_stage(name), attributes, start_ns)

    def record_stage(self, name: str, start_ns: int, end_ns: int, **attributes: AttributeValue) -> None:
        """Record a stage whose start and end were measured already (integer ns since the epoch)."""
        self.end_stage(self._open(check_stage(name), attributes or None, start_ns), end_ns)

    # --- context management -------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.fail(exc)
        self.end()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class Request(RequestAPI["StageSpan"]):
    """One inference request recorded as OpenTelemetry spans: the SERVER span, its shape and its outcome.

    Made by `tracing.request(...)`. Use it as a (sync or async) context manager, or call
    `end()` yourself (for example when a stream finishes after the handler returned).
    """

    __slots__ = (
        "_attached",
        "_ctx",
        "_ended",
        "_gen_ctx",
        "_marked",
        "_recorded",
        "_stream",
        "_token",
        "_tracer",
        "end_ns",
        "span",
    )

    def __init__(self, span: Span, ctx: Context, start_ns: int, tracer: trace.Tracer) -> None:
        super().__init__(start_ns)
        self.span = span
        self._ctx = ctx
        self._tracer = tracer
        self.end_ns: int | None = None
        self._gen_ctx: Context | None = None
        self._recorded: BaseException | None = None
        self._stream: Any = None  # the open tracing.stream wrapper, while tokens flow
        self._marked = False
        self._ended = False
        self._token: object = None
        self._attached = False

    @property
    def context(self) -> Context:
        """The OpenTelemetry context holding this request's span (for propagation)."""
        return self._ctx

    def _add_attributes(self, attrs: dict[str, AttributeValue]) -> None:
        self.span.set_attributes(attrs)

    def _streaming(self) -> bool:
        return self._stream is not None

    def _mark_failed(self, exc: BaseException) -> None:
        _mark_failed(self.span, exc, self._error_type or _ERROR, record=exc is not self._recorded)
        self._recorded = exc
        self._marked = True

    def end(self, end_ns: int | None = None) -> None:
        """End the request span with its outcome, output tokens and TTFT (idempotent).

        A stream still open (the consumer never exhausted nor closed it) ends as abandoned.
        """
        if self._ended:
            return
        if self._stream is not None:
            self._stream._abandon(self._recorded)  # may end this request itself (end_request=True)
            if self._ended:
                return
        self._ended = True
        outcome = self._outcome or _OK
        attrs: dict[str, AttributeValue] = {S.ATTR_OUTCOME: outcome}
        if self.output_tokens is not None:
            attrs[ATTR_OUTPUT_TOKENS] = self.output_tokens
        if self.ttft_ns is not None:
            attrs[S.ATTR_TTFT_NS] = self.ttft_ns
        span = self.span
        if outcome != _OK and not self._marked:
            _mark_failed(span, None, self._error_type or outcome, record=False)
        span.set_attributes(attrs)
        self.end_ns = end_ns if end_ns is not None else _now()
        span.end(self.end_ns)

    # --- stages -------------------------------------------------------------------------

    def stage(self, name: str, **attributes: AttributeValue) -> Stage:
        """A stage of this request, as a context manager or decorator (`with req.stage("decode"):`)."""
        return Stage(name, attributes, self)

    def _open(self, name: str, attributes: Mapping[str, AttributeValue] | None, start_ns: int | None) -> StageSpan:
        attrs: dict[str, AttributeValue] = {S.ATTR_STAGE: name}
        if attributes:
            attrs.update(attributes)
        return self._start(name, attrs, start_ns)

    def _start(self, name: str, attrs: Mapping[str, AttributeValue], start_ns: int | None) -> StageSpan:
        gen_ctx = self._gen_ctx
        parent = gen_ctx if (gen_ctx is not None and name in _GEN_PARTS) else self._ctx
        span = self._tracer.start_span(name, parent, _INTERNAL, attrs, (), start_ns, False, False)
        if name == _GENERATION:
            ctx = trace.set_span_in_context(span, parent)
            self._gen_ctx = ctx
            return StageSpan(self, name, span, ctx)
        return StageSpan(self, name, span, None)

    def end_stage(self, stage: StageSpan, end_ns: int | None = None) -> None:
        """End the stage span `stage` now or at `end_ns` (the same as `stage.end(end_ns)`)."""
        stage.end(end_ns)

    def fail_stage(self, stage: StageSpan, exc: BaseException) -> None:
        """Mark the stage span `stage` failed by `exc` (the same as `stage.fail(exc)`)."""
        stage.fail(exc)

    # --- context management -------------------------------------------------------------

    def __enter__(self) -> Self:
        self._token = otel_context.attach(self._ctx)
        self._attached = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.fail(exc)
        self.end()
        if self._attached:
            self._attached = False
            otel_context.detach(self._token)  # type: ignore[arg-type]


class StageSpan:
    """An open stage span (from `Request.start_stage`); `end()` closes it, `fail()` marks it failed."""

    __slots__ = ("ctx", "ended", "name", "request", "span")

    def __init__(self, request: Request, name: str, span: Span, ctx: Context | None) -> None:
        self.request = request
        self.name = name
        self.span = span
        self.ctx = ctx
        self.ended = False

    def fail(self, exc: BaseException) -> None:
        """Mark this stage failed by `exc` (status ERROR, `error.type`, exception event)."""
        req = self.request
        _mark_failed(self.span, exc, error_type_of(exc), record=exc is not req._recorded)
        req._recorded = exc

    def end(self, end_ns: int | None = None) -> None:
        """End the stage span now or at `end_ns` (idempotent)."""
        if self.ended:
            return
        self.ended = True
        if self.ctx is not None and self.request._gen_ctx is self.ctx:
            self.request._gen_ctx = None
        self.span.end(end_ns)


class Stage:
    """A stage as a context manager (sync or async) or, called on a function, a decorator.

    Without an explicit request it belongs to the request current at entry; outside any
    request it is still recorded, as a child of the current span. The stage span is not made
    the current span: the request span stays current, so `inject()` and stages opened inside
    stay children of the request (the request model), and entering a stage stays cheap. To
    parent your own spans under a stage: `with trace.use_span(stage_span.span): ...`.
    """

    __slots__ = ("_attrs", "_name", "_open", "_request")

    def __init__(self, name: str, attributes: Mapping[str, AttributeValue] | None = None,
                 req: Request | None = None) -> None:
        self._name = check_stage(name)
        # the span's attributes, built once (the SDK copies them into the span)
        self._attrs: Mapping[str, AttributeValue] = (
            {S.ATTR_STAGE: name, **attributes} if attributes else _STAGE_ATTRS[name])
        self._request = req
        self._open: StageSpan | None = None

    def __enter__(self) -> StageSpan:
        req = self._request or current_request()
        if req is None:
            req = _orphan_request()
        opened = req._start(self._name, self._attrs, None)
        self._open = opened
        return opened

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        opened = self._open
        if opened is None:
            return
        self._open = None
        if exc is not None:
            opened.fail(exc)
        opened.end()

    async def __aenter__(self) -> StageSpan:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: F) -> F:
        """Decorate a sync or async function: each call runs inside a fresh stage."""
        name, attrs, req = self._name, dict(self._attrs), self._request
        del attrs[S.ATTR_STAGE]
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"{fn.__qualname__} is a generator; wrap its output with tracing.stream(...) instead")
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with Stage(name, attrs or None, req):
                    return await fn(*args, **kwargs)
            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Stage(name, attrs or None, req):
                return fn(*args, **kwargs)
        return cast(F, wrapper)


def _orphan_request() -> Request:
    """A stand-in parent for a stage opened outside any request: the current span, never ended."""
    span = trace.get_current_span()
    ctx = otel_context.get_current()
    return Request(span, ctx, _now(), tracer())


def _shape(model: str | None, model_version: str | None, tenant: str | None, input_tokens: int | None,
           stream: bool | None, attrs: dict[str, AttributeValue] | None = None) -> dict[str, AttributeValue]:
    """The request-shape attributes that are given, added to `attrs` (a new dict if None)."""
    if attrs is None:
        attrs = {}
    if model is not None:
        attrs[ATTR_MODEL] = model
    if model_version is not None:
        attrs[S.ATTR_MODEL_VERSION] = model_version
    if tenant is not None:
        attrs[S.ATTR_TENANT] = tenant
    if input_tokens is not None:
        attrs[ATTR_INPUT_TOKENS] = input_tokens
    if stream is not None:
        attrs[S.ATTR_STREAMING] = stream
    return attrs


def request_identity(name: str | None, *, model: str | None, model_version: str | None, tenant: str | None,
                     input_tokens: int | None, stream: bool | None, operation: str | None,
                     attributes: Mapping[str, AttributeValue] | None) -> tuple[str, dict[str, AttributeValue]]:
    """The request span's name and its attributes at start (both recorders name a request the same way).

    The name defaults to "{operation} {model}" as in the GenAI conventions.
    """
    attrs: dict[str, AttributeValue] = {S.ATTR_REQUEST: True}
    if operation is not None:
        attrs[S.ATTR_OPERATION] = operation
    _shape(model, model_version, tenant, input_tokens, stream, attrs)
    if attributes:
        attrs.update(attributes)
    if name is None:
        name = f"{operation or 'inference'} {model}" if model else (operation or "inference")
    return name, attrs


def request(name: str | None = None, *, model: str | None = None, model_version: str | None = None,
            tenant: str | None = None, input_tokens: int | None = None, stream: bool | None = None,
            operation: str | None = None, attributes: Mapping[str, AttributeValue] | None = None,
            carrier: Mapping[str, str] | None = None, context: Context | None = None,
            start_ns: int | None = None) -> Request:
    """Start one inference request (a SERVER span); use it with `with` / `async with` or call `end()`.

    `carrier` (incoming HTTP headers or a queued message) continues a W3C trace context;
    `context` names the parent context directly. The span name defaults to
    "{operation} {model}" as in the GenAI conventions.
    """
    spans = tracer()
    if carrier is not None:
        context = extract(carrier, context)
    name, attrs = request_identity(name, model=model, model_version=model_version, tenant=tenant,
                                   input_tokens=input_tokens, stream=stream, operation=operation,
                                   attributes=attributes)
    begin = start_ns if start_ns is not None else _now()
    span = spans.start_span(name, context, _SERVER, attrs, start_time=begin,
                            record_exception=False, set_status_on_exception=False)
    parent = context if context is not None else otel_context.get_current()
    req = Request(span, Context(), begin, spans)
    req._ctx = otel_context.set_value(REQUEST_KEY, req, trace.set_span_in_context(span, parent))
    return req


def stage(name: str, **attributes: AttributeValue) -> Stage:
    """A stage of the current request, as a context manager or a decorator (`@tracing.stage("preprocess")`)."""
    return Stage(name, attributes or None)


def traced_request(name: str | None = None, **shape: Any) -> Callable[[F], F]:
    """Decorate a sync or async handler so that each call is one request (see `request`)."""

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with request(name, **shape):
                    return await fn(*args, **kwargs)
            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with request(name, **shape):
                return fn(*args, **kwargs)
        return cast(F, wrapper)

    return decorate
