"""`tailscope collect --forward`: what one receiver stores, a second one gets over OTLP/HTTP, facts included.

A is the real CLI (a child process) forwarding to B, a receiver in this process, both on
loopback. Spans reach A from the real OpenTelemetry SDK exporter: native spans and every engine
fixture (vLLM, SGLang, TGI, Triton). B must end with the very same spans (all columns) and the
same `requests` rows. A forward target that never answers must cost A nothing but drops.
"""

from __future__ import annotations

import gzip
import http.server
import io
import random
import signal
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from intake.collect.forward import Forwarder
from intake.collect.receiver import ProgressLine
from intake.otlp import decode_protobuf_table, promote
from tests.intake.collect_helpers import pb_body, running, start_cli_receiver
from tests.intake.engine_fixtures import SPANS, requests
from tracing import schema as S
from tracing.store import segment_files


def _stored(store: Path) -> list[dict[str, Any]]:
    """Every stored span, sorted by (TraceId, SpanId)."""
    tables = [pq.read_table(p) for p in segment_files(store)]
    # a merged segment (written by the compactor) declares its columns nullable: unify, do not compare, the schemas
    rows = pa.concat_tables(tables, promote_options="default").to_pylist() if tables else []
    return sorted(rows, key=lambda r: (r["TraceId"], r["SpanId"]))


def _native_spans(endpoint: str) -> None:
    """A few requests the way an instrumented server writes them, through the SDK's OTLP/HTTP exporter."""
    provider = TracerProvider(resource=Resource.create({"service.name": "native", "k8s.pod.name": "pod-a"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("forward-test")
    for i in range(5):
        with tracer.start_as_current_span("chat", attributes={"tailscope.request": True, "gen_ai.request.model": "m",
                                                              "tailscope.ttft_ns": 1000 + i}) as span:
            with tracer.start_as_current_span("queue_wait"):
                pass
            with tracer.start_as_current_span("generation", attributes={"gen_ai.usage.output_tokens": i}):
                pass
            span.add_event("first_token", {"i": i})
    provider.shutdown()


def test_a_forwarding_receiver_gives_the_next_one_the_same_spans_and_requests(tmp_path: Path) -> None:
    with running(tmp_path / "b", grpc_port=None) as b:
        proc, port = start_cli_receiver(tmp_path / "a", "--forward", f"http://127.0.0.1:{b.http_port}/v1/traces")
        try:
            endpoint = f"http://127.0.0.1:{port}/v1/traces"
            _native_spans(endpoint)
            for name, build in SPANS.items():
                for group in build():
                    exporter = OTLPSpanExporter(endpoint=endpoint)
                    assert exporter.export(group) is SpanExportResult.SUCCESS, name
                    exporter.shutdown()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(120) == 0  # stopping sends what is queued (up to the drain timeout)
        log = next((tmp_path).glob("collect-*.log")).read_text()
        a_spans = _stored(tmp_path / "a")
        assert f"{len(a_spans):,} forwarded, 0 not forwarded" in log, log
    b_spans = _stored(tmp_path / "b")
    assert len(a_spans) > 100
    # the engine requests were mapped on A (facts and synthetic spans) and arrived as such on B
    assert {dict(r["SpanAttributes"]).get(S.ATTR_ENGINE) for r in b_spans if r["IsRequest"]} >= {
        "vllm", "sglang", "tgi", "triton", None}
    assert sum(1 for r in b_spans if r["Stage"] and dict(r["SpanAttributes"]).get(S.ATTR_SYNTHETIC)) > 20
    assert b_spans == a_spans
    a_requests = requests(tmp_path / "a")
    assert a_requests and requests(tmp_path / "b") == a_requests


class _Hang:
    """A TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_a_hanging_forward_target_costs_intake_nothing_but_counted_drops(tmp_path: Path) -> None:
    hang = _Hang()
    rng = random.Random(7)
    try:
        with running(tmp_path / "a", grpc_port=None, durable=False, forward=f"http://127.0.0.1:{hang.port}/v1/traces",
                     forward_queue_spans=100, forward_timeout_s=0.5, drain_timeout_s=1.0) as a:
            for _ in range(10):  # one request at a time: each one is its own group commit
                body, _keys = pb_body(50, rng)
                req = urllib.request.Request(f"http://127.0.0.1:{a.http_port}/v1/traces", data=body,
                                             headers={"Content-Type": "application/x-protobuf"})
                with urllib.request.urlopen(req, timeout=60) as response:
                    assert response.status == 200
            f = a.forwarder
            assert f is not None
            # the first two groups fill the queue (one is being sent to the target that never answers),
            # the other eight are dropped at once
            assert (a.stats().stored_spans, f.queued_spans, f.dropped_spans, f.forwarded_spans) == (500, 100, 400, 0)
            out = io.StringIO()
            ProgressLine(a, out).tick(final=True)
            assert "forwarded 0 | fwd queue 100 | fwd dropped 400" in out.getvalue()
        assert (f.forwarded_spans, f.dropped_spans, f.queued_spans) == (0, 500, 0)
    finally:
        hang.close()
    assert len(_stored(tmp_path / "a")) == 500


class _StandIn(http.server.BaseHTTPRequestHandler):
    """Answers the statuses in `script` in turn (then 200), keeping each request's headers and spans."""

    script: ClassVar[list[int]] = []
    seen: ClassVar[list[tuple[dict[str, str], int]]] = []

    def do_POST(self) -> None:
        body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
        request = ExportTraceServiceRequest.FromString(body)
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        type(self).seen.append((dict(self.headers), spans))
        status = type(self).script.pop(0) if type(self).script else 200
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def stand_in() -> Iterator[tuple[type[_StandIn], int]]:
    handler = type("Handler", (_StandIn,), {"script": [], "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _table(n: int) -> pa.Table:
    body, _ = pb_body(n, random.Random(n))
    table, _result = decode_protobuf_table(body)
    return promote(table) if table.schema != S.SPAN_SCHEMA else table


def test_retryable_answers_are_retried_and_others_drop_the_batch(stand_in: tuple[type[_StandIn], int]) -> None:
    handler, port = stand_in
    handler.script.extend([503, 429, 503])
    f = Forwarder(f"http://127.0.0.1:{port}/v1/traces", token="s3cret", batch_spans=40)
    f.start()
    f.submit(_table(100))  # 3 batches of 40, 40, 20
    f.close(60)
    assert (f.forwarded_spans, f.dropped_spans, f.retries) == (100, 0, 3)
    assert [spans for _, spans in handler.seen] == [40, 40, 40, 40, 40, 20]
    assert all(h["Authorization"] == "Bearer s3cret" and h["Content-Encoding"] == "gzip" for h, _ in handler.seen)

    handler.seen.clear()
    handler.script.extend([400])
    g = Forwarder(f"http://127.0.0.1:{port}/v1/traces", batch_spans=40)
    g.start()
    g.submit(_table(60))
    g.close(60)
    assert (g.forwarded_spans, g.dropped_spans, g.retries, g.last_error) == (20, 40, 0, "HTTP 400")
    assert [spans for _, spans in handler.seen] == [40, 20]


def test_a_forward_url_that_is_not_one_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Forwarder("127.0.0.1:4318")
