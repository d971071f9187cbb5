"""Breakdowns of a set of requests: overall percentiles, per replica (with outliers), per request shape,
peak concurrency, and the values of each dimension.

Every function reads `source` (the `requests` view by default, or any table / view with its
columns, such as a filtered copy) and takes an optional SQL condition `where` with its
`params`. Percentiles follow the one convention of analysis.engine.percentiles (`quantile_cont`);
with sampled traces (some `adjusted_count` other than 1 among the rows) they are its weighted
quantiles and the `*_weighted` counts say how many requests the stored ones stand for; where
every weight is 1 the unweighted SQL runs, so nothing changes. Token buckets are the report's
(analysis.stats.explain.bucket_bounds: [2^k, 2^(k+1) - 1], and 0 alone), labelled the same way (`1024-2047`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import duckdb
import polars as pl

from analysis.engine.percentiles import (
    MIN_TAIL,
    QUANTILES,
    metric_column,
    quote_ident,
    weight_where,
    weighted_quantiles_sql,
    weighted_window_sql,
)
from analysis.stats.explain import bucket_hi_sql, bucket_lo_sql, enough_for_tail
from tracing import schema as S

#: A replica is an outlier when its p99 is more than OUTLIER_MADS robust deviations
#: (MAD_SCALE x the median absolute deviation of the replicas' p99s) above their median ...
OUTLIER_MADS: Final = 3.0
MAD_SCALE: Final = 1.4826
#: ... and at least OUTLIER_RISE above that median.
OUTLIER_RISE: Final = 0.2
#: Effective requests from which a p99 has MIN_TAIL requests beyond it (fewer: `p99_low_sample`).
SOLID_P99_REQUESTS: Final = MIN_TAIL * 100
#: Metrics summarised by `summary`.
SUMMARY_METRICS: Final[tuple[str, ...]] = ("e2e", "ttft", "tpot")
#: Token columns `shape` buckets.
TOKEN_COLUMNS: Final[tuple[str, ...]] = ("input_tokens", "output_tokens")


def _outcomes() -> str:
    return ", ".join(f"count(*) FILTER (WHERE status = '{o}') AS {o}" for o in S.OUTCOMES)


def _weighted_counts(weight: str | None) -> str:
    """requests_weighted and <outcome>_weighted: what the rows stand for (the counts themselves when unweighted)."""
    if weight is None:
        return "count(*) AS requests_weighted, " + ", ".join(
            f"count(*) FILTER (WHERE status = '{o}') AS {o}_weighted" for o in S.OUTCOMES)
    w = quote_ident(weight)
    return f"sum({w}) AS requests_weighted, " + ", ".join(
        f"coalesce(sum({w}) FILTER (WHERE status = '{o}'), 0) AS {o}_weighted" for o in S.OUTCOMES)


def _n_effective(weight: str | None, col: str) -> str:
    """Kish's effective count of the non-null values of `col` (their count when unweighted)."""
    if weight is None:
        return f"count({col})"
    w = quote_ident(weight)
    return (f"coalesce(sum({w}) FILTER (WHERE {col} IS NOT NULL) ^ 2 "
            f"/ sum({w} * {w}) FILTER (WHERE {col} IS NOT NULL), 0)")


def summary(con: duckdb.DuckDBPyConnection, source: str = "requests", where: str = "true",
            params: Sequence[object] = ()) -> dict[str, float | int | None]:
    """Counts per outcome and the overall p50 / p90 / p99 (ms) of e2e, TTFT and TPOT.

    Keys: requests, one per outcome (ok, error, timeout, cancelled), the same weighted
    (requests_weighted, ok_weighted ..: what they stand for under sampling, equal to the counts
    otherwise), <metric>_p50_ms, <metric>_p90_ms, <metric>_p99_ms for e2e, ttft, tpot (None when
    no request has a value; weighted when sampled) and <metric>_n_effective (Kish).
    """
    qs = [(name, q) for name, q in QUANTILES if name in ("p50", "p90", "p99")]
    weight = weight_where(con, source, where, params)
    effective = ", ".join(f"{_n_effective(weight, quote_ident(metric_column(m)))} AS {m}_n_effective"
                          for m in SUMMARY_METRICS)
    if weight is None:  # a metric's quantiles from one state (a list of q), not one collection of its values per q
        listed = ", ".join(repr(q) for _, q in qs)
        pcts = ", ".join(f"quantile_cont({quote_ident(metric_column(m))}, [{listed}]) AS {m}_q"
                         for m in SUMMARY_METRICS)
    else:
        pcts = ", ".join(f"(SELECT {weighted_quantiles_sql(quote_ident(metric_column(m)), [q for _, q in qs])} "
                         f"FROM (SELECT *, {weighted_window_sql(quote_ident(metric_column(m)), weight, '')} "
                         f"FROM {source} WHERE {where})) AS {m}_q" for m in SUMMARY_METRICS)
    sql = f"SELECT count(*) AS requests, {_outcomes()}, {_weighted_counts(weight)}, {effective}, {pcts} " \
          f"FROM {source} WHERE {where}"
    n_where = 1 + (len(SUMMARY_METRICS) if weight is not None else 0)
    rel = con.execute(sql, list(params) * n_where)
    names = [d[0] for d in rel.description or []]
    rows = rel.fetchall()
    row = rows[0] if rows else ()
    out: dict[str, float | int | None] = {}
    for k, v in zip(names, row, strict=True):
        if k.endswith("_q"):
            for (name, _), x in zip(qs, v or [None] * len(qs), strict=True):
                out[f"{k[:-2]}_{name}_ms"] = None if x is None else x / 1e6
        else:
            out[k] = None if isinstance(v, float) and v != v else v
    return out


def replicas(con: duckdb.DuckDBPyConnection, metric: str = "e2e", source: str = "requests", where: str = "true",
             params: Sequence[object] = ()) -> pl.DataFrame:
    """Per replica ('(none)' when unknown): requests, counts per outcome, the same weighted (`*_weighted`),
    n_effective, p50_ms, p99_ms (weighted when sampled), `judged` and `outlier`.

    Judged: at least 100 effective requests (`mark_outliers`). Outlier: a judged replica whose p99 is more than
    OUTLIER_MADS x (MAD_SCALE x MAD of the judged replicas' p99s) above their median and at least OUTLIER_RISE
    above it. p99_low_sample: fewer than MIN_TAIL effective requests beyond the p99 (under 500 requests), as in
    `shape` and percentile_series: a judged replica's p99 that rests on 1-4 requests.
    """
    col = quote_ident(metric_column(metric))
    weight = weight_where(con, source, where, params)
    rep = "coalesce(replica, '(none)')"
    counts = (f"count(*) AS requests, {_outcomes()}, {_weighted_counts(weight)}, "
              f"{_n_effective(weight, col)} AS n_effective")
    if weight is None:
        sql = f"""
        SELECT {rep} AS replica, {counts},
               quantile_cont({col}, 0.5) / 1e6 AS p50_ms, quantile_cont({col}, 0.99) / 1e6 AS p99_ms
        FROM {source} WHERE {where} GROUP BY 1 ORDER BY 1"""
    else:
        sql = f"""
        SELECT {rep} AS replica, {counts},
               {weighted_quantiles_sql(col, [0.5])}[1] / 1e6 AS p50_ms,
               {weighted_quantiles_sql(col, [0.99])}[1] / 1e6 AS p99_ms
        FROM (SELECT *, {weighted_window_sql(col, weight, rep)} FROM {source} WHERE {where}) GROUP BY 1 ORDER BY 1"""
    return mark_outliers(con.sql(sql, params=list(params)).pl())


def mark_outliers(df: pl.DataFrame) -> pl.DataFrame:
    """The `judged` and `outlier` columns of `replicas` (the rule in its docstring), from each replica's p99_ms and
    n_effective.

    Judged: enough effective requests for a p99 with a tail (analysis.stats.explain.enough_for_tail, the minimum the
    report's counterfactual asks: 100); a smaller replica's p99 is close to its slowest request, so it is neither
    an outlier nor part of the fleet's median and deviation. Also `p99_low_sample` (`low_sample_p99`): judged or
    not, a p99 with fewer than MIN_TAIL requests beyond it, which a page says beside a flag. Public so every engine's
    per-replica breakdown (analysis.clickhouse.breakdowns) flags by this one rule.
    """
    judged = df.with_columns(pl.Series("judged", [enough_for_tail(float(n or 0)) for n in df.get_column("n_effective")],
                                       dtype=pl.Boolean), low_sample_p99())
    p99 = judged.filter(pl.col("judged") & pl.col("p99_ms").is_not_null()).get_column("p99_ms")
    if p99.is_empty():
        return judged.with_columns(pl.lit(False).alias("outlier"))
    med = float(p99.median() or 0.0)  # type: ignore[arg-type]
    mad = float((p99 - med).abs().median() or 0.0) * MAD_SCALE  # type: ignore[arg-type]
    return judged.with_columns((pl.col("judged") & (pl.col("p99_ms") > med + OUTLIER_MADS * max(mad, 1e-9))
                                & (pl.col("p99_ms") > (1 + OUTLIER_RISE) * med)).fill_null(False).alias("outlier"))


def shape(con: duckdb.DuckDBPyConnection, metric: str = "e2e", by: Sequence[str] = TOKEN_COLUMNS,
          source: str = "requests", where: str = "true", params: Sequence[object] = ()) -> pl.DataFrame:
    """Requests, p50_ms and p99_ms per token bucket of each column in `by` (input_tokens, output_tokens).

    Columns per bucketed column C: C_lo, C_hi (the report's bucket bounds) and C_bucket (its
    label, `lo-hi`); then requests, p50_ms, p99_ms (weighted when sampled), requests_weighted,
    n_effective (Kish), and p99_low_sample (fewer than MIN_TAIL effective requests beyond the p99,
    as in percentile_series). Requests without a value in C are left out.
    """
    check_token_columns(by)
    col = quote_ident(metric_column(metric))
    keys = []
    for c in by:
        keys += [f"({bucket_lo_sql(c)})::BIGINT AS {c}_lo", f"({bucket_hi_sql(c)})::BIGINT AS {c}_hi"]
    present = " AND ".join(f"{c} IS NOT NULL" for c in by) or "true"
    rows = f"({where}) AND {present} AND {col} IS NOT NULL"
    weight = weight_where(con, source, rows, params)
    if weight is None:
        df = con.sql(f"""
            SELECT {', '.join(keys)}, count(*) AS requests,
                   quantile_cont({col}, 0.5) / 1e6 AS p50_ms, quantile_cont({col}, 0.99) / 1e6 AS p99_ms
            FROM {source} WHERE {rows}
            GROUP BY ALL ORDER BY ALL""", params=list(params)).pl()
        df = df.with_columns(pl.col("requests").alias("requests_weighted"),
                             pl.col("requests").cast(pl.Float64).alias("n_effective"))
    else:
        w = quote_ident(weight)
        names = ", ".join(f"{c}_lo, {c}_hi" for c in by)
        df = con.sql(f"""
            SELECT {names}, count(*) AS requests,
                   {weighted_quantiles_sql(col, [0.5])}[1] / 1e6 AS p50_ms,
                   {weighted_quantiles_sql(col, [0.99])}[1] / 1e6 AS p99_ms,
                   sum({w}) AS requests_weighted, {_n_effective(weight, col)} AS n_effective
            FROM (SELECT *, {weighted_window_sql(col, weight, names)}
                  FROM (SELECT *, {', '.join(keys)} FROM {source} WHERE {rows}))
            GROUP BY ALL ORDER BY ALL""", params=list(params)).pl()
        df = df.select(*(c for c in df.columns if c not in ("requests_weighted", "n_effective")),
                       "requests_weighted", "n_effective")
    return label_shape(df, by)


def check_token_columns(by: Sequence[str]) -> None:
    """`shape`'s `by`: at least one column, each a token column (ValueError naming the bad one)."""
    if not by:
        raise ValueError("shape needs at least one token column")
    for c in by:
        if c not in TOKEN_COLUMNS:
            raise ValueError(f"cannot bucket {c!r}; use one of {', '.join(TOKEN_COLUMNS)}")


def label_shape(df: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """`shape`'s last columns: each bucket's label and p99_low_sample, from its C_lo / C_hi and n_effective.

    Public so every engine's shape breakdown (analysis.clickhouse.breakdowns) labels and flags by this one rule.
    """
    return df.with_columns([(pl.col(f"{c}_lo").cast(pl.String) + "-" + pl.col(f"{c}_hi").cast(pl.String))
                            .alias(f"{c}_bucket") for c in by]
                           + [low_sample_p99()])


def low_sample_p99() -> pl.Expr:
    """`p99_low_sample` from a frame's `n_effective`: fewer than MIN_TAIL effective requests beyond the p99 (the
    low-sample rule of analysis.engine.percentiles), so the p99 rests on its few slowest requests."""
    return (pl.col("n_effective").fill_null(0) * (1 - 0.99) < MIN_TAIL).alias("p99_low_sample")


def peak_concurrency(con: duckdb.DuckDBPyConnection, source: str = "requests", where: str = "true",
                     params: Sequence[object] = ()) -> int:
    """Most requests one replica was seen serving at once (from the end of their queue wait): its slots.

    At least 1. A request ending at the instant another starts is not counted twice.
    """
    rows = con.execute(f"""
        WITH ev AS (
            SELECT replica, start_ns + coalesce(queue_wait_ns, 0) AS t, 1 AS d FROM {source} WHERE {where}
            UNION ALL SELECT replica, end_ns AS t, -1 AS d FROM {source} WHERE {where})
        SELECT max(n) FROM (SELECT sum(d) OVER (PARTITION BY replica ORDER BY t, d
                                                ROWS UNBOUNDED PRECEDING) AS n FROM ev)""",
                      [*params, *params]).fetchall()
    return max(1, int(rows[0][0])) if rows and rows[0][0] is not None else 1


def dimension_values(con: duckdb.DuckDBPyConnection, dims: Sequence[str], source: str = "requests"
                     ) -> dict[str, list[str]]:
    """The distinct non-null values of each dimension column, sorted."""
    out: dict[str, list[str]] = {}
    for d in dims:
        rows = con.execute(f"SELECT DISTINCT {quote_ident(d)} FROM {source} WHERE {quote_ident(d)} IS NOT NULL "
                           "ORDER BY 1").fetchall()
        out[d] = [r[0] for r in rows]
    return out


def time_bounds(con: duckdb.DuckDBPyConnection, source: str = "requests") -> tuple[int | None, int | None, int]:
    """(first start_ns, last start_ns, requests) of `source`; (None, None, 0) when empty."""
    rows = con.execute(f"SELECT min(start_ns), max(start_ns), count(*) FROM {source}").fetchall()
    row = rows[0]
    return (None, None, 0) if not row[2] else (int(row[0]), int(row[1]), int(row[2]))
