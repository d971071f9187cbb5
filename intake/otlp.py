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
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tracing import schema as S
from tracing.errors import BadRequest
from tracing.rows import SECONDS_TEXT, SpanBatch, attr_int, attr_str, replica_of, sampling_of, threshold_text

try:  # the optional C decoder, built by pip install when a C compiler exists; Python is exact too
    from intake import _otlpx  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _otlpx = None

_KIND_NAMES = {f"SPAN_KIND_{k.upper()}": i for i, k in enumerate(S.SPAN_KINDS)}
_KIND_NAMES["SPAN_KIND_UNSPECIFIED"] = 0
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


class MalformedField(BadRequest):
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


def _parse_request(data: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError; any failure means malformed input
        raise ValueError(f"malformed OTLP protobuf ExportTraceServiceRequest ({exc})") from None
    return request


def decode_protobuf(data: bytes, batch: SpanBatch, *, strict: bool = False) -> DecodeResult:
    """Decode one serialized ExportTraceServiceRequest into `batch`."""
    return _decode_request(_parse_request(data), batch, strict=strict)


def _decode_request(request: ExportTraceServiceRequest, batch: SpanBatch, *, strict: bool) -> DecodeResult:
    result = DecodeResult()
    for rs in request.resource_spans:
        resource = _pb_attrs(rs.resource.attributes)
        service = resource.get("service.name", "")
        replica = replica_of(resource)
        for ss in rs.scope_spans:
            scope_name, scope_version = ss.scope.name, ss.scope.version
            for sp in ss.spans:
                problem = _check_ids(sp.trace_id.hex(), sp.span_id.hex(), sp.parent_span_id.hex())
                if problem is None:
                    problem = _time_problem(sp.start_time_unix_nano, sp.end_time_unix_nano,
                                            [ev.time_unix_nano for ev in sp.events])
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


#: The largest time storable: times are int64 nanoseconds since the epoch (until year 2262).
MAX_TIME_NS = (1 << 63) - 1


def _time_problem(start: int, end: int, event_times: list[int]) -> str | None:
    """Why these span times cannot be stored (None when they can): outside 0..MAX_TIME_NS or end < start."""
    for name, value in (("startTimeUnixNano", start), ("endTimeUnixNano", end)):
        if not 0 <= value <= MAX_TIME_NS:
            return f"{name} {value} is outside 0..{MAX_TIME_NS} (int64 nanoseconds since 1970)"
    if end < start:
        return "endTimeUnixNano is before startTimeUnixNano"
    for i, value in enumerate(event_times):
        if not 0 <= value <= MAX_TIME_NS:
            return f"events[{i}].timeUnixNano {value} is outside 0..{MAX_TIME_NS} (int64 nanoseconds since 1970)"
    return None


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


def json_attrs(kvs: Any, where: str) -> dict[str, str]:
    """An OTLP/JSON attribute list as a str -> str map; `where` names the list in an error."""
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
        resource = json_attrs((rs.get("resource") or {}).get("attributes"), f"{where_rs}.resource.attributes")
        service = resource.get("service.name", "")
        replica = replica_of(resource)
        for j, ss in enumerate(_list(rs, "scopeSpans", where_rs, "instrumentationLibrarySpans")):
            where_ss = f"{where_rs}.scopeSpans[{j}]"
            if not isinstance(ss, Mapping):
                raise ValueError(f"{where_ss} must be an object")
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
            owner = Owner(resource, service, replica, str(scope.get("name", "")), str(scope.get("version", "")))
            for k, sp in enumerate(_list(ss, "spans", where_ss)):
                append_json_span(sp, f"{where_ss}.spans[{k}]", owner, batch, result,
                                  strict=strict, malformed_raises=malformed_raises)
    return result


@dataclass(frozen=True)
class Owner:
    """What a span takes from the resource and scope around it."""

    resource: dict[str, str]
    service: str
    replica: str | None
    scope_name: str
    scope_version: str


def append_json_span(sp: Any, where: str, owner: Owner, batch: SpanBatch, result: DecodeResult, *,
                      strict: bool, malformed_raises: bool) -> None:
    """Append one parsed OTLP/JSON span to `batch`, or count it rejected (raise when strict)."""
    try:
        batch_args = _json_span(sp, where)
    except ValueError as exc:
        if strict or (malformed_raises and isinstance(exc, MalformedField)):
            raise
        result.reject(str(exc))
        return
    batch.append(**batch_args, service=owner.service, resource=owner.resource, scope_name=owner.scope_name,
                 scope_version=owner.scope_version, replica=owner.replica)
    result.accepted += 1


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
    kind = _json_enum(sp.get("kind"), _KIND_NAMES, f"{where}.kind")
    status = sp.get("status") or {}
    if not isinstance(status, Mapping):
        raise MalformedField(f"{where}.status must be an object")
    code = _json_enum(status.get("code"), _STATUS_NAMES, f"{where}.status.code")
    name = sp.get("name", "")
    if not isinstance(name, str):
        raise MalformedField(f"{where}.name must be a string")
    events = []
    event_times = []
    for e, ev in enumerate(_list(sp, "events", where)):
        if not isinstance(ev, Mapping):
            raise MalformedField(f"{where}.events[{e}] must be an object")
        ev_attrs = json_attrs(ev.get("attributes"), f"{where}.events[{e}].attributes")
        event_times.append(_json_int(ev, "timeUnixNano", f"{where}.events[{e}]"))
        events.append({"TimestampNs": event_times[-1], "Name": str(ev.get("name", "")),
                       "Attributes": list(ev_attrs.items())})
    problem = _time_problem(start, end, event_times)
    if problem:
        raise ValueError(f"{where}: {problem}")
    links = []
    for n, ln in enumerate(_list(sp, "links", where)):
        if not isinstance(ln, Mapping):
            raise MalformedField(f"{where}.links[{n}] must be an object")
        links.append({"TraceId": _hex_id(ln.get("traceId"), f"{where}.links[{n}].traceId"),
                      "SpanId": _hex_id(ln.get("spanId"), f"{where}.links[{n}].spanId"),
                      "TraceState": str(ln.get("traceState", "")),
                      "Attributes": list(json_attrs(ln.get("attributes"), f"{where}.links[{n}].attributes").items())})
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "kind": S.SPAN_KINDS[kind] if 0 <= kind < len(S.SPAN_KINDS) else "Unspecified",
        "start_ns": start,
        "end_ns": end,
        "attrs": json_attrs(sp.get("attributes"), f"{where}.attributes"),
        "status_code": S.STATUS_CODES[code] if 0 <= code < 3 else "Unset",
        "status_message": str(status.get("message", "")),
        "trace_state": str(sp.get("traceState", "")),
        "events": events,
        "links": links,
    }


def _json_error(exc: json.JSONDecodeError) -> str:
    """'invalid JSON (<what>, line L column C)'; the line only when the text has several (some of
    json's messages end in 'at', so the position is not appended with another 'at')."""
    where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
    return f"invalid JSON ({exc.msg}, {where})"


def decode_json(text: str | bytes, batch: SpanBatch, *, strict: bool = False) -> DecodeResult:
    """Parse and decode one OTLP/JSON ExportTraceServiceRequest document into `batch`."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(_json_error(exc)) from None
    except RecursionError:
        raise ValueError(f"invalid JSON (nested deeper than {MAX_JSON_DEPTH} levels)") from None
    return decode_json_obj(payload, batch, strict=strict)


#: Deepest JSON nesting accepted (arrays and objects). OTLP needs about 10 plus nested attribute
#: values; the limit keeps the parser and the attribute walk far from Python's recursion limit.
MAX_JSON_DEPTH = 64


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON `data`, brackets inside strings ignored.

    Vectorized over the positions of quotes, backslashes and brackets only, so it costs a few
    milliseconds per megabyte and never recurses (malformed JSON gives some number; the parser
    then says what is wrong).
    """
    b = np.frombuffer(data, np.uint8)
    pos = np.flatnonzero((b == 0x22) | (b == 0x5C) | (b == 0x5B) | (b == 0x5D) | (b == 0x7B) | (b == 0x7D))
    if not len(pos):
        return 0
    ch = b[pos]
    # a quote is escaped when an odd run of backslashes stands right before it in the text
    is_bs = ch == 0x5C
    quote = np.flatnonzero(ch == 0x22)
    run = np.zeros(len(quote), np.int64)
    k = quote.copy()
    active = k > 0
    while active.any():  # one pass per backslash of the longest run (1 or 2 in practice)
        j = np.where(active, k - 1, 0)
        active &= is_bs[j] & (pos[j] == pos[k] - 1)
        run += active
        k = np.where(active, j, k)
        active &= k > 0
    escaped = run % 2 == 1
    real = np.zeros(len(pos), bool)
    real[quote[~escaped]] = True
    inside = (np.cumsum(real) - real) % 2 == 1  # after an odd number of real quotes: inside a string
    delta = np.where(inside, 0, np.where((ch == 0x5B) | (ch == 0x7B), 1, np.where((ch == 0x5D) | (ch == 0x7D), -1, 0)))
    return int(np.cumsum(delta).max(initial=0))


def decode_json_request(text: str | bytes, batch: SpanBatch) -> DecodeResult:
    """Decode an OTLP/JSON request for a receiver: a wrong-typed field raises `MalformedField`
    (the request is malformed: 400), while spans that cannot be stored are only rejected."""
    data = text.encode() if isinstance(text, str) else text
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"JSON nested {depth} levels deep; the limit is {MAX_JSON_DEPTH}")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(_json_error(exc)) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid JSON (not UTF-8: {exc.reason} at byte {exc.start})") from None
    return _decode_json_obj(payload, batch, strict=False, malformed_raises=True)


def decode_protobuf_table(data: bytes) -> tuple[pa.Table, DecodeResult]:
    """Decode one serialized ExportTraceServiceRequest straight to a table in SPAN_SCHEMA.

    The same rows `decode_protobuf` appends to a `SpanBatch`. With the C extension
    `intake._otlpx` built (by `pip install`, with a C compiler) the columns are extracted without
    a Python object per span; requests it does not handle take the pure-Python path.
    """
    table, result = decode_protobuf_base(data)
    return promote(table), result


def decode_protobuf_base(data: bytes) -> tuple[pa.Table, DecodeResult]:
    """Like `decode_protobuf_table` but without the promoted columns (see `promote`).

    Receivers decode each request with this and `promote` a whole group at once, since
    Arrow compute calls cost the same for 500 rows as for 500,000.
    """
    if _otlpx is not None:
        # the extension checks the wire format of every field it reads and the UTF-8 of every string
        # it stores; anything else (and any doubt) comes back None and takes the upb path below
        cols = _otlpx.extract(data)
        if cols is not None:
            return base_from_columns(cols), DecodeResult(accepted=cols["n"])
    request = _parse_request(data)  # raises ValueError naming what upb found malformed
    batch = SpanBatch()
    result = _decode_request(request, batch, strict=False)
    return base_of(batch.to_table()), result


#: True when the C extension is there (columnar protobuf extraction).
FAST_PROTOBUF = _otlpx is not None
#: Columns `promote` computes from the others (Replica is kept: it comes from the resource).
PROMOTED_COLUMNS: tuple[str, ...] = ("Stage", "IsRequest", "Outcome", "Model", "ModelVersion", "Tenant",
                                     "InputTokens", "OutputTokens", "TtftNs", "AdjustedCount")
BASE_SCHEMA = pa.schema([f for f in S.SPAN_SCHEMA if f.name not in PROMOTED_COLUMNS])


def base_of(table: pa.Table) -> pa.Table:
    """`table` (in SPAN_SCHEMA) without its promoted columns, ready for `promote`."""
    return table.select(BASE_SCHEMA.names)


def _str_array(col: tuple[bytes, bytes]) -> pa.Array:
    off, data = col
    n = len(off) // 4 - 1
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(off), pa.py_buffer(data)])


def _map_array(attrs: tuple[bytes, tuple[bytes, bytes], tuple[bytes, bytes]]) -> pa.Array:
    off, keys, vals = attrs
    owners = len(off) // 4 - 1
    offsets = pa.Array.from_buffers(pa.int32(), owners + 1, [None, pa.py_buffer(off)])
    return pa.MapArray.from_arrays(offsets, _str_array(keys), _str_array(vals), type=S.ATTRS)


def _list_array(off: bytes, values: pa.Array, typ: pa.DataType) -> pa.Array:
    offsets = pa.Array.from_buffers(pa.int32(), len(off) // 4, [None, pa.py_buffer(off)])
    return pa.ListArray.from_arrays(offsets, values, type=typ)


class _Lookup:
    """Vectorized `attrs.get(key)` over a map column (keys are unique per row, as in a dict)."""

    def __init__(self, attrs: pa.ChunkedArray | pa.Array) -> None:
        chunks = attrs.chunks if isinstance(attrs, pa.ChunkedArray) else [attrs]
        keys: list[pa.Array] = []
        values: list[pa.Array] = []
        owners: list[np.ndarray] = []
        base = 0
        for chunk in chunks:
            n = len(chunk)
            if not n:
                continue
            offsets = chunk.offsets.to_numpy()  # the chunk's own offsets into the (unsliced) children
            lo, hi = int(offsets[0]), int(offsets[-1])
            keys.append(chunk.keys.slice(lo, hi - lo))
            values.append(chunk.items.slice(lo, hi - lo))
            owners.append(np.repeat(np.arange(base, base + n), np.diff(offsets)))
            base += n
        self.n = base
        self.values = pa.concat_arrays(values) if values else pa.array([], pa.string())
        self.owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
        # one pass over every key: the slot of each promoted key, then one scatter into a slot x row table
        slot = pc.index_in(pa.concat_arrays(keys) if keys else pa.array([], pa.string()), value_set=_LOOKUP_KEYS)
        slots = pc.fill_null(slot, -1).to_numpy(zero_copy_only=False)
        hits = np.flatnonzero(slots >= 0)
        self.index = np.full((len(_LOOKUP_KEYS), self.n), -1, np.int64)
        self.index[slots[hits], self.owner[hits]] = hits
        # per value: present (not null) and not empty, for `first` (rows.first_attr skips both)
        self.usable = pc.fill_null(pc.greater(pc.binary_length(self.values), 0), False).to_numpy(zero_copy_only=False)

    def get(self, key: str) -> pa.Array:
        """The value of `key` (one of _LOOKUP_KEYS) per row, null where the row has no such key."""
        index = self.index[_LOOKUP_SLOT[key]]
        if not self.n or index.max() < 0:
            return pa.nulls(self.n, pa.string())
        return self.values.take(pa.array(index, mask=index < 0))

    def first(self, keys: tuple[str, ...]) -> pa.Array:
        """Vectorized rows.first_attr: the first key whose value is present and not empty (index
        arithmetic in numpy and one take: a compute call costs tens of microseconds however short
        the column, and this runs once per commit group per promoted column)."""
        chosen = np.full(self.n, -1, np.int64)
        for key in keys:
            index = self.index[_LOOKUP_SLOT[key]]
            hit = np.flatnonzero((chosen < 0) & (index >= 0))
            hit = hit[self.usable[index[hit]]]
            chosen[hit] = index[hit]
        if not self.n or chosen.max() < 0:
            return pa.nulls(self.n, pa.string())
        return self.values.take(pa.array(chosen, mask=chosen < 0))


def _ttft(attrs: Any) -> pa.Array:
    """Vectorized rows.ttft_ns_of: `tailscope.ttft_ns`, else `gen_ai.response.time_to_first_chunk` seconds in ns."""
    declared = _ints(attrs.get(S.ATTR_TTFT_NS))
    text = attrs.get(S.ATTR_TIME_TO_FIRST_CHUNK)
    if text.null_count == len(text):
        return declared
    ok = pc.fill_null(pc.match_substring_regex(text, SECONDS_TEXT), False)
    secs = pc.cast(pc.if_else(ok, text, pa.scalar(None, pa.string())), pa.float64())
    ns = pc.cast(pc.round(pc.multiply(secs, 1e9), round_mode="half_to_even"), pa.int64())
    return pc.coalesce(declared, ns)


def _ints(text: pa.Array) -> pa.Array:
    """Vectorized rows.attr_int: plain decimals cast in Arrow, anything else through Python."""
    if text.null_count == len(text):
        return pa.nulls(len(text), pa.int64())
    plain = pc.fill_null(pc.match_substring_regex(text, r"^-?[0-9]{1,18}$"), False)
    odd = pc.and_(pc.invert(plain), pc.is_valid(text))
    if not pc.any(odd).as_py():
        return pc.cast(pc.if_else(plain, text, pa.scalar(None, pa.string())), pa.int64())
    return pa.array([attr_int(v) for v in text.to_pylist()], pa.int64())


def _per_distinct(text: pa.Array, rule: Callable[[str], float], missing: float) -> np.ndarray:
    """`rule` applied once per distinct string of `text`, spread back over its rows (`missing` on nulls)."""
    encoded = pc.dictionary_encode(text)
    values = np.array([rule(v) for v in encoded.dictionary.to_pylist()] + [missing], np.float64)
    index = pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    return values[index]


def _threshold_rule(state: str) -> float:
    return math.nan if threshold_text(state) is None else sampling_of(state, None)[0]


def _adjusted_counts(states: pa.Array, rates: pa.Array) -> pa.Array:
    """Vectorized rows.adjusted_count_of: the rule runs once per distinct TraceState and rate, not per row."""
    n = len(states)
    has_state = pc.any(pc.match_substring(states, "ot=")).as_py()
    if not has_state and rates.null_count == n:
        return pa.array(np.ones(n, np.float64))
    from_rate = _per_distinct(rates, lambda r: sampling_of("", r)[0], 1.0)
    if not has_state:
        return pa.array(from_rate)
    from_state = _per_distinct(states, _threshold_rule, math.nan)
    return pa.array(np.where(np.isnan(from_state), from_rate, from_state))


def new_builder() -> Any:
    """A columnar accumulator of protobuf bodies (intake._otlpx.Builder), or None without the extension."""
    return _otlpx.Builder() if _otlpx is not None else None


def base_from_columns(c: dict[str, Any]) -> pa.Table:
    """The BASE_SCHEMA table of columns extracted by intake._otlpx (extract() or Builder.take())."""
    n = c["n"]
    res_idx = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(c["res"])])
    scope_idx = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(c["scope"])])
    resources = _map_array(c["res_attrs"])
    res_dicts = [dict(kv) for kv in resources.to_pylist()]
    start = np.frombuffer(c["start"], np.int64)
    end = np.frombuffer(c["end"], np.int64)
    kind_raw = np.frombuffer(c["kind"], np.int32)
    code_raw = np.frombuffer(c["code"], np.int32)
    ev_struct = pa.StructArray.from_arrays(
        [pa.array(np.frombuffer(c["ev_time"], np.int64)), _str_array(c["ev_name"]), _map_array(c["ev_attrs"])],
        fields=list(S.EVENT))
    ln_struct = pa.StructArray.from_arrays(
        [_str_array(c["ln_trace"]), _str_array(c["ln_span"]), _str_array(c["ln_state"]), _map_array(c["ln_attrs"])],
        fields=list(S.LINK))
    one_resource = len(res_dicts) == 1
    columns = {
        "Timestamp": pa.array(start // 1000, pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(start),
        "TraceId": _str_array(c["trace"]),
        "SpanId": _str_array(c["span"]),
        "ParentSpanId": _str_array(c["parent"]),
        "TraceState": _str_array(c["state"]),
        "SpanName": _str_array(c["name"]),
        "SpanKind": _KIND_ARRAY.take(pa.array(np.where((kind_raw >= 0) & (kind_raw < len(S.SPAN_KINDS)),
                                                       kind_raw, 0))),
        "ServiceName": (pa.array([res_dicts[0].get("service.name", "")] * n, pa.string()) if one_resource else
                        pa.array([r.get("service.name", "") for r in res_dicts], pa.string()).take(res_idx)),
        "ResourceAttributes": resources.take(res_idx),
        "ScopeName": _str_array(c["scope_name"]).take(scope_idx),
        "ScopeVersion": _str_array(c["scope_version"]).take(scope_idx),
        "SpanAttributes": _map_array(c["attrs"]),
        "Duration": pa.array(end - start),
        "StatusCode": _STATUS_ARRAY.take(pa.array(np.where((code_raw >= 0) & (code_raw < 3), code_raw, 0))),
        "StatusMessage": _str_array(c["smsg"]),
        "Events": _list_array(c["ev_off"], ev_struct, pa.list_(S.EVENT)),
        "Links": _list_array(c["ln_off"], ln_struct, pa.list_(S.LINK)),
        "Replica": (pa.array([replica_of(res_dicts[0])] * n, pa.string()) if one_resource else
                    pa.array([replica_of(r) for r in res_dicts], pa.string()).take(res_idx)),
    }
    return pa.Table.from_arrays([columns[name] for name in BASE_SCHEMA.names], schema=BASE_SCHEMA)


def promote(table: pa.Table) -> pa.Table:
    """Add the promoted columns to a base table: the same rules as `SpanBatch.append`
    (rows.stage_of, is_request, outcome_of, first_attr, attr_int, adjusted_count_of), vectorized.
    Returns SPAN_SCHEMA."""
    attrs = _Lookup(table.column("SpanAttributes"))
    names = pa.concat_arrays(table.column("SpanName").chunks) if table.num_rows else pa.array([], pa.string())
    kinds = pa.concat_arrays(table.column("SpanKind").chunks) if table.num_rows else pa.array([], pa.string())
    codes = pa.concat_arrays(table.column("StatusCode").chunks) if table.num_rows else pa.array([], pa.string())
    states = pa.concat_arrays(table.column("TraceState").chunks) if table.num_rows else pa.array([], pa.string())
    null_str = pa.scalar(None, pa.string())
    declared = attrs.get(S.ATTR_STAGE)
    stage = pc.if_else(pc.is_in(declared, value_set=_STAGE_ARRAY), declared,
                       pc.if_else(pc.is_in(names, value_set=_STAGE_ARRAY), names, null_str))
    flag = attrs.get(S.ATTR_REQUEST)
    implied = pc.and_(pc.and_(pc.is_null(stage), pc.is_in(kinds, value_set=_REQUEST_KINDS)),
                      pc.is_valid(attrs.get(S.ATTR_OPERATION)))
    request = pc.if_else(pc.is_valid(flag), pc.fill_null(pc.equal(pc.ascii_lower(flag), "true"), False), implied)
    outcome_decl = attrs.get(S.ATTR_OUTCOME)
    err = pc.replace_substring(pc.ascii_lower(pc.fill_null(
        attrs.get(S.ATTR_ERROR_TYPE), "")), "_", "")
    timeout = pc.or_(pc.or_(pc.match_substring(err, "timeout"), pc.match_substring(err, "timedout")),
                     pc.match_substring(err, "deadline"))
    from_status = pc.if_else(pc.not_equal(codes, "Error"), "ok",
                             pc.if_else(timeout, "timeout",
                                        pc.if_else(pc.match_substring(err, "cancel"), "cancelled", "error")))
    outcome = pc.if_else(pc.is_in(outcome_decl, value_set=_OUTCOME_ARRAY), outcome_decl, from_status)
    promoted = {
        "Stage": stage,
        "IsRequest": request,
        "Outcome": pc.if_else(request, outcome, null_str),
        "Model": attrs.first(S.MODEL_KEYS),
        "ModelVersion": attrs.first(S.MODEL_VERSION_KEYS),
        "Tenant": attrs.first(S.TENANT_KEYS),
        "InputTokens": _ints(attrs.first(S.INPUT_TOKEN_KEYS)),
        "OutputTokens": _ints(attrs.first(S.OUTPUT_TOKEN_KEYS)),
        "TtftNs": _ttft(attrs),
        "AdjustedCount": _adjusted_counts(states, attrs.first(S.SAMPLE_RATE_KEYS)),
    }
    columns = [pa.chunked_array([promoted[name]]) if name in promoted else table.column(name)
               for name in S.COLUMN_NAMES]
    return pa.Table.from_arrays(columns, schema=S.SPAN_SCHEMA)


_LOOKUP_KEYS = pa.array(sorted({S.ATTR_STAGE, S.ATTR_REQUEST, S.ATTR_OPERATION, S.ATTR_OUTCOME, S.ATTR_ERROR_TYPE,
                                 S.ATTR_TTFT_NS, S.ATTR_TIME_TO_FIRST_CHUNK, *S.MODEL_KEYS, *S.MODEL_VERSION_KEYS,
                                 *S.TENANT_KEYS,
                                 *S.INPUT_TOKEN_KEYS, *S.OUTPUT_TOKEN_KEYS, *S.SAMPLE_RATE_KEYS}), pa.string())
_LOOKUP_SLOT = {k: i for i, k in enumerate(_LOOKUP_KEYS.to_pylist())}
_KIND_ARRAY = pa.array(S.SPAN_KINDS, pa.string())
_STATUS_ARRAY = pa.array(S.STATUS_CODES, pa.string())
_STAGE_ARRAY = pa.array(S.ALL_STAGES, pa.string())
_OUTCOME_ARRAY = pa.array(S.OUTCOMES, pa.string())
_REQUEST_KINDS = pa.array(["Server", "Internal"], pa.string())
