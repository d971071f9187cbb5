"""Single requests: the slowest ones, lookup by trace id, and one trace's waterfall with its critical path.

`waterfall(con, trace_id)` lists every span of a trace with the stretches it holds on its
request's critical path, by the rule of the `requests` view (analysis/engine/views.py): its
level-1 and level-2 stage stretches, a parent stage owning its stretch minus its
children's, and a yielding stage (streaming) only the instants no working stage holds.
Per stage, the stretches sum to the view's stage columns (tests/analysis/test_traces.py).
"""

from __future__ import annotations

from typing import Final

import duckdb
import polars as pl

from analysis.engine.model import span_stretches
from analysis.engine.percentiles import metric_column, quote_ident
from tracing import schema as S

#: Prefix of the temp objects a waterfall creates (views over one trace's spans).
_PREFIX: Final = "_tailscope_trace_"
#: Columns of `slowest`, besides the metric and the stage columns.
EXEMPLAR_COLUMNS: Final[tuple[str, ...]] = ("trace_id", "start", "start_ns", "replica", "model", "tenant", "status",
                                            "input_tokens", "output_tokens")



def slowest(con: duckdb.DuckDBPyConnection, metric: str = "e2e", limit: int = 50,
            source: str = "requests", where: str = "true", params: list[object] | None = None) -> pl.DataFrame:
    """The `limit` slowest requests of `source` by `metric` (the tail's exemplars), slowest first.

    Columns: EXEMPLAR_COLUMNS, latency_ms (the metric in ms) and <stage>_ms for every
    critical-path stage. `where` / `params` narrow the rows (a SQL condition on `source`).
    """
    col = quote_ident(metric_column(metric))
    stages = ", ".join(f"{s}_ns / 1e6 AS {s}_ms" for s in S.CRITICAL_PATH_COLUMNS)
    return con.sql(
        f"SELECT {', '.join(EXEMPLAR_COLUMNS)}, {col} / 1e6 AS latency_ms, {stages} FROM {source} "
        f"WHERE ({where}) AND {col} IS NOT NULL ORDER BY {col} DESC, trace_id LIMIT {int(limit)}",
        params=params or []).pl()


def find_requests(con: duckdb.DuckDBPyConnection, trace_id: str, source: str = "requests",
                  limit: int = 20) -> pl.DataFrame:
    """The request rows of one trace id: a full id, or a prefix of at least 8 hex digits (case ignored).

    A shorter prefix finds nothing (it would match too much to mean anything).
    """
    tid = trace_id.strip().lower()
    if len(tid) >= 32:
        return con.sql(f"SELECT * FROM {source} WHERE trace_id = ?", params=[tid]).pl()
    if len(tid) < 8:
        return con.sql(f"SELECT * FROM {source} WHERE false").pl()
    return con.sql(f"SELECT * FROM {source} WHERE starts_with(trace_id, ?) ORDER BY start_ns LIMIT {int(limit)}",
                   params=[tid]).pl()


def waterfall(con: duckdb.DuckDBPyConnection, trace_id: str, since_ns: int | None = None,
              until_ns: int | None = None) -> pl.DataFrame:
    """Every span of one trace (from the connection's `spans`) with its critical-path stretches.

    Columns: span_id, parent_span_id, name, stage, is_request, start_ns, end_ns, duration_ns,
    replica, status_code, start_ms / end_ms / duration_ms (offsets from the request start),
    critical_ms (time the span holds on the critical path) and critical_stretches (list of
    [from_ms, to_ms] offsets). `since_ns` / `until_ns` bound the span start times read, so
    only the segments of that range are scanned. Empty when the trace has no span there.
    """
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_PREFIX}t AS SELECT * FROM spans WHERE TraceId = $id "
                "AND ($lo IS NULL OR TimestampNs >= $lo) AND ($hi IS NULL OR TimestampNs < $hi)",
                {"id": trace_id, "lo": since_ns, "hi": until_ns}).fetchall()
    try:
        spans = con.sql(f"""
            SELECT SpanId AS span_id, ParentSpanId AS parent_span_id, SpanName AS name, Stage AS stage,
                   IsRequest AS is_request, TimestampNs AS start_ns, EndNs AS end_ns, Duration AS duration_ns,
                   Replica AS replica, StatusCode AS status_code
            FROM {_PREFIX}t ORDER BY TimestampNs, EndNs DESC, SpanId""").pl()
        if spans.height == 0:
            return spans.with_columns(pl.lit(None, pl.Float64).alias(c) for c in
                                      ("start_ms", "end_ms", "duration_ms", "critical_ms")).with_columns(
                pl.lit(None, pl.List(pl.List(pl.Float64))).alias("critical_stretches"))
        stretch = span_stretches(con, f"{_PREFIX}t")
    finally:
        con.execute(f"DROP TABLE IF EXISTS {_PREFIX}t").fetchall()
    roots = spans.filter(pl.col("is_request").fill_null(False))
    t0 = int((roots if roots.height else spans).get_column("start_ns").min())  # type: ignore[arg-type]
    ids = spans.get_column("span_id").to_list()
    return spans.with_columns(
        ((pl.col("start_ns") - t0) / 1e6).alias("start_ms"),
        ((pl.col("end_ns") - t0) / 1e6).alias("end_ms"),
        (pl.col("duration_ns") / 1e6).alias("duration_ms"),
        pl.Series("critical_ms", [sum(b - a for a, b in stretch.get(s, [])) / 1e6 for s in ids], pl.Float64),
        pl.Series("critical_stretches", [[[(a - t0) / 1e6, (b - t0) / 1e6] for a, b in stretch.get(s, [])]
                                         for s in ids], pl.List(pl.List(pl.Float64))),
    )
