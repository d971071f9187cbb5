"""The dashboard's one seam to an engine: what a page may ask of a store's DuckDB workbench or a ClickHouse bench.

dashboard.data caches calls to an `Engine`; pages ask `db.can("alerts")` rather than which engine runs.
Two implementations satisfy it: dashboard.data.Workbench (a store, on DuckDB) and
dashboard.clickhouse_data.ClickHouseBench (an otel_traces table). Every figure comes from an analysis
function either way; an engine computes nothing of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from analysis.attribute_filters import AttributeFilter, where_all
from analysis.engine import model as M

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl

    from analysis.capacity import Workload

#: The dimensions the sidebar filters on (columns of `requests`; analysis owns the list, alert links use it too).
FILTER_DIMENSIONS: Final[tuple[str, ...]] = M.FILTER_DIMENSIONS

#: What an engine may or may not do, by name: what each means.
CAPABILITIES: Final[dict[str, str]] = {
    "alerts": "the alerts `tailscope watch` keeps in a store's alerts/ directory",
    "prices": "a store's price table (STORE/prices.toml)",
    "spike_marks": "the report's spikes without their explanations (else the full report is computed once)",
    "segments": "a store's segment files: how the store is (analysis.engine.store_status, `tailscope store`)",
    "attribute_filters": "filtering by any attribute the report considers (analysis.attribute_filters)",
    "attribute_listing": "listing the attributes cheaply enough to offer them without being asked (a store reads "
                         "its materialized hours' attribute files)",
}


@dataclass(frozen=True)
class Filters:
    """What every page shows: a time range (ns, inclusive start, exclusive end) and dimension values.

    An empty tuple means "all values". Frozen and hashable so it can key `st.cache_data`.
    """

    since_ns: int | None = None
    until_ns: int | None = None
    service: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    replica: tuple[str, ...] = ()
    tenant: tuple[str, ...] = ()
    #: attribute filters (analysis.attribute_filters), one per key: a request meets each (one of its values)
    attributes: tuple[AttributeFilter, ...] = ()

    def where(self, alias: str = "", requests: str = "req") -> tuple[str, list[Any]]:
        """A DuckDB condition (never empty) and its parameters for the `requests` columns (`requests`: the relation
        of every request, which the attribute filters' stage rule reads)."""
        p = f"{alias}." if alias else ""
        parts: list[str] = ["true"]
        params: list[Any] = []
        if self.since_ns is not None:
            parts.append(f"{p}start_ns >= ?")
            params.append(self.since_ns)
        if self.until_ns is not None:
            parts.append(f"{p}start_ns < ?")
            params.append(self.until_ns)
        for dim in FILTER_DIMENSIONS:
            values = getattr(self, dim)
            if values:
                parts.append(f"{p}{dim} IN ({', '.join('?' for _ in values)})")
                params.extend(values)
        if self.attributes:
            cond, more = where_all(self.attributes, alias, requests=requests)
            parts.append(cond)
            params.extend(more)
        return " AND ".join(parts), params

    def narrowed(self, since_ns: int | None, until_ns: int | None) -> Filters:
        """The same filters over a sub-range of time."""
        return Filters(since_ns, until_ns, self.service, self.model, self.replica, self.tenant, self.attributes)


@runtime_checkable
class Engine(Protocol):
    """A source of request facts the pages read: its data version, background state and queries."""

    version: int
    pending: set[int]
    last_refresh_s: float
    last_refresh_took_s: float

    @property
    def store(self) -> Path | str:
        """What the pages key their caches by and the sidebar names: a store directory, or a DSN and table."""

    def can(self, capability: str) -> bool:
        """Whether this engine does `capability` (a key of CAPABILITIES)."""

    def missing(self, capability: str) -> str:
        """Why this engine cannot do `capability` (a sentence; empty when it can)."""

    def refresh(self) -> bool:
        """Pick up new data; True when the data version changed."""

    def loading_note(self) -> str | None:
        """A sentence while something loads in the background, else None."""

    def choices(self, dims: Sequence[str]) -> dict[str, Any]:
        """Time bounds, request count and the distinct values of each dimension, over everything."""

    def attribute_choices(self) -> dict[str, dict[str, Any]]:
        """The attributes the report considers over every request, with their values (where it
        `can("attribute_filters")`)."""

    def summary(self, f: Filters) -> dict[str, Any]:
        """Counts per outcome and p50/p90/p99 of the filtered requests."""

    def time_bounds(self, f: Filters) -> tuple[int | None, int | None, int]:
        """(first start_ns, last start_ns, requests) of the filtered requests."""

    def series(self, f: Filters, metric: str, window_s: int) -> pl.DataFrame:
        """The report's percentile series of `metric` in windows of `window_s`."""

    def report(self, f: Filters, metric: str, window_s: int | None, explain: bool) -> dict[str, Any]:
        """The report over the filtered requests (without its explanations unless `explain`)."""

    def explain_window(self, f: Filters, start_ns: int, end_ns: int, metric: str,
                       window_s: int | None) -> dict[str, Any]:
        """Any window explained as the report explains a spike."""

    def shape(self, f: Filters, metric: str, by: tuple[str, ...]) -> pd.DataFrame:
        """Requests and p50/p99 per token bucket."""

    def replicas(self, f: Filters, metric: str) -> pd.DataFrame:
        """Per replica counts, p50/p99 and the outlier flag."""

    def by_attribute(self, f: Filters, metric: str, key: str, choice: dict[str, Any]) -> pd.DataFrame:
        """Per value of attribute `key` (`choice`: its entry of attribute_choices): the replicas' columns."""

    def outlier_explanations(self, f: Filters, metric: str) -> list[dict[str, Any]]:
        """The outlier replicas one value of another dimension explains."""

    def exemplars(self, f: Filters, limit: int, metric: str, trace_ids: tuple[str, ...] | None) -> pd.DataFrame:
        """The slowest filtered requests (only `trace_ids`, when given)."""

    def find_trace(self, trace_id: str) -> pd.DataFrame:
        """The request rows of a trace id or a prefix of 8+ hex digits."""

    def trace_spans(self, trace_id: str, start_ns: int) -> pd.DataFrame:
        """The waterfall of one trace."""

    def workload(self, f: Filters) -> Workload:
        """The filtered requests as a queue replay reads them."""

    def cost(self, f: Filters, by: str, gpu_hour_usd: float | None, bucket_s: int | None) -> Any:
        """The cost table (a dict), or with `bucket_s` its series (pandas)."""

    def cost_page(self, f: Filters, by: str, gpu_hour_usd: float | None, bucket_s: int,
                  keys: tuple[str, ...] | None = None) -> tuple[Any, pd.DataFrame]:
        """The cost table (a dict; with `keys`, their totals as `selected`) and its series in `bucket_s` cells
        (pandas): what the Cost page draws."""

    def run_sql(self, sql: str, timeout_s: float, limit: int) -> tuple[pd.DataFrame, bool]:
        """One read-only query of the SQL console: (first `limit` rows, truncated?)."""

    def sql_help(self) -> tuple[str, dict[str, str]]:
        """The SQL console's caption and its example queries."""
