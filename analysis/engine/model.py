"""The request model, defined once: SQL that turns spans into one row per inference request.

Every consumer reads this definition: the `requests` / `stages` views (analysis.engine.views,
analysis.engine.connect), the materialized per-hour request files (analysis.engine.materialize), the
report's request facts (analysis.engine.percentiles) and, through those, the dashboard. The
rules (critical-path sweep, stage columns, TTFT / TPOT, outcome, replica, which spans a
request reads) are listed in docs/schema.md; tests/analysis/test_model_oracle.py checks
them against a plain-Python per-instant reference.

The SQL is generated for a `Dialect` (analysis.engine.dialect, the one table of what differs
between engines: `DUCKDB` and `CLICKHOUSE`, re-exported here for the model's callers).
"""

from __future__ import annotations

from collections.abc import Iterable

from analysis.engine.dialect import CLICKHOUSE as CLICKHOUSE
from analysis.engine.dialect import CLICKHOUSE_SETTINGS as CLICKHOUSE_SETTINGS
from analysis.engine.dialect import DUCKDB, Dialect, quote
from tracing import schema as S

HOUR_NS: int = 3_600_000_000_000
#: Hours, relative to a request's own hour (that of its span's start), whose stage spans it reads:
#: the SQL below keeps stage spans starting in [hour - 1 h, hour + 2 h), so clock skew either way is read.
READ_HOURS: tuple[int, ...] = (-1, 0, 1)


def in_read_hours_sql(ts: str, start_ns: str, d: Dialect = DUCKDB) -> str:
    """Whether a span starting at `ts` (ns) lies in the READ_HOURS of a request starting at `start_ns`: the stage
    spans a request reads (its model's and its stage attributes' rule, analysis.engine.attribute_values)."""
    h = HOUR_NS
    hour = f"{d.int_div(start_ns, str(h))} * {h}"
    return f"{ts} >= {hour} + {min(READ_HOURS) * h} AND {ts} < {hour} + {(max(READ_HOURS) + 1) * h}"


def hour_runs(hours: Iterable[int]) -> list[tuple[int, int]]:
    """[start, end) ns of each run of consecutive hours (hour starts, ns) of `hours`, in order."""
    runs: list[list[int]] = []
    for h in sorted(set(hours)):
        if runs and runs[-1][1] == h:
            runs[-1][1] = h + HOUR_NS
        else:
            runs.append([h, h + HOUR_NS])
    return [(a, b) for a, b in runs]


#: Columns of `requests`, in order.
REQUEST_COLUMNS: tuple[str, ...] = (
    "trace_id", "span_id", "parent_span_id", "start", "start_ns", "end_ns", "e2e_ns", "status", "replica",
    "service", "model", "model_version", "tenant", "input_tokens", "output_tokens", "streaming", "ttft_ns",
    "tpot_ns", *(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS), "span_name", "client_e2e_ns", "client_network_ns",
    "adjusted_count",
)
#: Request-level columns (no critical-path stage columns): what the report's request facts hold.
FACT_COLUMNS: tuple[str, ...] = ("trace_id", "span_id", "start_ns", "e2e_ns", "status", "replica", "service",
                                 "model", "model_version", "tenant", "input_tokens", "output_tokens", "ttft_ns",
                                 "tpot_ns", "adjusted_count")
#: Request columns a view is filtered by: the dashboard's sidebar, a shared link, an alert's dashboard link.
FILTER_DIMENSIONS: tuple[str, ...] = ("service", "model", "replica", "tenant")
#: Stage columns of `requests` (they sum to e2e_ns).
STAGE_COLUMNS: tuple[str, ...] = tuple(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS)
#: Stages whose span's replica is the request's replica (the replica that generated).
WORKER_STAGES: tuple[str, ...] = (S.GENERATION, S.PREFILL, S.DECODE)
#: Stages whose spans give a request's first token or replica.
INFO_STAGES: tuple[str, ...] = (*WORKER_STAGES, S.STREAMING)




def _in_list(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(quote(v) for v in values) + ")"




#: Span columns added after stores were written: (column, DuckDB type, the value an older segment reads as).
LATER_COLUMNS: tuple[tuple[str, str, str], ...] = (("AdjustedCount", "DOUBLE", "1.0"),)



def adjusted_count_sql(d: Dialect, trace_state: str = "TraceState", attrs: str = "SpanAttributes") -> str:
    """SQL of tracing.rows.adjusted_count_of over a span's TraceState and attribute map (docs/convention.md#sampling).

    The stored `AdjustedCount` column is this rule applied at intake; an engine without that column
    (ClickHouse over the Collector's own table) derives it here. Same order and result bit for bit:
    the first `ot` member's `th` (1-14 lowercase hex digits, right-padded to 14) gives
    2^56 / (2^56 - th); a malformed one gives 1; without one, the first non-empty SAMPLE_RATE_KEYS
    attribute when it is a decimal >= 1 (else 1); else 1.
    """
    p = _sampling_parts(d, trace_state, attrs)
    return f"(CASE WHEN {p['has_th']} THEN {p['from_th']} ELSE {p['from_rate']} END)"


def sampling_record_sql(d: Dialect, trace_state: str = "TraceState", attrs: str = "SpanAttributes"
                        ) -> tuple[str, str]:
    """SQL of two span conditions: it records a sampling probability (an `ot=th`, else a SAMPLE_RATE_KEYS
    attribute), and that record does not read (`tracing.rows.sampling_of`'s `malformed`)."""
    p = _sampling_parts(d, trace_state, attrs)
    recorded = f"({p['has_th']} OR {p['rate']} IS NOT NULL)"
    malformed = (f"(CASE WHEN {p['has_th']} THEN NOT {p['th_ok']} "
                 f"WHEN {p['rate']} IS NOT NULL THEN NOT {p['rate_ok']} ELSE false END)")
    return recorded, malformed


def _sampling_parts(d: Dialect, trace_state: str, attrs: str) -> dict[str, str]:
    hex56, matches, extract, to_double = d.hex56, d.regex_matches, d.regex_extract, d.to_double_or_null
    ws = " \\t"  # a regex class: space and tab
    ot = extract(trace_state, f"(?:^|,)[{ws}]*ot=([^,]*?)[{ws}]*(?:,|$)")
    has_ot = matches(trace_state, f"(?:^|,)[{ws}]*ot=")
    has_th = f"({has_ot} AND {matches(ot, '(?:^|;)th:')})"
    th = extract(ot, "(?:^|;)th:([^;]*)")
    two56 = str(1 << S.THRESHOLD_BITS)
    digits = S.THRESHOLD_DIGITS
    th_ok = matches(th, f"^[0-9a-f]{{1,{digits}}}$")
    from_th = (f"CASE WHEN {th_ok} THEN CAST({two56} AS DOUBLE) / "
               f"CAST({two56} - {hex56(f'rpad({th}, {digits}, {quote(chr(48))})')} AS DOUBLE) ELSE 1.0 END")
    rate = "coalesce(" + ", ".join(f"nullif({attrs}[{quote(k)}], '')" for k in S.SAMPLE_RATE_KEYS) + ")"
    rate_value = to_double(rate)
    rate_ok = f"({matches(rate, '^[0-9]{1,18}([.][0-9]{1,18})?$')} AND {rate_value} >= 1)"
    from_rate = f"CASE WHEN {rate} IS NOT NULL AND {rate_ok} THEN {rate_value} ELSE 1.0 END"
    return {"has_th": has_th, "th_ok": th_ok, "from_th": from_th, "rate": rate, "rate_ok": rate_ok,
            "from_rate": from_rate}


def stored_adjusted_count(d: Dialect, table: str = "") -> str:
    """The span's adjusted count: the promoted `AdjustedCount` column (an older DuckDB segment reads 1).

    Every source the model reads carries the column: the store promotes it at intake, the
    ClickHouse source derives it with `adjusted_count_sql` (analysis.clickhouse.promoted_sql).
    """
    pre = f"{table}." if table else ""
    return f"coalesce({pre}AdjustedCount, 1.0)"




#: The copies of a request span stored more than once (the same trace and span id: an exporter's retry, two
#: collectors) are one request, read from one copy: the first in this order. The earliest start, then the latest
#: end, then every other column of the span the model reads, each ascending with NULL first; where the span's
#: attributes are read (analysis.engine.attribute_values, analysis.clickhouse.attributes, analysis.attribute_filters:
#: `copy_order_sql` with `attrs`), then its attribute map's entries sorted by key, compared as text. A total order of
#: what a request is read from, so the same spans give the same request whatever their files, rows, engine, and
#: whether its hour is materialized; copies equal in all of it are interchangeable. (name, span column SQL).
COPY_ORDER: tuple[tuple[str, str], ...] = (
    ("rs", "TimestampNs"), ("re", "TimestampNs + Duration"), ("Outcome", "Outcome"), ("ServiceName", "ServiceName"),
    ("Replica", "Replica"), ("SpanName", "SpanName"), ("ParentSpanId", "ParentSpanId"), ("Model", "Model"),
    ("ModelVersion", "ModelVersion"), ("Tenant", "Tenant"), ("InputTokens", "InputTokens"),
    ("OutputTokens", "OutputTokens"), ("TtftNs", "TtftNs"), ("stream_attr", ""), ("adj", ""))
#: COPY_ORDER's columns read latest first (the others earliest, least first).
_DESCENDING: frozenset[str] = frozenset({"re"})


def copy_columns_sql(d: Dialect, table: str = "") -> str:
    """SQL of a request span's COPY_ORDER columns (a SELECT list naming them) from the span columns of `table` (a
    qualifier; none: unqualified): what the model's `req` holds of the span beside its ids."""
    pre = f"{table}." if table else ""
    exprs = {name: " + ".join(pre + part for part in expr.split(" + ")) for name, expr in COPY_ORDER if expr}
    exprs["stream_attr"] = f"{pre}SpanAttributes['{S.ATTR_STREAMING}']"
    exprs["adj"] = stored_adjusted_count(d, table)
    return ", ".join(e if e == name else f"{e} AS {name}" for name, e in exprs.items())


def copy_order_sql(attrs: tuple[Dialect, str] | None = None, columns: tuple[str, ...] = REQUEST_COLUMNS) -> str:
    """The ORDER BY list of COPY_ORDER over `copy_columns_sql`'s columns; with `attrs` (the dialect, the attribute
    map's expression) the map's entries sorted by key last. A query whose rows (`columns`) hold no `streaming` flag
    leaves the stream attribute out: copies apart only there give it the same rows, and ordering by it would decode
    every request span's attribute map (the facts' read doubled at 40 attributes a span)."""
    keys = [f"{name} {'DESC' if name in _DESCENDING else 'ASC'} NULLS FIRST" for name, _ in COPY_ORDER
            if name != "stream_attr" or "streaming" in columns or attrs is not None]
    if attrs is not None:
        keys.append(attrs[0].sorted_entries(attrs[1]))
    return ", ".join(keys)


def request_copy_sql(d: Dialect, spans: str, where: str, columns: dict[str, str]) -> str:
    """SQL of (TraceId, SpanId, `columns`) of each request span of `spans` meeting `where`, one row per span id: of
    a span stored more than once, its first copy by COPY_ORDER, the attribute map last. `columns`: name -> SQL over
    the span's columns (names apart from COPY_ORDER's). The copies are found by the hash of their ids alone (no map
    read; a collision only sends a span through the ordering), so only they are sorted."""
    key = d.hash2("TraceId", "SpanId")
    rows = f"FROM {spans} WHERE IsRequest AND ({where})"
    copies = f"SELECT {key} AS copy_key {rows} GROUP BY copy_key HAVING count(*) > 1"
    listed = ", ".join(f"{sql} AS {name}" for name, sql in columns.items())
    names = ", ".join(columns)
    return (f"SELECT TraceId, SpanId, {listed} {rows} AND {key} NOT IN ({copies}) UNION ALL "
            f"SELECT TraceId, SpanId, {names} FROM (SELECT *, row_number() OVER (PARTITION BY TraceId, SpanId "
            f"ORDER BY {copy_order_sql((d, 'SpanAttributes'))}) AS copy_n FROM (SELECT TraceId, SpanId, "
            f"SpanAttributes, {listed}, {copy_columns_sql(d)} {rows} AND {key} IN ({copies}))) WHERE copy_n = 1")


def _sweep(d: Dialect, part: str) -> str:
    """x1: end of a span's critical stretch [s0, x1) among the rows of its partition (same kind)."""
    frame = (f"OVER (PARTITION BY {part} ORDER BY e0 DESC, s0 DESC, SpanId "
             "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)")
    return f"greatest(s0, least(e0, coalesce({d.min_or_null('s0')} {frame}, e0)))"


def chain_sql(source: str, d: Dialect = DUCKDB, *, request_where: str = "TRUE", stages: bool = True,
              span_where: str = "TRUE", columns: tuple[str, ...] = REQUEST_COLUMNS) -> str:
    """The WITH clause computing per-request relations from the spans in `source` (a FROM item).

    `request_where` narrows the request spans (a condition on span columns, e.g. an hour
    range); `span_where` may narrow the stage spans read to those that can overlap them (a
    literal time bound lets the engine skip files). Defines `req` (deduplicated request spans),
    `info` (first token, replica) and,
    when `stages`, `l1w` / `l2w` (stretches) and `stage_ns` (critical-path ns per stage).
    Spans are matched to their parent by a 64-bit hash of (trace id, span id): joins and
    window partitions on one integer instead of two strings.
    """
    ctes = chain_ctes(source, d, request_where=request_where, stages=stages, span_where=span_where, columns=columns)
    return "WITH " + ",\n".join(f"{name} AS {'MATERIALIZED ' if mat and d.materialized_ctes else ''}({sql})"
                                 for name, mat, sql in ctes)


def chain_ctes(source: str, d: Dialect = DUCKDB, *, request_where: str = "TRUE", stages: bool = True,
               span_where: str = "TRUE", columns: tuple[str, ...] = REQUEST_COLUMNS) -> list[tuple[str, bool, str]]:
    """The relations of `chain_sql` in order: (name, materialize, SELECT); a later one reads earlier ones by name.

    An engine that plans a long WITH chain slowly (ClickHouse) runs them one by one into temporary tables.
    `columns`: the columns the final SELECT gives (the copy of a request span stored twice is picked by what they
    show: `copy_order_sql`).
    """
    y = _in_list(S.YIELDING_STAGES)
    h = str(HOUR_NS)
    ctes: dict[str, tuple[bool, str]] = {
        # request spans; one stored twice (same trace and span id) counts once
        "req0": (True, f"""
SELECT TraceId, SpanId, {copy_columns_sql(d)},
       {d.hash2('TraceId', 'SpanId')} AS rk, {d.hash2('TraceId', 'ParentSpanId')} AS rpk,
       {d.int_div('TimestampNs', h)} * {h} AS hr
FROM {source} WHERE IsRequest AND ({request_where})"""),
        # a request span stored twice (same trace and span id) counts once: its first copy by COPY_ORDER (the
        # copies are ordered on their own, so the other requests pay for no window)
        "dup": (True, "SELECT rk FROM req0 GROUP BY rk HAVING count(*) > 1"),
        "req": (True, f"""
SELECT * FROM req0 WHERE rk NOT IN (SELECT rk FROM dup)
UNION ALL
SELECT * FROM (SELECT * FROM req0 WHERE rk IN (SELECT rk FROM dup)
               QUALIFY row_number() OVER (PARTITION BY rk ORDER BY {copy_order_sql(columns=columns)}) = 1)"""),
        "st": (True, f"""
SELECT {d.hash2('TraceId', 'SpanId')} AS k, {d.hash2('TraceId', 'ParentSpanId')} AS pk, SpanId, Stage, Replica,
       TimestampNs AS s, TimestampNs + Duration AS e
FROM {source}
WHERE Stage IS NOT NULL AND ({span_where})
  AND TimestampNs < (SELECT max(re) FROM req) AND TimestampNs + Duration > (SELECT min(rs) FROM req)"""),
        # level 1: stage children of the request span that overlap it, clipped to it
        "l1w": (True, f"""
SELECT *{f", {_sweep(d, 'rk, yielding')} AS x1" if stages else ""} FROM (
  SELECT r.rk, r.rs, r.re, r.hr, st.k, st.SpanId, st.Stage AS stage, st.Replica,
         st.s AS raw_s, st.e AS raw_e, greatest(st.s, r.rs) AS s0, least(st.e, r.re) AS e0,
         st.Stage IN {y} AS yielding
  FROM st JOIN req r ON st.pk = r.rk
  WHERE least(st.e, r.re) > greatest(st.s, r.rs) AND st.s >= r.hr - {h} AND st.s < r.hr + 2 * {h})"""),
        # level 2: stage children of a level-1 working span that overlap the request,
        # clipped to that span's stretch (the facts, without stages, need no stretch)
        "l2": (True, f"""
SELECT p.rk, p.k AS parent, p.s0 AS ps, p.stage AS pstage, c.SpanId, c.Stage AS stage, c.Replica,
       c.s AS raw_s, c.e AS raw_e, greatest(c.s, p.s0) AS s0, least(c.e, {'p.x1' if stages else 'p.e0'}) AS e0,
       c.Stage IN {y} AS yielding
FROM st c JOIN l1w p ON c.pk = p.k
WHERE NOT p.yielding AND least(c.e, p.re) > greatest(c.s, p.rs)
  AND c.s >= p.hr - {h} AND c.s < p.hr + 2 * {h}"""),
        # the spans a request reads give its first token and replica
        "info": (False, f"""
SELECT rk,
       {d.agg_if('min', 'raw_e', f"stage = {quote(S.PREFILL)}")} AS prefill_end_ns,
       {d.agg_if('min', 'raw_s', f"stage = {quote(S.STREAMING)}")} AS stream_start_ns,
       {d.agg_if('arg_min', 'Replica, ' + d.row(['raw_s', 'SpanId']),
                 f"stage IN {_in_list(WORKER_STAGES)} AND Replica IS NOT NULL")} AS worker_replica
FROM (SELECT rk, SpanId, stage, Replica, raw_s, raw_e FROM l1w WHERE stage IN {_in_list(INFO_STAGES)}
      UNION ALL SELECT rk, SpanId, stage, Replica, raw_s, raw_e FROM l2 WHERE stage IN {_in_list(INFO_STAGES)})
GROUP BY rk"""),
    }
    if stages:
        ctes |= {
            "l2w": (True, f"SELECT *, {_sweep(d, 'rk, parent, ps, yielding')} AS x1 FROM l2 WHERE e0 > s0"),
            # Each stage's exclusive ns as signed parts, summed per request and stage in one pass:
            # a stretch counts for its stage; a level-2 stretch's exclusive ns are taken from its
            # parent's stage; a yielding stretch loses its overlap with each working sibling's stretch
            # (working siblings' stretches are disjoint). Summed, these are the exclusive times.
            "parts": (False, f"""
SELECT rk, stage, x1 - s0 AS ns FROM l1w WHERE x1 > s0
UNION ALL SELECT rk, stage, x1 - s0 FROM l2w WHERE x1 > s0
UNION ALL SELECT rk, pstage, s0 - x1 FROM l2w WHERE x1 > s0
UNION ALL {_overlap_sql("l1w", "rk", "stage", -1)}
UNION ALL {_overlap_sql("l2w", "rk, parent, ps", "stage", -1)}
UNION ALL {_overlap_sql("l2w", "rk, parent, ps", "pstage", 1)}"""),
            "stage_ns": (False, "SELECT rk,\n    " + ",\n    ".join(
                f"coalesce({d.agg_if('sum', 'ns', f'stage = {quote(s)}')}, 0) AS {s}_ns" for s in S.ALL_STAGES)
                + ",\n    sum(ns) AS covered_ns\nFROM parts\nGROUP BY rk"),
        }
    return [(name, mat, sql) for name, (mat, sql) in ctes.items()]


def _overlap_sql(table: str, part: str, stage: str, sign: int) -> str:
    """Rows (rk, `stage` column, `sign` x overlap) of each yielding stretch of `table` with each working
    sibling's stretch (same `part`), where they overlap."""
    on = " AND ".join(f"w.{c.strip()} = y.{c.strip()}" for c in part.split(","))
    ov = "least(y.x1, w.x1) - greatest(y.s0, w.s0)"
    return f"""SELECT y.rk, y.{stage}, {'' if sign > 0 else '-'}({ov}) FROM {table} y JOIN {table} w ON {on}
WHERE y.yielding AND NOT w.yielding AND y.x1 > y.s0 AND w.x1 > w.s0 AND {ov} > 0"""


def _ttft(d: Dialect) -> str:
    return "coalesce(r.TtftNs, i.prefill_end_ns - r.rs, i.stream_start_ns - r.rs)"


def select_sql(d: Dialect, source: str, *, stages: bool, columns: tuple[str, ...]) -> str:
    """The final SELECT of the model over the relations of `chain_ctes` (`source`: the spans, for client spans)."""
    return _select(d, source, stages=stages, columns=columns)


def _select(d: Dialect, source: str, *, stages: bool, columns: tuple[str, ...]) -> str:
    ttft = _ttft(d)
    tpot = f"((r.re - r.rs) - {ttft}) / (r.OutputTokens - 1)"
    h = str(HOUR_NS)
    exprs: dict[str, str] = {
        "trace_id": "r.TraceId",
        "span_id": "r.SpanId",
        "parent_span_id": "r.ParentSpanId",
        "start": d.ts_from_ns("r.rs"),
        "start_ns": "r.rs",
        "end_ns": "r.re",
        "e2e_ns": "r.re - r.rs",
        "status": "coalesce(r.Outcome, 'ok')",
        "replica": "coalesce(i.worker_replica, r.Replica)",
        "service": "r.ServiceName",
        "model": "r.Model",
        "model_version": "r.ModelVersion",
        "tenant": "r.Tenant",
        "input_tokens": "r.InputTokens",
        "output_tokens": "r.OutputTokens",
        "streaming": d.to_bool("coalesce(r.stream_attr = 'true', false)"),
        "ttft_ns": ttft,
        "tpot_ns": f"CASE WHEN r.OutputTokens > 1 THEN {d.round_int(tpot)} END",
        "other_ns": d.int64("(r.re - r.rs) - coalesce(k.covered_ns, 0)"),
        "span_name": "r.SpanName",
        "client_e2e_ns": "cl_e2e",
        "client_network_ns": "cl_e2e - (r.re - r.rs)",
        "adjusted_count": "r.adj",
    }
    for s in S.CRITICAL_PATH_COLUMNS:
        if s != S.OTHER:
            exprs[f"{s}_ns"] = d.int64(f"coalesce(k.{s}_ns, 0)")
    joins = ["LEFT JOIN info i ON i.rk = r.rk"]
    if stages:
        joins.append("LEFT JOIN stage_ns k ON k.rk = r.rk")
    client = "client_e2e_ns" in columns or "client_network_ns" in columns
    if client:
        # one client row per key: joined on the key alone, read only when it starts within the request's read
        # hours (a range in the ON clause is what ClickHouse before 25.x refuses with join_use_nulls)
        joins.append(f"""LEFT JOIN (SELECT {d.hash2('TraceId', 'SpanId')} AS k, min(TimestampNs) AS cs,
                          {d.arg_min('Duration', d.row(['TimestampNs', 'Duration']))} AS Duration
                   FROM {source} WHERE SpanKind = 'Client' GROUP BY k) cl
    ON cl.k = r.rpk""")
    cols = ",\n    ".join(f"{exprs[c]} AS {c}" for c in columns)
    if client:
        in_reach = f"cl.cs >= r.hr - {h} AND cl.cs < r.hr + 2 * {h}"
        cols = cols.replace("cl_e2e", f"(CASE WHEN {in_reach} THEN cl.Duration END)")
    return f"SELECT\n    {cols}\nFROM req r\n" + "\n".join(joins)


def requests_sql(source: str = "spans", d: Dialect = DUCKDB, *, request_where: str = "TRUE",
                 span_where: str = "TRUE") -> str:
    """One row per request (all REQUEST_COLUMNS) from the spans in `source`."""
    return chain_sql(source, d, request_where=request_where, span_where=span_where) + "\n" + _select(
        d, source, stages=True, columns=REQUEST_COLUMNS)


def facts_sql(source: str = "spans", d: Dialect = DUCKDB, *, request_where: str = "TRUE",
              columns: tuple[str, ...] = FACT_COLUMNS, span_where: str = "TRUE") -> str:
    """Request-level columns only (no critical-path sweep): the same rules as `requests_sql`, cheaper."""
    bad = [c for c in columns if c in STAGE_COLUMNS]
    if bad:
        raise ValueError(f"facts hold no stage column: {bad}")
    return chain_sql(source, d, request_where=request_where, stages=False, span_where=span_where,
                     columns=columns) + "\n" + _select(
        d, source, stages=False, columns=columns)


def stages_sql(source: str = "requests", d: Dialect = DUCKDB) -> str:
    """The long `stages` view: one row per request and stage over a `requests` relation."""
    keep = "trace_id, span_id, start, start_ns, status, replica, service, model, model_version, tenant"
    return d.unpivot_stages(keep, STAGE_COLUMNS, source)


def stretches_sql(source: str = "spans", d: Dialect = DUCKDB) -> str:
    """Each read stage span's critical stretch [s0, x1) before its children take their share.

    Columns: level (1, 2), trace_id, request_span_id, parent_span_id (the request span, or
    the level-1 parent), parent_s0 (the parent's stretch start at level 2), span_id, stage,
    yielding, s0, x1. `exclusive_stretches` turns these into each span's own intervals.
    """
    return chain_sql(source, d) + """
SELECT 1 AS level, r.TraceId AS trace_id, r.SpanId AS request_span_id, r.SpanId AS parent_span_id,
       NULL AS parent_s0, w.SpanId AS span_id, stage, yielding, s0, x1
FROM l1w w JOIN req r ON r.rk = w.rk WHERE x1 > s0
UNION ALL
SELECT 2, r.TraceId, r.SpanId, p.SpanId, w.ps, w.SpanId, w.stage, w.yielding, w.s0, w.x1
FROM l2w w JOIN req r ON r.rk = w.rk JOIN l1w p ON p.k = w.parent AND p.s0 = w.ps AND p.rk = w.rk
WHERE w.x1 > w.s0"""


Interval = tuple[int, int]


def subtract(base: list[Interval], holes: list[Interval]) -> list[Interval]:
    """Intervals of `base` not covered by `holes`."""
    out = base
    for h0, h1 in holes:
        nxt: list[Interval] = []
        for a, b in out:
            if h1 <= a or h0 >= b:
                nxt.append((a, b))
                continue
            if a < h0:
                nxt.append((a, h0))
            if h1 < b:
                nxt.append((h1, b))
        out = nxt
    return [(a, b) for a, b in out if b > a]


def exclusive_stretches(rows: list[dict[str, object]]) -> dict[tuple[str, str, int], list[Interval]]:
    """The instants each stage span owns, from `stretches_sql` rows: key (request span id, span id, s0).

    A working span owns its stretch minus its children's; a streaming span owns its stretch
    minus its working siblings' stretches. Their lengths add up to the `requests` stage columns.
    """
    def key(r: dict[str, object]) -> tuple[object, object, object]:
        return (r["request_span_id"], r["parent_span_id"], r["parent_s0"])

    working: dict[tuple[object, object, object], list[Interval]] = {}
    for r in rows:
        if not r["yielding"]:
            working.setdefault(key(r), []).append((int(r["s0"]), int(r["x1"])))  # type: ignore[call-overload]
    own: dict[tuple[str, str, int], list[Interval]] = {}
    for level in (2, 1):
        for r in rows:
            if r["level"] != level:
                continue
            s0, x1 = int(r["s0"]), int(r["x1"])  # type: ignore[call-overload]
            span = (str(r["request_span_id"]), str(r["span_id"]), s0)
            if r["yielding"]:
                own[span] = subtract([(s0, x1)], working.get(key(r), []))
            else:
                kids = [iv for c in rows if c["level"] == 2 and (c["request_span_id"], c["parent_span_id"],
                                                                 c["parent_s0"]) == (r["request_span_id"],
                                                                                     r["span_id"], s0)
                        for iv in own[(str(c["request_span_id"]), str(c["span_id"]), int(c["s0"]))]]  # type: ignore[call-overload]
                own[span] = subtract([(s0, x1)], kids)
    return own


def span_stretches(con: object, source: str = "spans") -> dict[str, list[Interval]]:
    """Per stage span id: the intervals (ns) it owns on its request's critical path, over `source`.

    `con` is a DuckDB connection; meant for one trace (the waterfall): the lengths add up to
    the stage columns of `requests`.
    """
    cur = con.execute(stretches_sql(source))  # type: ignore[attr-defined]
    names = [c[0] for c in cur.description or []]
    rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    out: dict[str, list[Interval]] = {}
    for (_, sid, _), ivs in exclusive_stretches(rows).items():
        out.setdefault(sid, []).extend(ivs)
    return out
