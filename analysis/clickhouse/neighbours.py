"""The noisy-neighbour step's figures (analysis.neighbours.Figures) gathered on a ClickHouse server.

Every figure is an aggregate computed there over the report's request facts (the session table of
analysis.clickhouse.report) and the spans of `otel_traces`; what comes back is a row per tenant (per tenant
and spike-or-baseline for the admitted requests and the GPU time), never a request's row or a span:

- the tail: the spike's requests slower than its baseline p99, per tenant their count, summed adjusted
  count and the replicas they ran on;
- admitted: the requests starting in the compared windows on those replicas;
- GPU time: analysis.cost's sweep in ClickHouse SQL (`cost.clickhouse_gpu_shares`) over the spans of every
  request the facts hold overlapping the compared windows (the same shares as over the whole table, the
  sweep being exact per minute; weighted when a request of the facts weighs other than 1), joined with the
  facts there;
- queued: the request model run there (analysis.clickhouse.model) over the spans of the other tenants'
  tail traces, and per tenant how many of those requests waited in the queue for more than half their latency.

The decision over these figures is analysis.neighbours.decide's, the same as over a store's.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analysis.clickhouse.client import Client, literal
from analysis.clickhouse.model import materialize_requests, requests_from_copy
from analysis.clickhouse.server import features
from analysis.neighbours import Tail
from analysis.stats.spikes import Spike

#: Session temporary table of the request model's queue wait over the other tenants' tail traces.
QUEUED_TEMP = "_tailscope_neighbour_requests"


def _in(values: list[int] | list[str]) -> str:
    return ", ".join(literal(v) for v in values) or "NULL"


class ServerFigures:
    """analysis.neighbours.Figures over a ClickHouse table (`table`, otel_traces-shaped) and the report's request
    facts (`facts_table` meeting `cond`); `valued`: the condition of a request counting in the report's frame,
    `col` its value's column, `weight` the adjusted count's column (None: unsampled, each weighs 1)."""

    def __init__(self, client: Client, table: str, facts_table: str, cond: str, valued: str, col: str,
                 weight: str | None) -> None:
        self.client, self.table, self.facts, self.cond = client, table, facts_table, cond
        self.valued, self.col, self.weight = valued, col, weight

    def _rows(self, sql: str) -> list[dict[str, Any]]:
        return list(self.client.query(sql, features(self.client).settings).to_pylist())

    def _frame(self, sql: str) -> pl.DataFrame:
        """The answer to `sql` with its `in_spike` column as booleans (ClickHouse answers a comparison as UInt8)."""
        got = pl.from_arrow(self.client.query(sql, features(self.client).settings))
        assert isinstance(got, pl.DataFrame)
        return got.with_columns(pl.col("in_spike").cast(pl.Boolean))

    def _w(self, prefix: str = "") -> str:
        return "toFloat64(1)" if self.weight is None else f"toFloat64({prefix}{self.weight})"

    def _tail_where(self, spike: Spike) -> str:
        # the frame's rows (analysis.clickhouse.report._rows' condition) in the spike, slower than its baseline p99
        return (f"{self.cond} AND {self.valued} AND start_ns >= {int(spike.start_ns)} AND start_ns < "
                f"{int(spike.end_ns)} AND toFloat64({self.col}) > {float(spike.baseline_p99_ns)!r}")

    def tail(self, spike: Spike) -> Tail:
        got = self._rows(f"SELECT coalesce(tenant, 'None') AS t, count() AS n, sum({self._w()}) AS nw, "
                         f"groupUniqArray(replica) AS r FROM {self.facts} WHERE {self._tail_where(spike)} GROUP BY t")
        replicas = sorted({str(r) for row in got for r in row["r"]})
        counts = {str(row["t"]): int(row["n"]) for row in got}
        if self.weight is None:
            return Tail(replicas, counts, None, None)
        weights = {str(row["t"]): float(row["nw"]) for row in got}
        return Tail(replicas, counts, weights, sum(weights.values()))

    def admitted(self, spike: Spike, replicas: list[str], cells: list[int], w: int) -> pl.DataFrame:
        wt = self._w()
        got = self._frame(
            f"SELECT tenant, start_ns >= {int(spike.start_ns)} AND start_ns < {int(spike.end_ns)} AS in_spike, "
            f"count() AS n, sum({wt}) AS nw, sum({wt} * {wt}) AS nw2, max({wt} != 1) AS weighted FROM {self.facts} "
            f"WHERE {self.cond} AND replica IN ({_in(replicas)}) AND intDiv(start_ns, {int(w)}) * {int(w)} "
            f"IN ({_in(cells)}) GROUP BY tenant, in_spike")
        return got.with_columns(pl.col("weighted").cast(pl.Boolean))

    def gpu(self, spike: Spike, replicas: list[str], cells: list[int], w: int) -> pl.DataFrame:
        # here, not at the top: analysis.cost generates its ClickHouse SQL on import (see analysis.neighbours)
        from analysis.cost import clickhouse_gpu_shares

        lo, hi = min(cells), max(cells) + w
        # the spans of every request overlapping [lo, hi): a request's spans lie within its own interval, so the
        # sweep over them shares [lo, hi) as over the whole table
        got = self._rows(f"SELECT min(start_ns) AS a, max(start_ns + coalesce(e2e_ns, 0)) AS b FROM {self.facts} "
                         f"WHERE start_ns < {int(hi)} AND start_ns + coalesce(e2e_ns, 0) >= {int(lo)}")[0]
        a = min(int(got["a"]), lo) if got["a"] is not None else lo
        b = max(int(got["b"]) + 1, hi) if got["b"] is not None else hi
        where = (f"Timestamp >= fromUnixTimestamp64Nano(toInt64({a})) "
                 f"AND Timestamp < fromUnixTimestamp64Nano(toInt64({b}))")
        # weighted as the store's sweep is when a request weighs other than 1, read off the facts' one column (not a
        # scan of every span's attributes)
        weighted = bool(self._rows(f"SELECT count() AS n FROM {self.facts} WHERE adjusted_count != 1")[0]["n"])
        shares, reps = clickhouse_gpu_shares(self.client, self.table, lo, hi, grid_ns=w, weighted=weighted,
                                             where=where)
        try:
            return self._frame(
                f"SELECT f.tenant AS tenant, s.bucket_ns >= {int(spike.start_ns)} AND s.bucket_ns < "
                f"{int(spike.end_ns)} AS in_spike, toInt64(sum(s.allocated_ns)) AS ns FROM {shares} AS s "
                f"INNER JOIN (SELECT trace_id, span_id, tenant FROM {self.facts} WHERE {self.cond}) AS f "
                f"ON f.trace_id = s.trace_id AND f.span_id = s.request_span_id "
                f"WHERE s.replica IN ({_in(replicas)}) AND s.bucket_ns IN ({_in(cells)}) GROUP BY tenant, in_spike")
        finally:
            for name in (shares, reps):
                self.client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")

    def queued(self, spike: Spike, tenant: str) -> list[tuple[str, int, float, float]]:
        others = f"{self._tail_where(spike)} AND coalesce(tenant, 'None') != {literal(tenant)}"
        got = self._rows(f"SELECT min(start_ns) AS a, max(start_ns + e2e_ns) AS e FROM {self.facts} WHERE {others}")[0]
        if got["a"] is None:
            return []
        lo, hi = int(got["a"]) - 1, int(got["e"]) + 1  # the spans analysis.neighbours.InMemory reads of them
        traces = f"TraceId IN (SELECT trace_id FROM {self.facts} WHERE {others})"
        cols = ("trace_id", "queue_wait_ns")
        # the facts' copy of the spans when it holds the range (no second promotion of the table's spans)
        if not requests_from_copy(self.client, self.table, lo, hi, traces, name=QUEUED_TEMP, columns=cols,
                                  facts=self.facts):
            materialize_requests(self.client, self.table, name=QUEUED_TEMP, columns=cols, where=(
                f"Timestamp >= fromUnixTimestamp64Nano(toInt64({lo})) AND Timestamp < fromUnixTimestamp64Nano("
                f"toInt64({hi})) AND ({traces})"))
        try:
            rows = self._rows(
                f"SELECT coalesce(o.tenant, 'None') AS t, count() AS n, sum(o.w) AS nw, "
                f"sumIf(o.w, r.queue_wait_ns * 2 > o.e2e_ns) AS q FROM (SELECT trace_id, tenant, e2e_ns, "
                f"{self._w()} AS w FROM {self.facts} WHERE {others}) AS o LEFT JOIN {QUEUED_TEMP} AS r "
                f"ON r.trace_id = o.trace_id GROUP BY t")
        finally:
            self.client.command(f"DROP TEMPORARY TABLE IF EXISTS {QUEUED_TEMP}")
        return [(str(r["t"]), int(r["n"]), float(r["nw"]), float(r["q"])) for r in rows]
