"""Shared machinery of the engine mappers: one trace's spans as rows, and synthetic stage spans.

A mapper gets every span of one trace as a row (a dict of `SPAN_SCHEMA` columns), marks the
engine's request span (IsRequest, Outcome, TtftNs, ...) in place and returns synthetic stage
spans laid on the request's timeline. Synthetic spans are children of the request span (prefill
and decode are children of a synthetic `generation` span), carry `tailscope.stage`,
`tailscope.synthetic = "true"` and `tailscope.derived_from`, and have span ids derived from a
hash of trace id + request span id + stage, so re-ingesting a file adds no duplicate.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tracing import schema as S
from tracing.rows import attr_int, first_attr, outcome_of, replica_of

Row = dict[str, Any]

#: Scope name of synthetic stage spans.
SCOPE = "tailscope.engines"
_NS_PER_S = 1_000_000_000


def attrs_of(row: Row) -> dict[str, str]:
    """The span attributes of a row as a dict."""
    return dict(row["SpanAttributes"] or ())


def resource_of(row: Row) -> dict[str, str]:
    """The resource attributes of a row as a dict."""
    return dict(row["ResourceAttributes"] or ())


def end_of(row: Row) -> int:
    """End of a span in ns since the epoch."""
    return int(row["TimestampNs"]) + int(row["Duration"])


def is_native(attrs: Mapping[str, str]) -> bool:
    """True for spans that already follow the tailscope convention: never remapped."""
    return S.ATTR_REQUEST in attrs or S.ATTR_STAGE in attrs or S.ATTR_SYNTHETIC in attrs


#: A non-negative decimal number of seconds as engines store it ("0.12", "1e-09"); anything else is ignored.
SECONDS_PATTERN = r"^\s*[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?\s*$"
_SECONDS = re.compile(SECONDS_PATTERN)


def seconds_ns(text: str | None) -> int | None:
    """Float seconds as stored (e.g. '0.0123') to integer ns (round half even), None when absent or not one.

    The same rule as the vectorized path (`vllm.normalize_table`): parse as a double, times 1e9, rint.
    """
    if text is None or not _SECONDS.match(text):
        return None
    value = float(text) * _NS_PER_S
    if not math.isfinite(value):
        return None
    return round(value)


_RUST_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|µs|μs|us|ms|s)\s*$")
_RUST_UNITS = {"ns": 1, "µs": 1_000, "μs": 1_000, "us": 1_000, "ms": 1_000_000, "s": _NS_PER_S}


def rust_duration_ns(text: str | None) -> int | None:
    """A Rust `Debug` Duration string ('12.3ms', '1.2s', '850µs', '7ns') to integer ns, else None."""
    if not text:
        return None
    match = _RUST_DURATION.match(text)
    if match is None:
        return None
    return int((Decimal(match.group(1)) * _RUST_UNITS[match.group(2)]).to_integral_value())


def derived_span_id(trace_id: str, span_id: str, key: str) -> str:
    """A deterministic 16-hex span id for the synthetic span `key` of request `span_id`."""
    digest = hashlib.blake2b(f"{trace_id}/{span_id}/{key}".encode(), digest_size=8).hexdigest()
    return digest if digest != "0" * 16 else "0" * 15 + "1"


def finish_reason_outcome(status_code: str, attrs: Mapping[str, str]) -> str:
    """Outcome from `gen_ai.response.finish_reasons` (abort → cancelled, error → error), else the status."""
    if S.ATTR_OUTCOME not in attrs:
        reasons = attrs.get(S.ATTR_FINISH_REASONS, "").lower()
        if "abort" in reasons or "cancel" in reasons:
            return "cancelled"
        if "error" in reasons:
            return "error"
    return outcome_of(status_code, attrs)


def mark_request(row: Row, engine: str, outcome: str, *, ttft_ns: int | None = None,
                 model: str | None = None, model_version: str | None = None,
                 input_tokens: int | None = None, output_tokens: int | None = None,
                 replica: str | None = None, streaming: bool | None = None, evidence: str = "") -> None:
    """Promote `row` to the request span of one inference request (in place); `evidence` says why the engine
    claimed it (its scope, service, attribute set or span tree: docs/engines.md#evidence)."""
    row["IsRequest"] = True
    row["Outcome"] = outcome
    if ttft_ns is not None:
        row["TtftNs"] = ttft_ns
    if model and not row["Model"]:
        row["Model"] = model
    if model_version and not row["ModelVersion"]:
        row["ModelVersion"] = model_version
    if input_tokens is not None and row["InputTokens"] is None:
        row["InputTokens"] = input_tokens
    if output_tokens is not None and row["OutputTokens"] is None:
        row["OutputTokens"] = output_tokens
    if replica and not row["Replica"]:
        row["Replica"] = replica
        row["ResourceAttributes"] = replica_resource(row["ResourceAttributes"], replica)
    extra = {S.ATTR_ENGINE: engine}
    if evidence:
        extra[S.ATTR_ENGINE_EVIDENCE] = evidence
    if streaming is not None:
        extra[S.ATTR_STREAMING] = "true" if streaming else "false"
    attrs = attrs_of(row)
    attrs.update({k: v for k, v in extra.items() if k not in attrs or k in (S.ATTR_ENGINE, S.ATTR_ENGINE_EVIDENCE)})
    attrs.update(fact_attrs(row, attrs))
    row["SpanAttributes"] = list(attrs.items())


def mark_not_request(row: Row, engine: str) -> None:
    """A span of the engine's request shape that the mapper decided is no request of its own (SGLang's
    prefill root under disaggregation, TGI's inner handler): say so as attributes too, so no later
    mapping (a forwarded copy, a ClickHouse table) counts it (in place)."""
    row["IsRequest"] = False
    row["Outcome"] = None
    attrs = attrs_of(row)
    attrs.update({S.ATTR_ENGINE: engine, S.ATTR_REQUEST: "false"})
    row["SpanAttributes"] = list(attrs.items())


def fact_attrs(row: Row, attrs: Mapping[str, str]) -> dict[str, str]:
    """The span attributes that make `row`'s promoted request facts readable without tailscope's columns.

    What a mapper promoted (request marker, outcome, TTFT, model, version, tokens) is written back as
    the convention's attributes, so `rows.SpanBatch.append` / `otlp.promote` on the attributes alone
    (a ClickHouse `otel_traces` table, any OTLP backend) give the same columns. A key whose value
    already promotes to the same value is left as it came.
    """
    out = {S.ATTR_REQUEST: "true" if row["IsRequest"] else "false"}
    if row["IsRequest"]:
        out[S.ATTR_OUTCOME] = row["Outcome"]
    if row["TtftNs"] is not None and attrs.get(S.ATTR_TTFT_NS) != str(row["TtftNs"]):
        out[S.ATTR_TTFT_NS] = str(row["TtftNs"])
    for column, keys in (("Model", S.MODEL_KEYS), ("ModelVersion", S.MODEL_VERSION_KEYS)):
        if row[column] and first_attr(attrs, keys) != row[column]:
            out[keys[0]] = row[column]
    for column, keys in (("InputTokens", S.INPUT_TOKEN_KEYS), ("OutputTokens", S.OUTPUT_TOKEN_KEYS)):
        if row[column] is not None and attr_int(first_attr(attrs, keys)) != row[column]:
            out[keys[0]] = str(row[column])
    return out


def replica_resource(resource: Any, replica: str | None) -> list[tuple[str, str]]:
    """`resource` (stored pairs) with `tailscope.replica` = `replica` when the resource rule would name
    another replica: a mapper's replica decision then survives in ResourceAttributes (docs/engines.md)."""
    pairs = dict(resource or ())
    if replica and replica_of(pairs) != replica:
        pairs[S.ATTR_REPLICA] = replica
    return list(pairs.items())


def int_or_none(text: str | None) -> int | None:
    """An integer attribute value, or None."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return int(float(text))
        except ValueError:
            return None


def json_list(text: str | None) -> list[Any]:
    """A JSON-array attribute value (engines store lists as JSON strings), or []."""
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return [text]
    return value if isinstance(value, list) else [value]


@dataclass
class Piece:
    """One stretch of the request's timeline that a stage holds."""

    stage: str
    start: int
    end: int
    source: str


@dataclass
class Timeline:
    """Synthetic stage spans of one request span, clipped to it."""

    request: Row
    engine: str
    replica: str | None = None
    pieces: list[Piece] = field(default_factory=list)

    def add(self, stage: str, start: int | None, end: int | None, source: str) -> None:
        """Add a stretch for `stage` (ignored when unknown or empty after clipping to the request)."""
        if start is None or end is None:
            return
        lo = max(int(start), int(self.request["TimestampNs"]))
        hi = min(int(end), end_of(self.request))
        if hi > lo:
            self.pieces.append(Piece(stage, lo, hi, source))

    def rows(self) -> list[Row]:
        """The synthetic spans: level-1 stages under the request, prefill/decode under generation."""
        req = self.request
        trace_id, req_id = req["TraceId"], req["SpanId"]
        out: list[Row] = []
        counts: dict[str, int] = {}

        def key(stage: str) -> str:
            n = counts.get(stage, 0)
            counts[stage] = n + 1
            return stage if n == 0 else f"{stage}#{n}"

        parts = sorted((p for p in self.pieces if p.stage in S.STAGE_PARENT), key=lambda p: (p.start, p.end))
        for level1 in [p for p in self.pieces if p.stage not in S.STAGE_PARENT]:
            out.append(self._row(derived_span_id(trace_id, req_id, key(level1.stage)), req_id, level1))
        # prefill/decode go under a synthetic generation span, one per run of touching parts, so a
        # gap between them (SGLang's decode_waiting) stays with the stage that holds it
        run: list[Piece] = []
        nxt: list[Piece | None] = [*parts, None]
        for piece in nxt:
            if piece is not None and (not run or piece.start <= max(p.end for p in run)):
                run.append(piece)
                continue
            if run:
                sources = " + ".join(dict.fromkeys(p.source for p in run))
                gen = Piece("generation", run[0].start, max(p.end for p in run), f"span of {sources}")
                gen_id = derived_span_id(trace_id, req_id, key("generation"))
                out.append(self._row(gen_id, req_id, gen))
                out.extend(self._row(derived_span_id(trace_id, req_id, key(p.stage)), gen_id, p) for p in run)
            run = [piece] if piece is not None else []
        return out

    def _row(self, span_id: str, parent: str, piece: Piece) -> Row:
        req = self.request
        replica = self.replica or req["Replica"]
        return {
            "Timestamp": piece.start // 1000,
            "TimestampNs": piece.start,
            "TraceId": req["TraceId"],
            "SpanId": span_id,
            "ParentSpanId": parent,
            "TraceState": "",
            "SpanName": piece.stage,
            "SpanKind": "Internal",
            "ServiceName": req["ServiceName"],
            "ResourceAttributes": replica_resource(req["ResourceAttributes"], replica),
            "ScopeName": SCOPE,
            "ScopeVersion": "",
            "SpanAttributes": [
                (S.ATTR_STAGE, piece.stage),
                (S.ATTR_SYNTHETIC, "true"),
                (S.ATTR_ENGINE, self.engine),
                (S.ATTR_DERIVED_FROM, piece.source),
            ],
            "Duration": piece.end - piece.start,
            "StatusCode": "Unset",
            "StatusMessage": "",
            "Events": [],
            "Links": [],
            "Stage": piece.stage,
            "IsRequest": False,
            "Outcome": None,
            "Replica": replica,
            "Model": None,
            "ModelVersion": None,
            "Tenant": None,
            "InputTokens": None,
            "OutputTokens": None,
            "TtftNs": None,
            "AdjustedCount": req.get("AdjustedCount") or 1.0,  # a derived stage stands for as many as its request
        }


class Trace:
    """All spans of one trace in a table, indexed by span id and by parent."""

    def __init__(self, spans: list[Row]) -> None:
        self.spans = spans
        self.by_id: dict[str, Row] = {s["SpanId"]: s for s in spans}
        self.children: dict[str, list[Row]] = {}
        for span in spans:
            self.children.setdefault(span["ParentSpanId"], []).append(span)

    def descendants(self, span_id: str) -> Iterator[Row]:
        """Every span below `span_id`, breadth first (cycles are cut)."""
        seen = {span_id}
        queue = list(self.children.get(span_id, ()))
        while queue:
            span = queue.pop(0)
            if span["SpanId"] in seen:
                continue
            seen.add(span["SpanId"])
            yield span
            queue.extend(self.children.get(span["SpanId"], ()))

    def ancestors(self, span: Row) -> Iterator[Row]:
        """The parents of `span`, nearest first, as far as the table holds them."""
        seen = {span["SpanId"]}
        parent = self.by_id.get(span["ParentSpanId"])
        while parent is not None and parent["SpanId"] not in seen:
            seen.add(parent["SpanId"])
            yield parent
            parent = self.by_id.get(parent["ParentSpanId"])


def first_of(values: Iterable[int | None]) -> int | None:
    """The smallest known value, or None."""
    known = [v for v in values if v is not None]
    return min(known) if known else None


def last_of(values: Iterable[int | None]) -> int | None:
    """The largest known value, or None."""
    known = [v for v in values if v is not None]
    return max(known) if known else None
