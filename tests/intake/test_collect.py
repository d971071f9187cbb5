"""`tailscope collect` driven by real clients: the official OTLP exporters, raw HTTP, bad input."""

from __future__ import annotations

import gzip
import json
import random
import threading
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from analysis.engine.connect import connect
from intake.collect import Receiver
from tests.intake.collect_helpers import T0, pb_body, running
from tracing.rows import attr_str

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def make_spans() -> list[ReadableSpan]:
    """Finished SDK spans covering every attribute type, events, links, status, kinds."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "llm", "service.instance.id": "r-7",
                                                        "host.arch": "x86_64"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("collect-test", "2.1")
    root = tracer.start_span("chat llama", kind=SpanKind.SERVER, start_time=T0, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-3-8b", "gen_ai.usage.input_tokens": 812,
        "gen_ai.usage.output_tokens": 91, "tailscope.tenant": "acme", "gen_ai.request.stream": True,
        "ratio": 0.1, "big": -(2**63), "huge": 1e300, "names": ["a", "b\"c"], "floats": [1.5, 2.0],
        "flags": [True, False], "ints": [1, -2], "unicode": "héllo ✓", "unicode_list": ["ü", "x"]})
    root.add_event("first_token", {"tokens": 1, "where": "decoder"}, timestamp=T0 + 5_000_000)
    ctx = trace.set_span_in_context(root)
    for i, stage in enumerate(("queue_wait", "prefill", "decode")):
        child = tracer.start_span(stage, context=ctx, start_time=T0 + i * 1_000_000,
                                  links=[Link(root.get_span_context(), {"why": "batch"})] if i == 2 else None,
                                  attributes={"tailscope.stage": stage, "batch.size": 8 + i})
        if stage == "decode":
            child.set_status(Status(StatusCode.ERROR, "oom on gpu 3"))
        child.end(end_time=T0 + (i + 1) * 1_000_000 + 7)
    root.end(end_time=T0 + 9_000_123)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def stored(store: Path) -> dict[str, dict[str, Any]]:
    """Every stored span by SpanId, read back through analysis.engine.connect."""
    con = connect(store)
    try:
        cur = con.execute("SELECT TraceId, SpanId, ParentSpanId, SpanName, SpanKind, TimestampNs, Duration, "
                          "SpanAttributes, ResourceAttributes, ScopeName, ScopeVersion, StatusCode, StatusMessage, "
                          "Events, Links, Stage, IsRequest, Model, Tenant, InputTokens FROM spans")
        names = [d[0] for d in cur.description]
        return {row[1]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
    finally:
        con.close()


def assert_roundtrip(spans: list[ReadableSpan], rows: dict[str, dict[str, Any]], peer: str = "127.0.0.1") -> None:
    """Ids, times and attributes stored byte for byte as the SDK made them (the resource plus the
    sending peer's address, `--record-peer` being on by default)."""
    assert len(rows) == len(spans)
    for sp in spans:
        assert sp.context is not None and sp.start_time is not None and sp.end_time is not None
        row = rows[f"{sp.context.span_id:016x}"]
        assert row["TraceId"] == f"{sp.context.trace_id:032x}"
        assert row["ParentSpanId"] == (f"{sp.parent.span_id:016x}" if sp.parent else "")
        assert row["TimestampNs"] == sp.start_time
        assert row["Duration"] == sp.end_time - sp.start_time
        assert row["SpanName"] == sp.name
        assert row["SpanAttributes"] == {k: attr_str(v) for k, v in (sp.attributes or {}).items()}
        assert row["ResourceAttributes"] == {**{k: attr_str(v) for k, v in sp.resource.attributes.items()},
                                             "tailscope.peer": peer}
        assert (row["ScopeName"], row["ScopeVersion"]) == ("collect-test", "2.1")
        assert [(e["TimestampNs"], e["Name"], e["Attributes"]) for e in row["Events"]] == [
            (e.timestamp, e.name, {k: attr_str(v) for k, v in (e.attributes or {}).items()}) for e in sp.events]
        assert [(ln["TraceId"], ln["SpanId"], ln["Attributes"]) for ln in row["Links"]] == [
            (f"{ln.context.trace_id:032x}", f"{ln.context.span_id:016x}",
             {k: attr_str(v) for k, v in (ln.attributes or {}).items()}) for ln in sp.links]
    root = next(r for r in rows.values() if r["SpanName"] == "chat llama")
    assert root["SpanAttributes"]["names"] == '["a","b\\"c"]'
    assert root["SpanAttributes"]["floats"] == "[1.5,2.0]"
    assert root["SpanAttributes"]["big"] == str(-(2**63))
    assert root["SpanAttributes"]["unicode_list"] == '["\\u00fc","x"]'
    assert (root["SpanKind"], root["IsRequest"], root["Model"], root["Tenant"], root["InputTokens"]) == (
        "Server", True, "llama-3-8b", "acme", 812)
    decode = next(r for r in rows.values() if r["SpanName"] == "decode")
    assert (decode["StatusCode"], decode["StatusMessage"], decode["Stage"]) == ("Error", "oom on gpu 3", "decode")


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_http_exporter_roundtrip(tmp_path: Path, compression: Compression) -> None:
    spans = make_spans()
    with running(tmp_path / "store") as receiver:
        exporter = HttpExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces", compression=compression)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert_roundtrip(spans, stored(tmp_path / "store"))


def test_grpc_exporter_roundtrip(tmp_path: Path) -> None:
    spans = make_spans()
    with running(tmp_path / "store") as receiver:
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert_roundtrip(spans, stored(tmp_path / "store"))


def json_body(start: Any = str(T0), trace_id: str = "5b8efff798038103d269b633813fc60c") -> dict[str, Any]:
    """A small OTLP/JSON request with two spans."""
    return {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "j"}}]},
            "scopeSpans": [{"scope": {"name": "js"}, "spans": [
                {"traceId": trace_id, "spanId": "eee19b7ec3c1b174", "name": "chat", "kind": 2,
                 "startTimeUnixNano": start, "endTimeUnixNano": str(T0 + 10),
                 "attributes": [{"key": "n", "value": {"intValue": "5"}}]},
                {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b175", "name": "decode",
                 "parentSpanId": "eee19b7ec3c1b174", "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 5)},
            ]}]}]}


def test_json_answered_in_json(tmp_path: Path) -> None:
    with running(tmp_path / "store") as receiver:
        r = httpx.post(f"http://127.0.0.1:{receiver.http_port}/v1/traces", content=json.dumps(json_body()),
                       headers={"Content-Type": "application/json; charset=utf-8"})
        assert (r.status_code, r.headers["content-type"], r.json()) == (200, "application/json", {})
    rows = stored(tmp_path / "store")
    assert rows["eee19b7ec3c1b174"]["SpanAttributes"] == {"n": "5"}
    assert rows["eee19b7ec3c1b175"]["ParentSpanId"] == "eee19b7ec3c1b174"


def rpc_status(r: httpx.Response) -> str:
    """The message of a google.rpc.Status body (protobuf or JSON)."""
    if r.headers["content-type"] == "application/x-protobuf":
        return status_pb2.Status.FromString(r.content).message
    return str(r.json()["message"])


def test_bad_inputs_answered_and_receiver_keeps_serving(tmp_path: Path) -> None:
    rng = random.Random(3)
    good, _ = pb_body(5, rng)
    with running(tmp_path / "store", max_body_bytes=1 << 20) as receiver:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        with httpx.Client() as client:
            cases: list[tuple[dict[str, str], bytes, int, str]] = [
                (PB, good[: len(good) // 2], 400, "malformed OTLP protobuf"),
                ({"Content-Type": "text/plain"}, good, 415, "Content-Type must be application/x-protobuf"),
                (JS, b'{"resourceSpans": [', 400, "invalid JSON"),
                (JS, json.dumps(json_body(start="soon")).encode(), 400,
                 "resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano must be an integer"),
                (JS, json.dumps(json_body(trace_id=42)).encode(), 400,  # type: ignore[arg-type]  # the bad id under test
                 "spans[0].traceId must be a hex string"),
                (JS, json.dumps({"resourceSpans": {"a": 1}}).encode(), 400, "resourceSpans must be a list"),
                (PB, b"\x00" * ((1 << 20) + 1), 413, "over the 1,048,576-byte limit"),
                ({**PB, "Content-Encoding": "gzip"}, gzip.compress(b"\x00" * (64 << 20)), 413,
                 "limit after gzip decompression"),
                ({**PB, "Content-Encoding": "gzip"}, gzip.compress(good)[:-12], 400, "gzip"),
                ({**PB, "Content-Encoding": "br"}, good, 415, "Content-Encoding 'br' is not supported"),
            ]
            for headers, body, status, message in cases:
                r = client.post(url, content=body, headers=headers)
                assert r.status_code == status, (headers, r.text)
                assert message in rpc_status(r), (status, rpc_status(r))
                assert client.post(url, content=good, headers=PB).status_code == 200
            assert client.get(url).status_code == 405
            assert client.post(url.replace("/v1/traces", "/v1/logs"), content=good, headers=PB).status_code == 404
        assert receiver.stats().bad_requests == len(cases) + 2
    assert len(stored(tmp_path / "store")) == 5  # the same good body, stored once


def test_missing_token(tmp_path: Path) -> None:
    spans = make_spans()
    rng = random.Random(4)
    good, _ = pb_body(3, rng)
    with running(tmp_path / "store", token="s3cret") as receiver:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        for headers in (PB, {**PB, "Authorization": "Bearer wrong"}, {**PB, "Authorization": "s3cret"}):
            r = httpx.post(url, content=good, headers=headers)
            assert r.status_code == 401 and "bearer token" in rpc_status(r)
        assert httpx.post(url, content=good, headers={**PB, "Authorization": "Bearer s3cret"}).status_code == 200
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.RpcError) as err:
                export(good)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True,
                                headers={"authorization": "Bearer s3cret"})
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert len(stored(tmp_path / "store")) == 3 + len(spans)


def test_partial_success_names_the_rejected(tmp_path: Path) -> None:
    req = ExportTraceServiceRequest.FromString(pb_body(3, random.Random(5))[0])
    req.resource_spans[0].scope_spans[0].spans[1].trace_id = b"\x00" * 16
    body = json_body()
    body["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["endTimeUnixNano"] = "1"
    with running(tmp_path / "store") as receiver:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        r = httpx.post(url, content=req.SerializeToString(), headers=PB)
        answer = ExportTraceServiceResponse.FromString(r.content)
        assert (r.status_code, answer.partial_success.rejected_spans) == (200, 1)
        assert "traceId must be 16 bytes" in answer.partial_success.error_message
        r = httpx.post(url, content=json.dumps(body), headers=JS)
        assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1"
        assert "endTimeUnixNano is before startTimeUnixNano" in r.json()["partialSuccess"]["errorMessage"]
        assert receiver.stats().rejected_spans == 2
    assert len(stored(tmp_path / "store")) == 3


def test_resent_spans_are_stored_once_across_restarts(tmp_path: Path) -> None:
    rng = random.Random(6)
    first, keys1 = pb_body(50, rng)
    second, keys2 = pb_body(50, rng)
    store = tmp_path / "store"
    with running(store) as receiver:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        for body in (first, first, second):
            assert httpx.post(url, content=body, headers=PB).status_code == 200
        assert receiver.stats().duplicate_spans == 50
    with running(store) as receiver:
        assert receiver.loaded_keys == 100
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        for body in (second, first):
            assert httpx.post(url, content=body, headers=PB).status_code == 200
        assert receiver.stats().stored_spans == 0
    con = connect(store)
    assert con.execute("SELECT count(*), count(DISTINCT (TraceId, SpanId)) FROM spans").fetchone() == (100, 100)
    assert {tuple(r) for r in con.execute("SELECT TraceId, SpanId FROM spans").fetchall()} == set(keys1 + keys2)


class _Gate:
    """Holds the segment writer at a gate so a test can see the queue fill up and drain."""

    def __init__(self, receiver: Receiver) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        real = receiver.writer.write

        def write(table: Any) -> Any:
            self.entered.set()
            assert self.open.wait(60), "gate never opened"
            return real(table)

        receiver.writer.write = write  # type: ignore[method-assign]  # the write under test, wrapped


def test_full_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    rng = random.Random(7)
    a, _ = pb_body(100, rng)
    b, _ = pb_body(100, rng)
    with running(tmp_path / "store", max_queue_spans=150) as receiver:
        gate = _Gate(receiver)
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        answers: list[int] = []
        sender = threading.Thread(target=lambda: answers.append(httpx.post(url, content=a, headers=PB,
                                                                           timeout=60).status_code))
        sender.start()
        assert gate.entered.wait(30)
        r = httpx.post(url, content=b, headers=PB)
        assert (r.status_code, r.headers["retry-after"]) == (503, "1")
        assert "write queue full" in rpc_status(r)
        gate.open.set()
        sender.join(60)
        assert answers == [200]
        assert httpx.post(url, content=b, headers=PB).status_code == 200
    assert len(stored(tmp_path / "store")) == 200


def test_stop_answers_in_flight_requests_and_flushes(tmp_path: Path) -> None:
    rng = random.Random(8)
    body, keys = pb_body(40, rng)
    store = tmp_path / "store"
    with running(store) as receiver:
        gate = _Gate(receiver)
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        answers: list[int] = []
        sender = threading.Thread(target=lambda: answers.append(httpx.post(url, content=body, headers=PB,
                                                                           timeout=60).status_code))
        sender.start()
        assert gate.entered.wait(30)
        stopper = threading.Thread(target=receiver.stop)
        stopper.start()
        gate.open.set()
        stopper.join(60)
        sender.join(60)
        assert answers == [200]
        with pytest.raises(httpx.TransportError):
            httpx.post(url, content=body, headers=PB, timeout=5)
    assert {(r["TraceId"], r["SpanId"]) for r in stored(store).values()} == set(keys)


def test_failed_write_answers_503_and_the_retry_is_stored(tmp_path: Path) -> None:
    rng = random.Random(9)
    body, keys = pb_body(30, rng)
    with running(tmp_path / "store") as receiver:
        real = receiver.writer.write
        calls = []

        def failing_once(table: Any) -> Any:
            calls.append(table.num_rows)
            if len(calls) == 1:
                raise OSError(28, "No space left on device")
            return real(table)

        receiver.writer.write = failing_once  # type: ignore[method-assign]  # one failing write
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        r = httpx.post(url, content=body, headers=PB)
        assert (r.status_code, r.headers["retry-after"]) == (503, "1")
        assert "No space left on device" in rpc_status(r)
        assert httpx.post(url, content=body, headers=PB).status_code == 200  # not dropped as a duplicate
    assert {(r["TraceId"], r["SpanId"]) for r in stored(tmp_path / "store").values()} == set(keys)


def test_grpc_bad_inputs_get_grpc_status_codes(tmp_path: Path) -> None:
    rng = random.Random(10)
    good, _ = pb_body(4, rng)
    with running(tmp_path / "store", max_body_bytes=1 << 16) as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        for body, code, message in [
            (good[: len(good) // 2], grpc.StatusCode.INVALID_ARGUMENT, "malformed OTLP protobuf"),
            (b"\x0a" + b"\x80" * 20, grpc.StatusCode.INVALID_ARGUMENT, "malformed OTLP protobuf"),
            (pb_body(2000, rng)[0], grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                export(body, timeout=30)
            assert err.value.code() is code
            assert message in (err.value.details() or "")
            answer = ExportTraceServiceResponse.FromString(export(good, timeout=30))
            assert not answer.HasField("partial_success")
    assert len(stored(tmp_path / "store")) == 4
