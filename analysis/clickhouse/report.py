"""`tailscope report` on ClickHouse: the request model runs on the server, little comes back.

1. The request facts (analysis.engine.model, CLICKHOUSE dialect) are put on the server into a session
   temporary table, for the range asked: read from the materialized `tailscope_requests` where
   analysis.clickhouse.coverage allows, computed from the spans elsewhere (`requests_facts`).
2. Detection (analysis.spikes.detect_windows, the same code and seed as on DuckDB) runs on one
   row per window (count, exact p50 / p99) and asks the server each pooled figure it needs
   (`_ServerValues`); the scan's ranks of the values above the pooled p99 are counted there too (per
   window, per block of scores, the blocks found there and checked on the client from the few groups of
   tied values at their edges: `_ServerValues.exceedances`, the same floats as over the values), so of
   the requests nothing comes back row by row. Sampled requests are weighed there (their
   adjusted counts), and the sampling judgement (sampling.judge) asks the server its counts and
   weighted quantiles (`_ServerJudged`): no per-request row comes back (`_phase1_server`).
3. Only when there is a spike, the explanation of analysis.report runs on the client over figures
   asked of the server: every dimension, built-in or attribute, stays there, asked per spike for
   figures (`_remote_attributes`); the baseline is one count (and summed weight), with its p99s with
   and without each candidate computed there (`_pushed_down`); the spike's requests stay there too,
   each figure the explanation reads of them asked there (`_ServerSpikeRows`: count, weights, p99,
   tail slice, rows above the baseline p99, exemplars). The culprit bounds and the explanation run
   over that one pass (`_bounded_rows`). The stage shares are means computed on the server
   (`_server_stages`: both tails chosen there, the request model run there over their traces), and
   so are the noisy-neighbour step's figures when queue_wait leads (analysis.clickhouse.neighbours: a row
   per tenant comes back; the decision is analysis.neighbours'). When the attribute pass
   failed, the spike windows' fact rows come back with the built-ins, and the baseline as counts per
   combination of them, explained on the client.

The report is the same dict as `analysis.report.build_report` on a store holding the same spans.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, cast

import duckdb
import numpy as np
import polars as pl

from analysis import contract as C
from analysis import report as RP
from analysis.clickhouse import attributes as CA
from analysis.clickhouse.client import DEFAULT_TABLE, Client, literal
from analysis.clickhouse.model import materialize_requests, requests_from_copy, temp_table
from analysis.clickhouse.neighbours import ServerFigures
from analysis.clickhouse.promotion import source_sql
from analysis.clickhouse.quantiles import arrays_sql, kish_sql, quantile_sql
from analysis.clickhouse.requests import requests_facts, span_where
from analysis.clickhouse.server import features
from analysis.engine import model as M
from analysis.engine import percentiles as P
from analysis.engine.connect import duck_type
from analysis.engine.percentiles import metric_column, ms, parse_time
from analysis.stats import attributes as A
from analysis.stats import explain as X
from analysis.stats import sampling as SM
from analysis.stats import spikes as SP
from analysis.stats.spikes import Detection, Spike
from tracing import schema as S
from tracing.errors import QueryError

if TYPE_CHECKING:
    import pyarrow as pa

#: Span columns a trace's waterfall reads (`Fetcher.traces`' default).
SPAN_INPUTS = ("TraceId", "SpanId", "ParentSpanId", "TimestampNs", "Duration", "Stage", "IsRequest", "Replica")
#: Session temporary table of the request facts of one report.
FACTS_TEMP = "_tailscope_facts"
#: Fact columns whose local (DuckDB) type is not read off their name.
_DUCK_TYPES: Final = {"adjusted_count": "DOUBLE"}
H = M.HOUR_NS


#: Spans a request starting in [lo, hi) may read (the model reads stage spans within an hour before).
_span_where = span_where


@dataclasses.dataclass(frozen=True)
class Asked:
    """What every step of a ClickHouse report shares: the client and table, the facts' session table, the
    condition on them (range and filters), and the report's options (`lo` / `hi`: the range in ns)."""

    client: Client
    table: str
    facts_table: str
    cond: str
    metric: str
    window_s: float | str | None
    lo: int | None
    hi: int | None
    include_failures: bool
    sampling_policy: str


def _in_range(lo_ns: int | None, hi_ns: int | None, col: str = "start_ns") -> str:
    return P.in_range_sql(col, lo_ns, hi_ns)


def _facts(client: Client, table: str, metric: str, lo: int | None, hi: int | None, facts: str | None,
           materialized: bool = True) -> str:
    """`facts` when given, else the request facts of [lo, hi) in FACTS_TEMP (no stage columns): read from the
    materialized requests table where `clickhouse.coverage` allows (`materialized`), computed elsewhere."""
    if facts is not None:
        return facts
    cols = tuple(c for c in M.FACT_COLUMNS if metric != "e2e" or c not in ("ttft_ns", "tpot_ns"))
    return requests_facts(client, table, lo_ns=lo, hi_ns=hi, name=FACTS_TEMP, columns=cols, materialized=materialized)


class _ServerValues:
    """spikes.WindowValues answered on the server: the values of `where` in `facts`, windows intDiv(start_ns, w).

    Each question is one aggregate over the requests; only its figures come back.
    """

    def __init__(self, client: Client, facts: str, where: str, value: str, weight: str | None, window_ns: int
                 ) -> None:
        self.client, self.facts, self.where, self.value, self.weight = client, facts, where, value, weight
        self.w = window_ns
        self.wins = np.zeros(0, dtype=np.int64)

    def _arrays(self) -> str:
        return arrays_sql(self.value, self.weight)

    def _quantiles(self) -> str:
        return f"{quantile_sql(self.weight, 0.5)} AS p50, {quantile_sql(self.weight, 0.99)} AS p99"

    def windows(self) -> pl.DataFrame:
        """Per window (ascending): win, n, p50, p99, tot (weighted count), sq (sum of squared weights)."""
        got = pl.from_arrow(self.client.query(
            f"SELECT win, length(s) AS n, {self._quantiles()}, tot, sq FROM (SELECT intDiv(start_ns, {self.w}) "
            f"AS win, {self._arrays()} FROM {self.facts} WHERE {self.where} GROUP BY win) ORDER BY win",
            features(self.client).settings))
        assert isinstance(got, pl.DataFrame)
        self.wins = got.get_column("win").to_numpy().astype(np.int64)
        return got

    def _listed(self, windows: np.ndarray) -> str:
        return ", ".join(str(int(x)) for x in self.wins[windows]) or "NULL"

    def pool(self, windows: np.ndarray) -> SP.Pool:
        """The flagged windows' values pooled on the server."""
        return self.pool_where(f"intDiv(start_ns, {self.w}) IN ({self._listed(windows)})")

    def pool_where(self, cond: str) -> SP.Pool:
        """The values of the requests meeting `cond` too, pooled on the server."""
        row = self.client.query(
            f"SELECT length(s) AS n, {self._quantiles()}, tot, sq FROM (SELECT {self._arrays()} FROM {self.facts} "
            f"WHERE {self.where} AND {cond})", features(self.client).settings).to_pylist()[0]
        n = int(row["n"])
        eff = float(n) if self.weight is None else (row["tot"] ** 2 / row["sq"] if row["sq"] > 0 else 0.0)
        return SP.Pool(float(row["p50"]), float(row["p99"]), n, float(row["tot"]), eff)

    def exceedances(self, threshold: float, judged: np.ndarray) -> SP.Exceedances:
        """The values above `threshold` as the scan reads them, from counts only: per window how many; of the judged
        windows' ones, where each block of scores starts (`_blocks`) and, per window, how many fall in each block
        (`spikes.summed_by_block` the sums: the same floats as over the values). One row per window comes back, and
        one row of the blocks."""
        over = f"{self.where} AND toFloat64({self.value}) > {threshold!r}"
        win = f"intDiv(start_ns, {self.w})"
        got = self.client.query(f"SELECT {win} AS win, count() AS k FROM {self.facts} WHERE {over} GROUP BY win")
        exceed = np.zeros(self.wins.size, dtype=np.int64)
        exceed[np.searchsorted(self.wins, got.column("win").to_numpy().astype(np.int64))] = got.column("k").to_numpy()
        total_k = int(exceed[judged].sum())
        if total_k == 0:
            return SP.Exceedances(exceed, np.zeros(0), np.zeros(self.wins.size))
        mine = f"{over} AND {win} IN ({self._listed(judged)})"
        scores, firsts = self._blocks(mine, total_k)
        blocks = self.client.query(
            f"SELECT win, groupArray(b) AS bs, groupArray(c) AS cs FROM (SELECT win, b, count() AS c FROM (SELECT "
            f"{win} AS win, arrayCount(f -> f <= r, [{', '.join(str(int(x)) for x in firsts)}]) - 1 AS b FROM (SELECT "
            f"start_ns, rank() OVER (ORDER BY toFloat64({self.value})) - 1 AS r FROM {self.facts} WHERE {mine})) "
            f"GROUP BY win, b) GROUP BY win").to_pylist()
        at = np.searchsorted(self.wins, np.asarray([int(r["win"]) for r in blocks], dtype=np.int64))
        sizes = [len(r["bs"]) for r in blocks]
        flat_b = np.asarray([b for r in blocks for b in r["bs"]], dtype=np.int64)
        flat_c = np.asarray([c for r in blocks for c in r["cs"]], dtype=np.int64)
        return SP.Exceedances(exceed, scores, SP.summed_by_block(np.repeat(at, sizes).astype(np.int64), flat_b,
                                                                 flat_c, scores, firsts, self.wins.size))

    def _blocks(self, mine: str, total_k: int) -> tuple[np.ndarray, np.ndarray]:
        """The block scores and first ranks of the `total_k` values meeting `mine` (`spikes.block_scores` of their
        tail scores), from one row: the server groups the equal values, scores each group by its ranks (its mean
        Savage score; the sums of harmonic numbers in its own floats) and runs the blocks' rule over them, and sends
        the blocks' first ranks with the groups holding the ranks the rule reads (`spikes.verified_blocks`: at most
        2 B + 1 of them, B <= H_K / SCORE_BLOCK_SPREAD + 1 blocks). The client checks the rule in its own floats;
        only when they would choose otherwise (a score within rounding of a block's edge) does every group of two
        or more equal values come back (one row a group) for `spikes.tied_scores`."""
        groups = f"SELECT toFloat64({self.value}) AS v, count() AS c FROM {self.facts} WHERE {mine} GROUP BY v"
        # per group of equal values (ascending, 1-based i): cs its size, lo its first rank, sc its mean score from
        # h[n + 1] = H_n and d[n + 1] = H_0 + ... + H_(n - 1) (a lone value's H_K - H_(K-lo-1)); js the groups where
        # the blocks start, from the top down (each step one search: the first group within the spread of the top
        # of what is left), at most H_K / spread + 1 steps; gi the groups at the blocks' edges and the largest
        spread = SP.SCORE_BLOCK_SPREAD
        row = self.client.query(
            f"SELECT k, arrayMap(j -> lo[j], arrayReverse(js)) AS fs, arrayMap(i -> lo[i], gi) AS glo, "
            f"arrayMap(i -> cs[i], gi) AS gc FROM (SELECT k, lo, cs, js, arraySort(arrayDistinct(arrayFilter(i -> "
            f"i > 0, arrayConcat(js, arrayMap(j -> toUInt64(j - 1), js), [toUInt64(length(cs))])))) AS gi FROM ("
            f"SELECT k, lo, cs, arrayFold((acc, step) -> if(length(acc) > 0 AND acc[-1] = 1, acc, arrayPushBack(acc, "
            f"toUInt64(arrayFirstIndex(x -> x >= sc[if(length(acc) = 0, length(sc), toUInt64(acc[-1] - 1))] - "
            f"{spread!r}, sc)))), range(toUInt64(hk / {spread!r}) + 2), CAST([], 'Array(UInt64)')) AS js "
            f"FROM (SELECT k, lo, cs, h[k + 1] AS hk, arrayMap((l, c) -> if(c = 1, hk - h[k - l], hk - (d[k - l + 1] - "
            f"d[k - l - c + 1]) / c), lo, cs) AS sc FROM (SELECT arrayMap(g -> g.2, arraySort(groupArray((v, c)))) "
            f"AS cs, arraySum(cs) AS k, arrayMap((e, c) -> e - c, arrayCumSum(cs), cs) AS lo, "
            f"arrayConcat([0.], arrayCumSum(arrayMap(i -> 1 / i, range(1, k + 1)))) AS h, "
            f"arrayConcat([0.], arrayCumSum(h)) AS d FROM ({groups})))))").to_pylist()[0]
        got = None if int(row["k"]) != total_k else SP.verified_blocks(
            total_k, np.asarray(row["fs"], dtype=np.int64), np.asarray(row["glo"], dtype=np.int64),
            np.asarray(row["gc"], dtype=np.int64))
        if got is not None:
            return got
        ties = self.client.query(
            f"SELECT lo_rank, c FROM (SELECT c, sum(c) OVER (ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT "
            f"ROW) - c AS lo_rank FROM ({groups})) WHERE c > 1")
        return SP.tied_scores(total_k, ties.column("lo_rank").to_numpy().astype(np.int64),
                              ties.column("c").to_numpy().astype(np.int64))


#: Session temporary table of what the sampling judgement reads, one row per analysed value (`_ServerJudged`).
JUDGED_TEMP = "_tailscope_judged"


class _ServerJudged:
    """sampling.JudgeInputs answered on the server over `table`'s columns v (value), w (weight), failed, recorded and
    malformed (one row per analysed value): each question is one aggregate, only its figures come back."""

    def __init__(self, client: Client, table: str) -> None:
        self.client, self.table = client, table

    def _row(self, select: str, where: str = "TRUE") -> dict[str, Any]:
        return dict(self.client.query(f"SELECT {select} FROM {self.table} WHERE {where}",
                                      features(self.client).settings).to_pylist()[0])

    def counts(self) -> SM.Counts:
        """The values counted."""
        row = self._row("countIf(recorded) AS r, countIf(NOT recorded) AS u, countIf(malformed) AS m, "
                        "countIf(w != 1) AS x")
        return SM.Counts(int(row["r"]), int(row["u"]), int(row["m"]), int(row["x"]) > 0)

    def quantiles(self, qs: tuple[float, ...], recorded_only: bool = False) -> list[float]:
        """Weighted quantiles by percentiles.weighted_quantile_sorted's rule (`clickhouse.wq_sql`)."""
        wanted = ", ".join(f"{quantile_sql('w', q)} AS q{i}" for i, q in enumerate(qs))
        got = self.client.query(
            f"SELECT {wanted} FROM (SELECT {arrays_sql('v', 'w')} FROM {self.table} "
            f"WHERE {'recorded' if recorded_only else 'TRUE'})", features(self.client).settings).to_pylist()[0]
        return [float(got[f"q{i}"]) for i in range(len(qs))]

    def unrecorded_split(self, slower_than: float | None) -> tuple[int, int, int, int]:
        """Counts of marked / unrecorded values, in and out of the mark."""
        mark = "failed" if slower_than is None else f"toFloat64(v) > {float(slower_than)!r}"
        row = self._row(f"countIf({mark}) AS a, countIf({mark} AND NOT recorded) AS b, countIf(NOT ({mark})) AS c, "
                        f"countIf(NOT ({mark}) AND NOT recorded) AS d")
        return int(row["a"]), int(row["b"]), int(row["c"]), int(row["d"])


def _judge_on_server(client: Client, table: str, facts_table: str, valued: str, col: str, lo: int | None,
                     hi: int | None, policy: str) -> SM.SamplingView:
    """sampling.judge over the analysed values (`valued` among `facts_table`'s), their sampling records read from the
    spans' request spans: every figure on the server (JUDGED_TEMP), none of their rows come back."""
    rec, bad = M.sampling_record_sql(M.CLICKHOUSE)
    temp_table(client, JUDGED_TEMP, (
        f"SELECT toFloat64({col}) AS v, toFloat64(adjusted_count) AS w, status != 'ok' AS failed, "
        f"coalesce(s.rec, false) AS recorded, coalesce(s.bad, false) AS malformed FROM {facts_table} AS f "
        f"LEFT JOIN (SELECT TraceId, TimestampNs, max({rec}) AS rec, max({bad}) AS bad "
        f"FROM {source_sql(table, _span_where(lo, hi))} WHERE IsRequest GROUP BY TraceId, TimestampNs) AS s "
        f"ON s.TraceId = f.trace_id AND s.TimestampNs = f.start_ns WHERE {valued}"))
    try:
        return SM.judge(_ServerJudged(client, JUDGED_TEMP), policy)
    finally:
        client.command(f"DROP TEMPORARY TABLE IF EXISTS {JUDGED_TEMP}")


def _phase1_server(q: Asked) -> tuple[C.Report, Detection | None, _ServerValues | None]:
    """analysis.report._prepare on the server: the counts (and weighted counts), the per-window table, each pooled
    figure detection asks for and the scan's counts come back (per window, and one row of its blocks of scores:
    `_ServerValues.exceedances`), nothing per request. Sampled requests
    (or a declared policy) are judged on the server too (`_judge_on_server`, their records read from `table`)."""
    client, table, facts_table, cond, metric, window_s = q.client, q.table, q.facts_table, q.cond, q.metric, q.window_s
    lo, hi, include_failures, sampling_policy = q.lo, q.hi, q.include_failures, q.sampling_policy
    if sampling_policy not in SM.POLICIES:
        raise QueryError("", f"unknown sampling policy {sampling_policy!r}; use one of {', '.join(SM.POLICIES)}")
    col = metric_column(metric)
    keep = "" if include_failures else " AND status = 'ok'"
    valued = f"{cond} AND {col} IS NOT NULL{keep}"
    is_valued = f"{col} IS NOT NULL{keep}"
    row = client.query(
        f"SELECT count() AS requests, countIf(status = 'ok') AS ok, countIf(status = 'error') AS error, "
        f"countIf(status = 'timeout') AS timeout, countIf(status = 'cancelled') AS cancelled, "
        f"min(start_ns) AS first_ns, max(start_ns) AS last_ns, countIf({is_valued}) AS values, "
        f"countIf(adjusted_count != 1) AS any_weighted, "
        f"countIf({is_valued} AND adjusted_count != 1) AS values_weighted, "
        f"sum(toFloat64(adjusted_count)) AS w_requests, sumIf(toFloat64(adjusted_count), status = 'ok') AS w_ok, "
        f"sumIf(toFloat64(adjusted_count), status = 'error') AS w_error, "
        f"sumIf(toFloat64(adjusted_count), status = 'timeout') AS w_timeout, "
        f"sumIf(toFloat64(adjusted_count), status = 'cancelled') AS w_cancelled, "
        f"sumIf(toFloat64(adjusted_count), {is_valued}) AS w_values, "
        f"sumIf(toFloat64(adjusted_count) * toFloat64(adjusted_count), {is_valued}) AS sq_values "
        f"FROM {facts_table} WHERE {cond}").to_pylist()[0]
    counts = {k: int(row[k] or 0) for k in ("requests", "ok", "error", "timeout", "cancelled")}
    values = int(row["values"])
    # the store's rule (report._frame_parts, detect): weighted counts when any request in range weighs other than 1,
    # weighted detection when any analysed value does
    sampled = int(row["any_weighted"] or 0) > 0
    weighted = ({k: float(row[f"w_{k}"] or 0.0) for k in ("requests", "ok", "error", "timeout", "cancelled")}
                if sampled else None)
    win = P.parse_duration(window_s) if window_s is not None else P.auto_window_s(
        counts["requests"], max((hi if hi is not None else int(row["last_ns"] or 0) + 1)
                                - (lo if lo is not None else int(row["first_ns"] or 0)), 1) / 1e9)
    report = RP.report_header(metric, win, counts, include_failures, lo, hi, values, weighted, None)
    if sampled:  # as report_header over the values' weights
        tot, sq = float(row["w_values"] or 0.0), float(row["sq_values"] or 0.0)
        report["values_weighted"] = tot
        report["values_effective"] = round(tot * tot / sq, 3) if sq else 0.0
    if values == 0:
        report["errors"].append(f"could not compute spikes because no request has a {metric} value in range")
        return report, None, None
    weigh = int(row["values_weighted"] or 0) > 0
    source = _ServerValues(client, facts_table, valued, col, "adjusted_count" if weigh else None, round(win * 1e9))
    try:
        t = source.windows()
        n = t.get_column("n").to_numpy().astype(np.int64)
        tot_w = t.get_column("tot").to_numpy().astype(np.float64)
        sq_w = t.get_column("sq").to_numpy().astype(np.float64)
        eff = np.divide(tot_w * tot_w, sq_w, out=np.zeros_like(tot_w), where=sq_w > 0) if weigh else n.astype(
            np.float64)
        det = SP.detect_windows(source.w, source.wins, n, t.get_column("p50").to_numpy().astype(np.float64),
                                t.get_column("p99").to_numpy().astype(np.float64),
                                tot_w if weigh else n.astype(np.float64), eff, source, weighted=weigh)
    except Exception as exc:
        report["errors"].append(f"could not compute spikes because {exc}")
        return report, None, None
    report["windows"] = int(det.n.size)
    report["baseline_p50_ms"] = ms(det.baseline_p50_ns)
    report["baseline_p99_ms"] = ms(det.baseline_p99_ns)
    if det.baseline.any():
        report["baseline_effective"] = (round(source.pool(det.baseline).n_effective, 3) if sampled
                                        else float(det.n[det.baseline].sum()))
    if sampled or sampling_policy != "auto":
        try:
            RP.record_sampling(report, _judge_on_server(client, table, facts_table, valued, col, lo, hi,
                                                        sampling_policy))
        except Exception as exc:
            report["errors"].append(f"could not judge the sampling because {str(exc).splitlines()[0]}")
    if det.note:
        report["errors"].append(f"could not compute spikes because {det.note}")
    return report, det, source


def _windows(det: Detection, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Window numbers (start // window) covering the time ranges."""
    w = det.window_ns
    return np.unique(np.concatenate([np.zeros(0, dtype=np.int64)] + [np.arange(a // w, -(-b // w), dtype=np.int64)
                                                                      for a, b in ranges]))


def _in_windows(det: Detection, windows: np.ndarray) -> str:
    """A condition: the request starts in one of `windows` (window numbers)."""
    return f"intDiv(start_ns, {det.window_ns}) IN ({', '.join(str(int(x)) for x in np.unique(windows)) or 'NULL'})"


def _duck_type(col: str) -> str:
    """The local (DuckDB) type of a fact column."""
    return _DUCK_TYPES.get(col, "BIGINT" if col.endswith("_ns") or col.endswith("tokens") else "VARCHAR")


def _pull_facts(client: Client, local: duckdb.DuckDBPyConnection, facts_table: str, where: str | None, metric: str,
                dims: Sequence[str] = X.DIMENSIONS) -> pa.Table | None:
    """The fact rows meeting `where` appended to the local `_phase2` (created on the first pull, by start; None: only
    created, empty); of the built-in dimensions only `dims` (the others null: the server explains them)."""
    # the columns analysis.report's explanation reads (its `source=` contract), nothing more
    wanted_cols = ["trace_id", "span_id", "start_ns", "e2e_ns", "status",
                   *(d if d in dims else f"CAST(NULL AS Nullable({'Int64' if d in X.BUCKETED else 'String'})) AS {d}"
                     for d in X.DIMENSIONS)] + (
        ["ttft_ns", "tpot_ns"] if metric != "e2e" else []) + ["adjusted_count"]
    names = [c.split(" AS ")[-1] for c in wanted_cols]
    exists = local.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = '_phase2'").fetchall()[0][0]
    if where is None:  # none wanted yet: the table made empty, nothing asked of the server
        if not exists:
            local.execute(f"CREATE TABLE _phase2 ({', '.join(f'{c} {_duck_type(c)}' for c in names)})")
        return None
    facts = client.query(f"SELECT {', '.join(wanted_cols)} FROM {facts_table} WHERE {where}")
    local.register("_facts_arrow", facts)
    select = "SELECT " + ", ".join(f"{c}::{_duck_type(c)} AS {c}" for c in facts.column_names) + (
        " FROM _facts_arrow ORDER BY start_ns")
    local.execute(f"INSERT INTO _phase2 {select}" if exists else f"CREATE TABLE _phase2 AS {select}")
    local.unregister("_facts_arrow")
    return facts


def build_report(client: Client, table: str = DEFAULT_TABLE, metric: str = "e2e",
                 window_s: float | str | None = None, since: str | int | datetime | None = None,
                 until: str | int | datetime | None = None, include_failures: bool = True,
                 sampling_policy: str = "auto", *, facts: str | None = None, where: str = "TRUE",
                 materialized: bool = True, dimensions: str | tuple[str, ...] | None = None,
                 exclude_dimensions: str | tuple[str, ...] | None = None) -> C.Report:
    """The `report --json` dict of the spans in `table` (otel_traces-shaped), computed as described above.

    `facts`: a session table already holding the request facts of `table` (the dashboard's),
    used instead of computing them; `where`: a ClickHouse condition on the fact columns (filters);
    `materialized`: read the intervals the materialized requests table covers (False: all on the fly);
    `dimensions` / `exclude_dimensions`: glob patterns of the dimensions considered, as analysis.report's.
    """
    lo, hi = parse_time(since), parse_time(until)
    facts_table = _facts(client, table, metric, lo, hi, facts, materialized)
    q = Asked(client, table, facts_table, f"{_in_range(lo, hi)} AND ({where})", metric, window_s, lo, hi,
              include_failures, sampling_policy)
    # detection (and the sampling judgement) on the server: only figures come back unless there is a spike
    report, det, _ = _phase1_server(q)
    local = duckdb.connect(":memory:")
    try:
        attrs = _attributes(q, report, RP.attribute_rules(dimensions, exclude_dimensions))
        if det is not None and det.spikes:
            report["spikes"] = RP.explain_all(_bounded_rows(q, local, det, report["sampled"], attrs), det.spikes)
    finally:
        local.close()
        CA.drop(client)
    for item in report["spikes"]:
        report["errors"].extend(item["errors"])
    return report


def _attributes(q: Asked, report: C.Report | dict[str, Any], rules: A.AttributeRules
                ) -> tuple[CA.ServerAttributes, A.AttributeRules]:
    """The attribute dimensions of the report's frame (its requests with a value) read on the server
    (analysis.clickhouse.attributes), recorded in the report's `attributes` as analysis.report does."""
    keep = "" if q.include_failures else " AND status = 'ok'"
    col = metric_column(q.metric)
    attrs = CA.read_attributes(q.client, q.table, q.facts_table, f"{q.cond} AND {col} IS NOT NULL{keep}", q.lo, q.hi,
                               rules, value=col)
    RP.skip_ruled_out_builtins(attrs.attrs, list(X.DIMENSIONS), rules)
    report["attributes"] = cast(Any, attrs.attrs.to_json())
    report["errors"].extend(attrs.attrs.errors)
    return attrs, rules


def _slow_counts(q: Asked, det: Detection, server: CA.ServerAttributes | None) -> RP.SlowCounts:
    """analysis.report.SlowCounts on the server: per window, the requests slower than the baseline p99 matching a
    candidate, and all of them (one row per window comes back)."""
    col = metric_column(q.metric) if q.metric in RP.REPORT_METRICS else "e2e_ns"
    keep = "" if q.include_failures else " AND status = 'ok'"
    index = {int(w): i for i, w in enumerate((det.window_start_ns // det.window_ns).tolist())}

    def slow_counts(coded: list[X.Coded], cand: X.Candidate) -> tuple[np.ndarray, np.ndarray]:
        got = q.client.query(
            f"SELECT intDiv(start_ns, {det.window_ns}) AS win, count() AS m, "
            f"countIf({_candidate_sql(coded, cand, server)}) AS k FROM {q.facts_table} WHERE {q.cond} "
            f"AND {col} IS NOT NULL{keep} AND toFloat64({col}) > {float(det.baseline_p99_ns)!r} GROUP BY win"
        ).to_pylist()
        k, m = np.zeros(len(index), dtype=np.int64), np.zeros(len(index), dtype=np.int64)
        for r in got:
            if int(r["win"]) in index:
                k[index[int(r["win"])]], m[index[int(r["win"])]] = int(r["k"]), int(r["m"])
        return k, m

    return slow_counts


def _bounded_rows(q: Asked, local: duckdb.DuckDBPyConnection, det: Detection, sampled: bool,
                  attrs: tuple[CA.ServerAttributes, A.AttributeRules] | None) -> RP.Rows:
    """analysis.report.culprit_bounds on ClickHouse (`det.spikes` moved to their culprits' windows), then the rows
    their explanation reads, from one pass: the culprit is ranked over the rows phase 2 brings for the detected
    spikes (`_rows`; the slow requests counted per window on the server), and those same rows are explained when
    every window the moved spikes read row by row is among them. Only when a spike moved past them is phase 2 read
    again for the moved spikes, the rows already read kept (only the new windows' rows come back)."""
    rows, read = _rows(q, local, det, det.spikes, sampled, attrs)
    if not RP.culprit_bounds(rows, _slow_counts(q, det, attrs[0] if attrs is not None else None)):
        return rows
    spike_windows = _windows(det, [(s.start_ns, s.end_ns) for s in det.spikes])
    if rows.spike_rows is not None or set(spike_windows.tolist()) <= read:  # (the server's: the moved ones' too)
        return rows
    _reset(local, keep_facts=True)
    return _rows(q, local, det, det.spikes, sampled, attrs, held=read)[0]


def _reset(local: duckdb.DuckDBPyConnection, keep_facts: bool = False) -> None:
    """Drop phase 2's local tables (`_rows` makes them again); `keep_facts`: all but the fact rows read."""
    local.execute("DROP VIEW IF EXISTS spans")
    local.execute("DROP TABLE IF EXISTS _spans_local")
    if not keep_facts:
        local.execute("DROP TABLE IF EXISTS _phase2")


def _rows(q: Asked, local: duckdb.DuckDBPyConnection, det: Detection, spikes: list[Spike], sampled: bool,
          attrs: tuple[CA.ServerAttributes, A.AttributeRules] | None = None, held: set[int] | None = None
          ) -> tuple[RP.Rows, set[int]]:
    """Phase 2: the fact rows the explanation of `spikes` reads one by one come into the local `_phase2`, for
    analysis.report's explanation to run there; with the windows read row by row. `attrs`: the attribute dimensions
    on the server (`_attributes`): their codes stay there, every figure the explanation reads of them is asked
    there (`_remote_attributes`); the noisy-neighbour step's figures are asked there too (`ServerFigures`);
    `held`: windows whose rows `_phase2` already holds (read again from it, not from the server)."""
    metric, include_failures, lo, hi = q.metric, q.include_failures, q.lo, q.hi
    col = metric_column(metric) if metric in RP.REPORT_METRICS else "e2e_ns"
    keep = "" if include_failures else " AND status = 'ok'"
    server = attrs[0] if attrs is not None else None
    valued, weight = f"{col} IS NOT NULL{keep}", "adjusted_count" if sampled else None  # a frame row; its weight
    rest, read = _pushed_down(q, local, det, spikes, valued, col, weight, server, held or set())

    def local_frame() -> pl.DataFrame:
        return local.sql(
            f"SELECT rowid AS rid, start_ns, e2e_ns, {col}::DOUBLE AS value, "
            f"{', '.join(X.DIMENSIONS)}{', adjusted_count AS weight, status' if sampled else ''}, trace_id, span_id "
            f"FROM _phase2 WHERE {_in_range(lo, hi)} AND {valued} ORDER BY start_ns").pl()

    frame = local_frame()
    remote = None
    if attrs is not None:
        remote = _remote_attributes(q.client, attrs[0], attrs[1], det, frame)
    frame = frame.drop(["trace_id", "span_id"])
    spike_rows = _ServerSpikeRows(q.client, server, sampled) if server is not None and _on_server(server, col) else None
    neighbours = ServerFigures(q.client, q.table, q.facts_table, q.cond, valued, col, weight)
    return RP.Rows.of(local, "_phase2", frame, det, metric, neighbours=neighbours, rest=rest, attributes=remote,
                      stages=_server_stages(q, det, valued, col, weight), spike_rows=spike_rows), read


def _on_server(attrs: CA.ServerAttributes, col: str) -> bool:
    """Whether every dimension is counted on the server over the frame of `col` (CA.ATTR_TEMP holds its values and
    the built-ins' labels): then the spike windows' requests stay there too (`_ServerSpikeRows`)."""
    return attrs.builtin is not None and attrs.value == col


class _ServerSpikeRows:
    """analysis.report.SpikeRows over the attribute pass's frame (CA.ATTR_TEMP: ids, start, the value v and the
    adjusted count w of each request): a spike's requests named by their start range, each figure the explanation
    reads of them one query (a row of figures comes back; the exemplars, at most MAX_EXEMPLARS trace ids). The
    rules are explain's: the tail by `tail_sql` (explain.tail_slice's), the p99 and the weights' sums by
    clickhouse.quantiles (percentiles.weighted_quantile_sorted's, explain.weighted_q's)."""

    def __init__(self, client: Client, attrs: CA.ServerAttributes, weighted: bool) -> None:
        """`weighted`: the requests are sampled (their adjusted counts weigh)."""
        self.client, self.attrs = client, attrs
        self.weight = "w" if weighted else None
        self._asked: dict[str, X.Counted] = {}

    def _counted(self, where: str) -> X.Counted:
        if where not in self._asked:
            row = self.client.query(
                f"SELECT length(s) AS n, {quantile_sql(self.weight, X.TAIL_Q)} AS q, tot, sq FROM (SELECT "
                f"{arrays_sql('v', self.weight)} FROM {CA.ATTR_TEMP} WHERE {where})",
                features(self.client).settings).to_pylist()[0]
            tot, sq = float(row["tot"]), float(row["sq"])
            weighted = self.weight is not None
            self._asked[where] = X.Counted(int(row["n"]), where, tot if weighted else None,
                                           (tot * tot / sq if sq > 0 else 0.0) if weighted else None,
                                           float(row["q"]))
        return self._asked[where]

    def rows(self, spike: Spike) -> X.Counted:
        """The spike's requests, with their (weighted) p99."""
        return self._counted(f"(start_ns >= {int(spike.start_ns)} AND start_ns < {int(spike.end_ns)})")

    def tail(self, spike: Spike) -> X.Counted:
        """Their tail slice (explain.tail_slice's rows, chosen by `tail_sql`)."""
        sql, _ = tail_sql(self.client, CA.ATTR_TEMP, self.rows(spike).where, "v", self.weight, "trace_id, span_id")
        return self._counted(f"((trace_id, span_id) IN (SELECT trace_id, span_id FROM ({sql})))")

    def excess(self, spike: Spike, tail: X.Counted) -> X.Counted:
        """Those slower than the spike's baseline p99, or `tail` when fewer than MIN_TAIL_SLICE."""
        got = self._counted(f"({self.rows(spike).where} AND v > {float(spike.baseline_p99_ns)!r})")
        return got if got.n >= X.MIN_TAIL_SLICE else tail

    def exemplars(self, spike: Spike, coded: Sequence[X.Coded], best: X.Candidate | None) -> list[str]:
        """explain.exemplar_rows: of the spike's requests at or above its p99 (else its tail), those matching `best`
        first, then by value, then start; their trace ids."""
        pool = f"({self.rows(spike).where} AND v >= {float(spike.p99_ns)!r})"
        if self._counted(pool).n == 0:
            pool = self.tail(spike).where
        first = "false" if best is None else f"coalesce({self.attrs.matches(coded, best)}, false)"
        got = self.client.query(f"SELECT toString(trace_id) AS t FROM {CA.ATTR_TEMP} WHERE {pool} "
                                f"ORDER BY NOT ({first}), v, start_ns LIMIT {X.MAX_EXEMPLARS}")
        return [str(t) for t in got.column("t").to_pylist()]


def tail_sql(client: Client, facts: str, where: str, col: str, weight: str | None,
             cols: str = "trace_id, start_ns, e2e_ns") -> tuple[str, int]:
    """(a query of the tail slice of `facts`' requests meeting `where`: `cols`, v (the value
    `col`) and w (the adjusted count `weight`, 1 when None); how many rows it holds), chosen as explain.tail_slice
    chooses them over the same rows in start order: sorted by value descending, then start, the first
    explain.tail_size of them, or weighted the first holding (1 - q) of the weight. One row of figures comes back."""
    v = f"toFloat64({col})"
    w = "toFloat64(1)" if weight is None else f"toFloat64({weight})"
    if weight is None:
        n = client.query(f"SELECT count() AS n FROM {facts} WHERE {where}").to_pylist()[0]["n"]
        k = X.tail_size(int(n))
    else:  # explain.tail_slice's weighted rule: the running sum of the weights in that order
        share = X.tail_share()  # the cut as explain.tail_weight computes it
        got = client.query(
            f"SELECT length(c) AS n, arrayFirstIndex(x -> x >= c[length(c)] * {share.numerator} / "
            f"{share.denominator}, c) AS k "
            f"FROM (SELECT arrayCumSum(arrayMap(x -> x.3, arraySort(x -> (-x.1, x.2), "
            f"groupArray(({v}, start_ns, {w}))))) AS c FROM {facts} WHERE {where})",
            features(client).settings).to_pylist()[0]
        n = int(got["n"])
        k = min(n, max(X.MIN_TAIL_SLICE, int(got["k"]) or n + 1))
    return (f"SELECT {cols}, {v} AS v, {w} AS w FROM {facts} WHERE {where} "
            f"ORDER BY v DESC, start_ns ASC LIMIT {k}"), k


#: Session temporary table of the requests (trace id and stage columns) in the traces of a spike's two tails.
STAGES_TEMP = "_tailscope_stage_requests"


def _server_stages(q: Asked, det: Detection, valued: str, col: str, weight: str | None) -> RP.RemoteStages:
    """analysis.report's stage shares computed on the server (RP.RemoteStages): the spike's and the local
    baseline's tails chosen there as explain.tail_slice chooses them (by value descending, then start; weighted, the
    slowest requests holding (1 - q) of the weight), the request model run there over the spans of both tails'
    traces (the spans the store's report reads: explain.stage_rows), and each stage's mean over either tail. Each
    query returns one row, the last one row a tail: no request's row and no span comes back."""
    client = q.client

    def one(sql: str) -> dict[str, Any]:
        return dict(client.query(sql, features(client).settings).to_pylist()[0])

    def stages(spike: Spike, local: np.ndarray, names: Sequence[str]) -> list[C.StageShare]:
        mine, k_spike = tail_sql(client, q.facts_table, f"{q.cond} AND {valued} AND start_ns >= {int(spike.start_ns)} "
                                                        f"AND start_ns < {int(spike.end_ns)}", col, weight)
        base, k = tail_sql(client, q.facts_table, f"{q.cond} AND {valued} AND "
                                                  f"{_in_windows(det, local // det.window_ns)}", col, weight)
        both = " UNION ALL ".join(f"SELECT start_ns, e2e_ns FROM ({t})" for t, n in ((mine, k_spike), (base, k)) if n)
        if not both:
            raise ValueError("the spike has no request with a value")
        got = one(f"SELECT min(start_ns) AS a, max(e2e_ns) AS l, max(start_ns + e2e_ns) AS e FROM ({both})")
        lo, hi = int(got["a"]) - int(got["l"]), int(got["e"]) + 1  # a span overlapping a tail request starts here
        # each trace once a tail, weighing its first request's adjusted count in tail order (explain.stage_shares)
        tails = " UNION ALL ".join(f"SELECT trace_id, argMin(w, (-v, start_ns)) AS w, {g} AS g FROM ({t}) "
                                   f"GROUP BY trace_id" for g, t in enumerate((mine, base)))
        cols = tuple(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS)
        in_tails = f"TraceId IN (SELECT trace_id FROM ({mine})) OR TraceId IN (SELECT trace_id FROM ({base}))"
        # the facts' copy of the spans when it holds the range (no second promotion of the table's spans)
        if not requests_from_copy(client, q.table, lo, hi, in_tails, name=STAGES_TEMP, columns=("trace_id", *cols),
                                  facts=q.facts_table):
            materialize_requests(client, q.table, name=STAGES_TEMP, columns=("trace_id", *cols), where=(
                f"Timestamp >= fromUnixTimestamp64Nano(toInt64({lo})) AND Timestamp < fromUnixTimestamp64Nano("
                f"toInt64({hi})) AND ({in_tails})"))
        try:
            means = ", ".join(
                f"sumIf(toFloat64({c}) * t.w, {c} IS NOT NULL) / sumIf(t.w, {c} IS NOT NULL) AS {c}"
                if weight is not None else f"avgOrNull({c}) AS {c}" for c in cols)
            got_rows = client.query(f"SELECT t.g AS g, {means} FROM {STAGES_TEMP} AS r INNER JOIN ({tails}) AS t "
                                    f"ON r.trace_id = t.trace_id GROUP BY t.g", features(client).settings).to_pylist()
        finally:
            client.command(f"DROP TEMPORARY TABLE IF EXISTS {STAGES_TEMP}")
        mean = [{s: 0.0 for s in names}, {s: 0.0 for s in names}]
        for r in got_rows:
            for s in names:
                x = r[f"{s}_ns"]
                mean[int(r["g"])][s] = 0.0 if x is None or math.isnan(x) else float(x)
        return cast(list[C.StageShare], X.shares_of_means(mean[0], mean[1], names))

    return stages


def _remote_attributes(client: Client, server: CA.ServerAttributes, rules: A.AttributeRules, det: Detection,
                       frame: pl.DataFrame) -> RP.RemoteAttributes:
    """The attribute dimensions for analysis.report's explanation, their codes left on the server: the cells of each
    combination holding one counted there over a spike's tail and the whole baseline, the nesting test's counts
    over the frame, the spike's p99 without each candidate holding one and which of the exemplar pool's requests
    match the best. Each question names the frame's rows it is about as a condition (`rows_sql`); what comes back
    is rows of figures, and for the exemplars at most MAX_EXEMPLARS requests (more only on a tie)."""
    start = frame.get_column("start_ns").to_numpy()
    values = frame.get_column("value").to_numpy()
    base_wins = np.unique(det.window_start_ns[det.baseline] // det.window_ns)
    base = f"intDiv(start_ns, {det.window_ns}) IN ({', '.join(str(int(x)) for x in base_wins) or 'NULL'})"
    keys = frame.select(pl.col("trace_id").cast(pl.String), pl.col("span_id").cast(pl.String))
    weights = frame.get_column("weight").to_numpy() if "weight" in frame.columns else None
    weighted = weights is not None

    def rows_sql(rows: X.Part) -> str:
        # some of the frame's rows as a condition: the server's own for rows it holds (X.Counted); those from the
        # slowest down to the least of them within their times when no other row there is as slow (a spike's rows,
        # its tail, the exemplar pool: checked here, where the frame's rows all are), else named one by one
        if isinstance(rows, X.Counted):
            return rows.where
        if rows.size == 0:
            return "false"
        a, b, v = int(start[rows].min()), int(start[rows].max()), float(values[rows].min())
        if int(((start >= a) & (start <= b) & (values >= v)).sum()) == rows.size:
            return f"(start_ns >= {a} AND start_ns <= {b} AND v >= {v!r})"
        listed = ", ".join(f"({literal(t)}, {literal(sp)})" for t, sp in keys[rows].iter_rows())
        return f"((trace_id, span_id) IN ({listed}))"

    # the culprit's bounds and the explanation of a spike that stayed on its windows ask the same questions over
    # the same rows (and the same labels): each is asked of the server once
    asked: dict[tuple[Any, ...], Any] = {}

    def once(key: tuple[Any, ...], ask: Callable[[], Any]) -> Any:
        if key not in asked:
            asked[key] = ask()
        return asked[key]

    def named(cands: list[X.Candidate]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        return tuple((c.dims, c.codes) for c in cands)

    def key(rows: X.Part) -> str | bytes:
        return rows.where if isinstance(rows, X.Counted) else rows.tobytes()

    def cells(coded: Sequence[X.Coded], combos: list[tuple[int, ...]], tail: X.Part, least: int
              ) -> dict[tuple[int, ...], X.Cells]:
        # weighted, a cell passes the guard with at least MIN_SHARE of the tail's weight: asked a little below that
        # (the server sums in its own order), so no cell that passes is left out
        total = (tail.weight if isinstance(tail, X.Counted) else
                 None if weights is None else float(weights[tail].sum()))
        floor = None if total is None else X.MIN_SHARE * total * (1 - 1e-9)
        return cast(dict[tuple[int, ...], X.Cells], once(
            ("cells", tuple(combos), key(tail), least),
            lambda: server.cells(client, coded, combos, rows_sql(tail), base, least, floor)))

    def overlap(coded: Sequence[X.Coded], a: list[X.Candidate], b: list[X.Candidate]
                ) -> tuple[list[int], list[list[int]]]:
        return cast(tuple[list[int], list[list[int]]], once(("overlap", named(a), named(b)),
                                                            lambda: server.overlap(client, coded, a, b)))

    def on_server(coded: Sequence[X.Coded], cand: X.Candidate) -> bool:
        return server.builtin is not None or any(coded[i].source != "builtin" for i in cand.dims)

    def spike_without(coded: Sequence[X.Coded], cands: list[X.Candidate], rows: X.Part) -> X.SpikeWithout:
        at = [n for n, c in enumerate(cands) if on_server(coded, c)]
        on = [cands[n] for n in at]
        got = once(("without", named(on), key(rows)),
                   lambda: server.spike_without(client, coded, on, rows_sql(rows), weighted))
        return {n: got[j] for j, n in enumerate(at)}

    def prefer(coded: Sequence[X.Coded], cand: X.Candidate, rows: np.ndarray, k: int) -> np.ndarray:
        found = server.prefer(client, coded, cand, rows_sql(rows), k)
        return np.asarray([key in found for key in keys[rows].iter_rows()], dtype=bool)

    return RP.RemoteAttributes(rules, list(server.attrs.coded), cells, overlap, spike_without, prefer, server.builtin)


def _pushed_down(q: Asked, local: duckdb.DuckDBPyConnection, det: Detection, spikes: list[Spike], valued: str,
                 col: str, weight: str | None = None, attrs: CA.ServerAttributes | None = None,
                 held: set[int] | None = None) -> tuple[RP.RestCounts, set[int]]:
    """Phase 2 with the dimension contrast pushed down.

    Row by row come back only the requests the explanation reads one by one: those of the spike
    windows, and none when every dimension is on the server (`attrs` holds the built-ins: the attribute pass
    ran; the stage shares' local baseline stays there too: `_server_stages`). Then the whole baseline comes back
    as one count, with its summed `weight` (the adjusted count, for sampled requests); else every other
    baseline request comes back as counts per combination of the built-ins (token counts by bucket); the
    baseline's (weighted) p99 with and without each candidate (the counterfactuals) is an exact quantile on the server
    (`_ServerTail`). So what comes back grows with the spike, not with the baseline. `attrs`: the attribute
    dimensions, which a candidate's predicate may name (their counts are asked by `_remote_attributes`); `held`:
    windows whose rows the local `_phase2` already holds (only the other spike windows' rows are pulled). Returns
    the windows read row by row too.
    """
    client, facts_table, cond, metric = q.client, q.facts_table, q.cond, q.metric
    w = det.window_ns
    # with every dimension on the server, the spike windows' rows stay there too (`_ServerSpikeRows`): none is read
    # row by row
    remote = attrs is not None and _on_server(attrs, col)
    spike_windows = _windows(det, [(s.start_ns, s.end_ns) for s in spikes])
    if remote:
        spike_windows = spike_windows[:0]
    new_windows = np.asarray(sorted(set(spike_windows.tolist()) - (held or set())), dtype=np.int64)
    one_by_one = np.union1d(spike_windows, np.asarray(sorted(held or set()), dtype=np.int64))
    base_wins = np.unique(det.window_start_ns[det.baseline] // w)
    listed = ", ".join(str(int(x)) for x in base_wins) or "NULL"
    near_listed = ", ".join(str(int(x)) for x in one_by_one) or "NULL"
    in_baseline = f"intDiv(start_ns, {w}) IN ({listed}) AND {valued}"
    # with the built-ins on the server too, the whole baseline is counted as one combination
    if new_windows.size or not held:
        _pull_facts(client, local, facts_table, f"{cond} AND {_in_windows(det, new_windows)}" if new_windows.size
                    else None, metric)
    rest_where = f"{cond} AND {in_baseline}" + ("" if remote else f" AND intDiv(start_ns, {w}) NOT IN ({near_listed})")
    strings = [] if remote else [d for d in X.DIMENSIONS if d not in X.BUCKETED]
    tokens = [] if remote else [d for d in X.DIMENSIONS if d in X.BUCKETED]
    # a bucket's representative: its lower bound (0 for 0; null for missing), which codes as the bucket; the shift
    # is kept non-negative since ClickHouse may evaluate it on every row, missing ones included (an error there)
    reps = ", ".join(f"if({CA.bucket_code_sql(t)} < 1, if({CA.bucket_code_sql(t)} = 0, 0, NULL), "
                     f"bitShiftLeft(toInt64(1), greatest({CA.bucket_code_sql(t)} - 1, 0))) AS _b_{t}" for t in tokens)
    group = ", ".join([*strings, *(f"_b_{t}" for t in tokens)])
    got = pl.from_arrow(client.query(
        f"SELECT {''.join(f'{x}, ' for x in [*strings, reps] if x)}count() AS n"
        f"{'' if weight is None else f', sum(toFloat64({weight})) AS w'} FROM {facts_table} WHERE {rest_where}"
        f"{f' GROUP BY {group}' if group else ''}"))
    assert isinstance(got, pl.DataFrame)
    combos = got.rename({f"_b_{t}": t for t in tokens}).with_columns(pl.col(t).cast(pl.Int64) for t in tokens)

    def values_without(coded: list[X.Coded], cand: X.Candidate) -> np.ndarray:
        got = client.query(f"SELECT toFloat64({col}) AS v FROM {facts_table} WHERE {rest_where} "
                           f"AND NOT {_candidate_sql(coded, cand, attrs)}")
        return got.column("v").to_numpy(zero_copy_only=False).astype(np.float64)

    return (combos, values_without, _ServerTail(client, facts_table, f"{cond} AND {in_baseline}", col,
                                                weight, attrs, f"intDiv(start_ns, {w}) IN ({listed})")), \
        set(one_by_one.tolist())


def _candidate_sql(coded: Sequence[X.Coded], cand: X.Candidate, attrs: CA.ServerAttributes | None = None) -> str:
    """A candidate's requests as a predicate over the facts (false where a dimension is missing); an attribute's
    through `attrs`."""
    parts = []
    for i, code in zip(cand.dims, cand.codes, strict=True):
        c = coded[i]
        if c.source != "builtin":
            assert attrs is not None, "an attribute candidate needs the attributes on the server"
            parts.append(attrs.candidate_sql(c.name, code))
        else:
            parts.append(f"{CA.bucket_code_sql(c.name)} = {int(code)}" if c.name in X.BUCKETED
                         else f"{c.name} = {literal(c.labels[code])}")
    return f"coalesce({' AND '.join(parts)}, false)"


class _ServerTail:
    """explain.BaselineTail on the server: the baseline's exact p99, whole and without a candidate's requests (its
    values sorted and interpolated as explain.TailQuantile does; weighted, by percentiles.weighted_quantile_sorted's
    rule as explain.weighted_q), so no baseline row comes back. Unweighted, `ask` computes every candidate's from the
    baseline's top slice in two queries; the others are one query each."""

    def __init__(self, client: Client, facts_table: str, where: str, col: str, weight: str | None = None,
                 attrs: CA.ServerAttributes | None = None, frame_where: str | None = None) -> None:
        """`where`: the baseline's requests (with a value) among `facts_table`'s; `col`: the value column;
        `weight`: their adjusted count's column (None: unweighted); `attrs`: the attribute dimensions;
        `frame_where`: the same requests among the attribute pass's frame (CA.ATTR_TEMP, when it holds `col`)."""
        self.client, self.facts_table, self.where, self.col = client, facts_table, where, col
        self.weight, self.attrs = weight, attrs
        self.frame_where = frame_where if attrs is not None and attrs.value == col else None
        self._whole: float | None = None
        self._without: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}

    def ask(self, coded: Sequence[X.Coded], cands: Sequence[X.Candidate]) -> None:
        """Unweighted, the p99 without each of `cands` in two queries instead of one a candidate, as
        explain.TailQuantile computes it (exact): the baseline's count and each candidate's count in it, then the
        baseline's top slice (TailQuantile.top_size values, any order among ties) with which candidate each value
        holds, and per candidate the quantile of the rest from the slice's values it does not hold. A candidate whose
        quantile reaches below the slice is left to `without_candidate`'s own query."""
        asked = {(c.dims, c.codes): c for c in cands}
        todo = [key for key in asked if key not in self._without]
        if self.weight is not None or self.frame_where is None or self.attrs is None or not todo:
            return
        attrs = self.attrs
        preds = [attrs.matches(coded, asked[key], codes=True) for key in todo]
        # each dimension's code computed once a row in a subquery, the candidates comparing codes
        rows = (f"SELECT v, {attrs.codes_sql(coded, (i for key in todo for i in key[0]))} FROM {CA.ATTR_TEMP} "
                f"WHERE {self.frame_where}")
        counts = ", ".join(f"countIf({p}) AS _wo_r{j}" for j, p in enumerate(preds))
        row = self.client.query(f"SELECT count() AS n, {counts} FROM ({rows})").to_pylist()[0]
        n = int(row["n"])
        top = X.TailQuantile.top_size(n)
        flags = ", ".join(f"{p} AS _wo_f{j}" for j, p in enumerate(preds))
        kept = ", ".join(f"arraySort(groupArrayIf(v, NOT _wo_f{j})) AS _wo_k{j}" for j in range(len(todo)))
        qs = []
        for j in range(len(todo)):
            n2 = n - int(row[f"_wo_r{j}"])
            # the rest's rank h = (n2 - 1) q; its value at floor(h) is the slice's kept value at floor(h) - below
            h, k = f"({n2 - 1} * {X.TAIL_Q!r})", f"_wo_k{j}"
            i = f"(toInt64(floor({h})) - ({n2} - toInt64(length({k}))))"
            a = f"{k}[{i} + 1]"
            qs.append(f"if({n2} <= 0 OR {i} < 0 OR length({k}) = 0, NULL, "
                      f"{a} + ({h} - floor({h})) * ({k}[least({i} + 1, length({k}) - 1) + 1] - {a})) AS _wo_q{j}")
        got = self.client.query(f"SELECT {', '.join(qs)} FROM (SELECT {kept} FROM (SELECT v, {flags} FROM "
                                f"({rows}) ORDER BY v DESC LIMIT {top}))").to_pylist()[0]
        for j, key in enumerate(todo):
            if got[f"_wo_q{j}"] is not None:
                self._without[key] = float(got[f"_wo_q{j}"])

    def _q(self, where: str) -> float:
        got = self.client.query(f"SELECT {quantile_sql(self.weight, X.TAIL_Q)} AS q FROM (SELECT "
                                f"{arrays_sql(self.col, self.weight)} FROM {self.facts_table} WHERE {where})",
                                features(self.client).settings)
        return float(got.column("q")[0].as_py())

    def quantile(self) -> float:
        """The whole baseline's p99 (asked once)."""
        if self._whole is None:
            self._whole = self._q(self.where)
        return self._whole

    def without_candidate(self, coded: Sequence[X.Coded], cand: X.Candidate) -> float:
        """The baseline's p99 without the candidate's requests (nan when none are left); asked once a candidate (the
        culprit's bounds and the explanation ask alike)."""
        key = (cand.dims, cand.codes)
        if key not in self._without:
            self._without[key] = self._q(f"{self.where} AND NOT {_candidate_sql(coded, cand, self.attrs)}")
        return self._without[key]


def explain_window(client: Client, table: str, start: str | int | datetime, end: str | int | datetime,
                   metric: str = "e2e", window_s: float | str | None = None,
                   since: str | int | datetime | None = None, until: str | int | datetime | None = None,
                   include_failures: bool = True, sampling_policy: str = "auto", *, facts: str | None = None,
                   where: str = "TRUE", materialized: bool = True, dimensions: str | tuple[str, ...] | None = None,
                   exclude_dimensions: str | tuple[str, ...] | None = None) -> C.Spike:
    """analysis.report.explain_window on ClickHouse: the requests starting in [start, end) explained as a spike.

    Detection runs on the server as in `build_report`; the window's and its baseline's p50 / p99
    are pooled there (weighted for sampled requests), and only the rows its explanation reads
    come back (as for a spike).
    """
    lo, hi = parse_time(since), parse_time(until)
    a, b = parse_time(start), parse_time(end)
    assert a is not None and b is not None
    facts_table = _facts(client, table, metric, lo, hi, facts, materialized)
    q = Asked(client, table, facts_table, f"{_in_range(lo, hi)} AND ({where})", metric, window_s, lo, hi,
              include_failures, sampling_policy)
    report, det, source = _phase1_server(q)
    sampled = bool(report["sampled"])
    if det is None or source is None:
        return RP.window_not_explained(a, b, report["errors"])
    local = duckdb.connect(":memory:")
    try:
        attrs = _attributes(q, report, RP.attribute_rules(dimensions, exclude_dimensions))
        if det.spikes:  # the culprits' bounds and, for a detected spike, its explanation read in one pass
            rows = _bounded_rows(q, local, det, sampled, attrs)
            for spike in det.spikes:
                if (spike.start_ns, spike.end_ns) == (a, b):  # a detected spike: the report's item
                    item = RP.explain_all(rows, [spike])[0]
                    item["detected"] = True
                    return item
            _reset(local)
        overlap = (det.window_start_ns < b) & (det.window_start_ns + det.window_ns > a)
        det = dataclasses.replace(det, baseline=det.baseline & ~overlap, spikes=[])
        base = source.pool(det.baseline) if det.baseline.any() else None
        inside = source.pool_where(f"start_ns >= {int(a)} AND start_ns < {int(b)}")
        if inside.n == 0 or base is None or base.n == 0:
            empty = RP.window_not_explained(a, b, report["errors"])
            empty["errors"].append("could not explain the window because " + (
                "no request with a value starts in it" if inside.n == 0 else "no baseline window lies outside it"))
            empty["requests"] = inside.n
            return empty
        det.baseline_p50_ns, det.baseline_p99_ns = base.p50_ns, base.p99_ns
        spike = Spike(start_ns=a, end_ns=b, requests=inside.n, p50_ns=inside.p50_ns, p99_ns=inside.p99_ns,
                      baseline_p50_ns=base.p50_ns, baseline_p99_ns=base.p99_ns, p_value=math.nan,
                      windows=int(overlap.sum()), requests_weighted=inside.n_weighted,
                      n_effective=round(inside.n_effective, 3) if sampled else inside.n_effective)
        item = RP.explain_all(_rows(q, local, det, [spike], sampled, attrs)[0], [spike])[0]
        item["detected"] = False
        return item
    finally:
        local.close()
        CA.drop(client)


class Fetcher:
    """Pulls into a local DuckDB `spans` the spans of a few traces (`traces`: a trace's waterfall reads them).
    Only the `inputs` columns come back (SPAN_INPUTS by default); the rest are null."""

    def __init__(self, client: Client, table: str, local: duckdb.DuckDBPyConnection,
                 inputs: Sequence[str] = SPAN_INPUTS) -> None:
        self.client, self.table, self.local = client, table, local
        self.cols = ", ".join(c for c, _, _ in S.SPAN_COLUMNS if c in inputs)  # one order everywhere
        cols = ", ".join(f"{c} {duck_type(t)}" for c, t, _ in S.SPAN_COLUMNS if c in inputs)
        # the local types, not the Arrow ones (ClickHouse's Bool comes back as UInt8)
        self.casts = ", ".join(f"{c}::{duck_type(t)} AS {c}" for c, t, _ in S.SPAN_COLUMNS if c in inputs)
        local.execute(f"CREATE TABLE _spans_local ({cols})")
        view = ", ".join(c if c in inputs else f"NULL::{duck_type(t)} AS {c}" for c, t, _ in S.SPAN_COLUMNS)
        local.execute(f"CREATE VIEW spans AS SELECT {view}, TimestampNs + Duration AS EndNs FROM _spans_local")

    def _pull(self, lo: int, hi: int, cond: str = "TRUE") -> None:
        where = (f"Timestamp >= fromUnixTimestamp64Nano(toInt64({lo})) "
                 f"AND Timestamp < fromUnixTimestamp64Nano(toInt64({hi}))")
        got = self.client.query(f"SELECT {self.cols} FROM {source_sql(self.table, where)} "
                                f"WHERE {cond}")
        self.local.register("_pulled", got)
        # a span pulled twice (two spikes' ranges overlap) is kept once
        self.local.execute(f"CREATE OR REPLACE TABLE _spans_local AS SELECT DISTINCT * FROM ("
                           f"SELECT {self.cols} FROM _spans_local UNION ALL SELECT {self.casts} FROM _pulled)")
        self.local.unregister("_pulled")

    def traces(self, trace_ids: list[str], lo_ns: int, hi_ns: int) -> None:
        """The spans of these traces in [lo_ns, hi_ns)."""
        if trace_ids:
            self._pull(lo_ns, hi_ns, f"TraceId IN ({', '.join(M.quote(t) for t in trace_ids)})")


def choose_window_s(client: Client, facts: str, since_ns: int | None = None, until_ns: int | None = None,
                    where: str = "TRUE") -> int:
    """analysis.percentiles.choose_window_s over a session facts table (`where` narrows it further)."""
    first, last, n = client.query(f"SELECT min(start_ns) AS a, max(start_ns) AS b, count() AS n FROM {facts} "
                                  f"WHERE {_in_range(since_ns, until_ns)} AND ({where})").to_pylist()[0].values()
    start = since_ns if since_ns is not None else (first or 0)
    end = until_ns if until_ns is not None else (last or 0) + 1
    return P.auto_window_s(int(n), max(end - start, 1) / 1e9)


def percentile_series(client: Client, table: str = DEFAULT_TABLE, metric: str = "e2e",
                      window_s: float | str | None = None, by: Sequence[str] = (),
                      since: str | int | datetime | None = None, until: str | int | datetime | None = None,
                      include_failures: bool = True, *, facts: str | None = None,
                      where: str = "TRUE", materialized: bool = True) -> pl.DataFrame:
    """`analysis.percentiles.percentile_series` with the windowed exact quantiles computed on the server.

    `quantilesExactInclusive` is DuckDB's `quantile_cont` (linear interpolation, rank (n - 1) q); on a
    sampled table the weighted quantiles (clickhouse.wq_sql), weighted counts and Kish's effective count
    are computed there too. Only one row per window (and group) comes back. Same columns as the DuckDB version.
    `facts` / `where` / `materialized` as in `build_report` (`facts` must hold the metric's column).
    """
    column = P.metric_column(metric)
    for name in by:
        if name not in P.GROUP_COLUMNS:
            raise QueryError("", f"cannot group by {name!r}; use one of {', '.join(P.GROUP_COLUMNS)}")
    lo, hi = parse_time(since), parse_time(until)
    stages = column in M.STAGE_COLUMNS
    cols = M.REQUEST_COLUMNS if stages else tuple(c for c in M.FACT_COLUMNS if metric != "e2e" or c not in
                                                  ("ttft_ns", "tpot_ns"))
    if facts is None:
        facts = requests_facts(client, table, lo_ns=lo, hi_ns=hi, name=FACTS_TEMP, columns=cols,
                               materialized=materialized)
    where = f"{_in_range(lo, hi)} AND ({where})"
    win = choose_window_s(client, facts, lo, hi, where) if window_s is None else P.parse_duration(window_s)
    w = round(win * 1e9)
    sampled = client.query(f"SELECT count() AS n FROM {facts} WHERE {where} AND adjusted_count != 1"
                           ).to_pylist()[0]["n"]
    keep = "TRUE" if include_failures else "status = 'ok'"
    qs = ", ".join(repr(q) for _, q in P.QUANTILES)
    groups = "".join(f", {g}" for g in by)
    counts = (f"count() AS requests, countIf(status = 'ok') AS ok, countIf(status = 'error') AS errors, "
              f"countIf(status = 'timeout') AS timeouts, countIf(status = 'cancelled') AS cancelled, "
              f"countIf({column} IS NOT NULL AND {keep}) AS n")
    key = f"intDiv(start_ns, {w}) * {w} AS window_start_ns{groups}"
    if sampled:  # weighted: the rule of percentiles.weighted_quantile_sorted over each window's sorted (value, weight)
        kept = f"{column} IS NOT NULL AND {keep}"
        wq = ", ".join(quantile_sql("adjusted_count", q) for _, q in P.QUANTILES)
        wsum = "toFloat64(adjusted_count)"
        names = f"window_start_ns{groups}, requests, ok, errors, timeouts, cancelled, n"
        # the arrays stay on the server: the outer query keeps one row of figures per window (and group)
        sql = f"""
SELECT {names}, if(length(s) = 0, [], [{wq}]) AS q, requests_weighted, ok_weighted, errors_weighted,
       timeouts_weighted, cancelled_weighted, n_weighted, n_effective
FROM (SELECT {key}, {counts}, sum({wsum}) AS requests_weighted, sumIf({wsum}, status = 'ok') AS ok_weighted,
             sumIf({wsum}, status = 'error') AS errors_weighted,
             sumIf({wsum}, status = 'timeout') AS timeouts_weighted,
             sumIf({wsum}, status = 'cancelled') AS cancelled_weighted, sumIf({wsum}, {kept}) AS n_weighted,
             {kish_sql("adjusted_count", kept)} AS n_effective, {arrays_sql(column, "adjusted_count", keep)}
      FROM {facts} WHERE {where} GROUP BY window_start_ns{groups})
ORDER BY window_start_ns{groups}"""
    else:
        sql = f"""
SELECT {key}, {counts},
       if(n = 0, [], quantilesExactInclusiveIf({qs})(toFloat64({column}), {column} IS NOT NULL AND {keep})) AS q
FROM {facts} WHERE {where}
GROUP BY window_start_ns{groups} ORDER BY window_start_ns{groups}"""
    frame = pl.from_arrow(client.query(sql, features(client).settings))
    assert isinstance(frame, pl.DataFrame)
    return P.series_frame(frame, by)
