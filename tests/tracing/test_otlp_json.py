"""`spans_to_json_line` writes, byte for byte, what the SDK's protobuf encoder and protobuf's `MessageToDict` make
of the same spans: compared on random spans of every shape (both routes of tracing/otlp_json.py: the direct one
and, for values it leaves to protobuf, the protobuf one).

The reference is written here from the libraries alone: `encode_spans`, `MessageToDict` with integer enums and
camel-case names, the ids turned from base64 into lowercase hex (the OTLP/JSON rule), `json.dumps` compact.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from tracing import otlp_json
from tracing.otlp_json import spans_to_json_line

PLAIN: list[Any] = ["", "a", "é ü", "x" * 40, 0, 1, -1, 2**63 - 1, -(2**63), 0.0, -0.0, 0.7, 1e300, 2.5e-310,
                    True, False]
#: values the direct route leaves to protobuf (or that protobuf itself refuses: the attribute is left out)
ODD: list[Any] = [float("nan"), float("inf"), -float("inf"), 2**63, -(2**63) - 1, b"\x00\xff", b"ok", None,
                  {"k": 1}, "\ud800", bytearray(b"x")]


def _reference(spans: Sequence[ReadableSpan]) -> str:
    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for obj in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64decode(obj[key]).hex()
    return json.dumps(doc, separators=(",", ":"))


def _value(rng: random.Random, odd: bool) -> Any:
    pool = PLAIN + (ODD if odd else [])
    if rng.random() < 0.15:
        kind = rng.choice([str, int, float, bool])
        items = [v for v in PLAIN if type(v) is kind]
        return tuple(rng.choice(items) for _ in range(rng.randrange(4)))
    if odd and rng.random() < 0.05:
        return [rng.choice(PLAIN), None]
    return rng.choice(pool)


def _attributes(rng: random.Random, odd: bool, bounded: bool = True) -> Any:
    keys = ["k", "gen_ai.usage.input_tokens", "", "ключ", "tailscope.stage", "z"]
    raw = {rng.choice(keys) + str(rng.randrange(3)) * rng.randrange(2): _value(rng, odd)
           for _ in range(rng.randrange(5))}
    if bounded and rng.random() < 0.3:  # some dropped: a count the encoder carries
        return BoundedAttributes(maxlen=1, attributes=raw, immutable=False)
    return raw if rng.random() < 0.8 else None


def _context(rng: random.Random, remote: bool = False) -> SpanContext:
    state = TraceState([("vendor", "v1"), ("x", "2")]) if rng.random() < 0.2 else None
    return SpanContext(rng.getrandbits(128) if rng.random() < 0.95 else 0, rng.getrandbits(64), remote,
                       TraceFlags(rng.randrange(2)), state)


def _spans(rng: random.Random, odd: bool) -> list[ReadableSpan]:
    resources = [Resource.create({"service.name": "a", "service.instance.id": "r0"}),
                 Resource.create({"service.name": "a", "service.instance.id": "r0"}),  # equal to the first
                 Resource({"service.name": "b", "n": 3}, schema_url="https://example.com/s/1"), Resource({})]
    scopes = [InstrumentationScope("tailscope", "0.1.0"), InstrumentationScope("x", None, "https://example.com/2",
                                                                              {"a": 1}),
              InstrumentationScope("", ""), None]
    out = []
    for _ in range(rng.randrange(1, 12)):
        events = [Event(rng.choice(["", "exception", "first token"]), _attributes(rng, odd, bounded=False),
                        timestamp=rng.choice([0, 1, 1_763_647_203_080_329_469]))
                  for _ in range(rng.choice([0, 0, 1, 2]))]
        links = [Link(_context(rng, rng.random() < 0.5), _attributes(rng, odd)) for _ in range(rng.choice([0, 0, 1]))]
        status = rng.choice([Status(), Status(StatusCode.OK), Status(StatusCode.ERROR, "boom"),
                             Status(StatusCode.ERROR)])
        parent = None if rng.random() < 0.3 else _context(rng, rng.random() < 0.3)
        out.append(ReadableSpan(
            rng.choice(["", "llm_request", "prefill", "ζ"]), _context(rng), parent,
            rng.choice(resources), _attributes(rng, odd), events, links, rng.choice(list(SpanKind)),
            status=status, start_time=rng.choice([None, 0, 1_763_647_203_080_329_469]),
            end_time=rng.choice([None, 0, 1_763_647_205_611_984_636]), instrumentation_scope=rng.choice(scopes)))
    return out


def test_the_line_is_what_the_protobuf_encoder_writes_on_random_spans() -> None:
    rng = random.Random(7)
    routes = {"direct": 0, "protobuf": 0}
    for case in range(600):
        spans = _spans(rng, odd=case % 3 == 0)
        try:
            otlp_json._request(spans)
            routes["direct"] += 1
        except otlp_json._NotPlain:
            routes["protobuf"] += 1
        try:
            want = _reference(spans)
        except Exception as exc:  # protobuf refuses the span (a name that is not UTF-8): so does the line
            try:
                spans_to_json_line(spans)
            except Exception as got:
                assert type(got) is type(exc), case
                continue
            raise AssertionError(f"case {case}: the reference failed ({exc!r}) and the line did not") from None
        assert spans_to_json_line(spans) == want, case
    assert routes["direct"] >= 350 and routes["protobuf"] >= 100, routes  # both routes were compared


def test_an_empty_batch_and_a_plain_span() -> None:
    assert spans_to_json_line([]) == _reference([]) == "{}"
    span = ReadableSpan("llm_request", SpanContext(1, 2, False), None, Resource({"service.name": "s"}),
                        {"tailscope.request": True, "n": 3, "x": 0.5}, kind=SpanKind.SERVER, start_time=5,
                        end_time=9, instrumentation_scope=InstrumentationScope("tailscope", "0.1.0"))
    assert json.loads(spans_to_json_line([span])) == {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "s"}}]},
        "scopeSpans": [{"scope": {"name": "tailscope", "version": "0.1.0"}, "spans": [{
            "traceId": "00000000000000000000000000000001", "spanId": "0000000000000002", "name": "llm_request",
            "kind": 2, "startTimeUnixNano": "5", "endTimeUnixNano": "9",
            "attributes": [{"key": "tailscope.request", "value": {"boolValue": True}},
                           {"key": "n", "value": {"intValue": "3"}}, {"key": "x", "value": {"doubleValue": 0.5}}],
            "status": {}, "flags": 256}]}]}]}
