"""Percentile series: p50 / p90 / p99 / p99.9 per time window and per group, with counts beside them.

One convention everywhere: DuckDB `quantile_cont`, linear interpolation between the two
nearest order statistics (rank h = (n - 1) * q, as numpy's default `linear` method, Spark's
`percentile` and ClickHouse's `quantileExactInclusive`). Failures (error, timeout,
cancelled) are included by default, so a saturated service does not look fast because its
timeouts were dropped; `include_failures=False` keeps only `ok` requests. A figure is
flagged `low_sample` when fewer than `MIN_TAIL` requests lie beyond its quantile
(p99 of 40 requests is the largest value, not a percentile).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

import duckdb
import polars as pl

from analysis import model as M
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
                 "model_version", "tenant", "input_tokens", "output_tokens")
_TTFT_COLUMNS = ("ttft_ns", "tpot_ns")


def _facts_sql(con: duckdb.DuckDBPyConnection, with_ttft: bool) -> str:
    """The request-level columns of the request model (analysis.model), no critical-path sweep.

    On a connection from analysis.connect: the materialized hours plus the model on the fly for
    the rest; on any other connection: the model over its `spans`.
    """
    cols = _FACT_COLUMNS + (_TTFT_COLUMNS if with_ttft else ())
    listed = ", ".join(cols)
    have = {name for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE view_name IN ('_requests_stored', '_request_facts_live')"
    ).fetchall()}
    if have == {"_requests_stored", "_request_facts_live"}:
        return f"SELECT {listed} FROM _requests_stored UNION ALL SELECT {listed} FROM _request_facts_live"
    return M.facts_sql("spans", columns=cols)


def _facts_table(con: duckdb.DuckDBPyConnection, with_ttft: bool) -> str:
    view = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'spans' AND NOT internal").fetchall()
    snapshot = hashlib.sha256(str(view).encode()).hexdigest()[:12]
    return f"{REQUESTS_TABLE}_{snapshot}_{'t' if with_ttft else 'e'}"  # per snapshot: refresh() gives new ones


def request_facts(con: duckdb.DuckDBPyConnection, with_ttft: bool = False) -> str:
    """Materialize, once per connection snapshot, the request-level columns of `requests` (no stage columns).

    The same rows and values as `requests` (one definition: analysis.model), read from the
    materialized hours where fresh and otherwise computed without the critical-path sweep.
    `ttft_ns` / `tpot_ns` are there only `with_ttft`. Returns the table name.
    """
    full = _facts_table(con, True)
    if _exists(con, full):
        return full
    table = full if with_ttft else _facts_table(con, False)
    if _exists(con, table):
        return table
    keep = {full, _facts_table(con, False)}
    for (old,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, ?)",
                              [REQUESTS_TABLE]).fetchall():
        if old not in keep:
            con.execute(f"DROP TABLE {quote_ident(old)}").fetchall()
    con.execute(f"CREATE TEMP TABLE {table} AS {_facts_sql(con, with_ttft)}").fetchall()
    return table


def request_source(con: duckdb.DuckDBPyConnection, metric: str = "e2e") -> str:
    """Where a metric's values come from: the request facts for e2e/ttft/tpot, the `requests` view for stages."""
    if metric in ("e2e", "ttft", "tpot"):
        return request_facts(con, with_ttft=metric != "e2e")
    return "requests"


def _exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    rows = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND temporary",
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
    errors, timeouts, cancelled, n (values behind the percentiles), p50_ms .. p999_ms, and
    p50_low_sample .. p999_low_sample. Windows with no request are absent.
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
    sql = f"""
SELECT (start_ns // $w) * $w AS window_start_ns{groups},
       count(*) AS requests,
       count(*) FILTER (WHERE status = 'ok') AS ok,
       count(*) FILTER (WHERE status = 'error') AS errors,
       count(*) FILTER (WHERE status = 'timeout') AS timeouts,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count({quote_ident(column)}) FILTER (WHERE {keep}) AS n,
       quantile_cont({quote_ident(column)}, $qs) FILTER (WHERE {keep}) AS q
FROM {src}
WHERE ($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)
GROUP BY ALL ORDER BY ALL
"""
    try:
        frame = con.sql(sql, params={"w": win_ns, "qs": qs, "since": since_ns, "until": until_ns}).pl()
    except duckdb.Error as exc:
        raise QueryError(sql, f"percentile series of {metric} failed: {str(exc).splitlines()[0]}") from exc
    q = pl.col("q")
    frame = frame.with_columns(
        [pl.from_epoch(pl.col("window_start_ns"), time_unit="ns").dt.replace_time_zone("UTC").alias("window_start")]
        + [(q.list.get(i, null_on_oob=True) / 1e6).alias(f"{name}_ms") for i, (name, _) in enumerate(QUANTILES)]
        + [(pl.col("n") * (1 - qv) < MIN_TAIL).alias(f"{name}_low_sample") for name, qv in QUANTILES]
    ).drop("q")
    first = ["window_start", "window_start_ns", *by]
    return frame.select(first + [c for c in frame.columns if c not in first]).with_columns(
        pl.col(c).cast(pl.Int64) for c in ("requests", "ok", "errors", "timeouts", "cancelled", "n"))
