"""The fair-share GPU-time sweep as SQL (docs/cost.md): each replica-minute swept on its own.

`sweep_sql` is the rule, in the dialect asked; analysis.cost runs it over a range and prices it, and
analysis.engine.materialize stores each hour's result beside its requests (`write_hour`), so a cost over
whole materialized hours is their stored rows summed.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Final

import duckdb

from analysis.engine import dialect as D
from analysis.engine import model as M
from tracing import schema as S
from tracing.errors import QueryError

#: Stages that occupy the GPU (generation counts only where it has no prefill / decode child).
GPU_STAGES: Final[tuple[str, ...]] = (S.PREFILL, S.DECODE, S.GENERATION)
#: The parts of generation, as a SQL list: a generation span with such a child is represented by it.
PARTS: Final = ", ".join(f"'{s}'" for s in S.GENERATION_PARTS)
#: The stage charged to the replica as cold-start overhead.
COLD_START_STAGE: Final = S.MODEL_LOAD
#: The key of time and requests with no value for the grouping column.
NONE_KEY: Final = "(none)"
#: The sweep's cell: each replica-minute is swept on its own (docs/cost.md), so an hour's shares are exact alone.
CELL_NS: Final = 60_000_000_000


def sweep_sql(dialect: str = "duckdb", grid: bool = False, weighted: bool = False,
              spans: str = "spans", cell_ns: int = CELL_NS) -> dict[str, str]:
    """The sweep as named SQL steps (each a SELECT over `spans` or earlier steps).

    `weighted` (sampled traces): each segment is shared in proportion to the active requests'
    adjusted counts, L x w / (sum of w), in float ns, each request's total rounded to whole ns
    (docs/cost.md#sampled-traces); without it the integer rule of analysis.cost's docstring.

    Parameters: $lo, $hi (ns, the clip window, never NULL) and, with `grid`, $grid (ns). `cell_ns`: the cells
    swept on their own (the minute; tests take narrower ones).
    `spans` names the relation of stored span columns the sweep reads.
    Steps of interest: `_cost_shares` (replica, trace_id, request_span_id,
    bucket_ns, allocated_ns) and `_cost_replicas` (replica, bucket_ns, observed_ns,
    allocated_ns, cold_start_ns, idle_ns).
    """
    d = D.dialect(dialect)

    def idiv(a: str, b: str) -> str:
        return f"({d.int_div(a, b)})"

    gpu_list = ", ".join(f"'{s}'" for s in GPU_STAGES)
    bucket = idiv("t", "$grid") + " * $grid" if grid else "0"
    steps: dict[str, str] = {}
    if weighted:  # a request's adjusted count (the largest of its request spans', should a store hold two)
        steps["_cost_req"] = (f"SELECT TraceId, SpanId, max({M.stored_adjusted_count(d)}) AS w "
                              f"FROM {spans} WHERE IsRequest GROUP BY TraceId, SpanId")
    else:
        steps["_cost_req"] = f"SELECT DISTINCT TraceId, SpanId FROM {spans} WHERE IsRequest"
    steps["_cost_st"] = f"""
SELECT TraceId, SpanId, ParentSpanId, Stage, coalesce(Replica, '{NONE_KEY}') AS replica,
       TimestampNs AS s, EndNs AS e
FROM {spans} WHERE Stage IN ({gpu_list}, '{COLD_START_STAGE}')"""
    # the GPU spans in the window (filtered before the parent joins), each with its request span; generation
    # spans with a prefill / decode child (x) are represented by those children
    steps["_cost_gpu"] = f"""
SELECT g.TraceId AS TraceId, g.replica AS replica, greatest(g.s, $lo) AS s, least(g.e, $hi) AS e,
       coalesce(r1.SpanId, r2.SpanId, g.SpanId) AS request_span_id
FROM (SELECT g.* FROM _cost_st g WHERE g.Stage IN ({PARTS}) AND least(g.e, $hi) > greatest(g.s, $lo)
      UNION ALL
      SELECT g.* FROM _cost_st g
      LEFT JOIN (SELECT DISTINCT TraceId, ParentSpanId FROM _cost_st WHERE Stage IN ({PARTS})) x
        ON x.TraceId = g.TraceId AND x.ParentSpanId = g.SpanId
      WHERE g.Stage = '{S.GENERATION}' AND x.TraceId IS NULL AND least(g.e, $hi) > greatest(g.s, $lo)) g
LEFT JOIN _cost_req r1 ON r1.TraceId = g.TraceId AND r1.SpanId = g.ParentSpanId
LEFT JOIN _cost_st p ON p.TraceId = g.TraceId AND p.SpanId = g.ParentSpanId
LEFT JOIN _cost_req r2 ON r2.TraceId = p.TraceId AND r2.SpanId = p.ParentSpanId"""
    # an integer per request in (trace id, request span id) order: the later steps sort and group integers
    steps["_cost_rid"] = """
SELECT TraceId, request_span_id, row_number() OVER (ORDER BY TraceId, request_span_id) AS rid
FROM (SELECT DISTINCT TraceId, request_span_id FROM _cost_gpu)"""
    if weighted:  # GPU spans without a request span weigh 1
        steps["_cost_rid"] = f"""
SELECT r.TraceId AS TraceId, r.request_span_id AS request_span_id, r.rid AS rid, coalesce(q.w, 1.0) AS w
FROM ({steps["_cost_rid"]}) r LEFT JOIN _cost_req q ON q.TraceId = r.TraceId AND q.SpanId = r.request_span_id"""
    cell = d.int64(str(int(cell_ns)))
    # the union of each request's GPU intervals on a replica: islands (gaps and islands)
    gpu_num = """
SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
          OVER (PARTITION BY replica, rid ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island
FROM (SELECT g.replica AS replica, r.rid AS rid, g.s AS s, g.e AS e,
             max(g.e) OVER (PARTITION BY g.replica, r.rid ORDER BY g.s, g.e
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
      FROM _cost_gpu g JOIN _cost_rid r ON r.TraceId = g.TraceId AND r.request_span_id = g.request_span_id)"""
    merged = f"SELECT replica, rid, min(s) AS s, max(e) AS e FROM ({gpu_num}) GROUP BY replica, rid, island"
    in_cells = d.grid_cells(idiv("m.s", cell) + f" * {cell}", "m.e", "c", cell)  # a row per cell [m.s, m.e) touches
    # each island cut at the cell edges (a piece per replica-minute it touches); iid ranks a cell's pieces by (end,
    # rid), rid ordering requests by (trace id, request span id): a running max of iid over the pieces started so
    # far in the cell names the active one that ends last in it (the remainder's recipient)
    steps["_cost_islands"] = f"""
SELECT *, row_number() OVER (PARTITION BY replica, cell ORDER BY e, rid) AS iid
FROM (SELECT m.replica AS replica, m.rid AS rid, c AS cell, greatest(m.s, c) AS s, least(m.e, c + {cell}) AS e
      FROM ({merged}) AS m{in_cells})"""
    steps["_cost_loads"] = f"""
SELECT m.replica AS replica, c AS cell, greatest(m.s, c) AS s, least(m.e, c + {cell}) AS e
FROM (SELECT replica, greatest(s, $lo) AS s, least(e, $hi) AS e FROM _cost_st
      WHERE Stage = '{COLD_START_STAGE}' AND least(e, $hi) > greatest(s, $lo)) AS m{in_cells}"""
    steps["_cost_observed"] = """
SELECT o.replica AS replica, greatest(o.first_ns, $lo) AS first_ns, least(o.last_ns, $hi) AS last_ns
FROM (SELECT coalesce(Replica, '{none}') AS replica, min(TimestampNs) AS first_ns, max(EndNs) AS last_ns
      FROM {spans} GROUP BY 1) o
WHERE o.replica IN (SELECT replica FROM _cost_st)
  AND least(o.last_ns, $hi) > greatest(o.first_ns, $lo)""".replace("{none}", NONE_KEY).replace("{spans}", spans)
    # the observed window's ends in each of its cells
    obs_cells = d.grid_cells(idiv("o.first_ns", cell) + f" * {cell}", "o.last_ns", "c", cell)
    window = f"""
UNION ALL SELECT o.replica, c, greatest(o.first_ns, c), 0, 0, NULL{{w0}} FROM _cost_observed o{obs_cells}
UNION ALL SELECT o.replica, c, least(o.last_ns, c + {cell}), 0, 0, NULL{{w0}} FROM _cost_observed o{obs_cells}"""
    if grid:
        cells = d.grid_cells(idiv("o.first_ns", "$grid") + " * $grid + $grid", "o.last_ns", "t", "$grid")
        window += f"""
UNION ALL SELECT o.replica, {idiv("t", cell)} * {cell}, t, 0, 0, NULL{{w0}} FROM _cost_observed o{cells}"""
    # events: (replica, cell, t, +-1 GPU, +-1 load, recipient candidate) and, weighted, the weight entering (+) or
    # leaving (-) the GPU at t
    if weighted:
        events = f"""
SELECT i.replica AS replica, i.cell AS cell, i.s AS t, 1 AS dg, 0 AS dl, i.iid AS cand, r.w AS dw
FROM _cost_islands i JOIN _cost_rid r ON r.rid = i.rid
UNION ALL SELECT i.replica, i.cell, i.e, -1, 0, NULL, -r.w FROM _cost_islands i JOIN _cost_rid r ON r.rid = i.rid
UNION ALL SELECT replica, cell, s, 0, 1, NULL, 0.0 FROM _cost_loads
UNION ALL SELECT replica, cell, e, 0, -1, NULL, 0.0 FROM _cost_loads{window.replace("{w0}", ", 0.0")}"""
        nw = ",\n       sum(sum(dw)) OVER (PARTITION BY replica, cell ORDER BY t ROWS UNBOUNDED PRECEDING) AS nw"
    else:
        events = f"""
SELECT replica, cell, s AS t, 1 AS dg, 0 AS dl, iid AS cand FROM _cost_islands
UNION ALL SELECT replica, cell, e, -1, 0, NULL FROM _cost_islands
UNION ALL SELECT replica, cell, s, 0, 1, NULL FROM _cost_loads
UNION ALL SELECT replica, cell, e, 0, -1, NULL FROM _cost_loads{window.replace("{w0}", "")}"""
        nw = ""
    # each distinct boundary t of a replica-minute (events grouped) with the running counts from there to the next
    # one in the same cell (the last boundary of a cell starts no segment)
    win = "PARTITION BY replica, cell ORDER BY t ROWS UNBOUNDED PRECEDING"
    nxt = d.lead("t", "replica, cell", "t")
    segs = f"""
SELECT replica, cell, t, {nxt} - t AS len_ns,
       sum(sum(dg)) OVER ({win}) AS n,
       sum(sum(dl)) OVER ({win}) AS nl,
       max(max(cand)) OVER ({win}) AS best{nw}
FROM ({events}) GROUP BY replica, cell, t"""
    # q, r: each segment's floor share and remainder; Q(t) = q_before: the floor shares of every segment of the
    # cell before t; weighted: q is the share of one unit of weight (float ns), no remainder
    share = ("len_ns / nw" if weighted else idiv("len_ns", "n"))
    remainder = "0" if weighted else "len_ns % n"
    steps["_cost_shared"] = f"""
SELECT *, sum(q) OVER ({win}) - q AS q_before
FROM (SELECT replica, cell, t, coalesce(len_ns, 0) AS len_ns, n, nl, best, {bucket} AS bucket_ns,
             CASE WHEN n > 0 AND len_ns IS NOT NULL THEN {share} ELSE 0 END AS q,
             CASE WHEN n > 0 AND len_ns IS NOT NULL THEN {remainder} ELSE 0 END AS r
      FROM ({segs}))"""
    if grid:
        cells = d.grid_cells(idiv("i.s", "$grid") + " * $grid", "i.e", "b0", "$grid")
        pieces = f"""
SELECT i.replica AS replica, i.rid AS rid, i.cell AS cell, greatest(i.s, b0) AS s, least(i.e, b0 + $grid) AS e,
       b0 AS bucket_ns
FROM _cost_islands i{cells}"""
    else:
        pieces = "SELECT replica, rid, cell, s, e, 0 AS bucket_ns FROM _cost_islands"
    total, part, by_weight = (("CAST(round(sum(part)) AS BIGINT)", "(qe.q_before - qs.q_before) * w.w",
                                "\n        JOIN _cost_rid w ON w.rid = p.rid") if weighted
                               else ("CAST(sum(part) AS BIGINT)", "qe.q_before - qs.q_before", ""))
    rem = "CAST(w.rem AS DOUBLE)" if weighted else "w.rem"  # (none when weighted) one type in the union
    steps["_cost_shares"] = f"""
SELECT a.replica AS replica, r.TraceId AS trace_id, r.request_span_id AS request_span_id, a.bucket_ns AS bucket_ns,
       a.allocated_ns AS allocated_ns
FROM (
    SELECT replica, rid, bucket_ns, {total} AS allocated_ns
    FROM (
        SELECT p.replica AS replica, p.rid AS rid, p.bucket_ns AS bucket_ns, {part} AS part
        FROM ({pieces}) p
        JOIN _cost_shared qs ON qs.replica = p.replica AND qs.cell = p.cell AND qs.t = p.s
        JOIN _cost_shared qe ON qe.replica = p.replica AND qe.cell = p.cell AND qe.t = p.e{by_weight}
        UNION ALL
        SELECT w.replica AS replica, i.rid AS rid, w.bucket_ns AS bucket_ns, {rem} AS part
        FROM (SELECT replica, cell, bucket_ns, best, sum(r) AS rem FROM _cost_shared WHERE r > 0
              GROUP BY replica, cell, bucket_ns, best) w
        JOIN _cost_islands i ON i.replica = w.replica AND i.cell = w.cell AND i.iid = w.best
    ) GROUP BY replica, rid, bucket_ns
) a JOIN _cost_rid r ON r.rid = a.rid"""
    if grid:
        observed = """greatest(0, least(o.last_ns, b.bucket_ns + $grid) - greatest(o.first_ns, b.bucket_ns))"""
        buckets = """(SELECT DISTINCT replica, bucket_ns FROM _cost_shared) b"""
    else:
        observed = "o.last_ns - o.first_ns"
        buckets = "(SELECT DISTINCT replica, 0 AS bucket_ns FROM _cost_shared) b"
    steps["_cost_replicas"] = f"""
SELECT b.replica AS replica, b.bucket_ns AS bucket_ns, CAST({observed} AS BIGINT) AS observed_ns,
       CAST(coalesce(a.allocated_ns, 0) AS BIGINT) AS allocated_ns,
       CAST(coalesce(x.cold_start_ns, 0) AS BIGINT) AS cold_start_ns,
       CAST(coalesce(x.idle_ns, 0) AS BIGINT) AS idle_ns
FROM {buckets}
JOIN _cost_observed o ON o.replica = b.replica
LEFT JOIN (SELECT replica, bucket_ns, sum(allocated_ns) AS allocated_ns FROM _cost_shares
           GROUP BY replica, bucket_ns) a
    ON a.replica = b.replica AND a.bucket_ns = b.bucket_ns
LEFT JOIN (SELECT replica, bucket_ns,
                  sum(CASE WHEN n = 0 AND nl > 0 THEN len_ns ELSE 0 END) AS cold_start_ns,
                  sum(CASE WHEN n = 0 AND nl = 0 THEN len_ns ELSE 0 END) AS idle_ns
           FROM _cost_shared GROUP BY replica, bucket_ns) x ON x.replica = b.replica AND x.bucket_ns = b.bucket_ns"""
    return steps


def sweep_params(since: int | None, until: int | None, grid_ns: int | None) -> dict[str, int]:
    """The sweep's parameters ($lo, $hi, $grid) of a range and grid, checked."""
    if grid_ns is not None and grid_ns <= 0:
        raise QueryError("", f"grid must be positive, got {grid_ns}")
    lo = since if since is not None else -(2**62)
    hi = until if until is not None else 2**62
    if hi <= lo:
        raise QueryError("", "the cost range is empty: until must be after since")
    params = {"lo": int(lo), "hi": int(hi)}
    if grid_ns is not None:
        params["grid"] = int(grid_ns)
    return params


# --- the sweep stored with each materialized hour ------------------------------------------------

#: An hour's stored sweep sits beside its requests file: requests-KEY.parquet -> cost-KEY.parquet.
COST_PREFIX: Final = "cost-"
#: The view (on a store connection) listing the fresh hours' cost files: hour_ns, path.
COST_FILES_VIEW: Final = "_cost_files_stored"
#: What an hour's cost file holds (it is part of the hour's key: a change rebuilds every hour). One row per
#: kind: 's' a share (replica, trace_id, request_span_id, minute_ns, allocated_ns: the integer sweep cut at the
#: minutes, over the hour), 'c' a replica-minute's cold start (replica, minute_ns, cold_start_ns), 'b' a
#: replica's bounds over the spans that start in the hour (replica, first_ns, last_ns, gpu: it has a GPU-stage
#: or model_load span there).
COST_LAYOUT: Final = ("cost-1: kind s/c/b; replica, trace_id, request_span_id, minute_ns, allocated_ns, "
                      "cold_start_ns, first_ns, last_ns, gpu")


def cost_path(requests_file: Path) -> Path:
    """The cost file written with an hour's requests file."""
    return requests_file.with_name(COST_PREFIX + requests_file.name.removeprefix("requests-"))


def run_sweep(con: duckdb.DuckDBPyConnection, params: dict[str, int], grid: bool, weighted: bool,
              spans: str = "spans", cell_ns: int = CELL_NS) -> None:
    """Run the sweep's steps into this connection's temp tables (`_cost_shares`, `_cost_replicas` and the
    steps before them); on an error the tables are dropped and a QueryError names the step."""
    for name, sql in sweep_sql("duckdb", grid=grid, weighted=weighted, spans=spans, cell_ns=cell_ns).items():
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql}", used).fetchall()
        except duckdb.Error as exc:
            drop_sweep(con)
            raise QueryError(sql, f"the GPU-time sweep failed at {name}: {str(exc).splitlines()[0]}") from exc
    for name in sweep_sql("duckdb", grid=grid):
        if name not in ("_cost_shares", "_cost_replicas"):
            con.execute(f"DROP TABLE IF EXISTS {name}").fetchall()


def drop_sweep(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the temp tables of a sweep."""
    for name in sweep_sql("duckdb", grid=True):
        con.execute(f"DROP TABLE IF EXISTS {name}").fetchall()


def bounds_sql(spans: str, where: str = "TRUE") -> str:
    """Per replica (NULL as NONE_KEY) of the spans of `spans` matching `where`: the first start, the last end and
    whether one is a GPU-stage or model_load span (the sweep's observed window and which replicas count)."""
    stages = ", ".join(f"'{s}'" for s in (*GPU_STAGES, COLD_START_STAGE))
    return (f"SELECT coalesce(Replica, '{NONE_KEY}') AS replica, min(TimestampNs) AS first_ns, max(EndNs) AS last_ns, "
            f"bool_or(Stage IN ({stages})) AS gpu FROM {spans} WHERE {where} GROUP BY 1")


def write_hour(con: duckdb.DuckDBPyConnection, source: str, hour_ns: int, path: Path) -> None:
    """Write the hour's cost file (COST_LAYOUT) to `path`: the integer sweep over [hour, hour + 1 h) of the spans
    of `source` (a relation of the hour's spans and its neighbours', as its requests are built from). Each
    replica-minute being swept on its own, the rows are exactly the whole store's sweep within the hour.

    The sweep reads one narrow copy of the spans it can use, made in one scan: the request spans and the
    generation / model_load spans that start before the hour ends (a GPU span in the hour and its parents do),
    and every prefill / decode span (one marks its generation as split wherever it lies)."""
    end = hour_ns + M.HOUR_NS
    tag = uuid.uuid4().hex[:8]
    narrow, bounds = f"_cost_in_{tag}", f"_cost_bounds_{tag}"
    parts = ", ".join(f"'{s}'" for s in S.GENERATION_PARTS)
    whole = ", ".join(f"'{s}'" for s in (S.GENERATION, COLD_START_STAGE))
    try:
        con.execute(f"""
            CREATE TEMP TABLE {narrow} AS
            SELECT TraceId, SpanId, ParentSpanId, Stage, Replica, TimestampNs, EndNs, IsRequest FROM {source}
            WHERE ((IsRequest OR Stage IN ({whole})) AND TimestampNs < {end}) OR Stage IN ({parts})""")
        con.execute(f"CREATE TEMP TABLE {bounds} AS "
                    f"{bounds_sql(source, f'TimestampNs >= {hour_ns} AND TimestampNs < {end}')}")
        run_sweep(con, {"lo": hour_ns, "hi": end, "grid": CELL_NS}, grid=True, weighted=False, spans=narrow)
        nulls = "NULL::BIGINT"
        con.execute(f"""
            COPY (SELECT 's' AS kind, replica, trace_id, request_span_id, bucket_ns AS minute_ns, allocated_ns,
                         {nulls} AS cold_start_ns, {nulls} AS first_ns, {nulls} AS last_ns, NULL::BOOLEAN AS gpu
                  FROM _cost_shares
                  UNION ALL SELECT 'c', replica, NULL, NULL, bucket_ns, NULL, cold_start_ns, NULL, NULL, NULL
                  FROM _cost_replicas WHERE cold_start_ns > 0
                  UNION ALL SELECT 'b', replica, NULL, NULL, NULL, NULL, NULL, first_ns, last_ns, gpu FROM {bounds})
            TO '{path}' (FORMAT parquet, COMPRESSION zstd)""")
    finally:
        drop_sweep(con)
        con.execute(f"DROP TABLE IF EXISTS {narrow}")
        con.execute(f"DROP TABLE IF EXISTS {bounds}")
