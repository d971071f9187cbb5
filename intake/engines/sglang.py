"""SGLang (0.5.23, `--enable-trace`): root span `{role} Req {rid[:8]}` with thread and slice spans.

The root (attributes `rid`, `module = sglang::request`) has one child per process thread
("Tokenizer (host:… | pid:…)", the scheduler, …) and the thread spans hold the slice spans
named after stages (`tokenize`, `prefill_waiting`, `prefill_forward` with `chunked_prefill`
inside, `decode_forward` with `decode_loop` inside, …). Slices are grandchildren of the root,
so each mapped slice is copied as a synthetic stage span directly under the root. When the
slices are not in the same table (a `tailscope collect` batch holding only the root) the
root's float-second `gen_ai.latency.*` attributes are laid out instead, like vLLM's.
Source: python/sglang/srt/observability/trace.py, req_time_stats.py (`RequestStage`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from intake.engines import vllm
from intake.engines._common import (
    Row,
    Timeline,
    Trace,
    attrs_of,
    end_of,
    finish_reason_outcome,
    is_native,
    mark_not_request,
    mark_request,
    seconds_ns,
)
from tracing.rows import is_random_instance_id

NAME = "sglang"
ROOT_PATTERN = r"^[a-z_]* ?Req \S{1,8}$"
_ROOT = re.compile(ROOT_PATTERN)

#: slice span name → stage, as RequestStage names them in sglang
#: python/sglang/srt/observability/req_time_stats.py @602413bc (API_SERVER_DISPATCH is "dispatch",
#: DC_DISPATCH "dc_dispatch"; older names kept). Unlisted slices (KV transfer, `fake_output`,
#: `quick_finish`, the mini load balancer's `mini_lb_launch` / `wait_pd_finish`) are left to `other`.
SLICE_STAGES: dict[str, str] = {
    "tokenize": "preprocess",
    "dispatch": "preprocess",
    "api_server_dispatch": "preprocess",
    "dc_dispatch": "preprocess",
    "dpc_dispatch": "preprocess",
    "request_process": "preprocess",
    "prefill_prepare": "preprocess",
    "decode_prepare": "preprocess",
    "prefill_waiting": "queue_wait",
    "decode_waiting": "queue_wait",
    "prefill_bootstrap": "queue_wait",
    "decode_bootstrap": "queue_wait",
    "prefill_forward": "prefill",
    "decode_forward": "decode",
}
#: Inner slices used only when their outer slice is missing.
INNER_SLICES: dict[str, tuple[str, str]] = {
    "chunked_prefill": ("prefill", "prefill_forward"),
    "decode_loop": ("decode", "decode_forward"),
}


def candidate_mask(names: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spans that may be SGLang request roots (checked further in `map_trace`)."""
    return pc.match_substring_regex(names, ROOT_PATTERN)


def _is_root(row: Row, attrs: dict[str, str]) -> bool:
    return bool(_ROOT.match(row["SpanName"] or "")) and not is_native(attrs) and "rid" in attrs


def evidence_of(trace: Trace, row: Row, attrs: dict[str, str]) -> str | None:
    """Why a root-shaped span (`Req <rid>` with `rid`) is SGLang's, or None: its `module` attribute, its
    scope or service, vLLM-style latency attributes, or its span tree (process-thread spans with host_id
    and pid). A name and an `rid` are no evidence on their own."""
    if attrs.get("module", "").startswith("sglang"):
        return f"attribute module={attrs['module']}"
    for what, value in (("scope", str(row.get("ScopeName") or "")), ("service", str(row.get("ServiceName") or ""))):
        if value.startswith("sglang"):
            return f"{what} {value}"
    if sum(k in attrs for k in vllm.LATENCY_SET) >= 2:
        return "attributes gen_ai.latency.*"
    if any({"host_id", "pid"} <= attrs_of(c).keys() for c in trace.children.get(row["SpanId"], ())):
        return "span tree: thread spans with host_id and pid"
    return None


def role_of(root: Row) -> str:
    """The disaggregation role in a root's name ('' when unified, 'prefill', 'decode')."""
    return str(root["SpanName"]).split(" Req ", 1)[0].strip()


def map_trace(trace: Trace) -> list[Row]:
    """Mark every SGLang request root of the trace and return its synthetic stage spans.

    Under prefill/decode disaggregation both nodes emit a root for the same `rid`; when they
    share the trace (the router propagated the context) the decode root is the request and the
    prefill root's slices are laid on it too, so the request is counted once.
    """
    groups: dict[str, list[tuple[Row, dict[str, str], str]]] = {}
    for row in list(trace.spans):
        attrs = attrs_of(row)
        if _is_root(row, attrs) and (why := evidence_of(trace, row, attrs)) is not None:
            groups.setdefault(attrs["rid"], []).append((row, attrs, why))
    out: list[Row] = []
    for roots in groups.values():
        roots.sort(key=lambda ra: (role_of(ra[0]) == "decode", end_of(ra[0]), ra[0]["SpanId"]))
        request, attrs, why = roots[-1]
        out.extend(map_request(trace, request, attrs, partners=[r for r, _, _ in roots[:-1]], evidence=why))
        for partner, _, _ in roots[:-1]:
            mark_not_request(partner, NAME)
    return out


def _replica(trace: Trace, span: Row) -> str | None:
    """host_id[:8]:pid of the thread span holding `span` (SGLang's resource names no instance)."""
    for parent in trace.ancestors(span):
        attrs = attrs_of(parent)
        if "host_id" in attrs and "pid" in attrs:
            return f"{attrs['host_id'][:8]}:{attrs['pid']}"
    return None


def _request_replica(trace: Trace, root: Row, worker: Row | None) -> str | None:
    """A stable resource name (tailscope.replica, k8s.pod.name, host.name, peer), else the worker
    thread's host_id[:8]:pid, else the resource's random per-process UUID.

    Each SGLang process calls Resource.create (sglang/srt/observability/trace.py), so one server
    carries one random service.instance.id per process; host_id is all zeros in many containers
    (then host:pid is not told apart across pods and is skipped).
    """
    own = root["Replica"]
    if own and not is_random_instance_id(own):
        return str(own)
    thread = _replica(trace, worker) if worker is not None else None
    if thread is not None and not thread.startswith("00000000"):
        return thread
    return own or thread


def map_request(trace: Trace, root: Row, attrs: dict[str, str], partners: Sequence[Row] = (),
                evidence: str = "") -> list[Row]:
    """Copy the root's (and its partner roots') stage slices under it, or lay out its latency attributes."""
    slices = [s for r in (root, *partners) for s in trace.descendants(r["SpanId"])
              if s["SpanName"] in SLICE_STAGES or s["SpanName"] in INNER_SLICES]
    names = {s["SpanName"] for s in slices}
    worker = next((s for s in slices if SLICE_STAGES.get(s["SpanName"]) in ("prefill", "decode")), None)
    replica = _request_replica(trace, root, worker)
    timeline = Timeline(root, NAME, replica)
    ttft = seconds_ns(attrs.get(vllm.TTFT))
    start, end = int(root["TimestampNs"]), end_of(root)
    if slices:
        for s in sorted(slices, key=lambda s: (s["TimestampNs"], s["SpanId"])):
            name = s["SpanName"]
            stage = SLICE_STAGES.get(name)
            if stage is None:
                stage, outer = INNER_SLICES[name]
                if outer in names:
                    continue
            timeline.add(stage, s["TimestampNs"], end_of(s), name)
        engine_end = max((p.end for p in timeline.pieces if p.stage in ("prefill", "decode")), default=None)
        first = start + ttft if ttft is not None else first_prefill_end(timeline)
        if first is not None and engine_end is not None:
            timeline.add("streaming", first, end, "derived: root end - last engine slice (detokenize, send)")
    elif ttft is not None:
        first = min(start + ttft, end)
        prefill = seconds_ns(attrs.get(vllm.PREFILL))
        decode = seconds_ns(attrs.get(vllm.DECODE))
        prefill_start = max(start, first - (prefill or 0))
        if prefill is not None:
            timeline.add("preprocess", start, prefill_start, f"derived: {vllm.TTFT} - {vllm.PREFILL}")
        timeline.add("prefill", prefill_start, first, vllm.PREFILL + " (includes scheduler queue)")
        if decode is not None:
            timeline.add("decode", first, first + decode, vllm.DECODE)
        timeline.add("streaming", first, end, "derived: e2e - time_to_first_token - time_in_model_decode")
    outcome = finish_reason_outcome(root["StatusCode"], attrs)
    if outcome == "ok" and any(s["StatusCode"] == "Error" for s in trace.descendants(root["SpanId"])):
        outcome = "error"  # SGLang sets ERROR with the abort info on the thread span
    mark_request(root, NAME, outcome, ttft_ns=ttft, replica=replica, evidence=evidence)
    return timeline.rows()


def first_prefill_end(timeline: Timeline) -> int | None:
    """End of the first prefill stretch: the first token when the root states no TTFT."""
    ends = [p.end for p in timeline.pieces if p.stage == "prefill"]
    return min(ends) if ends else None
