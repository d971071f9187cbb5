"""An independent reference for the vLLM mapping, written from the span format vLLM documents and
docs/engines.md's layout rule, not from intake/engines/vllm.py.

vLLM 0.33 (`--otlp-traces-endpoint`) emits one SERVER span `llm_request` per finished request, starting
at the request's arrival, with float-second latencies: `gen_ai.latency.time_to_first_token`, `e2e`,
`time_in_queue`, `time_in_model_prefill`, `time_in_model_decode`. The layout (docs/engines.md, "How each
timeline is laid out"): the first token F = start + TTFT; prefill [F - prefill, F]; queue_wait the queue
time before it; preprocess from the start to the queue (only when both queue and prefill are known);
decode [F, F + decode]; streaming [F, start + e2e] (the span's end without e2e); each clipped to the
request and dropped when empty; prefill and decode under one `generation` covering both. Without a TTFT
nothing is laid. Outcome: `finish_reasons` holding abort/cancel -> cancelled, error -> error, else the
span status. Seconds are non-negative decimal numbers, converted exactly (decimal) to integer ns.

Covers request spans without `vllm.request.*` children and with a real start (the other cases have their
own tests in test_engines_vllm_optin.py and test_engines_diagnostics.py).
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

_DECIMAL = re.compile(r"^\s*\d+(\.\d*)?([eE][-+]?\d+)?\s*$")
_PREFIX = "gen_ai.latency."

Layout = dict[str, tuple[int, int, str]]  # stage -> (start ns, end ns, parent: "request" or "generation")


def seconds(text: str | None) -> int | None:
    """A latency attribute in integer ns (exact decimal, half to even), None when absent or not a number."""
    if text is None or not _DECIMAL.match(text):
        return None
    try:
        return int((Decimal(text.strip()) * 1_000_000_000).to_integral_value(ROUND_HALF_EVEN))
    except InvalidOperation:
        return None


def outcome(status_code: str, attrs: dict[str, str]) -> str:
    """What the request's outcome is by the documented rule (finish reasons, then the span status)."""
    reasons = attrs.get("gen_ai.response.finish_reasons", "").lower()
    if "abort" in reasons or "cancel" in reasons:
        return "cancelled"
    if "error" in reasons:
        return "error"
    return "error" if status_code == "Error" else "ok"


def layout(start: int, end: int, attrs: dict[str, str]) -> Layout:
    """The stage stretches of one `llm_request` span."""
    get = {k: seconds(attrs.get(_PREFIX + k)) for k in
           ("time_to_first_token", "e2e", "time_in_queue", "time_in_model_prefill", "time_in_model_decode")}
    ttft, e2e = get["time_to_first_token"], get["e2e"]
    queue, prefill, decode = get["time_in_queue"], get["time_in_model_prefill"], get["time_in_model_decode"]
    if ttft is None:
        return {}
    out: Layout = {}

    def lay(stage: str, lo: int, hi: int, parent: str = "request") -> None:
        lo, hi = max(lo, start), min(hi, end)
        if hi > lo:
            out[stage] = (lo, hi, parent)

    first = min(start + ttft, end)
    prefill_from = max(start, first - (prefill or 0))
    queue_from = max(start, prefill_from - (queue or 0))
    if queue is not None and prefill is not None:
        lay("preprocess", start, queue_from)
    lay("queue_wait", queue_from, prefill_from)
    lay("prefill", prefill_from, first, "generation")
    if decode is not None:
        lay("decode", first, first + decode, "generation")
    lay("streaming", first, start + e2e if e2e is not None else end)
    parts = [out[s] for s in ("prefill", "decode") if s in out]
    if parts:
        out["generation"] = (min(p[0] for p in parts), max(p[1] for p in parts), "request")
    return out


def expected(row: dict[str, Any]) -> tuple[str, int | None, Layout]:
    """(outcome, TTFT ns, layout) of one `llm_request` row (SPAN_SCHEMA columns) as the format says."""
    attrs = dict(row["SpanAttributes"] or ())
    start = int(row["TimestampNs"])
    end = start + int(row["Duration"])
    ttft = seconds(attrs.get(_PREFIX + "time_to_first_token"))
    return outcome(row["StatusCode"], attrs), ttft, layout(start, end, attrs)


def mapped(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, int | None, Layout]]:
    """What a mapping produced, in the reference's terms: per (trace id, request span id) of each request
    span, (outcome, TTFT ns, layout) read off the request row and the stage spans under it."""
    by_id = {(r["TraceId"], r["SpanId"]): r for r in rows}
    out: dict[tuple[str, str], tuple[str, int | None, Layout]] = {}
    for r in rows:
        if r["IsRequest"]:
            out[(r["TraceId"], r["SpanId"])] = (r["Outcome"], r["TtftNs"], {})
    for r in rows:
        if not r["Stage"]:
            continue
        parent = by_id[(r["TraceId"], r["ParentSpanId"])]
        request = parent if parent["IsRequest"] else by_id[(r["TraceId"], parent["ParentSpanId"])]
        where = "request" if parent is request else str(parent["Stage"])
        lo = int(r["TimestampNs"])
        out[(request["TraceId"], request["SpanId"])][2][str(r["Stage"])] = (lo, lo + int(r["Duration"]), where)
    return out
