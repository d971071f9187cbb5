"""What the GPUs cost: fair-share GPU time per request, priced per GPU-hour, per tenant / model / replica.

The rule (docs/cost.md). Each replica-minute is swept on its own: its timeline is cut at every
boundary: the start and end of every GPU interval and model_load span on the replica, the ends
of its observed window, the minute's edges, and (for a series) the edges of the time grid. A
request is *in a GPU stage* on its replica while one of its prefill or decode spans runs, or
its generation span where the generation is not split into prefill / decode (the union of
those spans, per request). Each segment between consecutive boundaries, of length L ns:

- with n >= 1 requests in a GPU stage: each gets L // n ns (floor division) and the
  remainder L % n (< n ns) goes to the one active request that ends last within the minute
  (ties: the larger (trace id, request span id)), so the shares of a segment sum to L exactly;
- else, with a model_load span running: cold start, charged to the replica;
- else: idle.

A replica's observed time runs from the start of its first span to the end of its last
span (any span whose `Replica` is that replica), clipped to [since, until); a replica counts
when it has a GPU-stage or model_load span anywhere in the store. allocated + cold start +
idle = observed, exactly.

The sweep (analysis.engine.gpu_sweep; stored with each materialized hour, and `gpu_shares`
sums the stored hours of a range and sweeps the rest) is SQL over the documented `spans`
view: window functions over the interval boundaries (running sums for the counts and a
running prefix sum of the floor shares, so a request's share is Q(end) - Q(start); a running
max for the remainder's recipient), no Python loop over rows. On DuckDB the integer rule runs
that SQL up to each request's GPU intervals and the rest over numpy arrays (`sweep_arrays`, the
same rows). `cost_page` gives the Cost page's table and series from one sweep. Three pieces are
dialect-specific (analysis.engine.dialect: integer division, the next boundary, the grid's
cells); the rest is plain SQL (joins, CASE, sum/min/max, window sums).
`clickhouse_gpu_shares` runs the ClickHouse text on an otel_traces-shaped table (tested in
chdb against the DuckDB sweep, weighted and not).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import duckdb
import polars as pl
import pyarrow as pa

from analysis import clickhouse as C
from analysis.engine import gpu_sweep as GS
from analysis.engine import model as M
from analysis.engine.gpu_sweep import (
    CELL_NS,
    NONE_KEY,
    sweep_params,
    sweep_sql,
)
from analysis.engine.materialize import HOUR_NS, hour_where
from analysis.engine.percentiles import (
    in_range_sql,
    iso,
    parse_time,
    quote_ident,
    request_facts,
    source_columns,
    weight_where,
    weighted_quantiles_sql,
    weighted_window_sql,
)
from tracing.errors import QueryError

#: Version of the `tailscope cost --json` contract; bumped only on incompatible change.
COST_VERSION: Final = 1
#: What a cost table may be grouped by.
COST_GROUPS: Final[tuple[str, ...]] = ("tenant", "model", "model_version", "replica")
#: Name of the price table looked for beside the store when no --prices file is given.
PRICE_FILE: Final = "prices.toml"
#: The slowest share of requests whose GPU time `tail_gpu_share` reports.
TAIL_Q: Final = 0.99
NS_PER_HOUR: Final = 3_600_000_000_000

#: The sweeps of the runs `gpu_shares` sweeps beside the stored hours, kept by their caller for one state of the store
#: (the dashboard: per refresh): (run start, run end, grid ns or None) -> its `_cost_shares` and `_cost_replicas`.
KeptRuns = MutableMapping[tuple[int, int, int | None], tuple[pa.Table, pa.Table]]


def sampled_spans(con: duckdb.DuckDBPyConnection) -> bool:
    """True when some request span of the store weighs other than 1 (the weighted sweep then runs)."""
    try:
        rows = con.execute(f"SELECT bool_or({M.stored_adjusted_count(M.DUCKDB)} <> 1) FROM spans WHERE IsRequest"
                           ).fetchall()
    except duckdb.Error:  # a `spans` without the column: nothing recorded a sampling probability
        return False
    return bool(rows and rows[0][0])


def _sampled(con: duckdb.DuckDBPyConnection, facts: str) -> bool:
    """Whether some request weighs other than 1, read from the request facts (one column of a table already
    built) rather than a scan of every span."""
    return weight_where(con, facts) is not None


def gpu_shares(con: duckdb.DuckDBPyConnection, since: int | None = None, until: int | None = None,
               grid_ns: int | None = None, weighted: bool | None = None, cell_ns: int = CELL_NS,
               stored: bool = True, kept: KeptRuns | None = None) -> tuple[str, str]:
    """Run the sweep over [since, until) and keep its results in this connection's temp tables.

    Returns (shares table, replicas table): per (replica, request, bucket) the allocated
    GPU ns (read from stored hours, in several rows whose sum it is: readers sum); per (replica,
    bucket) observed / allocated / cold start / idle ns. With
    `grid_ns` the timeline is also cut at multiples of it and `bucket_ns` is each piece's
    grid cell; without it `bucket_ns` is 0. `weighted` (default: `sampled_spans`) shares each segment by
    adjusted counts. `cell_ns` (tests only): the width of the cells swept on their own. `drop_sweep(con)` removes
    the tables.

    On a store connection, the materialized hours inside the range are read from their stored sweeps
    (`stored_hours`) and only the rest of the range is swept: the same rows, the rule being exact per minute.
    `stored=False` sweeps everything. `kept`: where the caller keeps the sweeps of those other runs (the live hours
    beside the stored ones) for as long as the store does not change: a run found there is read, not swept again,
    and a run swept is put there.
    """
    params = sweep_params(since, until, grid_ns)
    if weighted is None:
        weighted = sampled_spans(con)
    files = stored_hours(con, params, grid_ns) if stored and not weighted and cell_ns == CELL_NS else {}
    if files:
        try:
            _from_stored(con, files, params, grid_ns, kept)
            return "_cost_shares", "_cost_replicas"
        except duckdb.IOException:  # a stored file superseded and removed since the connection listed it
            drop_sweep(con)
    GS.run_sweep(con, params, grid=grid_ns is not None, weighted=weighted, cell_ns=cell_ns)
    return "_cost_shares", "_cost_replicas"


def stored_hours(con: duckdb.DuckDBPyConnection, params: dict[str, int], grid_ns: int | None) -> dict[int, str]:
    """The materialized hours whose stored sweep (gpu_sweep.write_hour) serves [$lo, $hi): hour -> cost file.
    None unless the hour lies wholly inside the range and the grid (if any) is whole minutes, so that every
    cell of the grid is a sum of stored minutes."""
    if grid_ns is not None and grid_ns % CELL_NS:
        return {}
    try:
        rows = con.execute(f"SELECT hour_ns, path FROM {GS.COST_FILES_VIEW}").fetchall()
    except duckdb.Error:  # not a store connection: nothing stored
        return {}
    return {int(h): str(p) for h, p in rows if params["lo"] <= h and h + HOUR_NS <= params["hi"]}


def _runs(files: dict[int, str], lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs of [lo, hi) outside the stored hours `files`, in order."""
    runs, at = [], lo
    for h in sorted(files):
        if h > at:
            runs.append((at, h))
        at = h + HOUR_NS
    if at < hi:
        runs.append((at, hi))
    return runs


def _swept_run(con: duckdb.DuckDBPyConnection, params: dict[str, int], a: int, b: int, grid_ns: int | None,
               kept: KeptRuns | None) -> None:
    """`_cost_shares` and `_cost_replicas` of the run [a, b) over its spans and the running ones of the hour before
    it (`_run_spans`): read from `kept` when it holds the run, else swept (and put there)."""
    key = (a, b, grid_ns)
    got = kept.get(key) if kept is not None else None
    if got is not None:
        for name, table in zip(("_cost_shares", "_cost_replicas"), got, strict=True):
            arrow = f"{name}_kept"
            con.register(arrow, table)
            try:
                con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {arrow}")
            finally:
                con.unregister(arrow)
        return
    try:
        GS.run_sweep(con, {**params, "lo": a, "hi": b}, grid=grid_ns is not None, weighted=False,
                     spans=_run_spans(con, a, b))
    finally:
        con.execute("DROP TABLE IF EXISTS _cost_running")
    if kept is not None:
        kept[key] = (con.sql("SELECT * FROM _cost_shares").to_arrow_table(),
                     con.sql("SELECT * FROM _cost_replicas").to_arrow_table())


def keep_runs(con: duckdb.DuckDBPyConnection, kept: KeptRuns, since: int | None = None, until: int | None = None,
              grid_ns: int | None = None, facts: str | None = None) -> int:
    """Sweep into `kept` the runs `gpu_shares` over [since, until) with `grid_ns` would sweep beside the stored hours
    (none when no stored hour serves the range, or the requests, `facts` as `cost_table`'s, are sampled): what a
    later `gpu_shares` with the same `kept` then reads. The number of runs it swept."""
    params = sweep_params(since, until, grid_ns)
    if _sampled(con, facts or request_facts(con)):
        return 0
    files = stored_hours(con, params, grid_ns)
    todo = [r for r in _runs(files, params["lo"], params["hi"]) if (*r, grid_ns) not in kept] if files else []
    try:
        for a, b in todo:
            _swept_run(con, params, a, b, grid_ns, kept)
    finally:
        drop_sweep(con)
    return len(todo)


def _from_stored(con: duckdb.DuckDBPyConnection, files: dict[int, str], params: dict[str, int],
                 grid_ns: int | None, kept: KeptRuns | None = None) -> None:
    """`_cost_shares` and `_cost_replicas` over [$lo, $hi) from the stored hours `files`, the rest of the range
    swept (each run over its spans and the running ones of the hour before it: `_swept_run`, `kept`), and the
    replicas' observed windows from every stored hour's bounds and the other hours' spans."""
    lo, hi = params["lo"], params["hi"]
    live: list[str] = []
    for i, (a, b) in enumerate(_runs(files, lo, hi)):
        _swept_run(con, params, a, b, grid_ns, kept)
        con.execute(f"ALTER TABLE _cost_shares RENAME TO _cost_live_shares_{i}")
        con.execute(f"ALTER TABLE _cost_replicas RENAME TO _cost_live_replicas_{i}")
        live.append(str(i))
    bucket = (lambda x: f"({x} // {int(grid_ns)}) * {int(grid_ns)}") if grid_ns is not None else (lambda x: "0")
    src = f"read_parquet([{', '.join(M.quote(p) for p in files.values())}])"
    every = con.execute(f"SELECT path FROM {GS.COST_FILES_VIEW}").fetchall()
    every_src = f"read_parquet([{', '.join(M.quote(str(p)) for (p,) in every)}])"
    hours = [int(h) for (h,) in con.execute(f"SELECT hour_ns FROM {GS.COST_FILES_VIEW}").fetchall()]
    live_shares = "".join(f" UNION ALL SELECT replica, trace_id, request_span_id, bucket_ns, allocated_ns "
                          f"FROM _cost_live_shares_{n}" for n in live)
    live_cold = "".join(f" UNION ALL SELECT replica, bucket_ns, cold_start_ns FROM _cost_live_replicas_{n}"
                        for n in live)
    try:
        # a request's share in a bucket may be several rows (one per stored minute or hour): readers sum them
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _cost_shares AS
            SELECT replica, trace_id, request_span_id, {bucket("minute_ns")} AS bucket_ns, allocated_ns
            FROM {src} WHERE kind = 's'{live_shares}""")
        # each replica's observed window over the whole store, clipped to the range, and which replicas count
        windows = f"""
            SELECT replica, greatest(min(first_ns), {lo}) AS first_ns, least(max(last_ns), {hi}) AS last_ns
            FROM (SELECT replica, first_ns, last_ns, gpu FROM {every_src} WHERE kind = 'b'
                  UNION ALL {GS.bounds_sql("spans", f"NOT {hour_where(hours)}")})
            GROUP BY replica HAVING bool_or(gpu) AND least(max(last_ns), {hi}) > greatest(min(first_ns), {lo})"""
        if grid_ns is not None:
            g = int(grid_ns)
            cells = f"""SELECT w.replica, b AS bucket_ns,
                               least(w.last_ns, b + {g}) - greatest(w.first_ns, b) AS observed_ns, w.first_ns, w.last_ns
                        FROM ({windows}) w,
                             LATERAL (SELECT unnest(range((w.first_ns // {g}) * {g}, w.last_ns, {g})) AS b)"""
        else:
            cells = (f"SELECT replica, 0::BIGINT AS bucket_ns, last_ns - first_ns AS observed_ns, first_ns, last_ns "
                     f"FROM ({windows})")
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE _cost_replicas AS
            SELECT c.replica AS replica, c.bucket_ns::BIGINT AS bucket_ns, c.observed_ns::BIGINT AS observed_ns,
                   coalesce(a.allocated_ns, 0)::BIGINT AS allocated_ns,
                   coalesce(x.cold_start_ns, 0)::BIGINT AS cold_start_ns,
                   (c.observed_ns - coalesce(a.allocated_ns, 0) - coalesce(x.cold_start_ns, 0))::BIGINT AS idle_ns,
                   c.first_ns::BIGINT AS first_ns, c.last_ns::BIGINT AS last_ns
            FROM ({cells}) c
            LEFT JOIN (SELECT replica, bucket_ns, sum(allocated_ns) AS allocated_ns FROM _cost_shares
                       GROUP BY ALL) a ON a.replica = c.replica AND a.bucket_ns = c.bucket_ns
            LEFT JOIN (SELECT replica, bucket_ns, sum(cold_start_ns) AS cold_start_ns
                       FROM (SELECT replica, {bucket("minute_ns")} AS bucket_ns, cold_start_ns FROM {src}
                             WHERE kind = 'c'{live_cold}) GROUP BY ALL) x
                ON x.replica = c.replica AND x.bucket_ns = c.bucket_ns""")
    finally:
        for n in live:
            con.execute(f"DROP TABLE IF EXISTS _cost_live_shares_{n}")
            con.execute(f"DROP TABLE IF EXISTS _cost_live_replicas_{n}")


def _run_spans(con: duckdb.DuckDBPyConnection, a: int, b: int) -> str:
    """The spans a run of `_from_stored` over [a, b) sweeps: those starting in it and, of the hour before, those of
    the traces with a span still running at `a` (listed in the temp table `_cost_running`, which the caller drops).

    The same rows as sweeping every span of the hour before: a GPU interval in the run, and the spans above it
    that name its request or split its generation, belong to a trace whose spans either start in the run or
    include one running at `a` (a span nests in its parent's time); any other trace of the hour before has no
    GPU or model_load time after `a`. Reading all of that hour would double what a live hour's sweep scans."""
    con.execute("CREATE OR REPLACE TEMP TABLE _cost_running AS SELECT DISTINCT TraceId FROM spans "
                f"WHERE TimestampNs >= {a - HOUR_NS} AND TimestampNs < {a} AND EndNs > {a}")
    return (f"(SELECT * FROM spans WHERE TimestampNs >= {a} AND TimestampNs < {b} UNION ALL "
            f"SELECT * FROM spans WHERE TimestampNs >= {a - HOUR_NS} AND TimestampNs < {a} "
            "AND TraceId IN (SELECT TraceId FROM _cost_running))")


#: The span columns the sweep reads (the ClickHouse run copies only these into a temporary table).
SWEEP_INPUTS: Final[tuple[str, ...]] = ("TraceId", "SpanId", "ParentSpanId", "Stage", "Replica", "TimestampNs",
                                        "EndNs", "IsRequest", "AdjustedCount")


def clickhouse_gpu_shares(client: C.Client, table: str = C.DEFAULT_TABLE, since: int | None = None,
                          until: int | None = None, grid_ns: int | None = None,
                          weighted: bool | None = None, cell_ns: int = CELL_NS, where: str = ""
                          ) -> tuple[str, str]:
    """`gpu_shares` on ClickHouse: the sweep's ClickHouse text over an otel_traces-shaped `table`, each step
    into a temporary table of the client's session (same names and columns as `gpu_shares`').

    `weighted` defaults to whether some request span of the table weighs other than 1. The parameters are
    integers, written into the SQL as literals. `where` (over the table's columns, e.g. a Timestamp range) narrows
    the spans swept: the shares are the whole table's when it keeps every span of the requests overlapping the range.
    """
    params = sweep_params(since, until, grid_ns)
    spans = "_cost_spans"
    steps = [(spans, f"SELECT {', '.join(SWEEP_INPUTS)} FROM {C.source_sql(table, where)}")]
    if weighted is None:
        got = client.query(f"SELECT count(*) FROM {C.source_sql(table)} "
                           f"WHERE IsRequest AND {M.stored_adjusted_count(M.CLICKHOUSE)} <> 1")
        weighted = bool(got.column(0)[0].as_py())
    steps += list(sweep_sql("clickhouse", grid=grid_ns is not None, weighted=weighted, spans=spans,
                            cell_ns=cell_ns).items())
    engine = C.temp_engine(client, steps[0][1])  # the spans' copy, the largest: the sweep's tables follow it
    for name, sql in steps:
        for k, v in params.items():
            sql = sql.replace(f"${k}", f"toInt64({v})")
        try:
            C.temp_table(client, name, sql, engine)
        except QueryError as exc:
            raise QueryError(sql, f"the GPU-time sweep failed at {name} on ClickHouse: {exc.what}") from exc
    for name, _ in steps:
        if name not in ("_cost_shares", "_cost_replicas"):
            client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    return "_cost_shares", "_cost_replicas"


def drop_sweep(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the temp tables of `gpu_shares`."""
    GS.drop_sweep(con)


# --- prices --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prices:
    """USD per GPU-hour: per replica, else per model, else `default` (None: no price, no cost).

    A replica's price wins over its model's: a price belongs to the hardware when known.
    """

    default: float | None = None
    replica: Mapping[str, float] = field(default_factory=dict)
    model: Mapping[str, float] = field(default_factory=dict)
    source: str | None = None

    def of(self, replica: str | None, model: str | None) -> float | None:
        """The price of GPU time on `replica` spent on `model`."""
        if replica is not None and replica in self.replica:
            return self.replica[replica]
        if model is not None and model in self.model:
            return self.model[model]
        return self.default

    @property
    def known(self) -> bool:
        """True when any price is set (so costs can be computed)."""
        return self.default is not None or bool(self.replica) or bool(self.model)


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise QueryError("", f"{where}: a price must be a non-negative number of USD per GPU-hour, got {value!r}")
    return float(value)


def load_prices(path: Path | str, gpu_hour_usd: float | None = None) -> Prices:
    """Read a price table (TOML: `gpu_hour_usd = 2.5`, `[replica]` and `[model]` tables of name = USD).

    `gpu_hour_usd`, when given, replaces the file's default.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise QueryError("", f"cannot read price table {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise QueryError("", f"price table {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"gpu_hour_usd", "replica", "model"}
    if unknown:
        raise QueryError("", f"price table {path}: unknown key(s) {', '.join(sorted(unknown))}; "
                             "use gpu_hour_usd, [replica], [model]")
    tables: dict[str, dict[str, float]] = {}
    for name in ("replica", "model"):
        section = data.get(name, {})
        if not isinstance(section, dict):
            raise QueryError("", f"price table {path}: [{name}] must be a table of name = USD per GPU-hour")
        tables[name] = {str(k): _price(v, f"price table {path}, {name} {k}") for k, v in section.items()}
    default = data.get("gpu_hour_usd")
    if gpu_hour_usd is not None:
        default = gpu_hour_usd
    return Prices(None if default is None else _price(default, f"price table {path}, gpu_hour_usd"),
                  tables["replica"], tables["model"], str(path))


def prices_for(store: Path | str | None, prices_file: Path | str | None = None,
               gpu_hour_usd: float | None = None) -> Prices:
    """The prices to use: `prices_file`, else STORE/prices.toml when present, else `gpu_hour_usd` alone."""
    if gpu_hour_usd is not None:
        _price(gpu_hour_usd, "--gpu-hour-usd")
    if prices_file is not None:
        return load_prices(prices_file, gpu_hour_usd)
    beside = Path(store) / PRICE_FILE if store is not None else None
    if beside is not None and beside.is_file():
        return load_prices(beside, gpu_hour_usd)
    return Prices(gpu_hour_usd)


# --- the cost table --------------------------------------------------------------------------

def _key_expr(by: str, alias: str) -> str:
    return f"coalesce({alias}.{quote_ident(by)}::VARCHAR, '{NONE_KEY}')"


def _usd(ns: int, price: float | None) -> float | None:
    return None if price is None else ns * price / NS_PER_HOUR


def cost_table(con: duckdb.DuckDBPyConnection, by: str = "tenant", since: str | int | datetime | None = None,
               until: str | int | datetime | None = None, prices: Prices | None = None,
               facts: str | None = None, keys: Iterable[str] | None = None, kept: KeptRuns | None = None
               ) -> dict[str, Any]:
    """GPU time and its cost per `by` value over [since, until): the `tailscope cost --json` contract.

    GPU time is the fair share of each instant in [since, until) (see the module docstring);
    requests, tokens and the p99 tail are those of the requests that start in [since, until).
    Request columns come from `facts` (a table with the `requests` view's trace_id, span_id, start_ns,
    e2e_ns, replica, model, model_version, tenant, input_tokens, output_tokens), by default
    analysis.engine.percentiles.request_facts; a GPU share joins its request on (trace_id, span_id).
    `keys` (values of `by`): also the totals of those rows alone (`selected`), as the dashboard shows under a filter.
    `kept`: as `gpu_shares`'.
    """
    if by not in COST_GROUPS:
        raise QueryError("", f"cannot group cost by {by!r}; use one of {', '.join(COST_GROUPS)}")
    prices = prices or Prices()
    since_ns, until_ns = parse_time(since), parse_time(until)
    facts = facts or request_facts(con)
    weighted = _sampled(con, facts)
    shares, reps = gpu_shares(con, since_ns, until_ns, weighted=weighted, kept=kept)
    try:
        reqs, sql, params = _gpu_query(con, facts, shares, by, since_ns, until_ns, weighted, buckets=False)
        gpu = con.execute(sql, params).fetchall()
        rep_rows = con.execute(f"SELECT replica, observed_ns, allocated_ns, cold_start_ns, idle_ns FROM {reps} "
                               "ORDER BY replica").fetchall()
    except duckdb.Error as exc:
        raise QueryError("", f"the cost table failed: {str(exc).splitlines()[0]}") from exc
    finally:
        drop_sweep(con)
    return _cost_json(by, prices, weighted, since_ns, until_ns, reqs, gpu, rep_rows, keys)


def cost_page(con: duckdb.DuckDBPyConnection, by: str = "tenant", bucket_s: int = 60,
              since: str | int | datetime | None = None, until: str | int | datetime | None = None,
              prices: Prices | None = None, facts: str | None = None, keys: Iterable[str] | None = None,
              kept: KeptRuns | None = None) -> tuple[dict[str, Any], pl.DataFrame]:
    """`cost_table` (with `keys`, their `selected` totals) and `cost_series` over one range (the Cost page draws
    both): the same dict and frame from one sweep cut at the series' grid and one join of its shares with the
    request facts.

    Exact when the grid is whole cells of the sweep (`series_bucket_s`): its edges are cell edges, boundaries
    already, so a request's shares over the grid's cells sum to its share over the range, and so do the
    replicas' observed, cold-start and idle times. Otherwise (or for sampled requests, whose weighted shares are
    rounded per cell) the two are computed apart. `kept`: as `gpu_shares`'."""
    if by not in COST_GROUPS:
        raise QueryError("", f"cannot group cost by {by!r}; use one of {', '.join(COST_GROUPS)}")
    prices = prices or Prices()
    grid = int(bucket_s) * 1_000_000_000
    facts = facts or request_facts(con)
    weighted = _sampled(con, facts)
    if weighted or grid <= 0 or grid % CELL_NS:
        return (cost_table(con, by, since, until, prices, facts, keys, kept),
                cost_series(con, by, bucket_s, since, until, prices, facts, kept))
    since_ns, until_ns = parse_time(since), parse_time(until)
    shares, reps = gpu_shares(con, since_ns, until_ns, grid_ns=grid, weighted=False, kept=kept)
    try:
        reqs, sql, params = _gpu_query(con, facts, shares, by, since_ns, until_ns, False, buckets=True)
        gpu = con.sql(sql, params=params).pl()
        over = con.sql(f"SELECT bucket_ns, replica, observed_ns, allocated_ns, cold_start_ns, idle_ns, first_ns, "
                       f"last_ns FROM {reps}").pl()
    except duckdb.Error as exc:
        raise QueryError("", f"the cost table failed: {str(exc).splitlines()[0]}") from exc
    finally:
        drop_sweep(con)
    table = gpu.group_by("key", "replica", "model").agg(pl.col("ns").sum(), pl.col("tail_ns").sum())
    rep_rows = over.group_by("replica").agg(pl.col(c).sum() for c in ("observed_ns", "allocated_ns",
                                                                      "cold_start_ns", "idle_ns")).sort("replica")
    return (_cost_json(by, prices, False, since_ns, until_ns, reqs, table.rows(), rep_rows.rows(), keys),
            _series_frame(gpu.drop("tail_ns").with_columns(pl.col("ns").cast(pl.Int64)),
                          over.select("bucket_ns", "replica", "cold_start_ns", "idle_ns", "first_ns", "last_ns"),
                          prices, grid))


def _gpu_query(con: duckdb.DuckDBPyConnection, facts: str, shares: str, by: str, since_ns: int | None,
               until_ns: int | None, weighted: bool, buckets: bool) -> tuple[list[Any], str, dict[str, Any]]:
    """The rows per key of the requests starting in range (`_requests_sql`), and the query (with its parameters)
    of GPU ns per ([bucket,] key, replica, model) (prices depend on replica and model) with the part of it spent
    on requests in range at or above their key's p99 (the tail): one join of the shares with the facts."""
    where = "($since IS NULL OR f.start_ns >= $since) AND ($until IS NULL OR f.start_ns < $until)"
    params = {"since": since_ns, "until": until_ns}
    key = "s.replica" if by == "replica" else _key_expr(by, "f")
    fkey = _key_expr(by, "f")
    reqs = con.execute(_requests_sql(con, facts, fkey, where, weighted), params).fetchall()
    tail_at = [(str(k), p) for k, _n, _nw, _i, _o, p in reqs]
    sql = f"""
        SELECT {"s.bucket_ns, " if buckets else ""}{key} AS key, s.replica, f.model, sum(s.allocated_ns)::BIGINT AS ns,
               sum(CASE WHEN {where} AND f.e2e_ns >= q.p99 THEN s.allocated_ns ELSE 0 END)::BIGINT AS tail_ns
        FROM {shares} s LEFT JOIN {facts} f ON f.trace_id = s.trace_id AND f.span_id = s.request_span_id
        LEFT JOIN (SELECT unnest($keys) AS key, unnest($p99s) AS p99) q ON q.key = {fkey}
        GROUP BY ALL"""
    return reqs, sql, {**params, "keys": [k for k, _ in tail_at], "p99s": [p for _, p in tail_at]}


def _cost_json(by: str, prices: Prices, weighted: bool, since_ns: int | None, until_ns: int | None,
               reqs: list[Any], gpu: list[Any], rep_rows: list[Any], keys: Iterable[str] | None = None
               ) -> dict[str, Any]:
    """The `tailscope cost --json` dict from the engine's rows: per key (requests, weighted, tokens in / out,
    p99), per (key, replica, model) (GPU ns, tail ns), per replica (observed, allocated, cold start, idle ns);
    with `keys`, `selected`: the totals of their rows (`_selected`)."""
    rows: dict[str, dict[str, Any]] = {}

    def row(k: str) -> dict[str, Any]:
        return rows.setdefault(k, {"key": k, "gpu_ns": 0, "gpu_seconds": 0.0, "cost_usd": 0.0 if prices.known
                                   else None, "requests": 0, "requests_weighted": 0, "input_tokens": 0,
                                   "output_tokens": 0,
                                   "usd_per_1k_output_tokens": None, "tail_gpu_ns": 0, "tail_gpu_share": None})

    model_ns: dict[tuple[str, str], int] = {}
    priced: dict[str, dict[float | None, int]] = {}  # key -> price -> ns: exact sums, priced once per price
    for k, replica, model, ns, tail_ns in gpu:
        r = row(str(k))
        r["gpu_ns"] += int(ns)
        r["tail_gpu_ns"] += int(tail_ns or 0)
        by_price = priced.setdefault(str(k), {})
        price = prices.of(replica, model)
        by_price[price] = by_price.get(price, 0) + int(ns)
        if model is not None:
            model_ns[(replica, model)] = model_ns.get((replica, model), 0) + int(ns)
    top_model: dict[str, str] = {}  # the model a replica spent most GPU time on (ties: the larger name)
    for (replica, model), _ns in sorted(model_ns.items(), key=lambda kv: (kv[1], kv[0][1])):
        top_model[replica] = model
    for k, by_price in priced.items():
        known_prices = {p: ns for p, ns in by_price.items() if p is not None}
        if rows[k]["cost_usd"] is not None:
            rows[k]["cost_usd"] = None if len(known_prices) < len(by_price) else sum(
                ns * p / NS_PER_HOUR for p, ns in sorted(known_prices.items()))
    for k, n, nw, tin, tout, _p99 in reqs:
        r = row(str(k))
        r["requests"], r["input_tokens"], r["output_tokens"] = int(n), int(tin), int(tout)
        r["requests_weighted"] = nw
    out_rows = []
    for r in sorted(rows.values(), key=lambda x: (-x["gpu_ns"], x["key"])):
        r["gpu_seconds"] = r["gpu_ns"] / 1e9
        if r["cost_usd"] is not None and r["output_tokens"]:
            r["usd_per_1k_output_tokens"] = r["cost_usd"] / r["output_tokens"] * 1000
        if r["gpu_ns"]:
            r["tail_gpu_share"] = r["tail_gpu_ns"] / r["gpu_ns"]
        out_rows.append(r)
    replicas = []
    for replica, obs, alloc, cold, idle in rep_rows:
        price = prices.of(replica, top_model.get(replica))
        replicas.append({
            "replica": replica, "observed_ns": int(obs), "allocated_ns": int(alloc),
            "cold_start_ns": int(cold), "idle_ns": int(idle),
            "observed_seconds": int(obs) / 1e9, "allocated_seconds": int(alloc) / 1e9,
            "cold_start_seconds": int(cold) / 1e9, "idle_seconds": int(idle) / 1e9,
            "idle_share": int(idle) / int(obs) if obs else None,
            "gpu_hour_usd": price,
            "overhead_usd": _usd(int(cold) + int(idle), price),
        })
    observed = sum(r["observed_ns"] for r in replicas)
    idle = sum(r["idle_ns"] for r in replicas)
    cold = sum(r["cold_start_ns"] for r in replicas)
    allocated = sum(r["allocated_ns"] for r in replicas)
    overhead = [r["overhead_usd"] for r in replicas]
    row_cost = [r["cost_usd"] for r in out_rows]
    known = prices.known and None not in overhead and None not in row_cost
    totals = {
        "observed_ns": observed, "allocated_ns": allocated, "cold_start_ns": cold, "idle_ns": idle,
        "idle_share": idle / observed if observed else None,
        "allocated_usd": sum(c for c in row_cost if c is not None) if known else None,
        "overhead_usd": sum(c for c in overhead if c is not None) if known else None,
    }
    out = {
        "version": COST_VERSION, "by": by, "sampled": weighted,
        "since": iso(since_ns) if since_ns is not None else None,
        "until": iso(until_ns) if until_ns is not None else None,
        "gpu_hour_usd": prices.default,
        "prices": {"source": prices.source, "replica": dict(prices.replica), "model": dict(prices.model)},
        "rows": out_rows, "replicas": replicas, "totals": totals,
    }
    if keys is not None:
        out["selected"] = _selected(out_rows, keys, prices.known)
    return out


def _selected(rows: list[dict[str, Any]], keys: Iterable[str], priced: bool) -> dict[str, Any]:
    """The totals of the rows whose key is one of `keys`: their GPU ns and, when every one of them has a cost (and
    some price is set), the sum of their costs, else None. No row of those keys: 0 ns (and 0.0 USD when priced)."""
    wanted = {str(k) for k in keys}
    chosen = [r for r in rows if r["key"] in wanted]
    costs = [r["cost_usd"] for r in chosen]
    return {"keys": sorted(wanted), "allocated_ns": sum(int(r["gpu_ns"]) for r in chosen),
            "allocated_usd": sum(costs, 0.0) if priced and None not in costs else None}


def _requests_sql(con: duckdb.DuckDBPyConnection, facts: str, fkey: str, where: str, weighted: bool) -> str:
    """Per key of the requests starting in range: requests, requests_weighted, input / output tokens and the
    p99 of e2e; `weighted`: tokens and p99 weigh each request's adjusted count (tokens rounded to whole ones)."""
    if not weighted:
        return f"""
            WITH f AS (SELECT * FROM {facts} f WHERE {where}),
                 q AS (SELECT {fkey} AS key, quantile_cont(e2e_ns, {TAIL_Q}) AS p99 FROM f GROUP BY 1)
            SELECT {fkey} AS key, count(*) AS requests, count(*) AS requests_weighted,
                   coalesce(sum(f.input_tokens), 0)::BIGINT AS input_tokens,
                   coalesce(sum(f.output_tokens), 0)::BIGINT AS output_tokens, any_value(q.p99) AS p99_ns
            FROM f JOIN q ON q.key = {fkey} GROUP BY 1"""
    w = "adjusted_count" if "adjusted_count" in source_columns(con, facts) else "1.0"
    return f"""
        WITH f AS (SELECT *, {w} AS _w FROM {facts} f WHERE {where}),
             q AS (SELECT key, {weighted_quantiles_sql("e2e_ns", [TAIL_Q])}[1] AS p99
                   FROM (SELECT *, {fkey} AS key, {weighted_window_sql("e2e_ns", "_w", fkey)} FROM f f) GROUP BY 1)
        SELECT {fkey} AS key, count(*) AS requests, sum(f._w) AS requests_weighted,
               coalesce(round(sum(f._w * f.input_tokens)), 0)::BIGINT AS input_tokens,
               coalesce(round(sum(f._w * f.output_tokens)), 0)::BIGINT AS output_tokens, any_value(q.p99) AS p99_ns
        FROM f JOIN q ON q.key = {fkey} GROUP BY 1"""


def series_bucket_s(window_s: float) -> int:
    """The cell of a cost series drawn beside charts of `window_s` windows: the window rounded up to whole minutes
    (the sweep's cells), so that each cell is a sum of the minutes stored with the materialized hours."""
    cell_s = CELL_NS // 1_000_000_000
    return max(1, math.ceil(window_s / cell_s)) * cell_s


def cost_series(con: duckdb.DuckDBPyConnection, by: str = "tenant", bucket_s: int = 60,
                since: str | int | datetime | None = None, until: str | int | datetime | None = None,
                prices: Prices | None = None, facts: str | None = None, kept: KeptRuns | None = None) -> pl.DataFrame:
    """GPU time per grid cell and `by` value (the sweep cut at the grid), with idle and cold start (`kept`: as
    `gpu_shares`').

    Columns: bucket_start (UTC), bucket_ns, key, gpu_ns, cost_usd, observed_ns, gpus. The replicas' idle and
    cold-start time of each cell appear under the keys '(idle)' and '(cold start)'. Within a
    cell, allocated + cold start + idle = the replicas' observed time in it.

    observed_ns: the part of the cell that lies between the first instant any replica is observed in the range and
    the last (a cell at the range's or the store's edge is only partly observed); gpus = gpu_ns / observed_ns, the
    cell's GPUs in use over the time actually observed (GPU seconds a second), which a partly observed cell does
    not understate.
    """
    if by not in COST_GROUPS:
        raise QueryError("", f"cannot group cost by {by!r}; use one of {', '.join(COST_GROUPS)}")
    prices = prices or Prices()
    grid = int(bucket_s) * 1_000_000_000
    facts = facts or request_facts(con)
    shares, reps = gpu_shares(con, parse_time(since), parse_time(until), grid_ns=grid,
                              weighted=_sampled(con, facts), kept=kept)
    key = "s.replica" if by == "replica" else _key_expr(by, "f")
    try:
        gpu = con.sql(f"""
            SELECT s.bucket_ns, {key} AS key, s.replica, f.model, sum(s.allocated_ns)::BIGINT AS ns
            FROM {shares} s LEFT JOIN {facts} f ON f.trace_id = s.trace_id AND f.span_id = s.request_span_id
            GROUP BY ALL""").pl()
        over = con.sql(f"SELECT bucket_ns, replica, cold_start_ns, idle_ns, first_ns, last_ns FROM {reps}").pl()
    finally:
        drop_sweep(con)
    return _series_frame(gpu, over, prices, grid)


def _series_frame(gpu: pl.DataFrame, over: pl.DataFrame, prices: Prices, grid_ns: int) -> pl.DataFrame:
    """cost_series' frame from the engine's rows: GPU ns per (bucket, key, replica, model), and the replicas'
    cold start and idle ns per bucket with their observed windows (first_ns, last_ns), which give each cell's
    observed time (`cost_series`' rule)."""
    price = [prices.of(r, m) for r, m in zip(gpu["replica"].to_list(), gpu["model"].to_list(), strict=True)]
    gpu = gpu.with_columns(pl.Series("price", price, dtype=pl.Float64))
    over_rows = over.unpivot(index=["bucket_ns", "replica"], on=["cold_start_ns", "idle_ns"],
                             variable_name="key", value_name="ns").with_columns(
        pl.col("key").replace({"cold_start_ns": "(cold start)", "idle_ns": "(idle)"}),
        pl.col("replica").map_elements(lambda r: prices.of(r, None), return_dtype=pl.Float64).alias("price"),
        pl.lit(None, dtype=pl.String).alias("model"))
    cols = ("bucket_ns", "key", "ns", "price")
    both = pl.concat([gpu.select(cols), over_rows.select(cols)])
    out = both.group_by("bucket_ns", "key").agg(
        pl.col("ns").sum().cast(pl.Int64).alias("gpu_ns"),
        pl.when(pl.col("price").is_null().any()).then(None)
        .otherwise((pl.col("ns") * pl.col("price")).sum() / NS_PER_HOUR).alias("cost_usd"))
    out = out.filter(pl.col("gpu_ns") > 0).sort("bucket_ns", "key")
    first, last = (over.get_column("first_ns").min(), over.get_column("last_ns").max()) if over.height else (0, 0)
    observed = (pl.min_horizontal(pl.lit(last, pl.Int64), pl.col("bucket_ns") + grid_ns)
                - pl.max_horizontal(pl.lit(first, pl.Int64), pl.col("bucket_ns")))
    return out.with_columns(
        pl.from_epoch(pl.col("bucket_ns"), time_unit="ns").dt.replace_time_zone("UTC").alias("bucket_start"),
        observed.cast(pl.Int64).alias("observed_ns"),
    ).with_columns((pl.col("gpu_ns") / pl.col("observed_ns")).alias("gpus")).select(
        "bucket_start", "bucket_ns", "key", "gpu_ns", "cost_usd", "observed_ns", "gpus")


def clickhouse_cost(client: C.Client, facts: str, table: str = C.DEFAULT_TABLE, by: str = "tenant",
                    since: int | None = None, until: int | None = None, prices: Prices | None = None,
                    bucket_s: int | None = None, keys: Iterable[str] | None = None) -> dict[str, Any] | pl.DataFrame:
    """`cost_table` (or, with `bucket_s`, `cost_series`) on ClickHouse: the sweep (clickhouse_gpu_shares) and
    its joins with the request facts run on the server; only the rows per key, replica and model come back.

    `facts`: a relation with the request facts of `table` (the dashboard's session table, filtered).
    Unsampled requests only: the weighted p99 of the tail's share is not written for ClickHouse yet. `keys`: as
    `cost_table`'s (the table only).
    """
    if by not in COST_GROUPS:
        raise QueryError("", f"cannot group cost by {by!r}; use one of {', '.join(COST_GROUPS)}")
    prices = prices or Prices()
    if client.query(f"SELECT countIf(adjusted_count != 1) AS n FROM {facts}").to_pylist()[0]["n"]:
        raise QueryError("", "the requests are sampled, and the weighted cost runs on a store only so far")
    grid = None if bucket_s is None else int(bucket_s) * 1_000_000_000
    shares, reps = clickhouse_gpu_shares(client, table, since, until, grid_ns=grid, weighted=False)
    fkey = f"coalesce(toString(f.{by}), {C.literal(NONE_KEY)})"
    key = "s.replica" if by == "replica" else fkey
    join = f"FROM {shares} AS s LEFT JOIN {facts} AS f ON f.trace_id = s.trace_id AND f.span_id = s.request_span_id"
    settings = C.features(client).settings
    try:
        if grid is not None:
            gpu = pl.from_arrow(client.query(
                f"SELECT s.bucket_ns AS bucket_ns, {key} AS key, s.replica AS replica, f.model AS model, "
                f"toInt64(sum(s.allocated_ns)) AS ns {join} GROUP BY bucket_ns, key, replica, model", settings))
            over = pl.from_arrow(client.query(
                f"SELECT bucket_ns, replica, cold_start_ns, idle_ns, first_ns, last_ns FROM {reps}"))
            assert isinstance(gpu, pl.DataFrame) and isinstance(over, pl.DataFrame)
            return _series_frame(gpu.with_columns(pl.col("ns").cast(pl.Int64)), over, prices, grid)
        where = in_range_sql("f.start_ns", since, until)
        reqs_sql = (f"SELECT {fkey} AS key, count() AS requests, count() AS requests_weighted, "
                    f"toInt64(coalesce(sum(f.input_tokens), 0)) AS input_tokens, "
                    f"toInt64(coalesce(sum(f.output_tokens), 0)) AS output_tokens, "
                    f"quantileExactInclusive({TAIL_Q})(f.e2e_ns) AS p99_ns FROM {facts} AS f WHERE {where} "
                    "GROUP BY key")
        reqs = [tuple(r.values()) for r in client.query(reqs_sql, settings).to_pylist()]
        gpu_rows = client.query(
            f"SELECT {key} AS key, s.replica AS replica, f.model AS model, toInt64(sum(s.allocated_ns)) AS ns, "
            f"toInt64(sum(if({where} AND f.e2e_ns >= q.p99_ns, s.allocated_ns, 0))) AS tail_ns "
            f"{join} LEFT JOIN ({reqs_sql}) AS q ON q.key = {fkey} GROUP BY key, replica, model", settings).to_pylist()
        rep_rows = [tuple(r.values()) for r in client.query(
            f"SELECT replica, observed_ns, allocated_ns, cold_start_ns, idle_ns FROM {reps} ORDER BY replica"
        ).to_pylist()]
    finally:
        for name in (shares, reps):
            client.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    gpu_t = [(r["key"], r["replica"], r["model"], r["ns"], r["tail_ns"]) for r in gpu_rows]
    return _cost_json(by, prices, False, since, until, reqs, gpu_t, rep_rows, keys)
