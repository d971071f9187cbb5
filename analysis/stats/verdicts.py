"""What a view may claim about a set of requests: whether spike detection could judge it at all, how a
window stands against its baseline, and which other dimension's value explains an outlier replica.

A dashboard that shows "no spike" when the detector never ran, a "cause" for a window whose p99 is
below its baseline, or an outlier replica that one tenant's requests make slow, says something
false. These rules say what is true; views call them instead of deciding themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import duckdb
import polars as pl

from analysis.breakdowns import mark_outliers, replicas
from analysis.engine.percentiles import (
    MIN_TAIL,
    NICE_WINDOWS_S,
    auto_window_s,
    metric_column,
    quote_ident,
    weight_where,
)
from analysis.stats.spikes import MIN_BASELINE_WINDOWS, MIN_RISE

#: Requests a window needs for its p99 to be judged by the detector (MIN_TAIL beyond the p99).
JUDGED_WINDOW_REQUESTS: Final = round(MIN_TAIL / (1 - 0.99))
#: Requests a window must hold on average for nearly every window to reach JUDGED_WINDOW_REQUESTS under steady
#: traffic: three Poisson standard deviations above it (a window of steady arrivals falls short with p < 0.2%).
MEAN_WINDOW_REQUESTS: Final = JUDGED_WINDOW_REQUESTS + math.ceil(3 * math.sqrt(JUDGED_WINDOW_REQUESTS))
#: Judged windows the detector needs: a baseline of MIN_BASELINE_WINDOWS and one more.
MIN_JUDGED_WINDOWS: Final = MIN_BASELINE_WINDOWS + 1
#: Fewest requests in a range that detection can ever judge.
MIN_JUDGED_REQUESTS: Final = MEAN_WINDOW_REQUESTS * MIN_JUDGED_WINDOWS
#: The start of every report error that says the detection did not run (analysis.report writes it).
NOT_COMPUTED: Final = "could not compute spikes because "
#: Dimensions whose values may explain an outlier replica (the replica's own requests of one value).
OUTLIER_DIMENSIONS: Final[tuple[str, ...]] = ("tenant", "model", "model_version", "service")
#: Most values of a dimension tried per outlier explanation (the most frequent on the outlier replicas).
OUTLIER_VALUES: Final = 8


def detection_window_s(requests: int, span_s: float) -> int | None:
    """The window (s) at which spike detection can judge `requests` spread over `span_s`, or None when none can.

    The report's own window (analysis.engine.percentiles.auto_window_s) when its windows hold on average the
    MEAN_WINDOW_REQUESTS that make nearly every one judged; else the smallest of the report's window sizes
    whose windows do while at least MIN_JUDGED_WINDOWS of them fit in the range. A filter that keeps few
    requests then gets
    wider windows instead of a detector that silently never ran.
    """
    if requests <= 0 or span_s <= 0:
        return None
    chosen = auto_window_s(requests, span_s)
    if requests * chosen / span_s >= MEAN_WINDOW_REQUESTS:
        return chosen
    for w in NICE_WINDOWS_S:
        if w > chosen and requests * w / span_s >= MEAN_WINDOW_REQUESTS:
            return w if span_s / w >= MIN_JUDGED_WINDOWS else None
    return None


def not_judged(report: dict[str, Any]) -> str | None:
    """Why the report's spike detection could not judge its range (the report's own reason), or None if it did.

    A report whose detection did not run has no spikes and says so in an error; "no spike" must then
    never be read as "all clear".
    """
    for error in report.get("errors", []):
        if str(error).startswith(NOT_COMPUTED):
            return str(error).removeprefix(NOT_COMPUTED)
    return None


def against_baseline(item: Mapping[str, Any]) -> str:
    """How an explained window (a report spike item, or analysis.report.explain_window's) stands against its
    baseline: `above` (p99 at least MIN_RISE over the baseline p99: something to explain), `slightly above`
    (over it, by less than a spike needs), `at or below` (no excess: nothing to explain) or `unknown`."""
    p99, base = item.get("p99_ms"), item.get("baseline_p99_ms")
    if p99 is None or base is None:
        return "unknown"
    if p99 <= base:
        return "at or below"
    return "above" if p99 >= (1 + MIN_RISE) * base else "slightly above"


def explain_outliers(by_replica: pl.DataFrame, without: Callable[[str, Any], pl.DataFrame],
                     values: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """For each outlier replica of `by_replica` (analysis.breakdowns.replicas), the dimension value whose
    requests make it one: with that value's requests left out of every replica (`without(dimension, value)`
    gives the breakdown again), the replica is no outlier under the same rule (mark_outliers), with enough requests
    left to judge it.

    Returns one item per explained replica ({replica, dimension, value, p99_ms, p99_without_ms, requests,
    requests_without, fleet_median_p99_without_ms}); when several values clear it, the one leaving the lowest p99. An
    outlier
    no single value explains is not listed (it is the replica's own).
    """
    outliers = by_replica.filter(pl.col("outlier"))
    if outliers.is_empty():
        return []
    best: dict[str, dict[str, Any]] = {}
    for dim, vals in values.items():
        for value in vals:
            again = mark_outliers(without(dim, value).drop("outlier", "judged", strict=False))
            fleet = again.filter(pl.col("judged"))
            median = fleet.get_column("p99_ms").median() if fleet.height else None
            for row in outliers.iter_rows(named=True):
                hit = again.filter(pl.col("replica") == row["replica"])  # still judged: a p99 to clear
                if (hit.is_empty() or hit.get_column("outlier")[0] or not hit.get_column("judged")[0]
                        or hit.get_column("p99_ms")[0] is None):
                    continue
                p99_without = float(hit.get_column("p99_ms")[0])
                old = best.get(row["replica"])
                if old is None or p99_without < old["p99_without_ms"]:
                    best[row["replica"]] = {
                        "replica": row["replica"], "dimension": dim, "value": value, "p99_ms": row["p99_ms"],
                        "p99_without_ms": p99_without, "requests": row["requests"],
                        "requests_without": int(hit.get_column("requests")[0]),
                        "fleet_median_p99_without_ms": None if median is None else float(median)}  # type: ignore[arg-type]
    return [best[r] for r in outliers.get_column("replica").to_list() if r in best]


def outlier_explanations(con: duckdb.DuckDBPyConnection, metric: str = "e2e", source: str = "requests",
                         where: str = "true", params: Sequence[object] = (),
                         dims: Sequence[str] = OUTLIER_DIMENSIONS) -> list[dict[str, Any]]:
    """`explain_outliers` on DuckDB: the outlier replicas of `source` under `where` that one value of one of
    `dims` explains (the values tried: the OUTLIER_VALUES most frequent on the outlier replicas)."""
    by_replica = replicas(con, metric, source, where, params)
    outliers = by_replica.filter(pl.col("outlier")).get_column("replica").to_list()
    if not outliers:
        return []
    present = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    values: dict[str, list[Any]] = {}
    for dim in dims:
        if dim not in present:
            continue
        col = quote_ident(dim)
        rows = con.execute(
            f"SELECT {col}, count(*) AS n FROM {source} WHERE ({where}) AND coalesce(replica, '(none)') "
            f"IN (SELECT unnest(?)) AND {col} IS NOT NULL GROUP BY 1 ORDER BY n DESC, 1 LIMIT {OUTLIER_VALUES}",
            [*params, outliers]).fetchall()
        values[dim] = [v for v, _ in rows]

    if weight_where(con, source, where, params) is None:  # then no subset weighs either: one grouped query
        frames = replicas_without(con, metric, source, where, params, values)
        return explain_outliers(by_replica, lambda dim, value: frames[(dim, value)], values)

    def without(dim: str, value: Any) -> pl.DataFrame:
        col = quote_ident(dim)
        return replicas(con, metric, source, f"({where}) AND {col} IS DISTINCT FROM ?", [*params, value])

    return explain_outliers(by_replica, without, values)


def replicas_without(con: duckdb.DuckDBPyConnection, metric: str, source: str, where: str, params: Sequence[object],
                     values: dict[str, list[Any]]) -> dict[tuple[str, Any], pl.DataFrame]:
    """Per (dimension, value) of `values`: the columns explain_outliers reads of `replicas` (replica, requests,
    n_effective, p99_ms) with that value's requests left out, all in one grouped query (one scan of `source` per
    value, one aggregation) instead of one `replicas` query each. Unweighted quantiles only: for unsampled rows."""
    pairs = [(dim, value) for dim, vals in values.items() for value in vals]
    if not pairs:
        return {}
    col = quote_ident(metric_column(metric))
    kept = " UNION ALL ".join(
        f"SELECT {k} AS k, coalesce(replica, '(none)') AS replica, {col} AS v FROM {source} "
        f"WHERE ({where}) AND {quote_ident(dim)} IS DISTINCT FROM ?" for k, (dim, _) in enumerate(pairs))
    got = con.sql(f"SELECT k, replica, count(*) AS requests, count(v) AS n_effective, "
                  f"quantile_cont(v, 0.99) / 1e6 AS p99_ms "
                  f"FROM ({kept}) GROUP BY 1, 2 ORDER BY 1, 2",
                  params=[x for _, value in pairs for x in (*params, value)]).pl()
    empty = got.clear().drop("k")
    parts = {int(k[0]): part.drop("k") for k, part in got.partition_by("k", as_dict=True).items()}
    return {pair: parts.get(k, empty) for k, pair in enumerate(pairs)}


def range_window_s(first_ns: int | None, last_ns: int | None, requests: int, since_ns: int | None = None,
                   until_ns: int | None = None) -> int | None:
    """`detection_window_s` for the requests of [since_ns, until_ns) whose first and last start and count are
    given (analysis.breakdowns.time_bounds): the range is the one asked, else the one seen (as the report's)."""
    if not requests or first_ns is None or last_ns is None:
        return None
    lo = since_ns if since_ns is not None else first_ns
    hi = until_ns if until_ns is not None else last_ns + 1
    return detection_window_s(requests, max(hi - lo, 1) / 1e9)
