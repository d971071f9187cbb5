"""Write OTLP/JSON the way the OpenTelemetry Collector's file exporter does.

One ExportTraceServiceRequest per line; ids as lowercase hex, enums as integers, 64-bit
integers as decimal strings (the OTLP/JSON rules). Used by the sample generators, which write
the committed samples, and by tests.

`spans_to_json_line` builds the JSON object straight from the SDK's spans: the same object, key for key and in
the same order, as the SDK's protobuf encoder (`encode_spans`) followed by protobuf's `MessageToDict` (what
`request_to_json` does), at about a third of the CPU. Anything outside the plain cases it knows (a value of another
type, an integer beyond 64 bits, a float that is not finite, text that is not valid UTF-8) takes the protobuf
route for the whole line. tests/tracing/test_otlp_json.py compares the two on random spans.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

_ID_KEYS = ("traceId", "spanId", "parentSpanId")
#: SpanKind -> the OTLP enum's number
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
#: the span flags the SDK's encoder sets: the parent's remoteness is known, and (the second) it is remote
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_INT64 = 1 << 63


class _NotPlain(Exception):
    """A value the direct route does not encode: the line takes the protobuf route."""


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def request_to_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The OTLP/JSON object of a protobuf ExportTraceServiceRequest."""
    doc = MessageToDict(request, use_integers_for_enums=True, preserving_proto_field_name=False)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return doc


def _text(value: object) -> str:
    """A string field's text (protobuf refuses text that is not valid UTF-8, such as a lone surrogate)."""
    if type(value) is not str or not (value.isascii() or _utf8(value)):
        raise _NotPlain
    return value


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _value(value: object) -> dict[str, Any]:
    """An AnyValue's JSON (the SDK's encoder's type order: bool before int; sequences of plain values)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": _text(value)}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        if -_INT64 <= value < _INT64:  # type: ignore[operator]
            return {"intValue": str(value)}
    elif kind is float:
        if math.isfinite(value):  # type: ignore[arg-type]
            return {"doubleValue": value}
    elif kind is tuple or kind is list:
        values = [_value(v) for v in value]  # type: ignore[attr-defined]
        return {"arrayValue": {"values": values} if values else {}}
    raise _NotPlain


def _attributes(attributes: Mapping[str, object] | None) -> list[dict[str, Any]]:
    """A KeyValue list's JSON (an empty key is the field's default, so it is left out)."""
    out = []
    for key, value in (attributes or {}).items():
        out.append({"key": _text(key), "value": _value(value)} if key else {"value": _value(value)})
    return out


def _scope(scope: Any) -> dict[str, Any]:
    """An InstrumentationScope's JSON (name, version and attributes, each left out when empty)."""
    out: dict[str, Any] = {}
    if scope is not None:
        if scope.name:
            out["name"] = _text(scope.name)
        if scope.version:
            out["version"] = _text(scope.version)
        if attrs := _attributes(scope.attributes):
            out["attributes"] = attrs
    return out


def _present(*fields: tuple[str, Any]) -> dict[str, Any]:
    """The fields that do not hold their default (0, empty text, an empty list): proto3 JSON leaves those out."""
    return {key: value for key, value in fields if value}


def _span(span: ReadableSpan) -> dict[str, Any]:
    """A Span's JSON: its fields in field-number order, each left out when it holds its default."""
    ctx = span.get_span_context()
    assert ctx is not None
    parent = span.parent
    events = [_present(("timeUnixNano", event.timestamp and str(event.timestamp)), ("name", _text(event.name)),
                       ("attributes", _attributes(event.attributes)),
                       ("droppedAttributesCount", event.dropped_attributes)) for event in span.events]
    links = [_present(("traceId", format(link.context.trace_id, "032x")),
                      ("spanId", format(link.context.span_id, "016x")), ("attributes", _attributes(link.attributes)),
                      ("droppedAttributesCount", link.dropped_attributes),
                      ("flags", _HAS_IS_REMOTE | (_IS_REMOTE if link.context.is_remote else 0)))
             for link in span.links]
    state = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items()) if ctx.trace_state else ""
    out = _present(
        ("traceId", format(ctx.trace_id, "032x")), ("spanId", format(ctx.span_id, "016x")),
        ("traceState", _text(state)), ("parentSpanId", parent is not None and format(parent.span_id, "016x")),
        ("name", _text(span.name)), ("kind", _KIND[span.kind]),
        ("startTimeUnixNano", span.start_time and str(span.start_time)),
        ("endTimeUnixNano", span.end_time and str(span.end_time)), ("attributes", _attributes(span.attributes)),
        ("droppedAttributesCount", span.dropped_attributes), ("events", events),
        ("droppedEventsCount", span.dropped_events), ("links", links), ("droppedLinksCount", span.dropped_links))
    out["status"] = _present(("message", _text(span.status.description or "")), ("code", span.status.status_code.value))
    out["flags"] = _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)
    return out


def _request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The ExportTraceServiceRequest's JSON: spans grouped by resource, then scope, in order of first appearance
    (equal resources or scopes group together, as in the SDK's encoder)."""
    groups: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
    seen: dict[int, dict[Any, list[dict[str, Any]]]] = {}  # id(resource) -> its group: one hash per object
    for span in spans:
        resource = span.resource
        group = seen.get(id(resource))
        if group is None:
            group = seen[id(resource)] = groups.setdefault(resource, {})
        group.setdefault(span.instrumentation_scope or None, []).append(_span(span))
    out = []
    for resource, scopes in groups.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            ss: dict[str, Any] = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                ss["schemaUrl"] = _text(scope.schema_url)
            scope_spans.append(ss)
        attrs = _attributes(resource.attributes)
        rs: dict[str, Any] = {"resource": {"attributes": attrs} if attrs else {}, "scopeSpans": scope_spans}
        if resource.schema_url:
            rs["schemaUrl"] = _text(resource.schema_url)
        out.append(rs)
    return {"resourceSpans": out} if out else {}


def spans_to_json_line(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP/JSON line (no trailing newline) holding `spans`, as the file exporter writes it."""
    try:
        doc = _request(spans)
    except _NotPlain:
        doc = request_to_json(encode_spans(spans))
    return json.dumps(doc, separators=(",", ":"))
