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
from typing import TYPE_CHECKING, Any, Final, cast

import polars as pl

from analysis import clickhouse as C
from analysis.attribute_filters import AttributeFilter
from analysis.clickhouse import breakdowns as CB
from analysis.clickhouse import report as CR
from analysis.clickhouse.model import temp_engine, temp_table
from analysis.cost import Prices, clickhouse_cost
from dashboard.engine import CAPABILITIES, FILTER_DIMENSIONS, Filters
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
#: What a ClickHouse table cannot do yet (dashboard.engine.CAPABILITIES), and why.
NOT_YET_CAN: Final[dict[str, str]] = {
    "alerts": "alerts are the state `tailscope watch` keeps in a store's alerts/ directory while it follows "
              "that store's new segments; it does not follow a ClickHouse table, so a table has no alerts to show",
    "prices": "per-replica and per-model prices live in a store's prices.toml; on a table, one price applies to all",
    "spike_marks": "the ClickHouse report computes spikes and explanations in one pass",
    "segments": "a table has no segment files; ClickHouse merges its own parts (system.parts says how)",
    "attribute_listing": "listing the attributes runs the report's attribute pass over the whole table, so it "
                         "waits until asked",
}
#: Attribute filter sets whose matching requests a bench keeps in session tables at once (the oldest dropped first).
MATCH_TABLES: Final = 4
#: Prefix of those session tables (`_matching`).
MATCH_TABLE: Final = "_tailscope_attr_match"
#: Seconds a console query may run (the server stops it).
SQL_TIMEOUT_S: Final = 10.0
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
    #: (data version, attribute filters) -> the session table of the requests meeting them (`_matching`)
    matches: dict[tuple[int, tuple[AttributeFilter, ...]], str] = field(default_factory=dict)
    made: int = 0  # match tables made so far (their names' numbers)

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
            for name in self.matches.values():  # computed from the facts just replaced
                self.client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")
            self.matches.clear()
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

    # --- the engine seam (dashboard.engine.Engine): each the module function of the same name below ----------

    def can(self, capability: str) -> bool:
        """What a ClickHouse table does of dashboard.engine.CAPABILITIES (NOT_YET says why not the others)."""
        return capability in CAPABILITIES and capability not in NOT_YET_CAN

    def missing(self, capability: str) -> str:
        """Why this engine cannot do `capability` (empty when it can)."""
        return "" if self.can(capability) else NOT_YET_CAN.get(capability, "it is not computed on ClickHouse yet")

    def choices(self, dims: Sequence[str]) -> dict[str, Any]:
        """`choices`."""
        return choices(self, dims)

    def attribute_choices(self) -> dict[str, dict[str, Any]]:
        """analysis.clickhouse.breakdowns.attribute_choices over every request."""
        with self.lock:
            return CB.attribute_choices(self.client, FACTS, self.table)

    def by_attribute(self, f: Filters, metric: str, key: str, choice: dict[str, Any]) -> pd.DataFrame:
        """analysis.clickhouse.breakdowns.by_attribute of the filtered requests."""
        with self.lock:
            return CB.by_attribute(self.client, FACTS, key, choice, metric, condition(self, f, FILTER_DIMENSIONS),
                                   self.table).to_pandas()

    def summary(self, f: Filters) -> dict[str, Any]:
        """`summary`."""
        return summary(self, f, FILTER_DIMENSIONS)

    def time_bounds(self, f: Filters) -> tuple[int | None, int | None, int]:
        """`time_bounds`."""
        return time_bounds(self, f, FILTER_DIMENSIONS)

    def series(self, f: Filters, metric: str, window_s: int) -> pl.DataFrame:
        """`series`."""
        return series(self, f, FILTER_DIMENSIONS, metric, window_s)

    def report(self, f: Filters, metric: str, window_s: int | None, explain: bool) -> dict[str, Any]:
        """`report` (always with its explanations: `can("spike_marks")` is false)."""
        return report(self, f, FILTER_DIMENSIONS, metric, window_s)

    def explain_window(self, f: Filters, start_ns: int, end_ns: int, metric: str,
                       window_s: int | None) -> dict[str, Any]:
        """`explain_window`."""
        return explain_window(self, f, FILTER_DIMENSIONS, start_ns, end_ns, metric, window_s)

    def shape(self, f: Filters, metric: str, by: tuple[str, ...]) -> pd.DataFrame:
        """`shape`."""
        return shape(self, f, FILTER_DIMENSIONS, metric, by)

    def replicas(self, f: Filters, metric: str) -> pd.DataFrame:
        """`replicas`."""
        return replicas(self, f, FILTER_DIMENSIONS, metric)

    def outlier_explanations(self, f: Filters, metric: str) -> list[dict[str, Any]]:
        """`outlier_explanations`."""
        return outlier_explanations(self, f, FILTER_DIMENSIONS, metric)

    def exemplars(self, f: Filters, limit: int, metric: str, trace_ids: tuple[str, ...] | None) -> pd.DataFrame:
        """`exemplars`."""
        return exemplars(self, f, FILTER_DIMENSIONS, limit, metric, trace_ids)

    def find_trace(self, trace_id: str) -> pd.DataFrame:
        """`find_trace`."""
        return find_trace(self, trace_id)

    def trace_spans(self, trace_id: str, start_ns: int) -> pd.DataFrame:
        """`trace_spans`."""
        return trace_spans(self, trace_id, start_ns)

    def workload(self, f: Filters) -> Workload:
        """`workload`."""
        return workload(self, f, FILTER_DIMENSIONS)

    def cost(self, f: Filters, by: str, gpu_hour_usd: float | None, bucket_s: int | None,
             keys: tuple[str, ...] | None = None) -> Any:
        """`cost` at one price for every key (a table has no price file); `keys`: as `cost`'s."""
        from analysis.cost import prices_for

        return cost(self, f, by, prices_for(None, None, gpu_hour_usd), bucket_s, keys)

    def cost_page(self, f: Filters, by: str, gpu_hour_usd: float | None, bucket_s: int,
                  keys: tuple[str, ...] | None = None) -> tuple[Any, pd.DataFrame]:
        """`cost` twice: the table (with `keys`, their totals), then the series (the server sweeps each)."""
        return self.cost(f, by, gpu_hour_usd, None, keys), self.cost(f, by, gpu_hour_usd, bucket_s)

    def run_sql(self, sql: str, timeout_s: float, limit: int) -> tuple[pd.DataFrame, bool]:
        """`run_sql`."""
        return run_sql(self, sql, timeout_s, limit)

    def sql_help(self) -> tuple[str, dict[str, str]]:
        """The console's caption and examples (ClickHouse SQL, readonly = 1)."""
        return ("One ClickHouse SELECT (or WITH … SELECT) over `spans`, `requests`, `stages`, computed from "
                f"`{self.table}` (see docs/scale-out.md). It runs with readonly = 1: no writes, no DDL, no setting "
                f"changes; the server stops it after {SQL_TIMEOUT_S:g} s. Sidebar filters do not apply here.",
                SQL_EXAMPLES)


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


def condition(b: ClickHouseBench, f: Filters, dims: Sequence[str]) -> str:
    """The filters as a ClickHouse condition on the request columns (the attribute filters read `b`'s spans)."""
    cond = CB.condition(f.since_ns, f.until_ns, {d: getattr(f, d) for d in dims})  # the dimension columns' values
    return f"{cond} AND (trace_id, span_id) IN (SELECT trace_id, span_id FROM {_matching(b, f.attributes)})" \
        if f.attributes else cond


def _matching(b: ClickHouseBench, attributes: tuple[AttributeFilter, ...]) -> str:
    """The session table of the requests (trace_id, span_id) of FACTS meeting every attribute filter, made once per
    data version and filter set: the filters' subqueries read the spans once, not again in each query of a report."""
    with b.lock:
        name = b.matches.get((b.version, attributes))
        if name is None:
            b.made += 1
            name = f"{MATCH_TABLE}_{b.made}"
            where = CB.attribute_condition(attributes, FACTS, b.table)
            sql = f"SELECT trace_id, span_id FROM {FACTS} WHERE {where}"
            temp_table(b.client, name, sql, temp_engine(b.client, sql))
            b.matches[(b.version, attributes)] = name
            while len(b.matches) > MATCH_TABLES:
                b.client.command(f"DROP TEMPORARY TABLE IF EXISTS {b.matches.pop(next(iter(b.matches)))}")
        return name


def choices(b: ClickHouseBench, dims: Sequence[str]) -> dict[str, Any]:
    """Time bounds and the distinct values of each filter dimension (analysis.clickhouse.breakdowns)."""
    with b.lock:
        lo, hi, n = CB.time_bounds(b.client, FACTS)
        return {"min_ns": lo, "max_ns": hi, "requests": n, **CB.dimension_values(b.client, FACTS, dims)}


def summary(b: ClickHouseBench, f: Filters, dims: Sequence[str]) -> dict[str, Any]:
    """analysis.clickhouse.breakdowns.summary of the filtered requests."""
    with b.lock:
        return CB.summary(b.client, FACTS, condition(b, f, dims))


def time_bounds(b: ClickHouseBench, f: Filters, dims: Sequence[str]) -> tuple[int | None, int | None, int]:
    """analysis.clickhouse.breakdowns.time_bounds of the filtered requests: (first, last start_ns, requests)."""
    with b.lock:
        return CB.time_bounds(b.client, f"(SELECT start_ns FROM {FACTS} WHERE {condition(b, f, dims)})")


def series(b: ClickHouseBench, f: Filters, dims: Sequence[str], metric: str,
           window_s: int | None = None) -> pl.DataFrame:
    """analysis.clickhouse.report.percentile_series of one metric over the filtered requests."""
    with b.lock:
        return CR.percentile_series(b.client, b.table, metric, window_s=window_s, since=f.since_ns,
                                    until=f.until_ns, facts=FACTS, where=condition(b, f, dims))


def report(b: ClickHouseBench, f: Filters, dims: Sequence[str], metric: str,
           window_s: int | None = None) -> dict[str, Any]:
    """analysis.clickhouse.report.build_report over the filtered requests (the `report --json` contract)."""
    with b.lock:
        return cast(dict[str, Any], CR.build_report(b.client, b.table, metric=metric, window_s=window_s,
                                                    since=f.since_ns, until=f.until_ns, include_failures=True,
                                                    facts=FACTS, where=condition(b, f, dims)))


def explain_window(b: ClickHouseBench, f: Filters, dims: Sequence[str], start_ns: int, end_ns: int,
                   metric: str, window_s: int | None = None) -> dict[str, Any]:
    """analysis.clickhouse.report.explain_window: any window explained as the report explains a spike."""
    with b.lock:
        return cast(dict[str, Any], CR.explain_window(b.client, b.table, start_ns, end_ns, metric=metric,
                                                      window_s=window_s, since=f.since_ns, until=f.until_ns,
                                                      facts=FACTS, where=condition(b, f, dims)))


def exemplars(b: ClickHouseBench, f: Filters, dims: Sequence[str], limit: int, metric: str,
              trace_ids: tuple[str, ...] | None) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.slowest under the filters (only `trace_ids`, when given)."""
    cond = condition(b, f, dims)
    if trace_ids is not None:
        cond += f" AND trace_id IN ({', '.join(CB.literal(t) for t in trace_ids) or 'NULL'})"
    with b.lock:
        return CB.slowest(b.client, FACTS, metric, limit, cond).to_pandas()


def replicas(b: ClickHouseBench, f: Filters, dims: Sequence[str], metric: str) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.replicas of the filtered requests."""
    with b.lock:
        return CB.replicas(b.client, FACTS, metric, condition(b, f, dims)).to_pandas()


def outlier_explanations(b: ClickHouseBench, f: Filters, dims: Sequence[str], metric: str) -> list[dict[str, Any]]:
    """analysis.stats.verdicts.explain_outliers over the filtered requests, each breakdown on the server."""
    from analysis.stats.verdicts import OUTLIER_DIMENSIONS, OUTLIER_VALUES, explain_outliers

    cond = condition(b, f, dims)
    with b.lock:
        by_replica = CB.replicas(b.client, FACTS, metric, cond)
        outliers = by_replica.filter(pl.col("outlier")).get_column("replica").to_list()
        if not outliers:
            return []
        reps = ", ".join(CB.literal(r) for r in outliers)
        values = {d: [r[d] for r in b.client.query(
            f"SELECT {d}, count() AS n FROM {FACTS} WHERE ({cond}) AND replica IN ({reps}) AND {d} IS NOT NULL "
            f"GROUP BY {d} ORDER BY n DESC, {d} LIMIT {OUTLIER_VALUES}").to_pylist()] for d in OUTLIER_DIMENSIONS}

        def without(dim: str, value: Any) -> pl.DataFrame:
            return CB.replicas(b.client, FACTS, metric, f"({cond}) AND {dim} IS DISTINCT FROM {CB.literal(value)}")

        return explain_outliers(by_replica, without, values)


def shape(b: ClickHouseBench, f: Filters, dims: Sequence[str], metric: str, by: tuple[str, ...]) -> pd.DataFrame:
    """analysis.clickhouse.breakdowns.shape of the filtered requests."""
    with b.lock:
        return CB.shape(b.client, FACTS, metric, by, condition(b, f, dims)).to_pandas()


def workload(b: ClickHouseBench, f: Filters, dims: Sequence[str]) -> Workload:
    """analysis.clickhouse.breakdowns.workload of the filtered requests: the rows a queue replay reads come back."""
    with b.lock:
        return CB.workload(b.client, FACTS, b.table, condition(b, f, dims), f.since_ns, f.until_ns)


def cost(b: ClickHouseBench, f: Filters, by: str, prices: Prices, bucket_s: int | None = None,
         keys: tuple[str, ...] | None = None) -> dict[str, Any] | pd.DataFrame:
    """analysis.cost.clickhouse_cost over the filters' time range: the cost table (with `keys`, their totals), or
    with `bucket_s` the series (as pandas). Like the store's page, every request of the range counts; the page keeps
    the keys filtered."""
    with b.lock:
        out = clickhouse_cost(b.client, FACTS, b.table, by=by, since=f.since_ns, until=f.until_ns, prices=prices,
                              bucket_s=bucket_s, keys=keys)
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
