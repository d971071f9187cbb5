"""NVIDIA Triton (2.73.0dev): the JSON trace file and the OpenTelemetry mode.

OpenTelemetry mode (`--trace-config mode=opentelemetry`, src/tracer.cc): a SERVER root span
`InferRequest` with the frontend timestamps as events (HTTP_RECV_START/END, HTTP_SEND_START/END
or GRPC_WAITREAD_*/GRPC_SEND_*), a child span named after the model (attributes
`triton.model_name`, `triton.model_version`, …; events REQUEST_START, QUEUE_START,
REQUEST_END) and below it a `compute` span (COMPUTE_START, COMPUTE_INPUT_END,
COMPUTE_OUTPUT_START, COMPUTE_END). Stages come from the event times (docs/engines.md):
network = receive + send, preprocess = REQUEST_START→QUEUE_START + COMPUTE_START→
COMPUTE_INPUT_END, queue_wait = QUEUE_START→COMPUTE_START, generation =
COMPUTE_INPUT_END→COMPUTE_OUTPUT_START (no prefill/decode split in Triton's timestamps).

JSON mode (`--trace-config triton,file=…`, TIMESTAMPS level): one JSON array of elements
`{"id","model_name","model_version","request_id"?,"parent_id"?}` and
`{"id","timestamps":[{"name","ns"}]}`; `[` is written first and `]` only at shutdown. The
`ns` values come from the steady (monotonic) clock; they are moved to wall time by adding
an offset: `$TAILSCOPE_TRITON_CLOCK_OFFSET_NS` (wall ns − monotonic ns, e.g. measured on
the server as `date +%s%N` minus the `CLOCK_MONOTONIC` reading) when set, else the file's
mtime minus its latest timestamp (Triton writes a trace when the request is released, so
the last write is close to the last timestamp). Each top-level trace becomes the same span
shape as the OpenTelemetry mode, then is mapped the same way.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from intake.engines._common import (
    Row,
    Timeline,
    Trace,
    attrs_of,
    first_of,
    is_native,
    last_of,
    mark_request,
)
from intake.engines.settings import ENGINES
from tracing.errors import InputError
from tracing.rows import SpanBatch, outcome_of
from tracing.settings import SettingError

NAME = "triton"
ROOT_NAME = "InferRequest"
COMPUTE_NAME = "compute"
SERVICE = "triton-inference-server"
#: Wall-clock offset (ns) added to the monotonic `ns` of a JSON trace file (the ENGINES settings table).
ENV_CLOCK_OFFSET = ENGINES.triton_clock_offset_ns.env

FRONTEND = (
    "HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END",
    "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END",
    "INFER_RESPONSE_COMPLETE",
)
REQUEST_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
_BOUNDARY = re.compile(r"\}\s*,\s*(\{)\s*\"id\"")  # Triton writes every element as {"id":…
COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def candidate_mask(names: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spans that may be Triton request roots (checked further in `map_trace`)."""
    return pc.equal(names, ROOT_NAME)


# --- mapping (both modes) ------------------------------------------------------------------


def _events(row: Row) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for event in row["Events"] or ():
        out.setdefault(event["Name"], []).append(int(event["TimestampNs"]))
    return out


def _first(ev: dict[str, list[int]], name: str) -> int | None:
    return min(ev[name]) if name in ev else None


def _last(ev: dict[str, list[int]], name: str) -> int | None:
    return max(ev[name]) if name in ev else None


def evidence_of(trace: Trace, row: Row) -> str | None:
    """Why an `InferRequest` span is Triton's, or None: its scope or service (src/tracer.cc), its frontend
    timestamp events, or its span tree (a model span with `triton.model_name`, a `compute` span)."""
    for what, value in (("scope", str(row.get("ScopeName") or "")), ("service", str(row.get("ServiceName") or ""))):
        if value.startswith("triton"):
            return f"{what} {value}"
    events = [e for e in _events(row) if e in FRONTEND]
    if events:
        return f"events {events[0]}"
    for child in trace.children.get(row["SpanId"], ()):
        if "triton.model_name" in attrs_of(child):
            return "span tree: a model span with triton.model_name"
    return None


def map_trace(trace: Trace) -> list[Row]:
    """Mark every Triton `InferRequest` root of the trace and return its synthetic stage spans."""
    out: list[Row] = []
    for row in list(trace.spans):
        if row["SpanName"] != ROOT_NAME or row["SpanKind"] not in ("Server", "Unspecified"):
            continue
        attrs = attrs_of(row)
        if is_native(attrs):
            continue
        why = evidence_of(trace, row)
        if why is not None:
            out.extend(map_request(trace, row, attrs, why))
    return out


def map_request(trace: Trace, root: Row, attrs: dict[str, str], evidence: str = "") -> list[Row]:
    """Lay one Triton request's activity timestamps on its timeline."""
    front = _events(root)
    models = [c for c in trace.children.get(root["SpanId"], ()) if c["SpanName"] != COMPUTE_NAME]
    model = next((m for m in models if "triton.model_name" in attrs_of(m)), models[0] if models else None)
    req: dict[str, list[int]] = _events(model) if model is not None else {}
    computes = []
    if model is not None:
        direct = [c for c in trace.children.get(model["SpanId"], ()) if c["SpanName"] == COMPUTE_NAME]
        # an ensemble's own model span has no compute: use its composing models' compute spans
        computes = direct or [s for s in trace.descendants(model["SpanId"]) if s["SpanName"] == COMPUTE_NAME]
    comp: dict[str, list[int]] = {}
    for c in computes:
        for name, values in _events(c).items():
            comp.setdefault(name, []).extend(values)
    timeline = Timeline(root, NAME)
    for lo, hi in (("HTTP_RECV_START", "HTTP_RECV_END"), ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")):
        timeline.add("network", _first(front, lo), _last(front, hi), f"{lo}→{hi}")
    for lo, hi in (("HTTP_SEND_START", "HTTP_SEND_END"), ("GRPC_SEND_START", "GRPC_SEND_END")):
        timeline.add("network", _first(front, lo), _last(front, hi), f"{lo}→{hi}")
    timeline.add("preprocess", _first(req, "REQUEST_START"), _first(req, "QUEUE_START"), "REQUEST_START→QUEUE_START")
    timeline.add("queue_wait", _first(req, "QUEUE_START"), _first(comp, "COMPUTE_START"), "QUEUE_START→COMPUTE_START")
    timeline.add("preprocess", _first(comp, "COMPUTE_START"), _first(comp, "COMPUTE_INPUT_END"),
                 "COMPUTE_START→COMPUTE_INPUT_END")
    timeline.add("generation", _first(comp, "COMPUTE_INPUT_END"), _last(comp, "COMPUTE_OUTPUT_START"),
                 "COMPUTE_INPUT_END→COMPUTE_OUTPUT_START")
    # Decoupled models (LLM backends: TensorRT-LLM python backend, the vLLM backend) return from
    # execute() at once and stream their responses later: generation runs on after the compute span,
    # up to the root's INFER_RESPONSE_COMPLETE (src/tracer.cc records it on the root when the last
    # response is sent); without this rule that time lands in `other`.
    complete = _last(front, "INFER_RESPONSE_COMPLETE")
    released = _last(req, "REQUEST_END")
    if complete is not None and released is not None and complete > released:
        after = last_of([_last(comp, "COMPUTE_END"), _last(comp, "COMPUTE_OUTPUT_START")])
        timeline.add("generation", after if after is not None else released, complete,
                     "decoupled: COMPUTE_END→INFER_RESPONSE_COMPLETE")
    m_attrs = attrs_of(model) if model is not None else {}
    status = "Error" if root["StatusCode"] == "Error" or (model is not None and model["StatusCode"] == "Error") \
        else root["StatusCode"]
    mark_request(root, NAME, outcome_of(status, attrs), model=m_attrs.get("triton.model_name"),
                 model_version=m_attrs.get("triton.model_version"), evidence=evidence)
    return timeline.rows()


# --- JSON trace file ------------------------------------------------------------------------


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _elements(path: Path, text: str, skip_bad: bool, report: object) -> list[dict[str, Any]]:
    """Decode the array's elements one by one; a missing `]` or a cut last element is tolerated."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    out: list[dict[str, Any]] = []
    size = len(text)
    while True:
        while pos < size and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= size or text[pos] == "]":
            return out
        try:
            element, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            boundary = _BOUNDARY.search(text, pos)
            if boundary is None:  # nothing after it: the element Triton was writing when we read
                _note(report, f"{path}:{_line_of(text, pos)}: incomplete last element dropped (live file)")
                return out
            if not skip_bad:
                raise InputError(str(path), _line_of(text, pos), f"bad Triton trace element ({exc.msg})") from None
            _bad(report, f"{path}:{_line_of(text, pos)}: bad Triton trace element ({exc.msg})")
            pos = boundary.start(1)
            continue
        if isinstance(element, dict) and "id" in element:
            out.append(element)
        elif not skip_bad:
            raise InputError(str(path), _line_of(text, pos), "Triton trace element without an `id`")
        else:
            _bad(report, f"{path}:{_line_of(text, pos)}: Triton trace element without an `id`")


def _bad(report: object, what: str) -> None:
    setattr(report, "bad_lines", getattr(report, "bad_lines", 0) + 1)  # noqa: B010
    _note(report, what)


def _note(report: object, what: str) -> None:
    problems = getattr(report, "problems", None)
    if isinstance(problems, list) and len(problems) < 20:
        problems.append(what)


def _hex(*parts: object, size: int) -> str:
    digest = hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=size).hexdigest()
    return digest if int(digest, 16) else digest[:-1] + "1"


def clock_offset(path: Path, latest_ns: int) -> int:
    """Wall ns minus monotonic ns for a JSON trace file: the env override, else mtime-anchored."""
    try:
        offset = ENGINES.triton_clock_offset_ns.resolve()
    except SettingError as exc:
        raise InputError(str(path), 0, str(exc)) from None
    return offset if offset is not None else path.stat().st_mtime_ns - latest_ns


def read_json_array(path: Path, data: bytes, *, skip_bad: bool, report: object) -> list[pa.Table]:
    """Decode a Triton JSON trace file into spans shaped like Triton's OpenTelemetry mode."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), 0, f"not UTF-8 text ({exc.reason})") from None
    traces: dict[int, dict[str, Any]] = {}
    for element in _elements(path, text, skip_bad, report):
        entry = traces.setdefault(int(element["id"]), {"meta": {}, "ts": []})
        if "timestamps" in element:
            for stamp in element["timestamps"] or ():
                if isinstance(stamp, dict) and "name" in stamp and "ns" in stamp:
                    entry["ts"].append((str(stamp["name"]), int(stamp["ns"])))
        elif "model_name" in element:
            entry["meta"] = element
    traces = {k: v for k, v in traces.items() if v["ts"]}
    if not traces:
        return []
    offset = clock_offset(path, max(ns for t in traces.values() for _, ns in t["ts"]))
    batch = SpanBatch()
    children: dict[int, list[int]] = {}
    for tid, entry in traces.items():
        parent = entry["meta"].get("parent_id")
        if parent is not None and int(parent) in traces:
            children.setdefault(int(parent), []).append(tid)
    for tid, entry in sorted(traces.items()):
        parent = entry["meta"].get("parent_id")
        if parent is not None and int(parent) in traces:
            continue
        _emit(batch, traces, children, tid, offset)
    return [batch.to_table()] if len(batch) else []


def _emit(batch: SpanBatch, traces: dict[int, dict[str, Any]], children: dict[int, list[int]],
          top: int, offset: int) -> None:
    entry = traces[top]
    first_raw = min(ns for _, ns in entry["ts"])
    model_name = str(entry["meta"].get("model_name", ""))
    trace_id = _hex("triton", model_name, top, first_raw, size=16)
    resource = {"service.name": SERVICE}
    family = [top]
    k = 0
    while k < len(family):
        family.extend(children.get(family[k], ()))
        k += 1
    all_ns = [ns for t in family for _, ns in traces[t]["ts"]]
    root_id = _hex(trace_id, "root", size=8)
    front = [(n, ns) for n, ns in entry["ts"] if n in FRONTEND]
    batch.append(trace_id=trace_id, span_id=root_id, parent_span_id="", name=ROOT_NAME, kind="Server",
                 start_ns=min(all_ns) + offset, end_ns=max(all_ns) + offset, service=SERVICE, resource=resource,
                 attrs={}, scope_name="triton-json-trace", events=_event_dicts(front, offset))

    def model_spans(tid: int, parent_span: str) -> None:
        e = traces[tid]
        meta = e["meta"]
        own = [(n, ns) for n, ns in e["ts"] if n not in FRONTEND]
        if not own:
            return
        model_id = _hex(trace_id, "model", tid, size=8)
        attrs = {"triton.model_name": str(meta.get("model_name", "")),
                 "triton.model_version": str(meta.get("model_version", "")),
                 "triton.trace_id": str(tid)}
        if meta.get("request_id"):
            attrs["triton.request_id"] = str(meta["request_id"])
        if meta.get("parent_id") is not None:
            attrs["triton.trace_parent_id"] = str(meta["parent_id"])
        req = [(n, ns) for n, ns in own if n not in COMPUTE_EVENTS]
        comp = [(n, ns) for n, ns in own if n in COMPUTE_EVENTS]
        batch.append(trace_id=trace_id, span_id=model_id, parent_span_id=parent_span,
                     name=attrs["triton.model_name"] or "model", kind="Server",
                     start_ns=(first_of(ns for n, ns in own if n == "REQUEST_START") or min(ns for _, ns in own))
                     + offset,
                     end_ns=(last_of(ns for n, ns in own if n == "REQUEST_END") or max(ns for _, ns in own)) + offset,
                     service=SERVICE, resource=resource, attrs=attrs, scope_name="triton-json-trace",
                     events=_event_dicts(req, offset))
        if comp:
            batch.append(trace_id=trace_id, span_id=_hex(trace_id, "compute", tid, size=8), parent_span_id=model_id,
                         name=COMPUTE_NAME, kind="Server", start_ns=min(ns for _, ns in comp) + offset,
                         end_ns=max(ns for _, ns in comp) + offset, service=SERVICE, resource=resource, attrs={},
                         scope_name="triton-json-trace", events=_event_dicts(comp, offset))
        for child in children.get(tid, ()):
            model_spans(child, model_id)

    model_spans(top, root_id)


def _event_dicts(stamps: list[tuple[str, int]], offset: int) -> list[dict[str, Any]]:
    ordered = sorted(stamps, key=lambda x: x[1])
    return [{"TimestampNs": ns + offset, "Name": name, "Attributes": []} for name, ns in ordered]
