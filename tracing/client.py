"""The client's view of an inference request: a CLIENT span that propagates W3C context.

The server's request span becomes a child of the client span, so the network stage can
be derived as client time minus server time. `client_request` works with any HTTP
library (send `call.headers`); `post_json` does the whole call with httpx (pass a client)
or the standard library, reading a JSON body or a server-sent-event stream.

    result = tracing.post_json("http://127.0.0.1:8000/v1/completions",
                               {"prompt": "hi", "max_tokens": 16, "stream": True})
    result.chunks, result.ttft_ns, result.trace_id
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from tracing import schema as S
from tracing._context import W3C, tracer
from tracing.instrument import error_type_of

__all__ = ["ClientCall", "ClientResult", "client_request", "post_json"]

#: Client span attribute: seconds from sending the request to the first streamed chunk (GenAI semconv).
ATTR_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
_now = time.time_ns


class ClientCall:
    """An open client span: send `headers` with the request, call `first_chunk()` on the first chunk."""

    def __init__(self, span: Span, headers: dict[str, str], start_ns: int) -> None:
        self.span = span
        self.headers = headers
        self.start_ns = start_ns
        self.first_chunk_ns: int | None = None
        self.status_code: int | None = None

    @property
    def trace_id(self) -> str:
        """The trace id (32 hex digits) shared with the server's request span."""
        return format(self.span.get_span_context().trace_id, "032x")

    def first_chunk(self) -> None:
        """Record the arrival of the first chunk of the response (once)."""
        if self.first_chunk_ns is None:
            self.first_chunk_ns = _now()
            self.span.set_attribute(ATTR_TIME_TO_FIRST_CHUNK, (self.first_chunk_ns - self.start_ns) / 1e9)

    def set_status(self, code: int) -> None:
        """Record the HTTP status; 4xx/5xx mark the span failed with error.type = the code."""
        self.status_code = code
        self.span.set_attribute("http.response.status_code", code)
        if code >= 400:
            self.span.set_attribute(S.ATTR_ERROR_TYPE, str(code))
            self.span.set_status(Status(StatusCode.ERROR, f"HTTP {code}"))

    def set(self, **attributes: AttributeValue) -> None:
        """Add attributes to the client span."""
        self.span.set_attributes(attributes)

    def __enter__(self) -> ClientCall:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.span.set_attribute(S.ATTR_ERROR_TYPE, error_type_of(exc))
            self.span.set_status(Status(StatusCode.ERROR, str(exc) or error_type_of(exc)))
            self.span.record_exception(exc)
        self.span.end()


def client_request(method: str, url: str, *, headers: Mapping[str, str] | None = None,
                   attributes: Mapping[str, AttributeValue] | None = None) -> ClientCall:
    """Start a CLIENT span for one HTTP call and return it with the headers to send (W3C injected)."""
    parts = urlsplit(url)
    attrs: dict[str, AttributeValue] = {"http.request.method": method.upper(), "url.full": url,
                                        "server.address": parts.hostname or ""}
    if parts.port is not None:
        attrs["server.port"] = parts.port
    if attributes:
        attrs.update(attributes)
    start = _now()
    span = tracer().start_span(f"{method.upper()} {parts.path or '/'}", kind=SpanKind.CLIENT, attributes=attrs,
                                start_time=start, record_exception=False, set_status_on_exception=False)
    out = dict(headers or {})
    W3C.inject(out, context=trace.set_span_in_context(span))
    return ClientCall(span, out, start)


@dataclass
class ClientResult:
    """What `post_json` got back: status, body or SSE chunks, and the client-side timings."""

    status: int
    trace_id: str
    duration_ns: int
    ttft_ns: int | None = None
    body: Any = None
    chunks: list[Any] = field(default_factory=list)


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        line = line.rstrip("\r\n")
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield data


def post_json(url: str, payload: Mapping[str, Any], *, timeout: float = 60.0, client: Any = None,
              headers: Mapping[str, str] | None = None) -> ClientResult:
    """POST `payload` as JSON inside a CLIENT span; read a JSON body or an SSE stream (`stream: true`).

    `client` is an optional `httpx.Client`; without it the standard library is used. An HTTP
    error status is returned in `status` (and marks the span failed), not raised.
    """
    body = json.dumps(payload).encode()
    base = {"content-type": "application/json", **(headers or {})}
    with client_request("POST", url, headers=base) as call:
        chunks: list[Any] = []
        parsed: Any = None
        if client is not None:
            with client.stream("POST", url, content=body, headers=call.headers, timeout=timeout) as resp:
                call.set_status(resp.status_code)
                if resp.headers.get("content-type", "").startswith("text/event-stream"):
                    for data in _sse_data(resp.iter_lines()):
                        call.first_chunk()
                        chunks.append(json.loads(data))
                else:
                    raw = resp.read()
                    parsed = json.loads(raw) if raw else None
        else:
            req = urllib.request.Request(url, data=body, headers=call.headers, method="POST")
            try:
                resp = urllib.request.urlopen(req, timeout=timeout)
            except urllib.error.HTTPError as err:
                call.set_status(err.code)
                raw = err.read()
                try:
                    parsed = json.loads(raw) if raw else None
                except ValueError:
                    parsed = raw.decode(errors="replace")
            else:
                with resp:
                    call.set_status(resp.status)
                    if (resp.headers.get("content-type") or "").startswith("text/event-stream"):
                        for data in _sse_data(line.decode() for line in resp):
                            call.first_chunk()
                            chunks.append(json.loads(data))
                    else:
                        raw = resp.read()
                        parsed = json.loads(raw) if raw else None
        duration = _now() - call.start_ns
        ttft = call.first_chunk_ns - call.start_ns if call.first_chunk_ns is not None else None
        return ClientResult(call.status_code or 0, call.trace_id, duration, ttft, parsed, chunks)
