"""The dashboard on ClickHouse (`tailscope dashboard --engine clickhouse --dsn DSN`): a bench over an otel_traces table.

`ClickHouseBench` stands where dashboard.data's Workbench stands: it computes the request
model on the server once per data version into the session temporary table `requests` (and
`stages`, for the SQL console) and every page's figure comes from an analysis function run
against it: analysis.clickhouse.report (report, explained windows, percentile series) and
analysis.clickhouse.breakdowns (summary, exemplars, trace lookup, waterfall). Only
aggregates and the rows a page lists come back. One client serves every session, one call
at a time (a ClickHouse session runs one query at a time; chdb is one engine per process).
dashboard.data dispatches to the functions below and keeps the caching; nothing here
computes a number of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import polars as pl

from analysis import clickhouse as C
from analysis.clickhouse import breakdowns as CB
from analysis.clickhouse import report as CR
from analysis.cost import Prices, clickhouse_cost
from tracing.errors import QueryError

if TYPE_CHECKING:
    import pandas as pd

    from analysis.capacity import Workload

#: The session table of the request facts every page reads (also the console's `requests`).
FACTS: Final = "requests"
HOUR_NS: Final = 3_600_000_000_000
#: Pages that run on ClickHouse (by title); the others say so in one sentence.
PAGES: Final[tuple[str, ...]] = ("Overview", "Spike", "Request shape", "Replicas", "What-if", "Capacity", "Cost",
                                  "Traces", "SQL")
#: Why a page does not run on ClickHouse yet, by title.
NOT_YET: Final[dict[str, str]] = {
    "Alerts": "alerts are the state `tailscope watch` keeps in a store's alerts/ directory while it follows "
              "that store's new segments; it does not follow a ClickHouse table, so a table has no alerts to show",
}
#: Example queries of the SQL console that read the same in DuckDB and ClickHouse (both consoles show them).
PORTABLE_SQL_EXAMPLES: Final[dict[str, str]] = {
    "critical path per stage": (
        "SELECT stage, round(sum(critical_ns) / 1e9, 1) AS total_s,\n"
        "       round(avg(critical_ns) / 1e6, 1) AS mean_ms\n"
        "FROM stages GROUP BY stage ORDER BY total_s DESC"
    ),
    "slowest requests": (
        "SELECT trace_id, start, replica, round(e2e_ns / 1e6) AS e2e_ms, status\n"
        "FROM requests ORDER BY e2e_ns DESC LIMIT 20"
    ),
}
#: Example ClickHouse queries of the SQL console (the DuckDB ones use DuckDB functions).
SQL_EXAMPLES: Final[dict[str, str]] = {
    "p50 / p99 per replica": (
        "SELECT replica, count() AS requests,\n"
        "       round(quantileExactInclusive(0.5)(e2e_ns) / 1e6) AS p50_ms,\n"
        "       round(quantileExactInclusive(0.99)(e2e_ns) / 1e6) AS p99_ms\n"
        "FROM requests GROUP BY replica ORDER BY p99_ms DESC"
    ),
    "p99 per minute": (
        "SELECT toStartOfMinute(start) AS minute, count() AS requests,\n"
        "       round(quantileExactInclusive(0.99)(e2e_ns) / 1e6) AS p99_ms\n"
        "FROM requests GROUP BY minute ORDER BY minute"
    ),
    **PORTABLE_SQL_EXAMPLES,
}


class FilterLike(Protocol):
    """What the sidebar's filters hold (dashboard.data.Filters)."""

    @property
    def since_ns(self) -> int | None:
        """Inclusive start (ns), or None."""

    @property
    def until_ns(self) -> int | None:
        """Exclusive end (ns), or None."""


@dataclass
class ClickHouseBench:
    """A ClickHouse client, the spans table, and the request facts computed into the session table FACTS.

    `version` changes when `refresh()` found the table changed (row count or newest span).
    """

    client: C.Client
    table: str
    store: str = ""
    version: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    last_refresh_s: float = 0.0
    last_refresh_took_s: float = 0.0
    pending: set[int] = field(default_factory=set)  # nothing computes in the background here
    seen: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        self.store = self.store or f"{self.client.dsn} · {self.table}"

    def refresh(self) -> bool:
        """Recompute the request facts when the table changed since the last refresh; True when it did."""
        with self.lock:
            t0 = time.perf_counter()
            row = self.client.query(f"SELECT count() AS n, max(Timestamp) AS last FROM {self.table}").to_pylist()[0]
            seen = (row["n"], str(row["last"]))
            self.last_refresh_s = time.time()
            if seen == self.seen:
                return False
            # the intervals the materialized table covers are read from it, the rest computed (equal rows)
            C.requests_facts(self.client, self.table, name=FACTS)
            self.seen = seen
            self.version += 1
            self.last_refresh_took_s = time.perf_counter() - t0
            return True

    def loading_note(self) -> str | None:
        """Nothing loads in the background on ClickHouse."""
        return None

    def close(self) -> None:
        """Release the client."""
        with self.lock:
            self.client.close()


def open_bench(dsn: str, table: str = C.DEFAULT_TABLE) -> ClickHouseBench:
    """A bench on `table` at `dsn`, with its request facts computed (DsnError / QueryError say what is wrong)."""
    C.check_table_name(table)
    bench = ClickHouseBench(C.open_client(dsn), table)
    try:
        bench.refresh()
    except BaseException:
        bench.close()
        raise
    return bench


def condition(f: FilterLike, dims: Sequence[str]) -> str:
    """The filters as a ClickHouse condition on the request columns."""
    return CB.condition(f.since_ns, f.until_ns, {d: getattr(f, d) for d in dims})  # the dimension columns' values


def choices(b: ClickHouseBench, dims: Sequence[str]) -> dict[str, Any]:
    """Time bounds and the distinct values of each filter dimension (analysis.clickhouse.breakdowns)."""
    with b.lock:
        lo, hi, n = CB.time_bounds(b.client, FACTS)
        return {"min_ns": lo, "max_ns": hi, "requests": n, **CB.dimension_values(b.client, FACTS, dims)}


def summary(b: ClickHouseBench, f: FilterLike, dims: Sequence[str]) -> dict[str, Any]:
    """analysis.clickhouse.breakdowns.summary of the filtered requests."""
    with b.lock:
        return CB.summary(b.client, FACTS, condition(f, dims))


def window_s(b: ClickHouseBench, f: FilterLike, dims: Sequence[str]) -> int:
    """The report's automatic window over the filtered requests (analysis.clickhouse.report.choose_window_s)."""
    with b.lock:
        return CR.choose_window_s(b.client, FACTS, f.since_ns, f.until_ns, condition(f, dims))


def series(b: ClickHouseBench, f: FilterLike, dims: Sequence[str], metric: str) -> pl.DataFrame:
    """analysis.clickhouse.report.percentile_series of one metric over the filtered requests."""
    with b.lock:
        return CR.percentile_series(b.client, b.table, metric, since=f.since_ns, until=f.until_ns, facts=FACTS,
                                    where=condition(f, dims))


def report(b: ClickHouseBench, f: FilterLike, dims: Sequence[str], metric: str) -> dict[str, Any]:
    """analysis.clickhouse.report.build_report over the filtered requests (the `report --json` contract)."""
    with b.lock:
        return CR.build_report(b.client, b.table, metric=metric, since=f.since_ns, until=f.until_ns,
                               include_failures=True, facts=FACTS, where=condition(f, dims))


def explain_window(b: ClickHouseBench, f: FilterLike, dims: Sequence[str], start_ns: int, end_ns: int,
                   metric: str) -> dict[str, Any]:
    """analysis.clickhouse.report.explain_window: any window explained as the report explains a spike."""
    with b.lock:
        return CR.explain_window(b.client, b.table, start_ns, end_ns, metric=metric, since=f.since_ns,
                                 until=f.until_ns, facts=FACTS, where=condition(f, dims))


def exemplars(b: ClickHouseBench, f: FilterLike, dims: Sequence[str], limit: int, metric: str,
              trace_ids: tuple[str, ...] | None) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.slowest under the filters (only `trace_ids`, when given)."""
    cond = condition(f, dims)
    if trace_ids is not None:
        cond += f" AND trace_id IN ({', '.join(CB.literal(t) for t in trace_ids) or 'NULL'})"
    with b.lock:
        return CB.slowest(b.client, FACTS, metric, limit, cond).to_pandas()


def replicas(b: ClickHouseBench, f: FilterLike, dims: Sequence[str], metric: str) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.replicas of the filtered requests."""
    with b.lock:
        return CB.replicas(b.client, FACTS, metric, condition(f, dims)).to_pandas()


def shape(b: ClickHouseBench, f: FilterLike, dims: Sequence[str], metric: str, by: tuple[str, ...]) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.shape of the filtered requests."""
    with b.lock:
        return CB.shape(b.client, FACTS, metric, by, condition(f, dims)).to_pandas()


def workload(b: ClickHouseBench, f: FilterLike, dims: Sequence[str]) -> Workload:
    """analysis.clickhouse.breakdowns.workload of the filtered requests: the rows a queue replay reads come back."""
    with b.lock:
        return CB.workload(b.client, FACTS, b.table, condition(f, dims), f.since_ns, f.until_ns)


def cost(b: ClickHouseBench, f: FilterLike, by: str, prices: Prices, bucket_s: int | None = None
         ) -> dict[str, Any] | pd.DataFrame:
    """analysis.cost.clickhouse_cost over the filters' time range: the cost table, or with `bucket_s` the series
    (as pandas). Like the store's page, every request of the range counts; the page keeps the keys filtered."""
    with b.lock:
        out = clickhouse_cost(b.client, FACTS, b.table, by=by, since=f.since_ns, until=f.until_ns, prices=prices,
                              bucket_s=bucket_s)
    return out if isinstance(out, dict) else out.to_pandas()


def find_trace(b: ClickHouseBench, trace_id: str) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.find_requests: the request rows of a trace id or a prefix of 8+ digits."""
    with b.lock:
        return CB.find_requests(b.client, FACTS, trace_id).to_pandas()


def trace_spans(b: ClickHouseBench, trace_id: str, start_ns: int) -> pd.DataFrame:
    """The waterfall of one trace from the spans of its request's hour and the next (as the store's segments)."""
    hour = (start_ns // HOUR_NS) * HOUR_NS
    with b.lock:
        return CB.waterfall(b.client, trace_id, hour, hour + 2 * HOUR_NS, b.table).to_pandas()


def run_sql(b: ClickHouseBench, sql: str, timeout_s: float, limit: int) -> tuple[pd.DataFrame, bool]:
    """One read-only ClickHouse query over spans / requests / stages (analysis.clickhouse.query_views, readonly = 1).

    At most `limit` rows come back (truncated?); the server stops it after `timeout_s`.
    QueryError says why a query was refused or failed.
    """
    text = sql.strip().rstrip(";").strip()
    first = text.split(None, 1)[0].upper() if text else ""
    if first not in ("SELECT", "WITH") and not first.startswith("("):
        raise QueryError(text, "type one SELECT (or WITH … SELECT) query" if not text else
                         f"only SELECT / WITH queries are allowed here, not {first}")
    with b.lock:
        out = C.query_views(b.client, text, b.table, computed=True,
                            limits={"max_execution_time": max(1, round(timeout_s)), "max_result_rows": limit + 1,
                                    "result_overflow_mode": "break"})
    frame = out.to_pandas()
    return frame.head(limit), len(frame) > limit
