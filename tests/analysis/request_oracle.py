"""A plain-Python reference of the request model (docs/schema.md), walking instant by instant.

Independent of analysis.engine.model: no sweep, no running minimum, no SQL. For every integer
instant t of a request it asks which span owns t, by the documented rules:

1. A request is a span with IsRequest; copies of one (same trace and span id) count once:
   the earliest start, then the longest, is kept.
2. It reads its stage spans: level 1 = stage spans whose parent is the request span and
   that overlap it; level 2 = stage spans whose parent is a level-1 working (non-streaming)
   span and that overlap the request. Other spans (a stage under a non-stage span, deeper
   levels, children of streaming) are not read. Only spans starting from one hour before
   the request's hour to the end of the hour after it are read.
3. At instant t, among the level-1 working spans active at t (clipped to the request), the
   one ending last owns t (ties: started last, then lower span id). If none, a streaming
   span active at t owns it (same order). If none, t is `other`.
4. An owning working span P splits its stretch (the instants it owns, an interval) among its
   level-2 children by rule 3 (children clipped to that stretch); what no child holds stays P's.
5. ttft: stated, else end of the first read prefill span - start, else first read streaming
   start - start. tpot: round half away from zero of (e2e - ttft) / (output tokens - 1).
   replica: the replica of the earliest-starting (then lowest id) read generation / prefill /
   decode span that names one, else the request span's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tracing import schema as S

HOUR = 3_600_000_000_000
WORKER = ("generation", "prefill", "decode")


@dataclass(frozen=True)
class Span:
    """The span fields the model reads."""

    trace: str
    id: str
    parent: str
    stage: str | None
    request: bool
    start: int
    end: int
    replica: str | None = None
    ttft: int | None = None
    output_tokens: int | None = None
    kind: str = "Internal"


def _winner(cands: list[tuple[int, int, str, Any]]) -> Any:
    """The candidate ending last, then starting last, then with the lower span id."""
    return min(cands, key=lambda c: (-c[0], -c[1], c[2]))[3]


def _owner(t: int, spans: list[tuple[int, int, Span]]) -> Any:
    """Owner of instant t among clipped spans (s0, e0, span): working first, then streaming."""
    active = [(e[1], e[0], e[2].id, e) for e in spans if e[0] <= t < e[1]]
    working = [c for c in active if c[3][2].stage not in S.YIELDING_STAGES]
    if working:
        return _winner(working)
    if active:
        return _winner(active)
    return None


def _overlaps(sp: Span, lo: int, hi: int) -> bool:
    return min(sp.end, hi) > max(sp.start, lo)


def reference(spans: list[Span]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (trace id, request span id): the stage columns, ttft, tpot, replica, e2e and client e2e."""
    by_parent: dict[tuple[str, str], list[Span]] = {}
    for sp in spans:
        by_parent.setdefault((sp.trace, sp.parent), []).append(sp)
    kept: dict[tuple[str, str], Span] = {}
    for sp in spans:
        if sp.request:
            key = (sp.trace, sp.id)
            old = kept.get(key)
            if old is None or (sp.start, -(sp.end - sp.start)) < (old.start, -(old.end - old.start)):
                kept[key] = sp
    clients: dict[tuple[str, str], list[Span]] = {}
    for sp in spans:
        if sp.kind == "Client":
            clients.setdefault((sp.trace, sp.id), []).append(sp)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key, r in kept.items():
        hr = (r.start // HOUR) * HOUR

        def near(sp: Span, hr: int = hr) -> bool:
            return hr - HOUR <= sp.start < hr + 2 * HOUR

        def children(parent: Span, r: Span = r, near: Any = near) -> list[Span]:
            return [c for c in by_parent.get((parent.trace, parent.id), [])
                    if c.stage is not None and _overlaps(c, r.start, r.end) and near(c)]

        level1 = children(r)
        clipped1 = [(max(sp.start, r.start), min(sp.end, r.end), sp) for sp in level1]
        owners1 = {t: _owner(t, clipped1) for t in range(r.start, r.end)}
        stretch: dict[int, tuple[int, int]] = {}  # id() of a level-1 clipped entry -> its owned interval
        for t, o in owners1.items():
            if o is not None:
                lo, hi = stretch.get(id(o), (t, t + 1))
                stretch[id(o)] = (min(lo, t), max(hi, t + 1))
        cols = {f"{s}_ns": 0 for s in S.CRITICAL_PATH_COLUMNS}
        read = list(level1)
        for entry in clipped1:
            if entry[2].stage not in S.YIELDING_STAGES:
                read += children(entry[2])
        for t, o in owners1.items():
            if o is None:
                cols["other_ns"] += 1
                continue
            parent = o[2]
            stage = parent.stage
            if parent.stage not in S.YIELDING_STAGES:
                lo, hi = stretch[id(o)]
                assert all(owners1[u] is o for u in range(lo, hi)), "a stretch is one interval"
                kids = [(max(c.start, lo), min(c.end, hi), c) for c in children(parent)]
                k = _owner(t, kids)
                if k is not None:
                    stage = k[2].stage
            cols[f"{stage}_ns"] += 1
        prefill_ends = [sp.end for sp in read if sp.stage == "prefill"]
        stream_starts = [sp.start for sp in read if sp.stage == "streaming"]
        ttft = r.ttft
        if ttft is None and prefill_ends:
            ttft = min(prefill_ends) - r.start
        if ttft is None and stream_starts:
            ttft = min(stream_starts) - r.start
        e2e = r.end - r.start
        tpot = None
        if r.output_tokens is not None and r.output_tokens > 1 and ttft is not None:
            x = (e2e - ttft) / (r.output_tokens - 1)
            tpot = int(math.copysign(math.floor(abs(x) + 0.5), x))
        workers = sorted((sp.start, sp.id, sp.replica) for sp in read if sp.stage in WORKER and sp.replica)
        replica = workers[0][2] if workers else r.replica
        client = [c for c in clients.get((r.trace, r.parent), []) if near(c)]
        client_e2e = min((c.start, c.end - c.start) for c in client)[1] if client else None
        out[key] = {"e2e_ns": e2e, **cols, "ttft_ns": ttft, "tpot_ns": tpot, "replica": replica,
                    "client_e2e_ns": client_e2e}
    return out
