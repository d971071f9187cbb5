"""The dashboard's breakdowns on ClickHouse: the functions of analysis.breakdowns and analysis.traces, pushed down.

Each reads a session table of request facts (analysis.clickhouse.materialize_requests) and a
ClickHouse condition `where` on its columns (see `condition`); only aggregates, or the few
rows asked for, come back. Percentiles are `quantileExactInclusive`, DuckDB's `quantile_cont`
to the last bit, so each function returns what its DuckDB namesake returns on the same requests.
A trace's waterfall pulls that trace's spans and runs analysis.traces.waterfall on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import duckdb
import polars as pl

from analysis import attribute_filters as AF
from analysis import breakdowns as B
from analysis import traces as T
from analysis.breakdowns import SUMMARY_METRICS
from analysis.capacity import Workload, observed_workload
from analysis.clickhouse import attributes as CA
from analysis.clickhouse.client import DEFAULT_TABLE, Client, literal
from analysis.clickhouse.promotion import source_sql
from analysis.clickhouse.quantiles import arrays_sql, kish_sql, quantile_sql
from analysis.clickhouse.report import Fetcher
from analysis.clickhouse.server import features
from analysis.engine.dialect import CLICKHOUSE
from analysis.engine.percentiles import QUANTILES, metric_column
from tracing import schema as S

#: Span columns a waterfall reads (the request model's inputs and what it lists); Events and Links stay behind.
WATERFALL_INPUTS: Final[tuple[str, ...]] = tuple(c for c, _, _ in S.SPAN_COLUMNS if c not in ("Events", "Links"))


def condition(since_ns: int | None = None, until_ns: int | None = None,
              values: dict[str, Sequence[str]] | None = None) -> str:
    """A condition on the request columns: start_ns in [since, until) and each column in its values (never empty)."""
    parts = ["TRUE"]
    if since_ns is not None:
        parts.append(f"start_ns >= {int(since_ns)}")
    if until_ns is not None:
        parts.append(f"start_ns < {int(until_ns)}")
    for col, vals in (values or {}).items():
        if vals:
            parts.append(f"{col} IN ({', '.join(literal(v) for v in vals)})")
    return " AND ".join(parts)


def attribute_condition(filters: Sequence[AF.AttributeFilter], facts: str, table: str = DEFAULT_TABLE) -> str:
    """analysis.attribute_filters.where_all on ClickHouse: the requests of `facts` meeting every attribute filter,
    their values read from the spans of `table` by the report's rule (never empty)."""
    return AF.where_all(filters, "", CLICKHOUSE, facts, source_sql(table))[0]


def attribute_choices(client: Client, facts: str, table: str = DEFAULT_TABLE) -> dict[str, dict[str, Any]]:
    """analysis.attribute_filters.attribute_choices on ClickHouse: the attributes the report considers over every
    request of `facts` (analysis.clickhouse.attributes, the report's pass; its session tables are dropped)."""
    from analysis.report import attribute_rules  # the report's settings

    try:
        found = CA.read_attributes(client, table, facts, "TRUE", None, None, attribute_rules())
    finally:
        CA.drop(client)
    return AF.choices_of(found.attrs)


def by_attribute(client: Client, facts: str, key: str, choice: dict[str, Any], metric: str = "e2e",
                 where: str = "TRUE", table: str = DEFAULT_TABLE) -> pl.DataFrame:
    """analysis.attribute_filters.by_attribute on ClickHouse: per value of attribute `key` (`choice`: its entry of
    `attribute_choices`; '(none)' where a request has none) the columns and outlier rule of `replicas`."""
    rel = AF.value_relation(facts, key, choice, where=where, d=CLICKHOUSE, requests=facts, spans=source_sql(table))
    return replicas(client, rel, metric, "TRUE").rename({"replica": "value"})


def _rows(client: Client, sql: str) -> list[dict[str, object]]:
    return client.query(sql).to_pylist()


def summary(client: Client, facts: str, where: str = "TRUE") -> dict[str, float | int | None]:
    """analysis.breakdowns.summary on the server: counts per outcome (stored and weighted), p50 / p90 / p99 (ms)
    of e2e, TTFT, TPOT and their effective counts; on a sampled table weighted (clickhouse.wq_sql over each metric's
    sorted (value, weight) pairs, Kish's effective count), one row back either way."""
    qs = [(name, q) for name, q in QUANTILES if name in ("p50", "p90", "p99")]
    sampled = _sampled(client, facts, where)
    w = "adjusted_count" if sampled else None
    outcomes = ", ".join(f"countIf(status = {literal(o)}) AS {o}" for o in S.OUTCOMES)
    if w is None:
        pcts = ", ".join(
            f"quantileExactInclusiveOrNull({q})(toFloat64({metric_column(m)})) / 1e6 AS {m}_{name}_ms"
            for m in SUMMARY_METRICS for name, q in qs)
        sql = (f"SELECT count() AS requests, {outcomes}, {_weighted_sql(None)}, "
               + ", ".join(f"count({metric_column(m)}) AS {m}_n_effective" for m in SUMMARY_METRICS)
               + f", {pcts} FROM {facts} WHERE {where}")
    else:  # the arrays stay in the inner query: one row of figures comes back
        figures = ", ".join(f"{quantile_sql(w, q, f'_{m}_')} / 1e6 AS {m}_{name}_ms"
                            for m in SUMMARY_METRICS for name, q in qs)
        inner = ", ".join(f"{kish_sql(w, f'{metric_column(m)} IS NOT NULL')} AS {m}_n_effective, "
                          f"{arrays_sql(metric_column(m), w, 'TRUE', f'_{m}_')}" for m in SUMMARY_METRICS)
        kept = ", ".join(["requests", *S.OUTCOMES, "requests_weighted", *(f"{o}_weighted" for o in S.OUTCOMES),
                          *(f"{m}_n_effective" for m in SUMMARY_METRICS)])
        sql = (f"SELECT {kept}, {figures} FROM (SELECT count() AS requests, {outcomes}, {_weighted_sql(w)}, {inner} "
               f"FROM {facts} WHERE {where})")
    row = _rows(client, sql)[0]
    out = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
    return out  # type: ignore[return-value]


def _weighted_sql(weight: str | None) -> str:
    """breakdowns' requests_weighted and <outcome>_weighted: the sums of `weight` (the counts when None)."""
    if weight is None:
        return "count() AS requests_weighted, " + ", ".join(
            f"countIf(status = {literal(o)}) AS {o}_weighted" for o in S.OUTCOMES)
    w = f"toFloat64({weight})"
    return f"sum({w}) AS requests_weighted, " + ", ".join(
        f"sumIf({w}, status = {literal(o)}) AS {o}_weighted" for o in S.OUTCOMES)


def _sampled(client: Client, facts: str, where: str) -> bool:
    """Whether some request where `where` holds stands for other than itself (adjusted_count != 1)."""
    return bool(_rows(client, f"SELECT countIf(adjusted_count != 1) AS n FROM {facts} WHERE {where}")[0]["n"])


#: The adjusted count as analysis.capacity reads it.
WEIGHT: Final = "toFloat64(adjusted_count) AS adjusted_count"


def _on_duckdb(client: Client, facts: str, where: str, columns: Sequence[str], name: str = "t",
               con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection (`con`, else a new one) whose table `name` holds `columns` of `facts` where `where` holds.

    The one path that needs rows: the queue replay (every arrival of the selected range).
    """
    con = con if con is not None else duckdb.connect(":memory:")
    con.register("t_arrow", client.query(f"SELECT {', '.join(columns)} FROM {facts} WHERE {where}"))
    con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM t_arrow')
    con.unregister("t_arrow")
    return con


def workload(client: Client, facts: str, table: str, where: str = "TRUE", since_ns: int | None = None,
             until_ns: int | None = None) -> Workload:
    """analysis.capacity.observed_workload of the requests where `where` holds, on a ClickHouse table.

    A queue replay reads every arrival, so the selected requests' start, e2e, queue wait, TTFT,
    replica and adjusted count come back, with the durations of the model_load spans in
    [since, until) (the cold start): memory grows with the selected range, not the table.
    """
    con = _on_duckdb(client, facts, where, ["start_ns", "e2e_ns", "start_ns + e2e_ns AS end_ns", "queue_wait_ns",
                                            "ttft_ns", "replica", WEIGHT], name="requests")
    try:
        span_where = " AND ".join(
            [f"Timestamp {op} fromUnixTimestamp64Nano(toInt64({int(t)}))"
             for op, t in ((">=", since_ns), ("<", until_ns)) if t is not None])
        con.register("spans_arrow", client.query(
            f"SELECT Stage, Duration, TimestampNs FROM {source_sql(table, span_where)} "
            f"WHERE Stage = '{S.MODEL_LOAD}'"))  # what observed_workload reads of the spans: the cold start
        con.execute("CREATE TABLE spans AS SELECT * FROM spans_arrow")
        con.unregister("spans_arrow")
        return observed_workload(con, since_ns, until_ns)
    finally:
        con.close()


def _counts_sql(col: str, weight: str | None) -> str:
    """breakdowns' count columns: requests, per outcome, the same weighted (`_weighted_sql`), n_effective (Kish's
    over the values of `col`; their count when unweighted)."""
    per = ", ".join(f"countIf(status = {literal(o)}) AS {o}" for o in S.OUTCOMES)
    eff = f"count({col})" if weight is None else kish_sql(weight, f"{col} IS NOT NULL")
    return f"count() AS requests, {per}, {_weighted_sql(weight)}, {eff} AS n_effective"


def _quantiles_ms(col: str, weight: str | None) -> tuple[str, str]:
    """p50_ms and p99_ms of `col` as (the outer query's columns, the inner grouped query's aggregates):
    quantileExactInclusive (DuckDB's quantile_cont) unweighted; weighted, clickhouse.wq_sql over `arrays_sql`'s
    aggregates, which stay in the inner query (only the figures come back)."""
    if weight is None:
        return "p50_ms, p99_ms", ", ".join(f"quantileExactInclusiveOrNull({q})(toFloat64({col})) / 1e6 AS {n}_ms"
                                           for n, q in (("p50", 0.5), ("p99", 0.99)))
    # nan (no value) becomes null, as breakdowns' min over no row
    return (", ".join(f"if(length(s) = 0, NULL, {quantile_sql(weight, q)} / 1e6) AS {n}_ms"
                      for n, q in (("p50", 0.5), ("p99", 0.99))), arrays_sql(col, weight, "TRUE"))


def _weighting(client: Client, facts: str, where: str) -> str | None:
    """`adjusted_count` when some request where `where` holds weighs other than 1, else None (unweighted)."""
    return "adjusted_count" if _sampled(client, facts, where) else None


def replicas(client: Client, facts: str, metric: str = "e2e", where: str = "TRUE") -> pl.DataFrame:
    """analysis.breakdowns.replicas on ClickHouse: per replica counts, p50 / p99 (ms) and the outlier flag.

    On the server, weighted on a sampled table (weighted counts, Kish, weighted quantiles): one row per replica.
    """
    col = metric_column(metric)
    weight = _weighting(client, facts, where)
    pcts, arrays = _quantiles_ms(col, weight)
    names = ", ".join(["replica", "requests", *S.OUTCOMES, "requests_weighted", *(f"{o}_weighted" for o in S.OUTCOMES),
                       "n_effective"])
    df = pl.from_arrow(client.query(
        f"SELECT {names}, {pcts} FROM (SELECT coalesce(replica, '(none)') AS replica, {_counts_sql(col, weight)}, "
        f"{arrays} FROM {facts} WHERE {where} GROUP BY replica) ORDER BY replica",
        features(client).settings))
    assert isinstance(df, pl.DataFrame)
    return B.mark_outliers(df)


def _bucket_bounds_sql(col: str) -> tuple[str, str]:
    """ClickHouse SQL of the power-of-two bucket (lo, hi) of a token count (explain.bucket_bounds), settled in
    integers: exp2 of a whole float is exact, and log2 one off next to a power of two is corrected. Every
    branch is safe to evaluate (multiIf evaluates them all)."""
    g = f"toInt64(exp2(floor(log2(toFloat64(greatest({col}, 1))))))"
    lo = f"multiIf({col} <= 0, 0, {g} > {col}, intDiv({g}, 2), {g} * 2 <= {col}, {g} * 2, {g})"
    return lo, f"if({col} <= 0, 0, 2 * ({lo}) - 1)"


def shape(client: Client, facts: str, metric: str = "e2e", by: Sequence[str] = B.TOKEN_COLUMNS,
          where: str = "TRUE") -> pl.DataFrame:
    """analysis.breakdowns.shape on ClickHouse: requests and p50 / p99 (ms) per token bucket of each column in `by`.

    On the server, weighted on a sampled table (summed weights, Kish, weighted quantiles): one row per bucket.
    """
    B.check_token_columns(by)
    col = metric_column(metric)
    rows = " AND ".join([f"({where})", *(f"{c} IS NOT NULL" for c in by), f"{col} IS NOT NULL"])
    weight = _weighting(client, facts, rows)
    pcts, arrays = _quantiles_ms(col, weight)
    keys, names = [], []
    for c in by:
        lo, hi = _bucket_bounds_sql(c)
        keys += [f"{lo} AS {c}_lo", f"{hi} AS {c}_hi"]
        names += [f"{c}_lo", f"{c}_hi"]
    tail = "" if weight is None else (f", sum(toFloat64({weight})) AS requests_weighted, "
                                      f"{kish_sql(weight, f'{col} IS NOT NULL')} AS n_effective")
    outer = "" if weight is None else ", requests_weighted, n_effective"
    df = pl.from_arrow(client.query(
        f"SELECT {', '.join(names)}, requests, {pcts}{outer} FROM (SELECT {', '.join(keys)}, count() AS requests"
        f"{tail}, {arrays} FROM {facts} WHERE {rows} "
        f"GROUP BY {', '.join(names)}) ORDER BY {', '.join(names)}", features(client).settings))
    assert isinstance(df, pl.DataFrame)
    if weight is None:
        df = df.with_columns(pl.col("requests").alias("requests_weighted"),
                             pl.col("requests").cast(pl.Float64).alias("n_effective"))
    return B.label_shape(df, by)


def time_bounds(client: Client, facts: str) -> tuple[int | None, int | None, int]:
    """analysis.breakdowns.time_bounds: (first start_ns, last start_ns, requests); (None, None, 0) when empty."""
    row = _rows(client, f"SELECT min(start_ns) AS a, max(start_ns) AS b, count() AS n FROM {facts}")[0]
    n = int(row["n"])  # type: ignore[call-overload]
    return (None, None, 0) if not n else (int(row["a"]), int(row["b"]), n)  # type: ignore[call-overload]


def dimension_values(client: Client, facts: str, dims: Sequence[str]) -> dict[str, list[str]]:
    """analysis.breakdowns.dimension_values: the distinct non-null values of each column, sorted."""
    return {d: [str(r[d]) for r in _rows(client, f"SELECT DISTINCT {d} FROM {facts} WHERE {d} IS NOT NULL "
                                                 f"ORDER BY {d}")] for d in dims}


def slowest(client: Client, facts: str, metric: str = "e2e", limit: int = 50, where: str = "TRUE") -> pl.DataFrame:
    """analysis.traces.slowest on the server: the `limit` slowest requests, slowest first, the same columns."""
    col = metric_column(metric)
    stages = ", ".join(f"{s}_ns / 1e6 AS {s}_ms" for s in S.CRITICAL_PATH_COLUMNS)
    out = pl.from_arrow(client.query(
        f"SELECT {', '.join(T.EXEMPLAR_COLUMNS)}, {col} / 1e6 AS latency_ms, {stages} FROM {facts} "
        f"WHERE ({where}) AND {col} IS NOT NULL ORDER BY {col} DESC, trace_id LIMIT {int(limit)}"))
    assert isinstance(out, pl.DataFrame)
    return out


def find_requests(client: Client, facts: str, trace_id: str, limit: int = 20) -> pl.DataFrame:
    """analysis.traces.find_requests on the server: a full trace id, or a prefix of 8+ hex digits."""
    tid = trace_id.strip().lower()
    if len(tid) >= 32:
        cond = f"trace_id = {literal(tid)}"
    elif len(tid) < 8:
        cond = "FALSE"
    else:
        cond = f"startsWith(trace_id, {literal(tid)})"
    out = pl.from_arrow(client.query(f"SELECT * FROM {facts} WHERE {cond} ORDER BY start_ns LIMIT {int(limit)}"))
    assert isinstance(out, pl.DataFrame)
    return out


def waterfall(client: Client, trace_id: str, since_ns: int, until_ns: int, table: str = DEFAULT_TABLE) -> pl.DataFrame:
    """analysis.traces.waterfall of one trace: its spans starting in [since, until) come back, the rule runs here."""
    local = duckdb.connect(":memory:")
    try:
        Fetcher(client, table, local, inputs=WATERFALL_INPUTS).traces([trace_id], since_ns, until_ns)
        return T.waterfall(local, trace_id)
    finally:
        local.close()
