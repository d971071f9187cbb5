"""The client helper: a CLIENT span that propagates W3C context, over the stdlib and over httpx."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import tracing
from tests.tracing.otel_helpers import span_id, spans, trace_id
from tracing import schema as S
from tracing.client import ATTR_TIME_TO_FIRST_CHUNK

__all__ = ["spans"]

SEEN: list[dict[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        SEEN.append({k.lower(): v for k, v in self.headers.items()})
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if body.get("fail"):
            self._send(500, "application/json", b'{"error": "boom"}')
        elif body.get("stream"):
            events = b"".join(b"data: " + json.dumps({"token": f"t{i}"}).encode() + b"\n\n" for i in range(3))
            self._send(200, "text/event-stream", events + b"data: [DONE]\n\n")
        else:
            self._send(200, "application/json", json.dumps({"text": "hello"}).encode())

    def _send(self, status: int, ctype: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    SEEN.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("use_httpx", [False, True])
def test_post_json_records_the_client_view(spans: InMemorySpanExporter, server: str, use_httpx: bool) -> None:
    client = httpx.Client() if use_httpx else None
    try:
        streamed = tracing.post_json(server, {"prompt": "hi", "stream": True}, client=client)
        plain = tracing.post_json(server, {"prompt": "hi"}, client=client)
        failed = tracing.post_json(server, {"fail": True}, client=client)
    finally:
        if client is not None:
            client.close()
    assert [c["token"] for c in streamed.chunks] == ["t0", "t1", "t2"]
    assert streamed.ttft_ns is not None and 0 < streamed.ttft_ns <= streamed.duration_ns
    assert plain.body == {"text": "hello"} and plain.ttft_ns is None
    assert failed.status == 500 and failed.body == {"error": "boom"}
    finished = spans.get_finished_spans()
    assert [s.kind for s in finished] == [SpanKind.CLIENT] * 3
    for span, headers in zip(finished, SEEN, strict=True):
        assert headers["traceparent"].startswith(f"00-{trace_id(span):032x}-{span_id(span):016x}-")
        assert span.name == "POST /v1/completions"
        attrs = span.attributes or {}
        assert attrs["http.request.method"] == "POST" and attrs["server.address"] == "127.0.0.1"
    ttfc = (finished[0].attributes or {})[ATTR_TIME_TO_FIRST_CHUNK]
    assert isinstance(ttfc, float) and ttfc > 0
    assert finished[0].status.status_code is StatusCode.UNSET
    assert (finished[2].attributes or {})[S.ATTR_ERROR_TYPE] == "500"
    assert finished[2].status.status_code is StatusCode.ERROR
    assert streamed.trace_id == f"{trace_id(finished[0]):032x}"


def test_client_request_with_any_library_and_server_continuation(spans: InMemorySpanExporter) -> None:
    with tracing.client_request("POST", "http://127.0.0.1:9/x") as call:
        with tracing.request(model="m", carrier=call.headers) as req:  # what the server side does
            pass
        call.set_status(200)
    kinds = {s.kind: s for s in spans.get_finished_spans()}
    client_span, server_span = kinds[SpanKind.CLIENT], kinds[SpanKind.SERVER]
    assert server_span.parent is not None and server_span.parent.span_id == span_id(client_span)
    assert req.span.get_span_context().trace_id == trace_id(client_span)


def test_connection_refused_marks_the_client_span(spans: InMemorySpanExporter) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OSError):
        tracing.post_json(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"}, timeout=5)
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert "error.type" in (span.attributes or {})
