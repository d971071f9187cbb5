"""Traces that follow no convention: ingest, report and sql say so, and say what to add."""

from __future__ import annotations

import http.client
import io
import json
from pathlib import Path

from intake.collect.decode import JSON
from intake.collect.receiver import ProgressLine
from intake.recognition import NO_REQUEST_FIX, Recognition, recognise
from tests.intake.collect_helpers import running
from tests.intake.engine_fixtures import FIXTURES, T0, run_cli
from tracing.rows import SpanBatch

#: The shape of opentelemetry-proto's examples/trace.json: one plain span, no GenAI or tailscope keys.
_SERVICE = [{"key": "service.name", "value": {"stringValue": "my.service"}}]
PLAIN = {"resourceSpans": [{"resource": {"attributes": _SERVICE},
                            "scopeSpans": [{"scope": {"name": "my.library", "version": "1.0.0"}, "spans": [{
                                "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "eee19b7ec3c1b173", "name": "I'm a server span",
                                "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 1000), "kind": 2,
                                "attributes": [{"key": "my.span.attr", "value": {"stringValue": "some value"}}]}]}]}]}


def _plain_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(PLAIN, indent=2))
    return path


def test_ingest_of_plain_otlp_says_no_request_was_recognised_and_how_to_fix(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = run_cli("ingest", "--store", str(store), str(_plain_file(tmp_path)))
    assert result.exit_code == 0, result.output
    assert "0 request(s) recognised among 1 span(s)" in result.stdout
    assert "no span was recognised as a request" in result.stderr
    assert "tailscope.request=true" in result.stderr and "docs/convention.md" in result.stderr
    assert f"tailscope map --suggest --store {store}" in " ".join(result.stderr.split())


def test_report_on_plain_otlp_names_the_cause(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert run_cli("ingest", "--quiet", "--store", str(store), str(_plain_file(tmp_path))).exit_code == 0
    result = run_cli("report", "--store", str(store))
    assert result.exit_code == 0, result.output
    assert "coverage: 0 request(s) recognised among 1 span(s)" in result.stdout
    assert NO_REQUEST_FIX.split(";")[0].format(store=store) in " ".join(result.stderr.split())
    as_json = run_cli("report", "--store", str(store), "--json")
    assert json.loads(as_json.stdout)["requests"] == 0  # the contract on stdout is unchanged
    assert "no span was recognised as a request" in as_json.stderr


def test_engine_requests_are_counted_and_their_gaps_named(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = run_cli("ingest", "--store", str(store), str(FIXTURES / "vllm.otlp.jsonl"))
    assert result.exit_code == 0, result.output
    assert "4 request(s) recognised" in result.stdout and "(vllm 4 by scope vllm.tracing.otel)" in result.stdout
    assert "no span was recognised" not in result.stderr
    report = run_cli("report", "--store", str(store))
    assert "vllm: vLLM emits no span for an aborted request" in " ".join(report.stdout.split())


def test_sql_empty_result_still_names_its_columns(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert run_cli("ingest", "--quiet", "--store", str(store), str(_plain_file(tmp_path))).exit_code == 0
    narrow = run_cli("sql", "SELECT SpanName AS name, Duration AS d FROM spans WHERE false", "--store", str(store))
    assert narrow.exit_code == 0, narrow.output
    assert "name" in narrow.stdout and " d " in narrow.stdout and "0 row(s)" in narrow.stdout
    wide = run_cli("sql", "SELECT * FROM requests LIMIT 5", "--store", str(store))
    assert wide.exit_code == 0, wide.output
    assert "columns: " in wide.stdout and "e2e_ns" in wide.stdout and "queue_wait_ns" in wide.stdout


def test_sql_wide_rows_print_one_block_per_row_with_every_name(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert run_cli("ingest", "--quiet", "--store", str(store), str(FIXTURES / "vllm.otlp.jsonl")).exit_code == 0
    cols = run_cli("sql", "SELECT * FROM requests LIMIT 2", "--store", str(store), "--format", "csv")
    names = cols.stdout.splitlines()[0].split(",")
    assert len(names) > 20
    out = run_cli("sql", "SELECT * FROM requests ORDER BY start_ns LIMIT 2", "--store", str(store))
    lines = out.stdout.splitlines()
    assert sum(line.startswith("-[ row ") for line in lines) == 2
    for name in names:  # every name on its own line, twice (two rows), none blank
        assert sum(line.split(" | ")[0].strip() == name for line in lines) == 2, name
    assert "2 row(s)" in out.stdout


def test_recognise_counts_requests_by_engine() -> None:
    batch = SpanBatch()
    for i, (attrs, kind) in enumerate((({"gen_ai.operation.name": "chat", "tailscope.engine": "vllm"}, "Server"),
                                       ({"gen_ai.operation.name": "chat"}, "Server"),
                                       ({"gen_ai.operation.name": "chat"}, "Client"),
                                       ({}, "Server"))):
        batch.append(trace_id="a" * 32, span_id=f"{i + 1:016x}", parent_span_id="", name="s", kind=kind,
                     start_ns=T0, end_ns=T0 + 1, service="x", resource={}, attrs=attrs)
    seen = recognise(batch.to_table())
    assert (seen.spans, seen.requests, seen.engines) == (4, 2, {"vllm": 1})
    assert seen.problem() is None
    assert Recognition(3, 0).problem() is not None and Recognition(0, 0).problem() is None


def test_collect_console_line_counts_requests_and_says_why_there_are_none(tmp_path: Path) -> None:
    with running(tmp_path / "store", grpc_port=None) as receiver:
        assert receiver.http_port is not None
        conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=30)
        conn.request("POST", "/v1/traces", body=json.dumps(PLAIN).encode(), headers={"Content-Type": JSON})
        assert conn.getresponse().status == 200
        conn.close()
    out = io.StringIO()
    ProgressLine(receiver, out).tick(final=True)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("no span was recognised as a request: no span carries tailscope.request")
    assert lines[1] == NO_REQUEST_FIX.format(store=receiver.store)
    assert "| stored 1 | requests 0 |" in lines[2]
