"""Sampled copies of a store, made by the rules samplers follow: OpenTelemetry consistent probability sampling
(keep a trace when the randomness in its trace id, its last 56 bits, is at least the threshold; write
`ot=th:<threshold>` in the tracestate of every span kept) and a tail-based sampler that keeps requests for
being slow or failed without recording anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from intake.otlp import base_of, promote
from tracing import schema as S
from tracing.store import SegmentWriter

TWO56 = 2**56


def threshold(p: float) -> int:
    """The 56-bit rejection threshold of keep probability p (spec: kept when randomness >= threshold)."""
    return min(TWO56 - 1, max(0, round((1.0 - p) * TWO56)))


def th_text(t: int) -> str:
    """`th` as the spec writes it: 14 hex digits, trailing zeros removed ('0' for keep-all)."""
    return f"{t:014x}".rstrip("0") or "0"


def randomness(trace_id: str) -> int:
    """The randomness the spec takes from a W3C trace id: its last 7 bytes."""
    return int(trace_id[-14:], 16)


def keeps(p: float) -> Callable[[int], bool]:
    """Whether consistent sampling at probability p keeps a trace, from its id as an integer (its last 56 bits)."""
    t = threshold(p)
    return lambda trace_id: (trace_id & (TWO56 - 1)) >= t


def read_spans(store: Path) -> pa.Table:
    """Every span of a store as one table in SPAN_SCHEMA."""
    tables = [pq.read_table(f) for f in sorted(store.glob(S.SEGMENT_GLOB))]
    return pa.concat_tables(tables).select(list(S.COLUMN_NAMES)).cast(S.SPAN_SCHEMA)


def requests_of(spans: pa.Table) -> list[dict[str, Any]]:
    """The request spans (trace id, outcome, tenant, duration)."""
    req = spans.filter(pc.field("IsRequest"))
    return req.select(["TraceId", "Outcome", "Tenant", "Duration"]).to_pylist()


def consistent_sample(spans: pa.Table, keep_p: Callable[[dict[str, Any]], float]) -> pa.Table:
    """Keep each trace with the probability its request gets, by the spec's rule, recording its threshold."""
    th_of: dict[str, int] = {}
    for r in requests_of(spans):
        t = threshold(keep_p(r))
        if randomness(r["TraceId"]) >= t:
            th_of[r["TraceId"]] = t
    kept = spans.filter(pc.is_in(spans.column("TraceId"), pa.array(list(th_of), pa.string())))
    states = pa.array([f"ot=th:{th_text(th_of[t])}" for t in kept.column("TraceId").to_pylist()], pa.string())
    kept = kept.set_column(kept.schema.get_field_index("TraceState"), "TraceState", states)
    return promote(base_of(kept))


def tail_sample(spans: pa.Table, slow_ns: int, head_p: float) -> pa.Table:
    """A head sampler recording `ot=th` keeps `head_p` of every request; a tail-based sampler beside it adds every
    failed request and every one slower than `slow_ns` the head left out, with nothing recorded."""
    reqs = requests_of(spans)
    t = threshold(head_p)
    head = {r["TraceId"] for r in reqs if randomness(r["TraceId"]) >= t}
    tail = {r["TraceId"] for r in reqs
            if r["TraceId"] not in head and (r["Outcome"] != "ok" or r["Duration"] > slow_ns)}
    kept = spans.filter(pc.is_in(spans.column("TraceId"), pa.array(sorted(tail | head), pa.string())))
    states = pa.array(["" if tid in tail else f"ot=th:{th_text(t)}" for tid in kept.column("TraceId").to_pylist()],
                      pa.string())
    kept = kept.set_column(kept.schema.get_field_index("TraceState"), "TraceState", states)
    return promote(base_of(kept))


def write_store(store: Path, spans: pa.Table) -> Path:
    """A new store holding `spans`."""
    SegmentWriter(store, kind="w").write(spans)
    return store


def facts(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """start_ns, tenant, status, e2e_ns, adjusted_count of every request of a connection's store."""
    cur = con.execute("SELECT start_ns, tenant, status, e2e_ns, adjusted_count FROM requests ORDER BY start_ns")
    names = [c[0] for c in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
