"""`tailscope ingest`: formats, idempotence, bad input, and a round trip of real SDK spans."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner, Result

from analysis import connect
from tailscope.cli import app
from tracing.otlp_json import spans_to_json_line

runner = CliRunner()
T0 = 1_763_647_200_000_000_000


def make_spans(n_traces: int = 3, service: str = "svc") -> list[ReadableSpan]:
    """Finished spans from the real SDK: a request with a child per trace, varied attributes."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service,
                                                        "service.instance.id": "replica-7"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.ingest", "1.2.3")
    for i in range(n_traces):
        root = tracer.start_span("request", kind=trace.SpanKind.SERVER, start_time=T0 + i * 1000,
                                 attributes={"tailscope.request": True, "gen_ai.request.model": "m",
                                             "gen_ai.usage.input_tokens": 10 + i, "ratio": 0.25,
                                             "tags": ["a", "b"], "flag": False})
        child = tracer.start_span("decode", context=trace.set_span_in_context(root), start_time=T0 + i * 1000 + 10,
                                  attributes={"tailscope.stage": "decode"})
        child.add_event("first_token", {"index": 0}, timestamp=T0 + i * 1000 + 20)
        child.end(end_time=T0 + i * 1000 + 400)
        if i == 1:
            root.set_status(trace.Status(trace.StatusCode.ERROR, "boom"))
        root.end(end_time=T0 + i * 1000 + 500)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def write_jsonl(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def ingest(*args: str) -> Result:
    return runner.invoke(app, ["ingest", "--quiet", *args])


def sql_json(store: Path, query: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["sql", query, "--store", str(store), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_round_trip_of_sdk_spans_through_otlp_json_keeps_ids_times_and_attributes(tmp_path: Path) -> None:
    spans = make_spans()
    path = write_jsonl(tmp_path / "in.jsonl", [spans_to_json_line(spans)])
    store = tmp_path / "store"
    result = ingest(str(path), "--store", str(store))
    assert result.exit_code == 0, result.output
    rows = {r["SpanId"]: r for r in sql_json(store, "SELECT SpanId, TraceId, ParentSpanId, TimestampNs, "
                                             "Duration, SpanName, SpanKind, StatusCode, StatusMessage, "
                                             "ScopeName, ScopeVersion, ServiceName, Replica, "
                                             "map_entries(SpanAttributes) AS attrs, "
                                             "to_json(Events) AS events FROM spans")}
    assert len(rows) == len(spans) == 6
    for span in spans:
        ctx = span.get_span_context()
        assert ctx is not None and span.start_time is not None and span.end_time is not None  # a finished span
        row = rows[format(ctx.span_id, "016x")]
        assert row["TraceId"] == format(ctx.trace_id, "032x")
        assert row["ParentSpanId"] == (format(span.parent.span_id, "016x") if span.parent else "")
        assert row["TimestampNs"] == span.start_time
        assert row["Duration"] == span.end_time - span.start_time
        assert row["SpanName"] == span.name
        assert row["SpanKind"] == ("Server" if span.kind == trace.SpanKind.SERVER else "Internal")
        assert row["ScopeName"] == "tests.ingest" and row["ScopeVersion"] == "1.2.3"
        assert row["ServiceName"] == "svc" and row["Replica"] == "replica-7"
        attrs = {e["key"]: e["value"] for e in row["attrs"]}
        expected = {k: v for k, v in (span.attributes or {}).items()}
        assert set(attrs) == set(expected)
        if span.name == "request":
            assert attrs["tailscope.request"] == "true"
            assert attrs["gen_ai.usage.input_tokens"] == str(expected["gen_ai.usage.input_tokens"])
            assert attrs["ratio"] == "0.25" and attrs["tags"] == '["a","b"]' and attrs["flag"] == "false"
        else:
            events = json.loads(row["events"])
            assert events == [{"TimestampNs": span.start_time + 10, "Name": "first_token",
                               "Attributes": {"index": "0"}}]
    statuses = sorted((r["StatusCode"], r["StatusMessage"]) for r in rows.values() if r["SpanName"] == "request")
    assert statuses == [("Error", "boom"), ("Unset", ""), ("Unset", "")]


def test_protobuf_gzip_and_length_prefixed_files_store_the_same_rows(tmp_path: Path) -> None:
    spans = make_spans()
    body = encode_spans(spans).SerializeToString()
    single = tmp_path / "one.pb"
    single.write_bytes(body)
    framed = tmp_path / "framed.pb.gz"
    half = len(spans) // 2
    parts = [encode_spans(spans[:half]).SerializeToString(), encode_spans(spans[half:]).SerializeToString()]
    framed.write_bytes(gzip.compress(b"".join(struct.pack(">I", len(p)) + p for p in parts)))
    jsonl = write_jsonl(tmp_path / "in.jsonl.gz", [spans_to_json_line(spans)], gz=True)
    query = ("SELECT TraceId, SpanId, TimestampNs, Duration, map_entries(SpanAttributes) a, Stage, IsRequest "
             "FROM spans ORDER BY SpanId")
    results = []
    for i, path in enumerate((single, framed, jsonl)):
        store = tmp_path / f"s{i}"
        result = ingest(str(path), "--store", str(store))
        assert result.exit_code == 0, result.output
        results.append(sql_json(store, query))
    assert len(results[0]) == 6
    assert results[0] == results[1] == results[2]


def test_reingesting_a_file_adds_no_duplicate(tmp_path: Path) -> None:
    spans = make_spans()
    first = write_jsonl(tmp_path / "a.jsonl", [spans_to_json_line(spans[:4])])
    overlapping = write_jsonl(tmp_path / "b.jsonl", [spans_to_json_line(spans)] * 2)
    store = tmp_path / "store"
    assert ingest(str(first), "--store", str(store)).exit_code == 0
    assert ingest(str(first), "--store", str(store)).exit_code == 0
    result = runner.invoke(app, ["ingest", str(overlapping), "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert "12 spans read, 2 stored, 10 already present" in " ".join(result.stdout.split())
    counts = sql_json(store, "SELECT count(*) AS n, count(DISTINCT (TraceId, SpanId)) AS d FROM spans")
    assert counts == [{"n": 6, "d": 6}]


def test_corrupt_line_names_file_and_line_and_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    spans = make_spans(6)
    store = tmp_path / "store"
    earlier = write_jsonl(tmp_path / "earlier.jsonl", [spans_to_json_line(spans[:2])])
    assert ingest(str(earlier), "--store", str(store)).exit_code == 0
    lines = [spans_to_json_line(spans[i:i + 2]) for i in range(2, 12, 2)]
    lines[2] = lines[2][: len(lines[2]) // 2]  # line 3 cut in half
    bad = write_jsonl(tmp_path / "bad.jsonl", lines)
    result = runner.invoke(app, ["ingest", str(bad), "--store", str(store)])
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert f"error: {bad}:3: invalid JSON" in message
    assert sql_json(store, "SELECT count(*) AS n FROM spans") == [{"n": 2}]
    result = runner.invoke(app, ["ingest", str(bad), "--store", str(store), "--skip-bad"])
    assert result.exit_code == 0, result.output
    assert "skipped 1 bad line(s)" in result.stdout
    assert sql_json(store, "SELECT count(*) AS n FROM spans") == [{"n": 10}]


@pytest.mark.parametrize(("content", "expected"), [
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "0102030405060708"}]}]}]}',
     "resourceSpans[0].scopeSpans[0].spans[0].traceId must be hex"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102030405060708090a0b0c0d0e0f10", '
     '"spanId": "0102030405060708", "startTimeUnixNano": "soon"}]}]}]}',
     "startTimeUnixNano must be an integer"),
    ('{"resourceSpans": {"oops": 1}}', "resourceSpans must be a list"),
])
def test_wrong_fields_are_named(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content + "\n")
    result = runner.invoke(app, ["ingest", str(path), "--store", str(tmp_path / "store")])
    assert result.exit_code == 1
    assert expected in " ".join(result.output.split())


def test_enum_names_numbers_as_strings_and_unknown_fields_are_accepted(tmp_path: Path) -> None:
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "s"}}]},
                              "somethingNew": True,
                              "scopeSpans": [{"scope": {"name": "x"}, "spans": [{
                                  "traceId": "0102030405060708090A0B0C0D0E0F10", "spanId": "0102030405060708",
                                  "name": "request", "kind": "SPAN_KIND_SERVER", "startTimeUnixNano": T0,
                                  "endTimeUnixNano": str(T0 + 5), "status": {"code": "STATUS_CODE_ERROR"},
                                  "attributes": [{"key": "n", "value": {"intValue": "7"}}], "future": 1}]}]}]}
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(doc) + "\n")
    store = tmp_path / "store"
    assert ingest(str(path), "--store", str(store)).exit_code == 0
    assert sql_json(store, "SELECT TraceId, SpanKind, StatusCode, Duration, SpanAttributes['n'] AS n FROM spans") == [
        {"TraceId": "0102030405060708090a0b0c0d0e0f10", "SpanKind": "Server", "StatusCode": "Error",
         "Duration": 5, "n": "7"}]


def test_missing_file_and_missing_store_errors_are_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["ingest", str(tmp_path / "nope.jsonl"), "--store", str(tmp_path / "s")])
    assert result.exit_code == 1
    assert "nope.jsonl: no such file or directory" in " ".join(result.output.split())
    result = runner.invoke(app, ["sql", "SELECT 1", "--store", str(tmp_path / "absent")])
    assert result.exit_code == 1
    assert "no store there" in " ".join(result.output.split())


def test_sql_formats(tmp_path: Path) -> None:
    spans = make_spans(1)
    path = write_jsonl(tmp_path / "in.jsonl", [spans_to_json_line(spans)])
    store = tmp_path / "store"
    assert ingest(str(path), "--store", str(store)).exit_code == 0
    csv_out = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM spans", "--store", str(store), "-f", "csv"])
    assert csv_out.stdout == "n\n2\n"
    bad = runner.invoke(app, ["sql", "SELECT nope FROM spans", "--store", str(store)])
    assert bad.exit_code == 1 and "query failed" in bad.output


def test_connect_sees_the_same_rows(tmp_path: Path) -> None:
    spans = make_spans(2)
    path = write_jsonl(tmp_path / "in.jsonl", [spans_to_json_line(spans)])
    store = tmp_path / "store"
    assert ingest(str(path), "--store", str(store)).exit_code == 0
    con = connect(store)
    assert con.execute("SELECT count(*) FROM requests").fetchone() == (2,)
