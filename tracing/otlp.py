"""Decode OTLP trace payloads (protobuf or JSON) into a `SpanBatch`.

Both decoders yield the same stored strings for the same spans: ids as lowercase hex,
enums as the ClickHouse exporter's names, attribute values through `rows.attr_str`.
A span that cannot be stored (bad id, bad time) is rejected with a reason; in strict
mode the first one raises `ValueError` naming the field.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tracing import schema as S
from tracing.rows import SpanBatch, attr_str, replica_of

_KIND_NAMES = {f"SPAN_KIND_{k.upper()}": i for i, k in enumerate(S.SPAN_KINDS)}
_KIND_NAMES["SPAN_KIND_UNSPECIFIED"] = 0
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


class MalformedField(ValueError):
    """A JSON field of the wrong type or spelling: the request itself is malformed (HTTP 400).

    `decode_json` (non-strict) still counts it as one rejected span; the receiver uses
    `decode_json_request`, which raises it instead, and rejects only unstorable spans.
    """


@dataclass
class DecodeResult:
    """What one payload decoded to: spans appended to the batch, and spans rejected."""

    accepted: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def reject(self, what: str) -> None:
        """Count one rejected span and keep its reason (the first few)."""
        self.rejected += 1
        if len(self.errors) < 5:
            self.errors.append(what)


# --- protobuf ------------------------------------------------------------------------------


def _pb_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return ""
    if which == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)


def _pb_attrs(kvs: Any) -> dict[str, str]:
    return {kv.key: attr_str(_pb_value(kv.value)) for kv in kvs}


def decode_protobuf(data: bytes, batch: SpanBatch, *, strict: bool = False) -> DecodeResult:
    """Decode one serialized ExportTraceServiceRequest into `batch`."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError; any failure means malformed input
        raise ValueError(f"malformed OTLP protobuf ExportTraceServiceRequest ({exc})") from None
    result = DecodeResult()
    for rs in request.resource_spans:
        resource = _pb_attrs(rs.resource.attributes)
        service = resource.get("service.name", "")
        replica = replica_of(resource)
        for ss in rs.scope_spans:
            scope_name, scope_version = ss.scope.name, ss.scope.version
            for sp in ss.spans:
                problem = _check_ids(sp.trace_id.hex(), sp.span_id.hex(), sp.parent_span_id.hex())
                if problem is None and sp.end_time_unix_nano < sp.start_time_unix_nano:
                    problem = "endTimeUnixNano is before startTimeUnixNano"
                if problem is not None:
                    if strict:
                        raise ValueError(f"span {sp.name!r}: {problem}")
                    result.reject(f"span {sp.name!r}: {problem}")
                    continue
                batch.append(
                    trace_id=sp.trace_id.hex(),
                    span_id=sp.span_id.hex(),
                    parent_span_id=sp.parent_span_id.hex(),
                    name=sp.name,
                    kind=S.SPAN_KINDS[sp.kind] if 0 <= sp.kind < len(S.SPAN_KINDS) else "Unspecified",
                    start_ns=sp.start_time_unix_nano,
                    end_ns=sp.end_time_unix_nano,
                    service=service,
                    resource=resource,
                    attrs=_pb_attrs(sp.attributes),
                    status_code=S.STATUS_CODES[sp.status.code] if 0 <= sp.status.code < 3 else "Unset",
                    status_message=sp.status.message,
                    trace_state=sp.trace_state,
                    scope_name=scope_name,
                    scope_version=scope_version,
                    events=[
                        {"TimestampNs": ev.time_unix_nano, "Name": ev.name,
                         "Attributes": list(_pb_attrs(ev.attributes).items())}
                        for ev in sp.events
                    ],
                    links=[
                        {"TraceId": ln.trace_id.hex(), "SpanId": ln.span_id.hex(),
                         "TraceState": ln.trace_state,
                         "Attributes": list(_pb_attrs(ln.attributes).items())}
                        for ln in sp.links
                    ],
                    replica=replica,
                )
                result.accepted += 1
    return result


def _check_ids(trace_id: str, span_id: str, parent: str) -> str | None:
    if len(trace_id) != 32 or trace_id == "0" * 32:
        return f"traceId must be 16 bytes (32 hex digits) and not all zero, got {trace_id!r}"
    if len(span_id) != 16 or span_id == "0" * 16:
        return f"spanId must be 8 bytes (16 hex digits) and not all zero, got {span_id!r}"
    if parent and len(parent) != 16:
        return f"parentSpanId must be empty or 8 bytes (16 hex digits), got {parent!r}"
    return None


# --- JSON ----------------------------------------------------------------------------------


def _json_int(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = obj.get(key, 0)
    if isinstance(value, bool):
        raise MalformedField(f"{where}.{key} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise MalformedField(f"{where}.{key} must be an integer (number or decimal string), got {value!r}")


def _json_value(value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        raise MalformedField(f"{where} must be an AnyValue object, got {type(value).__name__}")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return _json_int(value, "intValue", where)
    if "doubleValue" in value:
        raw = value["doubleValue"]
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise MalformedField(f"{where}.doubleValue must be a number, got {raw!r}") from None
    if "arrayValue" in value:
        return [_json_value(v, where) for v in (value["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in value:
        return {kv.get("key", ""): _json_value(kv.get("value", {}), where)
                for kv in (value["kvlistValue"] or {}).get("values", [])}
    if "bytesValue" in value:
        try:
            return base64.b64decode(value["bytesValue"], validate=True)
        except (binascii.Error, TypeError):
            raise MalformedField(f"{where}.bytesValue must be base64") from None
    return ""


def _json_attrs(kvs: Any, where: str) -> dict[str, str]:
    if kvs is None:
        return {}
    if not isinstance(kvs, list):
        raise MalformedField(f"{where} must be a list of key/value objects")
    out: dict[str, str] = {}
    for kv in kvs:
        if not isinstance(kv, Mapping) or not isinstance(kv.get("key"), str):
            raise MalformedField(f"{where} holds an entry without a string 'key'")
        out[kv["key"]] = attr_str(_json_value(kv.get("value", {}), f"{where}[{kv['key']}]"))
    return out


def _json_enum(raw: Any, names: Mapping[str, int], where: str) -> int:
    if raw is None:
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw in names:
        return names[raw]
    raise MalformedField(f"{where} must be an integer enum, got {raw!r}")


def _hex_id(raw: Any, where: str) -> str:
    if raw is None or raw == "":
        return ""
    if not isinstance(raw, str):
        raise MalformedField(f"{where} must be a hex string, got {type(raw).__name__}")
    try:
        bytes.fromhex(raw)
    except ValueError:
        raise MalformedField(f"{where} must be hex, got {raw!r}") from None
    return raw.lower()


def _list(obj: Mapping[str, Any], key: str, where: str, *alt: str) -> list[Any]:
    value = obj.get(key)
    for other in alt:
        if value is None:
            value = obj.get(other)
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedField(f"{where}.{key} must be a list, got {type(value).__name__}")
    return value


def decode_json_obj(payload: Any, batch: SpanBatch, *, strict: bool = False) -> DecodeResult:
    """Decode one OTLP/JSON ExportTraceServiceRequest (already parsed) into `batch`."""
    return _decode_json_obj(payload, batch, strict=strict, malformed_raises=False)


def _decode_json_obj(payload: Any, batch: SpanBatch, *, strict: bool, malformed_raises: bool) -> DecodeResult:
    if not isinstance(payload, Mapping):
        raise ValueError(f"expected an ExportTraceServiceRequest object, got {type(payload).__name__}")
    result = DecodeResult()
    for i, rs in enumerate(_list(payload, "resourceSpans", "")):
        where_rs = f"resourceSpans[{i}]"
        if not isinstance(rs, Mapping):
            raise ValueError(f"{where_rs} must be an object")
        resource = _json_attrs((rs.get("resource") or {}).get("attributes"), f"{where_rs}.resource.attributes")
        service = resource.get("service.name", "")
        replica = replica_of(resource)
        for j, ss in enumerate(_list(rs, "scopeSpans", where_rs, "instrumentationLibrarySpans")):
            where_ss = f"{where_rs}.scopeSpans[{j}]"
            if not isinstance(ss, Mapping):
                raise ValueError(f"{where_ss} must be an object")
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
            for k, sp in enumerate(_list(ss, "spans", where_ss)):
                where = f"{where_ss}.spans[{k}]"
                try:
                    batch_args = _json_span(sp, where)
                except ValueError as exc:
                    if strict or (malformed_raises and isinstance(exc, MalformedField)):
                        raise
                    result.reject(str(exc))
                    continue
                batch.append(**batch_args, service=service, resource=resource,
                             scope_name=str(scope.get("name", "")),
                             scope_version=str(scope.get("version", "")), replica=replica)
                result.accepted += 1
    return result


def _json_span(sp: Any, where: str) -> dict[str, Any]:
    if not isinstance(sp, Mapping):
        raise MalformedField(f"{where} must be an object")
    trace_id = _hex_id(sp.get("traceId"), f"{where}.traceId")
    span_id = _hex_id(sp.get("spanId"), f"{where}.spanId")
    parent = _hex_id(sp.get("parentSpanId"), f"{where}.parentSpanId")
    problem = _check_ids(trace_id, span_id, parent)
    if problem:
        raise ValueError(f"{where}: {problem}")
    start = _json_int(sp, "startTimeUnixNano", where)
    end = _json_int(sp, "endTimeUnixNano", where)
    if end < start:
        raise ValueError(f"{where}: endTimeUnixNano is before startTimeUnixNano")
    kind = _json_enum(sp.get("kind"), _KIND_NAMES, f"{where}.kind")
    status = sp.get("status") or {}
    if not isinstance(status, Mapping):
        raise MalformedField(f"{where}.status must be an object")
    code = _json_enum(status.get("code"), _STATUS_NAMES, f"{where}.status.code")
    name = sp.get("name", "")
    if not isinstance(name, str):
        raise MalformedField(f"{where}.name must be a string")
    events = []
    for e, ev in enumerate(_list(sp, "events", where)):
        if not isinstance(ev, Mapping):
            raise MalformedField(f"{where}.events[{e}] must be an object")
        ev_attrs = _json_attrs(ev.get("attributes"), f"{where}.events[{e}].attributes")
        events.append({"TimestampNs": _json_int(ev, "timeUnixNano", f"{where}.events[{e}]"),
                       "Name": str(ev.get("name", "")), "Attributes": list(ev_attrs.items())})
    links = []
    for n, ln in enumerate(_list(sp, "links", where)):
        if not isinstance(ln, Mapping):
            raise MalformedField(f"{where}.links[{n}] must be an object")
        links.append({"TraceId": _hex_id(ln.get("traceId"), f"{where}.links[{n}].traceId"),
                      "SpanId": _hex_id(ln.get("spanId"), f"{where}.links[{n}].spanId"),
                      "TraceState": str(ln.get("traceState", "")),
                      "Attributes": list(_json_attrs(ln.get("attributes"), f"{where}.links[{n}].attributes").items())})
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "kind": S.SPAN_KINDS[kind] if 0 <= kind < len(S.SPAN_KINDS) else "Unspecified",
        "start_ns": start,
        "end_ns": end,
        "attrs": _json_attrs(sp.get("attributes"), f"{where}.attributes"),
        "status_code": S.STATUS_CODES[code] if 0 <= code < 3 else "Unset",
        "status_message": str(status.get("message", "")),
        "trace_state": str(sp.get("traceState", "")),
        "events": events,
        "links": links,
    }


def decode_json(text: str | bytes, batch: SpanBatch, *, strict: bool = False) -> DecodeResult:
    """Parse and decode one OTLP/JSON ExportTraceServiceRequest document into `batch`."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    return decode_json_obj(payload, batch, strict=strict)


def decode_json_request(text: str | bytes, batch: SpanBatch) -> DecodeResult:
    """Decode an OTLP/JSON request for a receiver: a wrong-typed field raises `MalformedField`
    (the request is malformed: 400), while spans that cannot be stored are only rejected."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid JSON (not UTF-8: {exc.reason} at byte {exc.start})") from None
    return _decode_json_obj(payload, batch, strict=False, malformed_raises=True)


def decode_protobuf_table(data: bytes) -> tuple[pa.Table, DecodeResult]:
    """Decode one serialized ExportTraceServiceRequest straight to a table in SPAN_SCHEMA.

    The same rows `decode_protobuf` appends to a `SpanBatch`, for receivers that want a table.
    """
    batch = SpanBatch()
    result = decode_protobuf(data, batch)
    return batch.to_table(), result
