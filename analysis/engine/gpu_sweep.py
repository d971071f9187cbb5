"""The fair-share GPU-time sweep as SQL (docs/cost.md): each replica-minute swept on its own.

`sweep_sql` is the rule, in the dialect asked (`sweep_arrays`: its integer rule's later steps over numpy arrays, the
same rows, which `run_sweep` runs on DuckDB); analysis.cost runs it over a range and prices it, and
analysis.engine.materialize stores each hour's result beside its requests (`write_hour`), so a cost over
whole materialized hours is their stored rows summed.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any, Final

import duckdb
import numpy as np
import numpy.typing as npt
import pyarrow as pa

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
    allocated_ns, cold_start_ns, idle_ns, and the replica's observed window in the range: first_ns, last_ns).
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
       CAST(coalesce(x.idle_ns, 0) AS BIGINT) AS idle_ns,
       CAST(o.first_ns AS BIGINT) AS first_ns, CAST(o.last_ns AS BIGINT) AS last_ns
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
              spans: str = "spans", cell_ns: int = CELL_NS, arrays: bool = True) -> None:
    """Run the sweep into this connection's temp tables (`_cost_shares`, `_cost_replicas`); on an error the tables
    are dropped and a QueryError names the step.

    The integer rule (not `weighted`) runs the SQL's steps up to each request's GPU intervals, then the rest over
    arrays (`sweep_arrays`: the same rows at a fraction of the CPU); `arrays=False`, or inputs whose keys would
    not fit in int64, run every step in SQL."""
    steps = sweep_sql("duckdb", grid=grid, weighted=weighted, spans=spans, cell_ns=cell_ns)
    names = list(steps)
    if arrays and not weighted:
        names = ["_cost_req", "_cost_st", "_cost_gpu", "_cost_rid", "_cost_observed"]
    for name in names:
        sql = steps[name]
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql}", used).fetchall()
        except duckdb.Error as exc:
            drop_sweep(con)
            raise QueryError(sql, f"the GPU-time sweep failed at {name}: {str(exc).splitlines()[0]}") from exc
    if names != list(steps) and not _swept_arrays(con, params, grid, cell_ns):
        run_sweep(con, params, grid, weighted, spans, cell_ns, arrays=False)
        return
    for name in sweep_sql("duckdb", grid=grid):
        if name not in ("_cost_shares", "_cost_replicas"):
            con.execute(f"DROP TABLE IF EXISTS {name}").fetchall()


def _swept_arrays(con: duckdb.DuckDBPyConnection, params: dict[str, int], grid: bool, cell_ns: int) -> bool:
    """`_cost_shares` and `_cost_replicas` from the SQL's GPU intervals (`_cost_gpu`, `_cost_rid`), model_load spans
    (`_cost_st`) and observed windows (`_cost_observed`) through `sweep_arrays`; False when it declined."""
    lo, hi = params["lo"], params["hi"]
    step = int(params["grid"]) if grid else None
    tag = uuid.uuid4().hex[:8]
    codes, got_s, got_r = f"_cost_codes_{tag}", f"_cost_got_s_{tag}", f"_cost_got_r_{tag}"
    con.execute(f"CREATE TEMP TABLE {codes} AS SELECT replica, (row_number() OVER (ORDER BY replica) - 1)::BIGINT "
                "AS code FROM (SELECT DISTINCT replica FROM _cost_st)")

    def cols(sql: str, n: int) -> list[npt.NDArray[np.int64]]:
        got = con.sql(sql).to_arrow_table()  # (fetchnumpy would import pandas)
        return [np.ascontiguousarray(got.column(i).to_numpy(), dtype=np.int64) for i in range(n)]

    try:
        gpu = cols(f"SELECT c.code, r.rid, g.s, g.e FROM _cost_gpu g JOIN _cost_rid r ON r.TraceId = g.TraceId "
                   f"AND r.request_span_id = g.request_span_id JOIN {codes} c ON c.replica = g.replica", 4)
        loads = cols(f"SELECT c.code, greatest(l.s, {lo}), least(l.e, {hi}) FROM _cost_st l JOIN {codes} c "
                     f"ON c.replica = l.replica WHERE l.Stage = '{COLD_START_STAGE}' "
                     f"AND least(l.e, {hi}) > greatest(l.s, {lo})", 3)
        observed = cols(f"SELECT c.code, o.first_ns, o.last_ns FROM _cost_observed o JOIN {codes} c "
                        "ON c.replica = o.replica", 3)
        out = sweep_arrays((gpu[0], gpu[1], gpu[2], gpu[3]), (loads[0], loads[1], loads[2]),
                           (observed[0], observed[1], observed[2]), int(cell_ns), step)
        if out is None:
            return False
        (s_rep, s_rid, s_b, s_v), (r_rep, r_b, r_cold, r_idle) = out
        con.register(got_s, pa.table({"code": s_rep, "rid": s_rid, "bucket_ns": s_b, "allocated_ns": s_v}))
        con.register(got_r, pa.table({"code": r_rep, "bucket_ns": r_b, "cold_start_ns": r_cold, "idle_ns": r_idle}))
        bucket = "BIGINT" if grid else "INTEGER"  # the SQL's types: its bucket is the literal 0 without a grid
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _cost_shares AS
            SELECT c.replica AS replica, r.TraceId AS trace_id, r.request_span_id AS request_span_id,
                   s.bucket_ns::{bucket} AS bucket_ns, s.allocated_ns::BIGINT AS allocated_ns
            FROM {got_s} s JOIN _cost_rid r ON r.rid = s.rid JOIN {codes} c ON c.code = s.code""")
        observed_ns = (f"greatest(0, least(o.last_ns, x.bucket_ns + {step}) - greatest(o.first_ns, x.bucket_ns))"
                       if step is not None else "o.last_ns - o.first_ns")
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _cost_replicas AS
            SELECT c.replica AS replica, x.bucket_ns::{bucket} AS bucket_ns, ({observed_ns})::BIGINT AS observed_ns,
                   coalesce(a.allocated_ns, 0)::BIGINT AS allocated_ns, x.cold_start_ns::BIGINT AS cold_start_ns,
                   x.idle_ns::BIGINT AS idle_ns, o.first_ns::BIGINT AS first_ns, o.last_ns::BIGINT AS last_ns
            FROM {got_r} x JOIN {codes} c ON c.code = x.code JOIN _cost_observed o ON o.replica = c.replica
            LEFT JOIN (SELECT code, bucket_ns, sum(allocated_ns) AS allocated_ns FROM {got_s} GROUP BY ALL) a
                ON a.code = x.code AND a.bucket_ns = x.bucket_ns""")
        return True
    except duckdb.Error as exc:
        drop_sweep(con)
        raise QueryError("", f"the GPU-time sweep failed over its arrays: {str(exc).splitlines()[0]}") from exc
    finally:
        for name in (got_s, got_r):
            with contextlib.suppress(duckdb.Error):
                con.unregister(name)
        con.execute(f"DROP TABLE IF EXISTS {codes}")


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


# --- the same sweep over arrays (numpy): what `run_sweep` runs for the integer rule ---------------------------

I64 = npt.NDArray[np.int64]


def _ranges(a: I64, b: I64, step: int) -> tuple[I64, I64]:
    """(row, t) for each t in range(a[row], b[row], step) (the SQL's `grid_cells`), rows in order."""
    k = np.maximum(0, (b - a + step - 1) // step)
    which = np.repeat(np.arange(a.size, dtype=np.int64), k)
    first = np.repeat(np.cumsum(k) - k, k)
    return which, a[which] + (np.arange(which.size, dtype=np.int64) - first) * step


def _cut(s: I64, e: I64, step: int) -> tuple[I64, I64, I64, I64]:
    """Each interval [s, e) cut at the multiples of `step`: (which interval, cell start, piece start, piece end),
    one row per cell the interval touches."""
    which, c = _ranges((s // step) * step, e, step)
    return which, c, np.maximum(s[which], c), np.minimum(e[which], c + step)


def _starts(*keys: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """True where a row of sorted keys begins a new group (any key differs from the row before)."""
    n = keys[0].size
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
        for k in keys:
            new[1:] |= k[1:] != k[:-1]
    return new


def sweep_arrays(gpu: tuple[I64, I64, I64, I64], loads: tuple[I64, I64, I64], observed: tuple[I64, I64, I64],
                 cell: int, grid: int | None) -> tuple[tuple[I64, I64, I64, I64], tuple[I64, I64, I64, I64]] | None:
    """The integer sweep of `sweep_sql` (unweighted) from its inputs, in numpy: the same rows.

    gpu: (replica code, request number rid, start, end) of each GPU interval clipped to the range (end > start);
    loads: (replica code, start, end) of each model_load span clipped likewise; observed: (replica code, first,
    last) of each replica's observed window. Returns ((replica, rid, bucket, allocated ns) per share row,
    (replica, bucket, cold start ns, idle ns) per replica-bucket), or None when the keys would not fit in int64
    (the caller runs the SQL). Each step is the SQL's: the union of a request's intervals (islands), cut at the
    cells; each cell's pieces ranked by (end, rid); the boundaries' running counts, floor shares and remainder
    recipient; a piece's share Q(end) - Q(start).
    """
    rep, rid, s, e = gpu
    l_rep, l_s, l_e = loads
    o_rep, o_first, o_last = observed
    nrep = 1 + max([int(x.max()) for x in (rep, l_rep, o_rep) if x.size], default=0)
    nrid = int(rid.max()) + 1 if rid.size else 1
    if nrep * nrid >= 2**62 or (s.size and (int(s.min()) < 0 or int(e.max()) >= 2**61)):
        return None
    # islands: +1 at each start, -1 at each end, in (replica, rid, t) order, starts first at a tie (touching
    # intervals merge): one packed key per request and one per instant
    tk = np.concatenate([s * 2, e * 2 + 1])
    o = np.lexsort((tk, np.concatenate([rep, rep]) * nrid + np.concatenate([rid, rid])))
    d = 1 - 2 * (tk[o] & 1)
    depth = np.cumsum(d)
    opens, closes = o[(d == 1) & (depth == 1)], o[(d == -1) & (depth == 0)]
    r2, q2 = np.concatenate([rep, rep]), np.concatenate([rid, rid])
    i_rep, i_rid, i_s, i_e = r2[opens], q2[opens], tk[opens] // 2, tk[closes] // 2
    # pieces: the islands cut at the cells; loads likewise; the observed windows' cells (and grid edges)
    w, pc, ps, pe = _cut(i_s, i_e, cell)
    lw, lc, ls, le = _cut(l_s, l_e, cell)
    ow, oc, _, _ = _cut(o_first, o_last, cell)
    gw, gt = _ranges((o_first // grid) * grid + grid, o_last, grid) if grid is not None else (ow[:0], oc[:0])
    gc = (gt // cell) * cell
    cells_at = [x for x in (pc, lc, oc, gc) if x.size]
    c_min = min((int(x.min()) for x in cells_at), default=0)
    ncells = (max((int(x.max()) for x in cells_at), default=0) - c_min) // cell + 1
    if nrep * ncells * (cell + 1) >= 2**62:
        return None

    def at(r: I64, c: I64, x: I64) -> I64:
        """An instant x of cell c (x in [c, c + cell]) on replica r as one key, ordered by (replica, cell, x)."""
        return ((r * ncells + (c - c_min) // cell) * (cell + 1)) + (x - c)

    # iid ranks a cell's pieces by (end, rid)
    p_rep, p_rid = i_rep[w], i_rid[w]
    o = np.lexsort((p_rid, at(p_rep, pc, pe)))
    p_rep, p_rid, pc, ps, pe = p_rep[o], p_rid[o], pc[o], ps[o], pe[o]
    p_cell = at(p_rep, pc, pc) // (cell + 1)  # (replica, cell) as one number
    gfirst = np.flatnonzero(_starts(p_cell))
    iid = np.arange(p_rep.size, dtype=np.int64) - np.repeat(gfirst, np.diff(np.append(gfirst, p_rep.size))) + 1
    # events (replica, cell, t as one key; +-1 GPU, +-1 load, recipient candidate), grouped into boundaries
    ev = np.concatenate([at(p_rep, pc, ps), at(p_rep, pc, pe), at(l_rep[lw], lc, ls), at(l_rep[lw], lc, le),
                         at(o_rep[ow], oc, np.maximum(o_first[ow], oc)), at(o_rep[ow], oc, np.minimum(o_last[ow],
                                                                                                   oc + cell)),
                         at(o_rep[gw], gc, gt)])
    k0, k1, k2, k3 = ps.size, 2 * ps.size, 2 * ps.size + ls.size, 2 * (ps.size + ls.size)
    dg, dl, cand = (np.zeros(ev.size, np.int64) for _ in range(3))
    dg[:k0], dg[k0:k1], dl[k1:k2], dl[k2:k3], cand[:k0] = 1, -1, 1, -1, iid
    o = np.argsort(ev)
    ev = ev[o]
    first = np.flatnonzero(_starts(ev))  # each distinct boundary
    if first.size:
        dg, dl, cand = (np.add.reduceat(dg[o], first), np.add.reduceat(dl[o], first),
                        np.maximum.reduceat(cand[o], first))
    else:
        dg, dl, cand = dg[:0], dl[:0], cand[:0]
    b_key = ev[first]
    b_cell = b_key // (cell + 1)
    b_rep = b_cell // ncells
    b_t = (b_cell % ncells) * cell + c_min + b_key % (cell + 1)
    n, nl = np.cumsum(dg), np.cumsum(dl)  # every cell's events sum to 0: the running sums restart by themselves
    g_new = _starts(b_cell)
    gidx = np.cumsum(g_new) - 1  # the boundary's cell as a dense number
    groups = int(gidx[-1]) + 1 if gidx.size else 0
    top = int(cand.max()) + 1 if cand.size else 1
    if groups * top >= 2**62:
        return None
    best = np.maximum.accumulate(gidx * top + cand) - gidx * top  # running max of the candidates in the cell
    nxt = np.append(b_t[1:], 0)
    has_len = np.append(~g_new[1:], False)  # the cell's last boundary starts no segment
    length = np.where(has_len, nxt - b_t, 0)
    active = has_len & (n > 0)
    q, r = np.divmod(length, np.where(active, n, 1))
    q, r = np.where(active, q, 0), np.where(active, r, 0)
    excl = np.cumsum(q) - q
    q_before = excl - excl[np.flatnonzero(g_new)][gidx]
    bucket = (b_t // grid) * grid if grid is not None else np.zeros(b_t.size, np.int64)
    # each piece (cut at the grid) takes Q(end) - Q(start) of its cell's boundaries
    if grid is not None:
        sw, sb, ss, se = _cut(ps, pe, grid)
    else:
        sw, ss, se = np.arange(ps.size, dtype=np.int64), ps, pe
        sb = np.zeros(ps.size, np.int64)
    part = (q_before[np.searchsorted(b_key, at(p_rep[sw], pc[sw], se))]
            - q_before[np.searchsorted(b_key, at(p_rep[sw], pc[sw], ss))])
    # the remainders, to the piece of the cell ranked `best`
    rem = np.flatnonzero(r > 0)
    piece_first = np.zeros(groups, np.int64)
    piece_first[np.searchsorted(b_cell[np.flatnonzero(g_new)], p_cell[gfirst])] = gfirst
    to = piece_first[gidx[rem]] + best[rem] - 1
    req = np.concatenate([p_rep[sw] * nrid + p_rid[sw], b_rep[rem] * nrid + p_rid[to]])
    (s_req, s_b), (s_v,) = _sum_by((req, np.concatenate([sb, bucket[rem]])), np.concatenate([part, r[rem]]))
    idle = np.where(n == 0, np.where(nl > 0, 0, length), 0)
    cold = np.where(n == 0, np.where(nl > 0, length, 0), 0)
    (rr, rb), (rc, ri) = _sum_by((b_rep, bucket), cold, idle)
    return (s_req // nrid, s_req % nrid, s_b, s_v), (rr, rb, rc, ri)


def _sum_by(keys: tuple[I64, ...], *values: I64) -> tuple[tuple[I64, ...], tuple[I64, ...]]:
    """Sums of `values` per distinct tuple of `keys`: (the distinct keys, the sums), sorted by the keys."""
    o = np.lexsort(keys[::-1])
    ks = tuple(k[o] for k in keys)
    first = np.flatnonzero(_starts(*ks))
    if not first.size:
        return tuple(k[:0] for k in ks), tuple(v[:0] for v in values)
    return tuple(k[first] for k in ks), tuple(np.add.reduceat(v[o], first) for v in values)
