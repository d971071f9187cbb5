"""Percentile series: p50 / p90 / p99 / p99.9 per time window and per group, with counts beside them.

One convention everywhere: DuckDB `quantile_cont`, linear interpolation between the two
nearest order statistics (rank h = (n - 1) * q, as numpy's default `linear` method, Spark's
`percentile` and ClickHouse's `quantileExactInclusive`). Failures (error, timeout,
cancelled) are included by default, so a saturated service does not look fast because its
timeouts were dropped; `include_failures=False` keeps only `ok` requests. A figure is
flagged `low_sample` when fewer than `MIN_TAIL` requests lie beyond its quantile
(p99 of 40 requests is the largest value, not a percentile).

Sampled traces: each request weighs its `adjusted_count` (how many it stands for). The weighted
quantile keeps the convention: with whole weights it equals `quantile_cont` over the values each
repeated that many times (docs/methods.md#sampled-traces); where every weight is 1 the unweighted
path runs, so nothing changes. The low-sample rule then reads the effective count (Kish).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl

from analysis.engine import model as M
from analysis.engine.views import LIVE_FACTS_BETWEEN, LIVE_HOURS
from tracing import schema as S
from tracing.errors import QueryError

#: Quantiles of every series: (column prefix, q).
QUANTILES: Final[tuple[tuple[str, float], ...]] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))
#: A quantile q of n values is flagged low-sample when n * (1 - q) < MIN_TAIL.
MIN_TAIL: Final = 5
#: Metrics with a column in `requests`: end-to-end, TTFT, TPOT and each critical-path stage.
METRIC_COLUMNS: Final[dict[str, str]] = {
    "e2e": "e2e_ns",
    "ttft": "ttft_ns",
    "tpot": "tpot_ns",
    **{stage: f"{stage}_ns" for stage in S.CRITICAL_PATH_COLUMNS},
}
#: Columns a series may be grouped by.
GROUP_COLUMNS: Final[tuple[str, ...]] = ("replica", "service", "model", "model_version", "tenant", "status")
#: Window sizes the automatic choice picks from (seconds).
NICE_WINDOWS_S: Final[tuple[int, ...]] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
                                          21600, 43200, 86400)
#: The automatic window aims at this many requests per window (p99 then has 20 beyond it) ...
TARGET_PER_WINDOW: Final = 2000
#: ... and at most this many windows (a busy service gets longer windows, not hundreds of them) ...
MAX_WINDOWS: Final = 60
#: ... but keeps at least this many windows in the range.
MIN_WINDOWS: Final = 8
#: Name of the per-connection table of request facts (see `request_facts`).
REQUESTS_TABLE: Final = "_tailscope_request_facts"

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def in_range_sql(col: str, since: int | None, until: int | None) -> str:
    """SQL of `since <= col < until` in integer literals (an open end is left out): both engines' dialect."""
    parts = ["TRUE"]
    if since is not None:
        parts.append(f"{col} >= {int(since)}")
    if until is not None:
        parts.append(f"{col} < {int(until)}")
    return " AND ".join(parts)


def quote_ident(name: str) -> str:
    """A SQL identifier, double-quoted with embedded quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def metric_column(metric: str) -> str:
    """The `requests` column of a metric name (e2e, ttft, tpot or a stage); QueryError if unknown."""
    try:
        return METRIC_COLUMNS[metric]
    except KeyError:
        raise QueryError("", f"unknown metric {metric!r}; use one of {', '.join(METRIC_COLUMNS)}") from None


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration such as '5m', '30s', '1h', '250ms' or a plain number of seconds."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*", text)
        if not m:
            raise QueryError("", f"cannot read duration {text!r}; write e.g. 30s, 5m, 1h")
        value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if value <= 0:
        raise QueryError("", f"duration must be positive, got {text!r}")
    return value


def parse_time(value: str | int | float | datetime | None) -> int | None:
    """Integer ns since the epoch from an ISO-8601 time (naive = UTC), a datetime, or epoch s/ns."""
    if value is None:
        return None
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000
    if isinstance(value, (int, float)):
        return int(value) if abs(value) > 1e14 else int(value * 1_000_000_000)
    text = value.strip()
    if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):
        return parse_time(float(text) if "." in text else int(text))
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise QueryError("", f"cannot read time {value!r}; write e.g. 2025-11-20T14:30:00Z") from None
    return parse_time(dt)


def ms(ns: float | None) -> float | None:
    """Nanoseconds as the milliseconds a report shows: rounded to the microsecond, None when missing or infinite."""
    return round(ns / 1e6, 3) if ns is not None and math.isfinite(ns) else None


def iso(ns: int) -> str:
    """ISO-8601 UTC text of an epoch-ns instant, 'Z'-suffixed, with sub-second digits only when present."""
    sec, rem = divmod(int(ns), 1_000_000_000)
    dt = datetime.fromtimestamp(sec, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if rem:
        text += f".{rem // 1000:06d}".rstrip("0")
    return text + "Z"


def low_sample(n: int, q: float) -> bool:
    """True when fewer than MIN_TAIL of n values lie beyond quantile q."""
    return n * (1 - q) < MIN_TAIL


def weighted_quantile_sorted(values: npt.NDArray[np.float64], weights: npt.NDArray[np.float64] | None,
                             q: float) -> float:
    """The quantile q of sorted `values`, each standing for `weights` of them (None: 1 each); nan when empty.

    N = sum of weights, rank h = (N - 1) q, v(p) = the first value whose cumulative weight exceeds p;
    the answer is v(floor h) + (h - floor h) (v(floor h + 1) - v(floor h)), v past the end being the
    last value. With whole weights this is `quantile_cont` of the values repeated that many times; with
    every weight 1 (or None) it is computed as `quantile_cont` itself, bit for bit.
    """
    n = values.size
    if n == 0:
        return math.nan
    if weights is None or bool(np.all(weights == 1.0)):
        h = (n - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, n - 1)
        return float(values[lo] + (h - lo) * (values[hi] - values[lo]))
    cum = np.cumsum(weights, dtype=np.float64)
    h = (float(cum[-1]) - 1.0) * q
    lo = math.floor(h)
    i = min(int(np.searchsorted(cum, lo, side="right")), n - 1)
    j = min(int(np.searchsorted(cum, lo + 1, side="right")), n - 1)
    return float(values[i] + (h - lo) * (values[j] - values[i]))


def quantiles_unsorted(values: npt.NDArray[np.float64], qs: tuple[float, ...]) -> list[float]:
    """`quantile_cont` of unsorted `values` at each q, as weighted_quantile_sorted (unweighted) computes it: a
    partition puts in place only the order statistics it reads, not a sort. Reorders `values` in place."""
    n = values.size
    if n == 0:
        return [math.nan] * len(qs)
    values.partition(sorted({i for q in qs for lo in [math.floor((n - 1) * q)] for i in (lo, min(lo + 1, n - 1))}))
    return [weighted_quantile_sorted(values, None, q) for q in qs]


def effective_count(weights: npt.NDArray[np.float64] | None, n: int | None = None) -> float:
    """Kish's effective sample size (sum w)^2 / sum w^2: n when every weight is equal, less when they vary."""
    if weights is None:
        return float(n or 0)
    total = float(weights.sum())
    squares = float(np.square(weights).sum())
    return total * total / squares if squares > 0 else 0.0


def weighted_quantiles_sql(value: str, qs: Sequence[float], keep: str = "TRUE") -> str:
    """One aggregate (a list, one item per q) of the weighted quantiles of `value` per GROUP BY group.

    Needs the window columns of `weighted_window_sql` (cum, tot) on the rows; the rule of
    `weighted_quantile_sorted`. `keep` narrows the rows counted (the window's FILTER must match).
    """
    items = []
    for q in qs:
        lo = f"floor((tot - 1) * {q!r})"
        a = f"min({value}) FILTER (WHERE {keep} AND {value} IS NOT NULL AND cum > {lo})"
        b = f"coalesce(min({value}) FILTER (WHERE {keep} AND {value} IS NOT NULL AND cum > {lo} + 1), " \
            f"max({value}) FILTER (WHERE {keep} AND {value} IS NOT NULL))"
        h = f"max((tot - 1) * {q!r}) FILTER (WHERE {keep} AND {value} IS NOT NULL)"
        items.append(f"({a} + ({h} - floor({h})) * ({b} - {a}))")
    return "[" + ", ".join(items) + "]"


def weighted_window_sql(value: str, weight: str, partition: str, keep: str = "TRUE") -> str:
    """Window columns `cum` (cumulative weight in value order) and `tot` (the group's weight) over kept rows."""
    cond = f"{keep} AND {value} IS NOT NULL"
    over = f"PARTITION BY {partition}" if partition else ""
    return (f"sum({weight}) FILTER (WHERE {cond}) OVER ({over} ORDER BY {value} "
            f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum, "
            f"sum({weight}) FILTER (WHERE {cond}) OVER ({over}) AS tot")


def weight_column(con: duckdb.DuckDBPyConnection, source: str, since: int | None = None,
                  until: int | None = None) -> str | None:
    """`adjusted_count` when `source` has it and some request in [since, until) weighs other than 1, else None
    (the unweighted path: unsampled data give exactly what they gave before weights existed)."""
    return weight_where(con, source, "($1 IS NULL OR start_ns >= $1) AND ($2 IS NULL OR start_ns < $2)",
                        [since, until])


#: Whether any row weighs other than 1: the one rule that turns the weighted path on.
ANY_WEIGHTED_SQL: Final = "bool_or(adjusted_count <> 1)"


def source_columns(con: duckdb.DuckDBPyConnection, source: str) -> set[str]:
    """The column names of `source` (a table or view name, or a parenthesised query); empty when it cannot be read."""
    try:
        cur = con.execute(f"SELECT * FROM {source} LIMIT 0")
        cols = {c[0] for c in cur.description or []}
        cur.fetchall()
    except duckdb.Error:
        return set()
    return cols


def weight_where(con: duckdb.DuckDBPyConnection, source: str, where: str = "true",
                 params: Sequence[object] = ()) -> str | None:
    """`adjusted_count` when `source` has it and some row where `where` holds weighs other than 1, else None."""
    if "adjusted_count" not in source_columns(con, source):
        return None
    row = con.execute(f"SELECT {ANY_WEIGHTED_SQL} FROM {source} WHERE {where}", list(params)).fetchall()
    return "adjusted_count" if row and row[0][0] else None


def auto_window_s(requests: int, span_s: float) -> int:
    """The window for a range: the smallest nice size holding ~TARGET_PER_WINDOW requests and giving at most
    MAX_WINDOWS windows, while keeping at least MIN_WINDOWS."""
    if requests <= 0 or span_s <= 0:
        return 60
    want = max(TARGET_PER_WINDOW * span_s / requests, span_s / MAX_WINDOWS)
    cap = span_s / MIN_WINDOWS
    choice = next((w for w in NICE_WINDOWS_S if w >= want), NICE_WINDOWS_S[-1])
    if choice > cap:
        fitting = [w for w in NICE_WINDOWS_S if w <= cap]
        choice = fitting[-1] if fitting else NICE_WINDOWS_S[0]
    return choice


_FACT_COLUMNS = ("trace_id", "span_id", "start_ns", "e2e_ns", "status", "replica", "service", "model",
                 "model_version", "tenant", "input_tokens", "output_tokens", "adjusted_count")
_TTFT_COLUMNS = ("ttft_ns", "tpot_ns")


def _facts_sql(con: duckdb.DuckDBPyConnection, with_ttft: bool) -> tuple[str, str, bool]:
    """(stored, live, in place): SQL of the request-level columns of the request model (analysis.engine.model), no
    critical-path sweep; `stored` (with a `rid` column) reads materialized hours in place, `live`
    computes the rest, or, `in place`, reads them with their `rid` from a reader's table (connect.live_facts_from).

    On a connection from analysis.engine.connect: the materialized hours plus the model on the fly for
    the rest; on any other connection: the model over its `spans` (`stored` empty).
    """
    cols = _FACT_COLUMNS + (_TTFT_COLUMNS if with_ttft else ())
    listed = ", ".join(cols)
    have = {name for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE view_name IN ('_request_rows_stored', '_request_facts_live')"
    ).fetchall()}
    if have == {"_request_rows_stored", "_request_facts_live"}:
        kept = "rid" in source_columns(con, "_request_facts_live")
        return (f"SELECT {listed}, rid FROM _request_rows_stored",
                f"SELECT {listed}{', rid' if kept else ''} FROM _request_facts_live", kept)
    return "", M.facts_sql("spans", columns=cols), False


def _facts_table(con: duckdb.DuckDBPyConnection, with_ttft: bool) -> str:
    # the views' SQL names the snapshot's files (connect binds them in `_spans_files` and the views read it)
    view = con.execute("SELECT view_name, sql FROM duckdb_views() WHERE view_name IN ('spans', '_spans_files', "
                       "'_spans_live_files', '_request_rows_stored', '_request_facts_live') AND NOT internal "
                       "ORDER BY view_name, temporary").fetchall()
    snapshot = hashlib.sha256(str(view).encode()).hexdigest()[:12]
    return f"{REQUESTS_TABLE}_{snapshot}_{'t' if with_ttft else 'e'}"  # per snapshot: refresh() gives new ones


def request_facts(con: duckdb.DuckDBPyConnection, with_ttft: bool = False) -> str:
    """Make, once per connection snapshot, the request-level columns of `requests` (no stage columns); return
    the name of the view holding them.

    The same rows and values as `requests` (one definition: analysis.engine.model), read in place from the
    materialized hours where fresh and otherwise computed without the critical-path sweep (into a
    temp table, so once), or read in place from a reader's table of them (connect.live_facts_from). Each
    row has a `rid`, unique in the view, to address it by (`facts_by_rid`); ids of stored rows name their
    file and row, so the facts of a day of spans take no memory until read.
    `ttft_ns` / `tpot_ns` are there only `with_ttft`.
    """
    full = _facts_table(con, True)
    if _exists(con, full):
        return full
    name = full if with_ttft else _facts_table(con, False)
    if _exists(con, name):
        return name
    keep = {full, _facts_table(con, False)}
    keep |= {f"{k}_live" for k in keep}
    for old, kind in con.execute(
            "SELECT view_name, 'VIEW' FROM duckdb_views() WHERE temporary AND starts_with(view_name, $p) "
            "UNION ALL SELECT table_name, 'TABLE' FROM duckdb_tables() WHERE temporary AND starts_with(table_name, $p)",
            {"p": REQUESTS_TABLE}).fetchall():
        if old not in keep:
            con.execute(f"DROP {kind} {quote_ident(old)}").fetchall()
    stored, live, in_place = _facts_sql(con, with_ttft)
    # the live rows' ids stay below every stored file's (connect.ROW_ID_FILE_SHIFT)
    if in_place:  # a reader's own table of them (connect.live_facts_from): nothing to copy
        rows = live
    else:
        _live_facts_table(con, f"{name}_live", live, ", ".join(_FACT_COLUMNS + (_TTFT_COLUMNS if with_ttft else ())))
        rows = f"SELECT *, rowid AS rid FROM {name}_live"
    con.execute(f"CREATE TEMP VIEW {name} AS {f'{stored} UNION ALL ' if stored else ''}{rows}").fetchall()
    return name


#: Spans of a stale hour per part of its facts (`_live_facts_table`): an hour of 5 M spans held 1.1 GiB in the
#: model's relations at once.
SPANS_PER_FACTS_PART: Final = 2_000_000


def _live_facts_table(con: duckdb.DuckDBPyConnection, table: str, live: str, columns: str) -> None:
    """Make `table` of the rows of `live` (`_facts_sql`'s), one stale hour at a time where the connection offers that
    (connect's LIVE_FACTS_BETWEEN, `columns` of it), and an hour of more than SPANS_PER_FACTS_PART spans in parts by
    trace: the model's relations then hold that many spans, not every stale hour's at once (at 10 M spans those
    passed 3 GiB). The same rows either way."""
    hours: list[tuple[int, int]] = []
    if _has_live_hours(con):
        spans = {int(h): int(n) for h, n in con.execute(
            f"SELECT TimestampNs // {M.HOUR_NS} * {M.HOUR_NS}, count(*) FROM _spans_live GROUP BY 1").fetchall()}
        hours = [(int(h), max(1, math.ceil(spans.get(int(h), 0) / SPANS_PER_FACTS_PART))) for (h,) in con.execute(
            f"SELECT hour_ns FROM {LIVE_HOURS} ORDER BY hour_ns").fetchall()]
    if len(hours) < 2 and all(parts == 1 for _, parts in hours):
        con.execute(f"CREATE TEMP TABLE {table} AS {live}").fetchall()
        return
    first = True
    for h, parts in hours:
        for part in range(parts):
            rows = f"SELECT {columns} FROM {LIVE_FACTS_BETWEEN}({h}, {h + M.HOUR_NS}, {part}, {parts})"
            con.execute(f"CREATE TEMP TABLE {table} AS {rows}" if first else f"INSERT INTO {table} {rows}").fetchall()
            first = False


def _has_live_hours(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection is one of analysis.engine.connect's (its views of the live hours and their facts)."""
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND NOT temporary",
                            [LIVE_HOURS]).fetchall()[0][0])


def facts_by_rid(con: duckdb.DuckDBPyConnection, facts: str, rids: Sequence[int], columns: str = "trace_id",
                 start_ns: Sequence[int] | npt.NDArray[np.int64] = ()) -> dict[int, tuple[object, ...]]:
    """`columns` of the rows of a facts view (`request_facts`, a caller's with a `rid` column, or a table
    addressed by rowid) by row id.

    `start_ns`, the rows' start times when the caller has them, bound the read (the stored hours are
    sorted by start time, so row groups outside are skipped).
    """
    rid = row_id_column(con, facts)
    where = f"{rid} IN (SELECT unnest($rids))"
    params: dict[str, object] = {"rids": list(rids)}
    if len(start_ns):
        where += " AND start_ns >= $lo AND start_ns <= $hi"
        params |= {"lo": int(min(start_ns)), "hi": int(max(start_ns))}
    return {int(r[0]): tuple(r[1:]) for r in con.execute(
        f"SELECT {rid}, {columns} FROM {facts} WHERE {where}", params).fetchall()}


def row_id_column(con: duckdb.DuckDBPyConnection, facts: str) -> str:
    """How rows of `facts` are addressed: its `rid` column, or the rowid of a table without one (a caller's copy)."""
    return "rid" if "rid" in source_columns(con, facts) else "rowid"


def request_source(con: duckdb.DuckDBPyConnection, metric: str = "e2e") -> str:
    """Where a metric's values come from: the request facts for e2e/ttft/tpot, the `requests` view for stages."""
    if metric in ("e2e", "ttft", "tpot"):
        return request_facts(con, with_ttft=metric != "e2e")
    return "requests"


def _exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    rows = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND temporary",
                       [name]).fetchall()
    return bool(rows and rows[0][0])


def time_range(con: duckdb.DuckDBPyConnection, since: int | None = None, until: int | None = None,
               source: str | None = None) -> tuple[int, int, int]:
    """(first start_ns, last start_ns, requests) of the requests in [since, until)."""
    src = source or request_facts(con)
    row = con.execute(
        f"SELECT min(start_ns), max(start_ns), count(*) FROM {src} "
        "WHERE start_ns >= coalesce(?, start_ns) AND start_ns < coalesce(?, start_ns + 1)",
        [since, until]).fetchall()[0]
    if row[2] == 0:
        return (0, 0, 0)
    return (int(row[0]), int(row[1]), int(row[2]))


def choose_window_s(con: duckdb.DuckDBPyConnection, since: int | None = None, until: int | None = None,
                    source: str | None = None) -> int:
    """The automatic window size (seconds) for the requests in [since, until)."""
    lo, hi, n = time_range(con, since, until, source)
    start = since if since is not None else lo
    end = until if until is not None else hi + 1
    return auto_window_s(n, max(end - start, 1) / 1e9)


#: The request and value counts of a window (DuckDB), the same in the weighted and unweighted series.
_COUNTS_SQL: Final = """count(*) AS requests,
       count(*) FILTER (WHERE status = 'ok') AS ok,
       count(*) FILTER (WHERE status = 'error') AS errors,
       count(*) FILTER (WHERE status = 'timeout') AS timeouts,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count({col}) FILTER (WHERE {keep}) AS n"""
_COUNT_NAMES: Final = ("requests", "ok", "errors", "timeouts", "cancelled", "n")


def series_frame(frame: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """The columns of `percentile_series` from a frame of window_start_ns, `by`, the counts and `q`
    (the list of QUANTILES values in ns), with the weighted counts and n_effective when sampled.

    Any engine computing the windows (DuckDB here, ClickHouse in analysis.clickhouse.report) ends here.
    """
    if "n_effective" not in frame.columns:  # unsampled: the weighted counts are the counts
        frame = frame.with_columns([pl.col(c).cast(pl.Float64).alias(f"{c}_weighted") for c in _COUNT_NAMES]
                                   + [pl.col("n").cast(pl.Float64).alias("n_effective")])
    q, tail_n = pl.col("q"), pl.col("n_effective")
    frame = frame.with_columns(
        [pl.from_epoch(pl.col("window_start_ns"), time_unit="ns").dt.replace_time_zone("UTC").alias("window_start")]
        + [(q.list.get(i, null_on_oob=True) / 1e6).alias(f"{name}_ms") for i, (name, _) in enumerate(QUANTILES)]
        + [(tail_n * (1 - qv) < MIN_TAIL).alias(f"{name}_low_sample") for name, qv in QUANTILES]
    ).drop("q")
    first = ["window_start", "window_start_ns", *by]
    return frame.select(first + [c for c in frame.columns if c not in first]).with_columns(
        pl.col(c).cast(pl.Int64) for c in ("window_start_ns", *_COUNT_NAMES))


def percentile_series(
    con: duckdb.DuckDBPyConnection,
    metric: str = "e2e",
    window_s: float | str | None = None,
    by: Sequence[str] = (),
    since: str | int | datetime | None = None,
    until: str | int | datetime | None = None,
    include_failures: bool = True,
    source: str | None = None,
) -> pl.DataFrame:
    """p50/p90/p99/p99.9 (ms) per window (and per `by` group) of `metric`, with counts and low-sample flags.

    `source` (a table or view name with the `requests` columns used) replaces the store's
    requests, e.g. a filtered set; the automatic window is then chosen from its rows.

    Columns: window_start (UTC datetime), window_start_ns, the `by` columns, requests, ok,
    errors, timeouts, cancelled, n (values behind the percentiles), the same counts weighted by
    the requests' adjusted counts (requests_weighted .. n_weighted: how many they stand for),
    n_effective (Kish's effective count of the values), p50_ms .. p999_ms (weighted when sampled),
    and p50_low_sample .. p999_low_sample (on n_effective). Windows with no request are absent.
    """
    column = metric_column(metric)
    for name in by:
        if name not in GROUP_COLUMNS:
            raise QueryError("", f"cannot group by {name!r}; use one of {', '.join(GROUP_COLUMNS)}")
    since_ns, until_ns = parse_time(since), parse_time(until)
    src = source if source is not None else request_source(con, metric)
    win = (parse_duration(window_s) if window_s is not None
           else choose_window_s(con, since_ns, until_ns, source if source is not None else request_facts(con)))
    win_ns = round(win * 1e9)
    groups = "".join(f", {quote_ident(g)}" for g in by)
    qs = [q for _, q in QUANTILES]
    keep = "TRUE" if include_failures else "status = 'ok'"
    weight = weight_column(con, src, since_ns, until_ns)
    col = quote_ident(column)
    counts = _COUNTS_SQL.format(col=col, keep=keep)
    if weight is None:
        sql = f"""
SELECT (start_ns // $w) * $w AS window_start_ns{groups},
       {counts},
       quantile_cont({col}, $qs) FILTER (WHERE {keep}) AS q
FROM {src}
WHERE ($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)
GROUP BY ALL ORDER BY ALL
"""
    else:
        part = "window_start_ns" + groups
        w = quote_ident(weight)
        kept = f"{keep} AND {col} IS NOT NULL"
        sql = f"""
SELECT window_start_ns{groups},
       {counts},
       {weighted_quantiles_sql(col, qs, keep)} AS q,
       sum({w}) AS requests_weighted,
       coalesce(sum({w}) FILTER (WHERE status = 'ok'), 0) AS ok_weighted,
       coalesce(sum({w}) FILTER (WHERE status = 'error'), 0) AS errors_weighted,
       coalesce(sum({w}) FILTER (WHERE status = 'timeout'), 0) AS timeouts_weighted,
       coalesce(sum({w}) FILTER (WHERE status = 'cancelled'), 0) AS cancelled_weighted,
       coalesce(sum({w}) FILTER (WHERE {kept}), 0) AS n_weighted,
       coalesce(sum({w}) FILTER (WHERE {kept}) ^ 2 / sum({w} * {w}) FILTER (WHERE {kept}), 0) AS n_effective
FROM (SELECT *, {weighted_window_sql(col, w, part, keep)}
      FROM (SELECT (start_ns // $w) * $w AS window_start_ns, * FROM {src}
            WHERE ($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)))
GROUP BY ALL ORDER BY ALL
"""
    try:
        params = {"w": win_ns, "since": since_ns, "until": until_ns} | ({"qs": qs} if weight is None else {})
        frame = con.sql(sql, params=params).pl()
    except duckdb.Error as exc:
        raise QueryError(sql, f"percentile series of {metric} failed: {str(exc).splitlines()[0]}") from exc
    return series_frame(frame, by)
