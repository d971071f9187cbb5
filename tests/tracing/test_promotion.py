"""The attribute convention: which span is the request, its stage, shape, outcome and replica."""

from __future__ import annotations

import pytest

from tracing import schema as S
from tracing.rows import SpanBatch, attr_str, is_request, outcome_of, replica_of, stage_of


def test_plain_otel_spans_are_recognised_by_name_and_genai_keys() -> None:
    assert stage_of("prefill", {}) == "prefill"
    assert stage_of("tokenize", {S.ATTR_STAGE: "preprocess"}) == "preprocess"
    assert stage_of("tokenize", {S.ATTR_STAGE: "not-a-stage"}) is None
    assert is_request("Server", None, {"gen_ai.operation.name": "chat"})
    assert is_request("Internal", None, {"gen_ai.operation.name": "chat"})
    assert not is_request("Client", None, {"gen_ai.operation.name": "chat"})   # a caller's span, not a server's
    assert not is_request("Server", "decode", {"gen_ai.operation.name": "chat"})
    assert not is_request("Server", None, {"gen_ai.operation.name": "chat", S.ATTR_REQUEST: "false"})
    assert is_request("Client", None, {S.ATTR_REQUEST: "TRUE"})


@pytest.mark.parametrize(("status", "attrs", "outcome"), [
    ("Unset", {}, "ok"),
    ("Ok", {}, "ok"),
    ("Error", {}, "error"),
    ("Error", {"error.type": "TimeoutError"}, "timeout"),
    ("Error", {"error.type": "DEADLINE_EXCEEDED"}, "timeout"),
    ("Error", {"error.type": "asyncio.CancelledError"}, "cancelled"),
    ("Error", {S.ATTR_OUTCOME: "cancelled"}, "cancelled"),
    ("Unset", {S.ATTR_OUTCOME: "timeout"}, "timeout"),
])
def test_outcome(status: str, attrs: dict[str, str], outcome: str) -> None:
    assert outcome_of(status, attrs) == outcome


def test_replica_falls_back_from_host_to_instance_id_to_pid() -> None:
    assert replica_of({"service.instance.id": "r1", "host.name": "h"}) == "h"
    assert replica_of({"service.instance.id": "r1", "process.pid": "9"}) == "r1"
    assert replica_of({"host.name": "h", "process.pid": "9"}) == "h"
    assert replica_of({"process.pid": "9"}) == "9"
    assert replica_of({}) is None


def test_attribute_strings_and_promoted_shape() -> None:
    assert [attr_str(v) for v in ("x", True, 3, 0.5, [1, 2], b"\x01")] == ["x", "true", "3", "0.5", "[1,2]", "01"]
    batch = SpanBatch()
    batch.append(trace_id="a" * 32, span_id="b" * 16, parent_span_id="", name="POST /v1/chat", kind="Server",
                 start_ns=10, end_ns=30, service="svc", resource={"host.name": "node-1"},
                 attrs={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                        "gen_ai.usage.prompt_tokens": "12", "gen_ai.usage.output_tokens": "4",
                        "tenant.id": "acme", S.ATTR_TTFT_NS: "7"})
    row = batch.to_table().to_pylist()[0]
    assert {k: row[k] for k in ("Stage", "IsRequest", "Outcome", "Replica", "Model", "Tenant", "InputTokens",
                                "OutputTokens", "TtftNs", "Duration", "TimestampNs")} == {
        "Stage": None, "IsRequest": True, "Outcome": "ok", "Replica": "node-1", "Model": "m", "Tenant": "acme",
        "InputTokens": 12, "OutputTokens": 4, "TtftNs": 7, "Duration": 20, "TimestampNs": 10}
