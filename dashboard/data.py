"""The dashboard's one data-access module: the store, its cached connection, and cached calls into analysis.

The store is opened with analysis.engine.connect; the dashboard's `req` relation reads the hours
the store holds materialized (analysis.engine.materialize) in place and keeps only the stale hours'
rows in memory, recomputing an hour whenever analysis' key for it changes (a segment landed
in the hour or either neighbour). Segments are immutable Parquet files written by rename, so
refreshing while `tailscope collect` writes never locks or half-reads the store.

Pages call the functions below with a `Filters`. Each is a `st.cache_data` wrapper around a
public analysis function (analysis.report, .percentiles, .breakdowns, .traces, .whatif),
keyed by the store, its data version and the filters (the connection `_db` is unhashed);
this module computes nothing itself, so every number on a page is the analysis' own
(`tailscope report --json` gives the same spikes). Each call runs on its own `.cursor()`:
a DuckDB connection is not thread-safe, and Streamlit runs each session in its own thread.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import duckdb
import streamlit as st

# the store's opening needs only these (no polars, no analysis.report): see `_open_early`
from analysis.engine.attribute_values import LIVE_FILE_VIEW, LIVE_VALUES, keep_live_values, live_file_sql, write_live
from analysis.engine.connect import LIVE_FACTS_RID, connect, keep_live_facts, live_facts_from, live_requests_from
from analysis.engine.connect import refresh as refresh_views
from analysis.engine.materialize import (
    HOUR_NS,
    Snapshot,
    exact_hour_sql,
    hour_of,
    hour_where,
    request_keys_sql,
    snapshot,
    stored_source,
)
from analysis.engine.model import REQUEST_COLUMNS, facts_sql, requests_sql
from analysis.engine.views import VIEW_SQL, files_source, spans_sql
from dashboard.settings import DASHBOARD
from tracing import schema as S
from tracing.errors import QueryError, StoreError, TailscopeError
from tracing.store import default_store, require_store, segment_files

if TYPE_CHECKING:
    import pandas as pd

    from analysis.capacity import Workload

#: Latency metrics a page can chart: label → analysis metric name.
METRICS: dict[str, str] = {"end-to-end": "e2e", "TTFT": "ttft", "TPOT": "tpot"}
#: Critical-path stage columns of `requests`, in display order (they sum to e2e_ns).
STAGE_COLUMNS: tuple[str, ...] = tuple(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS)
#: Request outcomes (tracing.schema), in display order.
OUTCOMES: tuple[str, ...] = tuple(S.OUTCOMES)
SQL_ROW_LIMIT = 5_000
#: The sidebar offers the attributes at once (no toggle) while listing them costs at most about what reading this
#: many requests' values from the spans costs (about 1 CPU-s with 40 attributes: bench_attribute_choices) ...
LISTING_BUDGET_REQUESTS = 50_000
#: ... a request of a materialized hour counting for this share of one (its values read from the hour's file).
LISTING_MATERIALIZED_SHARE = 0.25
#: The GPU-time sweeps of live runs (analysis.cost.KeptRuns) a workbench keeps per refresh: the Cost page's range
#: and a few more (each about 20 bytes a request of the live hours).
KEPT_COST_RUNS = 8
#: A (re)load reading more segment bytes than this shows request facts first (see Workbench.refresh).
QUICK_LOAD_BYTES = DASHBOARD.quick_load_bytes.resolve_or_default(None, None, logging.getLogger("tailscope.dashboard"))


# --- where the store is ------------------------------------------------------------------

def engine_args(argv: list[str] | None = None) -> tuple[str, str, str]:
    """(engine, dsn, table): `--engine` / `--table` after `streamlit run app.py --`, else the variables above."""
    log = logging.getLogger("tailscope.dashboard")
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--engine", default=DASHBOARD.engine.resolve_or_default(None, None, log))
    parser.add_argument("--table", default=DASHBOARD.table.resolve_or_default(None, None, log))
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return args.engine, DASHBOARD.dsn.resolve_or_default(None, None, log), args.table


def store_path(argv: list[str] | None = None) -> Path:
    """The store: `--store DIR` passed after `streamlit run app.py --`, else $TAILSCOPE_STORE, else default."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--store", default=None)
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return Path(args.store).expanduser() if args.store else default_store()


# --- filters -----------------------------------------------------------------------------

# --- the workbench: one connection per store, the materialized hours read in place ------------

class KeptCostRuns(OrderedDict[Any, Any]):
    """analysis.cost.KeptRuns holding at most KEPT_COST_RUNS runs, the oldest put dropped first."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        while len(self) > KEPT_COST_RUNS:
            self.popitem(last=False)


def _list_source(files: list[Path]) -> str:
    return files_source([str(f) for f in files])


@dataclass
class Workbench:
    """A DuckDB connection (analysis.engine.connect) whose relation `req` holds every request of the store.

    `req` reads the hours the store holds materialized (analysis.engine.materialize) from their files
    in place, and the other (stale) hours from table `req_live`, which the workbench computes
    itself with the model's own SQL and keys by `Snapshot.key`: analysis owns the rule of
    which segments an hour's requests read, so an hour is recomputed exactly when analysis
    would call its file stale. `version` changes whenever `refresh()` found new or changed
    segments or files; it keys the caches.
    """

    store: Path
    con: duckdb.DuckDBPyConnection = field(init=False)
    version: int = 0
    snap: Snapshot | None = None
    #: key (Snapshot.key) of the rows `req_live` holds for each stale hour
    keys: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_refresh_s: float = 0.0
    last_refresh_took_s: float = 0.0
    pending: set[int] = field(default_factory=set)
    worker: threading.Thread | None = None
    worker_error: str | None = None
    #: the thread computing the unfiltered Overview's numbers into the query caches (see `warm`)
    warmer: threading.Thread | None = None
    #: set once that warm-up is over (its numbers cached, or it failed)
    warmed: threading.Event = field(default_factory=threading.Event)
    #: set once the warm-up has the unfiltered Overview's numbers (or is over): what a server waits for before it
    #: answers (dashboard/server.py); the full spike report and the other pages' imports go on behind
    overview_warmed: threading.Event = field(default_factory=threading.Event)
    #: requests of the hours not materialized (`req_live`'s rows) and of the materialized ones, as of the last refresh
    live_requests: int = 0
    stored_requests: int = 0
    #: the stale hours' request facts in start order (connect.keep_live_facts) and their attribute file
    #: (attribute_values.write_live), made once per refresh that changed them and shared by every report; a report's
    #: cursor pins the pair it started with (`pin`), and a pair is dropped once it is replaced and no cursor pins it
    #: (`pin_lock` guards these five; a cursor never waits for a refresh)
    live_facts: str | None = None
    live_file: Path | None = None
    live_serial: int = 0
    pins: Counter[str] = field(default_factory=Counter)
    retired: dict[str, Path | None] = field(default_factory=dict)
    pin_lock: threading.Lock = field(default_factory=threading.Lock)
    #: the GPU-time sweeps of the runs beside the stored hours (the live hours) for this refresh's segments
    #: (analysis.cost.gpu_shares' `kept`): a new price, grouping or filter on the Cost page reads them instead of
    #: sweeping again; replaced (empty) by a refresh that changed the data. `cost_lock`: one cost computation at a
    #: time, so that a page asking for a run being swept (the warm-up's, `keep_cost_runs`) waits for it
    cost_runs: KeptCostRuns = field(default_factory=KeptCostRuns)
    cost_lock: threading.Lock = field(default_factory=threading.Lock)
    #: the warm-up's sweep of those runs for the unfiltered Cost page (`warm_cost`), once started
    cost_warm: Future[None] | None = None
    #: the warm-up's last step, after that sweep: the unfiltered Capacity page (`prewarm_capacity`), once started
    capacity_warm: Future[None] | None = None
    scratch: Path = field(init=False)

    def __post_init__(self) -> None:
        self.con = connect(self.store)
        self.con.execute(_empty_req_sql(self.con))
        self.scratch = Path(tempfile.mkdtemp(prefix="tailscope-live-"))
        weakref.finalize(self, shutil.rmtree, self.scratch, True)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for this thread (a DuckDB connection is not thread-safe)."""
        return self.con.cursor()

    def refresh(self) -> bool:
        """Pick up segments and materialized files written since the last refresh; True when the data changed.

        Fresh hours are read from their files (nothing copied). A stale hour whose inputs changed
        (its key differs) is computed exactly at once when the change is small; a large load (the
        first open of a big store never materialized) first fills the request facts (one scan,
        no stage columns) so every page can render within seconds, and computes the critical
        paths hour by hour, newest first, in a background thread (`pending` holds the hours left).
        """
        with self.lock:
            t0 = time.perf_counter()
            snap = snapshot(self.store)
            old = self.snap
            if (old is not None and old.segments == snap.segments and old.fresh == snap.fresh
                    and old.mapping == snap.mapping):
                self.last_refresh_s = time.time()
                return False
            keys = {h: snap.key(h) for h in snap.stale}
            redo = sorted(h for h, k in keys.items() if self.keys.get(h) != k)
            gone = sorted((set(self.keys) - set(keys)) | set(redo))
            quick = sum(max(_size(f), 0) for f in snap.inputs(redo)) > QUICK_LOAD_BYTES
            cur = self.con.cursor()
            made: tuple[str, Path | None] | None = None
            staged = {name: f"_live_values_next_{name}" for name in LIVE_VALUES} if redo else None
            # when every stale hour is recomputed, `req_live` will hold exactly the requests the values are read for:
            # their attribute file is written beside the sweep too, not in the transaction (see `_keep_live`)
            early = (self.scratch / f"attributes-live-next-{self.live_serial + 1}.arrow"
                     if redo and set(redo) == set(keys) else None)
            try:
                with ThreadPoolExecutor(1, thread_name_prefix="tailscope-live-values") as pool:
                    # the new hours' attribute values on a cursor of their own, beside their rows (the sweep), into
                    # tables that the transaction below moves into LIVE_VALUES: no reader sees them before it commits
                    values = pool.submit(_stage_live_values, self.con, snap, redo, staged, early) if staged else None
                    if redo:
                        cur.execute(f"CREATE TEMP TABLE {_NEXT_ROWS} AS SELECT * FROM main.req_live LIMIT 0")
                    if redo and quick:
                        _insert_facts(cur, snap, redo, into=_NEXT_ROWS)
                    for hour in [] if quick else redo:
                        _insert_exact(cur, snap, hour, into=_NEXT_ROWS)
                    if values is not None:
                        values.result()
                cur.execute("BEGIN")
                if gone:
                    cur.execute("DELETE FROM req_live WHERE (start_ns // ?) * ? IN (SELECT unnest(?))",
                                [HOUR_NS, HOUR_NS, gone])
                if redo:
                    cur.execute(f"INSERT INTO req_live BY NAME SELECT * FROM {_NEXT_ROWS}")
                refresh_views(cur, self.store, snap)
                keep_live_values(cur, "req_live", gone, redo, staged=staged)  # the live hours' values, read once
                made = self._keep_live(cur, early)  # their facts and attribute file, made once for every report
                pending = ((self.pending & set(keys)) - set(redo)) | (set(redo) if quick else set())
                live_requests_from(cur, None if pending else "main.req_live")  # their exact rows, once all are
                cols = ", ".join(REQUEST_COLUMNS)
                stored = (f"SELECT {cols}, true AS critical_path FROM {stored_source(list(snap.fresh.values()))} "
                          "UNION ALL ") if snap.fresh else ""
                cur.execute(f"CREATE OR REPLACE VIEW req AS {stored}SELECT {cols}, critical_path FROM req_live")
                cur.execute("CREATE OR REPLACE VIEW requests AS SELECT * FROM req")
                cur.execute("CREATE OR REPLACE VIEW stages AS " + VIEW_SQL["stages"])
                live, every = cur.execute("SELECT (SELECT count(*) FROM req_live), (SELECT count(*) FROM req)"
                                          ).fetchall()[0]
                cur.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
                if made is not None and made[1] is not None:
                    made[1].unlink(missing_ok=True)
                if early is not None:
                    early.unlink(missing_ok=True)
                for table in (staged or {}).values():  # committed by their own cursor; moved (dropped) only above
                    with contextlib.suppress(duckdb.Error):
                        cur.execute(f"DROP TABLE IF EXISTS main.{table}")
                raise
            finally:
                cur.close()
            self.snap = snap
            self.keys = keys
            self.cost_runs = KeptCostRuns()  # the spans changed: the runs' sweeps are swept again when asked for
            with self.pin_lock:  # the next pair for new cursors; the replaced one dropped once no cursor pins it
                if self.live_facts is not None:
                    self.retired[self.live_facts] = self.live_file
                self.live_facts, self.live_file = made
            self._drop_unpinned()
            self.live_requests, self.stored_requests = int(live), int(every) - int(live)
            self.pending = pending
            self.version += 1
            self.last_refresh_s = time.time()
            self.last_refresh_took_s = time.perf_counter() - t0
        if self.pending:
            self._start_worker()
        return True

    def _keep_live(self, cur: duckdb.DuckDBPyConnection, written: Path | None = None) -> tuple[str, Path | None]:
        """Make the next table of the live hours' request facts from `req_live` (their facts are this workbench's
        rows, not recomputed) and, when they have rows and their values are kept, their attribute file (`written`:
        the file `_stage_live_values` wrote of exactly these requests, numbered as this table numbers them); point the
        connection's views at both. (table, file)."""
        self.live_serial += 1
        table = f"_live_facts_{self.live_serial}"
        keep_live_facts(cur, "req_live", table)
        have = {t for (t,) in cur.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
        path = None
        if set(LIVE_VALUES.values()) <= have and cur.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]:
            path = written or write_live(cur, table, self.scratch / f"attributes-live-{self.live_serial}.arrow")
        elif written is not None:
            written.unlink(missing_ok=True)
        cur.execute(f"CREATE OR REPLACE VIEW {LIVE_FILE_VIEW} AS {live_file_sql(path)}")
        return table, path

    def _drop_unpinned(self) -> None:
        """Drop the replaced live-facts tables and attribute files no cursor pins (call holding `lock`: never
        beside a refresh's transaction)."""
        with self.pin_lock:
            done = {t: p for t, p in self.retired.items() if not self.pins[t]}
            for table in done:
                del self.retired[table]
                self.pins.pop(table, None)
        if not done:
            return
        cur = self.con.cursor()
        try:
            for table, path in done.items():
                cur.execute(f"DROP TABLE IF EXISTS main.{table}")
                if path is not None:
                    path.unlink(missing_ok=True)
        finally:
            cur.close()

    def pin(self, cur: duckdb.DuckDBPyConnection) -> str | None:
        """Bind `cur` to the live facts and attribute file current now (temporary views on it): a refresh making the
        next ones meanwhile cannot change the rows, or their ids, that a report on `cur` reads. The pinned table's
        name, for `unpin` once `cur` is closed."""
        with self.pin_lock:
            table = self.live_facts
            if table is None:
                return None
            self.pins[table] += 1
            path = self.live_file
        live_facts_from(cur, table, temporary=True)
        cur.execute(f"CREATE OR REPLACE TEMP VIEW {LIVE_FILE_VIEW} AS {live_file_sql(path)}")
        return table

    def unpin(self, table: str | None) -> None:
        """Release a `pin`; a table replaced meanwhile is dropped with its file when this was its last cursor (or by
        the refresh running now, which this does not wait for)."""
        if table is None:
            return
        with self.pin_lock:
            self.pins[table] -= 1
        if self.lock.acquire(blocking=False):
            try:
                self._drop_unpinned()
            finally:
                self.lock.release()

    def refresh_if_gone(self) -> bool:
        """Refresh when a materialized file `req` reads, or a segment the views read, was removed (superseded
        or merged by compaction, then deleted after its grace period; or its hour removed by retention): a
        dashboard left open that long would otherwise fail to read it. True when refreshed."""
        snap = self.snap
        if snap is not None and any(not f.exists() for f in (*snap.fresh.values(), *snap.segments)):
            return self.refresh()
        return False

    def warm(self) -> None:
        """Start computing the unfiltered Overview's numbers (its spikes first) in a background thread.

        Called when the store opens with every hour's rows ready: the spike detection (the longest
        step of the first page) and the summary and series run in two threads while the first
        session draws its sidebar and imports its page (each call's result is cached and computed
        once: a page reaching a call a thread is computing waits for it); the explanations for the
        Spike page follow (see `prewarm`).
        """
        if any(t is not None and t.is_alive() for t in (self.worker, self.warmer)):
            return
        self.warmer = threading.Thread(target=self._warm, name="tailscope-prewarm", daemon=True)
        self.warmer.start()

    def _warm(self) -> None:
        try:
            with contextlib.suppress(Exception):  # a cache warm-up must never take the server down
                _IMPORTED.wait(IMPORT_WAIT_S)  # a store opened while this module is imported (`_open_early`)
                prewarm(self)
        finally:
            self.overview_warmed.set()
            self.warmed.set()  # the cost sweep below is not waited for
        self.warm_behind()

    def warm_behind(self) -> None:
        """The warm-up's steps after the Overview's numbers, once per opening: the Cost page's sweep, then the
        unfiltered Capacity page."""
        self.warm_cost()
        self.warm_capacity()

    def warm_cost(self) -> None:
        """Start `prewarm_cost` in its own (non-daemon) thread, `cost_warm`: an interpreter exiting meanwhile waits
        for its DuckDB queries instead of ending under them."""
        self.cost_warm = _WARM_COST.submit(_quietly(prewarm_cost, self))

    def warm_capacity(self) -> None:
        """Start `prewarm_capacity` in the same thread after the cost sweep, `capacity_warm`: the unfiltered Capacity
        page's curve (its workload read and about thirty replays: 2-3 CPU-s at 1.4 M requests), computed once per
        opening (not per refresh: a refresh that changed the data leaves it unused), so that a first visit of the
        page finds it instead of waiting for it."""
        self.capacity_warm = _WARM_COST.submit(_quietly(prewarm_capacity, self))

    def _start_worker(self) -> None:
        if self.worker is not None and self.worker.is_alive():
            return
        self.worker = threading.Thread(target=self._compute_pending, name="tailscope-critical-path", daemon=True)
        self.worker.start()

    def _compute_pending(self) -> None:
        """Replace the facts-only rows of each pending hour (newest first) with the exact `requests` rows."""
        while True:
            with self.lock:
                if not self.pending or self.snap is None:
                    break
                hour = max(self.pending)
                snap, key = self.snap, self.keys.get(hour)
            work = self.con.cursor()
            try:
                work.execute("CREATE TEMP TABLE exact_rows AS SELECT * FROM main.req_live LIMIT 0")
                _insert_exact(work, snap, hour, into="exact_rows")
                with self.lock:
                    if hour not in self.pending or key != self.keys.get(hour):
                        continue  # a refresh recomputed or changed this hour meanwhile
                    work.execute("BEGIN")
                    work.execute("DELETE FROM main.req_live WHERE (start_ns // ?) * ? = ?", [HOUR_NS, HOUR_NS, hour])
                    work.execute("INSERT INTO main.req_live BY NAME SELECT * FROM exact_rows")
                    if self.pending == {hour}:  # every live row exact now
                        live_requests_from(work, "main.req_live")
                    work.execute("COMMIT")
                    self.pending.discard(hour)
                    self.version += 1
            except (duckdb.Error, ValueError) as exc:  # keep the facts rows; say why on the pages
                with self.lock:
                    self.pending.discard(hour)
                    self.worker_error = f"could not compute the critical paths of one hour because {exc}"
            finally:
                work.close()
        with contextlib.suppress(Exception):  # a cache warm-up must never take the server down
            _IMPORTED.wait(IMPORT_WAIT_S)
            prewarm(self)
        self.warm_behind()

    def loading_note(self) -> str | None:
        """A sentence for the pages while critical paths are still being computed, else None."""
        if self.pending:
            hours = len(self.pending)
            return (f"Critical paths (stage columns) are still being computed for {hours} hour(s) of data, "
                    "newest first; stage breakdowns fill in as they finish. Refresh, or turn Live on, to update.")
        return self.worker_error

    def files_for(self, start_ns: int) -> list[Path]:
        """Segment files that can hold spans of a request starting at `start_ns` (materialize's rule)."""
        return self.snap.inputs([hour_of(start_ns)]) if self.snap is not None else []

    # --- the engine seam (dashboard.engine.Engine): each a public analysis function over `req` ----------------

    def can(self, capability: str) -> bool:
        """A store does everything the pages ask (dashboard.engine.CAPABILITIES); it lists the attributes at once
        while that is cheap (LISTING_BUDGET_REQUESTS)."""
        if capability == "attribute_listing":
            cost = self.live_requests + LISTING_MATERIALIZED_SHARE * self.stored_requests
            return cost <= LISTING_BUDGET_REQUESTS
        return capability in CAPABILITIES

    def missing(self, capability: str) -> str:
        """Why the store cannot do `capability` now (empty when it can)."""
        if capability == "attribute_listing" and not self.can(capability):
            return (f"listing them reads the values of {self.stored_requests + self.live_requests:,} requests, "
                    f"{self.live_requests:,} of them from the spans (hours not materialized yet)")
        return ""

    def choices(self, dims: Sequence[str]) -> dict[str, Any]:
        """analysis.breakdowns.time_bounds and dimension_values over every request."""
        with _cursor(self) as cur:
            lo, hi, n = B.time_bounds(cur, "req")
            return {"min_ns": lo, "max_ns": hi, "requests": n, **B.dimension_values(cur, dims, "req")}

    def attribute_choices(self) -> dict[str, dict[str, Any]]:
        """analysis.attribute_filters.attribute_choices over every request: the materialized hours' rows by their
        store row ids (their attribute values are read from the files written with them), the others' by rowid."""
        cols = ", ".join(["trace_id", "span_id", "start_ns", *X.DIMENSIONS])
        rows = (f"(SELECT rid, {cols} FROM _request_rows_stored UNION ALL "
                f"SELECT rowid AS rid, {cols} FROM main.req_live)")
        with _cursor(self) as cur:
            return AF.attribute_choices(cur, rows, store_rows=True)

    def summary(self, f: Filters) -> dict[str, Any]:
        """analysis.breakdowns.summary of the filtered requests."""
        cond, params = f.where()
        with _cursor(self) as cur:
            return B.summary(cur, "req", cond, params)

    def time_bounds(self, f: Filters) -> tuple[int | None, int | None, int]:
        """analysis.breakdowns.time_bounds of the filtered requests."""
        with _cursor(self, f) as cur:
            return B.time_bounds(cur, "requests")

    def series(self, f: Filters, metric: str, window_s: int) -> pl.DataFrame:
        """analysis.engine.percentiles.percentile_series of the filtered requests."""
        with _cursor(self, f) as cur:
            return percentile_series(cur, metric, window_s=window_s, since=f.since_ns, until=f.until_ns,
                                     source="requests")

    def report(self, f: Filters, metric: str, window_s: int | None, explain: bool) -> dict[str, Any]:
        """analysis.report.build_report (find_spikes without `explain`) over the filtered requests."""
        run = build_report if explain else find_spikes
        source = _report_source(self, f)
        with _cursor(self, f) as cur:
            return cast(dict[str, Any], run(cur, metric=metric, window_s=window_s, since=f.since_ns,
                                            until=f.until_ns, include_failures=True, source=source,
                                            only=_report_only(f, source)))

    def explain_window(self, f: Filters, start_ns: int, end_ns: int, metric: str,
                       window_s: int | None) -> dict[str, Any]:
        """analysis.report.explain_window over the filtered requests."""
        source = _report_source(self, f)
        with _cursor(self, f) as cur:
            return cast(dict[str, Any], explain_window(cur, start_ns, end_ns, metric=metric, window_s=window_s,
                                                       since=f.since_ns, until=f.until_ns, source=source,
                                                       only=_report_only(f, source)))

    def shape(self, f: Filters, metric: str, by: tuple[str, ...]) -> pd.DataFrame:
        """analysis.breakdowns.shape of the filtered requests."""
        cond, params = f.where()
        with _cursor(self) as cur:
            return B.shape(cur, metric, by, "req", cond, params).to_pandas()

    def replicas(self, f: Filters, metric: str) -> pd.DataFrame:
        """analysis.breakdowns.replicas of the filtered requests."""
        cond, params = f.where()
        with _cursor(self) as cur:
            return B.replicas(cur, metric, "req", cond, params).to_pandas()

    def by_attribute(self, f: Filters, metric: str, key: str, choice: dict[str, Any]) -> pd.DataFrame:
        """analysis.attribute_filters.by_attribute of the filtered requests."""
        cond, params = f.where()
        with _cursor(self) as cur:
            return AF.by_attribute(cur, key, choice, metric, "req", cond, params).to_pandas()

    def outlier_explanations(self, f: Filters, metric: str) -> list[dict[str, Any]]:
        """analysis.stats.verdicts.outlier_explanations of the filtered requests."""
        cond, params = f.where()
        with _cursor(self) as cur:
            return V.outlier_explanations(cur, metric, "req", cond, params)

    def exemplars(self, f: Filters, limit: int, metric: str, trace_ids: tuple[str, ...] | None) -> pd.DataFrame:
        """analysis.traces.slowest of the filtered requests (only `trace_ids`, when given)."""
        cond, params = f.where()
        if trace_ids is not None:
            cond, params = f"({cond}) AND list_contains(?, trace_id)", [*params, list(trace_ids)]
        with _cursor(self) as cur:
            return T.slowest(cur, metric, limit, "req", cond, params).to_pandas()

    def find_trace(self, trace_id: str) -> pd.DataFrame:
        """analysis.traces.find_requests over every request."""
        with _cursor(self) as cur:
            return T.find_requests(cur, trace_id, "req").to_pandas()

    def trace_spans(self, trace_id: str, start_ns: int) -> pd.DataFrame:
        """analysis.traces.waterfall, reading only the segments of the request's hour and the next."""
        files = self.files_for(start_ns)
        if not files:
            import pandas as pd

            return pd.DataFrame()
        with _cursor(self) as cur:
            mapping = self.snap.mapping if self.snap is not None else None
            cur.execute(f"CREATE TEMP VIEW spans AS {spans_sql(_list_source(files), mapping)}")
            return T.waterfall(cur, trace_id).to_pandas()

    def workload(self, f: Filters) -> Workload:
        """analysis.capacity.observed_workload of the filtered requests."""
        from analysis.capacity import observed_workload

        with _cursor(self, f) as cur:
            return observed_workload(cur, f.since_ns, f.until_ns)

    def cost(self, f: Filters, by: str, gpu_hour_usd: float | None, bucket_s: int | None) -> Any:
        """analysis.cost.cost_table (or with `bucket_s` cost_series, as pandas) over the filters' time range."""
        from analysis.cost import cost_series, cost_table, prices_for

        prices = prices_for(Path(self.store), None, gpu_hour_usd)
        kept = self.cost_runs
        with self.cost_lock, _cursor(self) as cur:
            if bucket_s is None:
                return cost_table(cur, by=by, since=f.since_ns, until=f.until_ns, prices=prices, facts="req",
                                  kept=kept)
            return cost_series(cur, by=by, bucket_s=bucket_s, since=f.since_ns, until=f.until_ns, prices=prices,
                               facts="req", kept=kept).to_pandas()

    def cost_page(self, f: Filters, by: str, gpu_hour_usd: float | None, bucket_s: int,
                  keys: tuple[str, ...] | None = None) -> tuple[Any, pd.DataFrame]:
        """analysis.cost.cost_page: the cost table (with `keys`, their totals) and its series (pandas) from one sweep
        over the filters' range."""
        from analysis.cost import cost_page, prices_for

        prices = prices_for(Path(self.store), None, gpu_hour_usd)
        kept = self.cost_runs
        with self.cost_lock, _cursor(self) as cur:
            table, series = cost_page(cur, by=by, bucket_s=bucket_s, since=f.since_ns, until=f.until_ns,
                                      prices=prices, facts="req", keys=keys, kept=kept)
            return table, series.to_pandas()

    def keep_cost_runs(self, f: Filters, bucket_s: int) -> int:
        """analysis.cost.keep_runs: the GPU-time sweep of the live runs of the filters' time range at the Cost page's
        cells, kept for this refresh (`cost_runs`); the number of runs swept."""
        from analysis.cost import keep_runs

        kept = self.cost_runs
        with self.cost_lock, _cursor(self) as cur:
            return keep_runs(cur, kept, f.since_ns, f.until_ns, int(bucket_s) * 1_000_000_000, facts="req")

    def run_sql(self, sql: str, timeout_s: float, limit: int) -> tuple[pd.DataFrame, bool]:
        """One read-only query in the store's sandbox (see `run_sql`)."""
        return run_sql(str(self.store), sql, timeout_s, limit)

    def sql_help(self) -> tuple[str, dict[str, str]]:
        """The console's caption and examples (DuckDB SQL over the store's views)."""
        return ("One SELECT (or WITH … SELECT) over the views `spans`, `requests`, `stages` (see docs/schema.md). "
                "The console reads only the store: no files, no network, no COPY/ATTACH/INSTALL; a query running "
                f"past {SQL_TIMEOUT_S:g} s is interrupted. Sidebar filters do not apply here.", SQL_EXAMPLES)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # compacted away between glob and stat
        return -1


def _insert_exact(cur: duckdb.DuckDBPyConnection, snap: Snapshot, hour: int, into: str = "req_live") -> None:
    """Insert the exact `requests` rows of one stale hour: the rows its materialized file would hold, computed as
    the hour's build computes them (the critical-path sweep in C where it is built)."""
    with exact_hour_sql(cur, snap, hour) as sql:
        cur.execute(f"INSERT INTO {into} BY NAME SELECT *, true AS critical_path FROM ({sql})")


def _insert_facts(cur: duckdb.DuckDBPyConnection, snap: Snapshot, hours: list[int], into: str = "req_live") -> None:
    """Insert request facts (no stage columns) of the requests starting in `hours`: one scan of their inputs."""
    source = f"({spans_sql(_list_source(snap.inputs(hours)), snap.mapping)})"
    cur.execute(f"""
        INSERT INTO {into} BY NAME
        SELECT *, make_timestamp(start_ns // 1000) AS start, start_ns + e2e_ns AS end_ns, false AS critical_path
        FROM ({facts_sql(source, request_where=hour_where(hours))})""")


#: The temporary table of a refresh's new `req_live` rows, computed before its transaction (see `_stage_live_values`).
_NEXT_ROWS = "_req_live_next"


def _stage_live_values(con: duckdb.DuckDBPyConnection, snap: Snapshot, hours: list[int], into: dict[str, str],
                       file: Path | None = None) -> None:
    """Compute the attribute values of the stale `hours` of `snap` (attribute_values.keep_live_values) into the tables
    `into`, committed on a cursor of their own over views of the snapshot's files: the requests are the model's
    request spans of each hour (materialize.request_keys_sql, the rows the sweep computes), so this runs beside the
    critical-path sweep (both mostly in DuckDB and the C kernel, which release the GIL) instead of after it. `file`:
    also write these requests' attribute file there (attribute_values.write_live), their rows numbered as
    connect.keep_live_facts numbers the same requests (for a refresh whose live rows will be exactly these)."""
    cur = con.cursor()
    try:
        for table in into.values():  # left by a refresh that failed before moving them
            cur.execute(f"DROP TABLE IF EXISTS main.{table}")
        mapping = snap.mapping
        cur.execute(f"CREATE TEMP VIEW _next_spans AS {spans_sql(_list_source(list(snap.segments)), mapping)}")
        cur.execute(f"CREATE TEMP VIEW _next_spans_live AS "
                    f"{spans_sql(_list_source(snap.inputs(snap.stale)), mapping)}")
        cur.execute("CREATE TEMP TABLE _next_keys AS " + " UNION ALL ".join(
            f"({request_keys_sql(snap, h)})" for h in hours))
        keep_live_values(cur, "_next_keys", [], hours, spans="_next_spans", live_spans="_next_spans_live", into=into)
        if file is not None:
            cur.execute(f"CREATE TEMP TABLE _next_facts AS SELECT trace_id, span_id, start_ns, {LIVE_FACTS_RID} "
                        "FROM _next_keys")
            write_live(cur, "_next_facts", file, values=into)
    finally:
        cur.close()


def _empty_req_sql(con: duckdb.DuckDBPyConnection) -> str:
    """CREATE TABLE req_live with the `requests` view's columns, `critical_path` and no rows.

    The types are read from the model's SQL over an empty span table on a cursor of `con` (its temp
    objects go with it). The empty table is tracing.schema.empty_span_table (no pandas import before the store
    can open).
    """
    cur = con.cursor()
    try:
        cur.register("_empty_spans_for_req", S.empty_span_table())
        cur.execute("CREATE TEMP VIEW _empty_req AS " + requests_sql("(" + spans_sql("_empty_spans_for_req") + ")"))
        cols = cur.execute("DESCRIBE _empty_req").fetchall()
    finally:
        cur.close()
    return ("CREATE OR REPLACE TABLE req_live (" + ", ".join(f'"{c[0]}" {c[1]}' for c in cols)
            + ", critical_path BOOLEAN)")


@st.cache_resource(show_spinner="Loading the store…")
def workbench(store: str) -> Workbench:
    """The workbench of `store`, loaded once per server process and shared by every session."""
    wb = Workbench(require_store(Path(store)).resolve())
    wb.refresh()
    if not wb.pending:  # else the background pass warms the caches once the critical paths are done
        wb.warm()
    return wb


def _open_early() -> None:
    """Start opening the configured store (`workbench`, which the router's `open_store` then waits for) in a thread,
    when this module is first imported by a session's script (the first session of a server just started): the
    imports below (polars, the analysis stack: about 0.3 CPU-s) then run beside the store's refresh, mostly DuckDB
    queries and the C sweep, which release the interpreter, instead of before it. A failure is left for
    `open_store` to report."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    if get_script_run_ctx(suppress_warning=True) is None or engine_args()[0] != "duckdb":
        return
    path = str(store_path())

    def opening() -> None:
        with contextlib.suppress(Exception):
            workbench(path)

    threading.Thread(target=opening, name="tailscope-open", daemon=True).start()


#: Set once this module is imported: the warm-up (`prewarm`, from a store opened early) calls what is defined below.
_IMPORTED = threading.Event()
#: The longest the warm-up waits for that (seconds; an import that failed leaves the pages to report it).
IMPORT_WAIT_S = 60.0
_open_early()

# --- what the pages' queries need: imported while the store opens (`_open_early`) ----------------------------------

import polars as pl  # noqa: E402

from analysis import attribute_filters as AF  # noqa: E402
from analysis import breakdowns as B  # noqa: E402
from analysis import traces as T  # noqa: E402
from analysis.attribute_filters import AttributeFilter  # noqa: E402
from analysis.engine.percentiles import auto_window_s, parse_time, percentile_series  # noqa: E402
from analysis.engine.sandbox import SandboxConnection  # noqa: E402
from analysis.mapping.rules import no_request_hint as _no_request_hint  # noqa: E402
from analysis.report import build_report, explain_window, find_spikes, marks_of  # noqa: E402
from analysis.stats import explain as X  # noqa: E402
from analysis.stats import verdicts as V  # noqa: E402
from analysis.stats.spikes import MIN_RISE as SPIKE_MIN_RISE  # noqa: E402
from dashboard import clickhouse_data as CHD  # noqa: E402
from dashboard.engine import CAPABILITIES, FILTER_DIMENSIONS, Engine, Filters  # noqa: E402

#: Seconds a SQL console query may run before it is interrupted.
SQL_TIMEOUT_S = CHD.SQL_TIMEOUT_S


@st.cache_resource(show_spinner="Computing the requests on ClickHouse…")
def clickhouse_bench(dsn: str, table: str) -> CHD.ClickHouseBench:
    """The ClickHouse bench of `dsn` / `table`, opened once per server process and shared by every session."""
    return CHD.open_bench(dsn, table)


#: What a page reads: the store's workbench, or a ClickHouse table's bench (the seam: dashboard.engine.Engine).
Bench = Engine


def open_store() -> Bench:
    """The workbench of the configured store (or ClickHouse table); shows an error and stops the page if it fails."""
    engine, dsn, table = engine_args()
    if engine == "clickhouse":
        try:
            return clickhouse_bench(dsn, table)
        except TailscopeError as exc:
            st.error(f"cannot open ClickHouse: {exc}")
            st.stop()
            raise
    path = store_path()
    try:
        wb = workbench(str(path))
        wb.refresh_if_gone()
        return wb
    except StoreError as exc:
        st.error(f"{exc}")
        st.stop()
        raise  # unreachable: st.stop() raises


def open_for(title: str, capability: str) -> Bench:
    """The engine, for a page that needs `capability`: where the engine cannot, the page says why and stops."""
    db = open_store()
    if not db.can(capability):
        st.title(title)
        st.info(f"The {title} page does not run on this engine yet: {db.missing(capability)}; open "
                "`tailscope dashboard --store DIR` on a store for it.")
        st.stop()
        raise AssertionError("unreachable: st.stop() raises")
    return db


@contextlib.contextmanager
def _cursor(db: Workbench, filters: Filters | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor whose `requests` (and so `stages`) shows only the rows `filters` keeps, pinned to the live hours'
    facts of now (`Workbench.pin`)."""
    cur = db.cursor()
    pinned = None
    try:
        pinned = db.pin(cur)
        if filters is not None:
            cond, params = filters.where()
            cur.execute(f"CREATE TEMP VIEW requests AS SELECT * FROM main.req WHERE {_inline(cond, params)}")
        yield cur
    finally:
        cur.close()
        db.unpin(pinned)


def _inline(cond: str, params: list[Any]) -> str:
    """`cond` with its ? parameters inlined as literals (a view cannot take parameters)."""
    out: list[str] = []
    it = iter(params)
    for piece in cond.split("?")[:-1]:
        value = next(it)
        lit = str(int(value)) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"
        out.append(piece + lit)
    out.append(cond.split("?")[-1])
    return "".join(out)


# --- queries: caching wrappers around public analysis functions -------------------------

@st.cache_data(show_spinner=False, max_entries=64)
def choices(_db: Bench, store: str, version: int) -> dict[str, Any]:
    """Time bounds and the distinct values of each filter dimension, over the whole store."""
    return _db.choices(FILTER_DIMENSIONS)


@st.cache_data(show_spinner=False, max_entries=16)
def attribute_choices(_db: Bench, store: str, version: int) -> dict[str, dict[str, Any]]:
    """The attributes the report considers over the whole store and their values ({} where the engine cannot)."""
    return _db.attribute_choices() if _db.can("attribute_filters") else {}


def attribute_filter(choices: dict[str, dict[str, Any]], key: str, values: tuple[str, ...]) -> AttributeFilter:
    """analysis.attribute_filters.attribute_filter: the sidebar's attribute pick as a filter."""
    return AF.attribute_filter(choices, key, values)


@st.cache_data(show_spinner=False, max_entries=64)
def by_attribute(_db: Bench, store: str, version: int, filters: Filters, metric: str, key: str) -> pd.DataFrame:
    """Per value of attribute `key` under `filters` (the replicas' columns; empty where the engine cannot)."""
    import pandas as pd

    choices = attribute_choices(_db, store, version)
    if key not in choices:
        return pd.DataFrame()
    return _db.by_attribute(filters, metric, key, choices[key])


def attribute_table(db: Bench, f: Filters, metric: str, key: str, title: str) -> None:
    """Requests and p50/p99 per value of attribute `key` (analysis.attribute_filters.by_attribute) as a chart (p99
    bars, p50 ticks, outliers marked, slowest first) and a table."""
    from dashboard import charts, formats

    df = by_attribute(db, str(db.store), db.version, f, metric, key)
    if df.empty:
        st.info("No requests match the filters.")
        return
    df = df.sort_values(["p99_ms", "value"], ascending=[False, True])
    # the chart's requests: what the stored ones stand for (the table shows both counts when sampled)
    weighted = df["requests_weighted"] if "requests_weighted" in df.columns else df["requests"]
    st.altair_chart(charts.replica_chart(df.assign(requests=weighted), "value", key), width="stretch",
                    key=f"by_attr_chart_{title}")
    st.caption(f"Per value of {key}: bars p99 (red: an outlier, more than 3 robust deviations and 20% above the "
               f"median p99 of the values with {MIN_REPLICA_REQUESTS} requests or more; grey: fewer, not judged), "
               "ticks p50; (none): requests without a value.")
    cols = [c for c in ("value", "outlier", "requests", "p50_ms", "p99_ms", *OUTCOMES, "n_effective")
            if c in df.columns]
    st.dataframe(df[cols], hide_index=True, key=f"by_attr_{title}", column_config={
        "value": st.column_config.TextColumn(key), "requests": formats.number("requests"),
        "n_effective": formats.number("effective requests"), "p50_ms": formats.ms("p50"), "p99_ms": formats.ms("p99"),
        **{o: formats.number(o) for o in OUTCOMES}})


def attribute_pick(db: Bench, page: str, label: str) -> str | None:
    """The attribute to group by (widget `<page>_attribute`, titled `label`), behind a toggle (`<page>_by_attr`)
    where listing the attributes is not cheap; None until one is picked or where the engine cannot."""
    if not db.can("attribute_filters"):
        st.toggle(label, key=f"{page}_by_attr", disabled=True, help=db.missing("attribute_filters"))
        return None
    if not db.can("attribute_listing") and not st.toggle(label, key=f"{page}_by_attr",
                                                         help=db.missing("attribute_listing")):
        return None
    keys = list(attribute_choices(db, str(db.store), db.version))
    return st.selectbox(label, keys, index=None, key=f"{page}_attribute", placeholder="pick an attribute")


def no_request_hint(store: Path | str) -> str:
    """What to run when the store holds spans but no request (analysis.mapping's words)."""
    return _no_request_hint(store)


@st.cache_data(show_spinner=False, max_entries=256)
def summary(_db: Bench, store: str, version: int, filters: Filters) -> dict[str, Any]:
    """analysis.breakdowns.summary of the filtered requests: counts per outcome, p50/p90/p99 (ms)."""
    return _db.summary(filters)


@st.cache_data(show_spinner=False, max_entries=256)
def detection(_db: Bench, store: str, version: int, filters: Filters) -> dict[str, Any]:
    """The filtered requests' count and the window spike detection can judge them at (analysis.stats.verdicts):
    {"requests", "judged_window_s" (None: detection cannot judge this few requests), "window_s" (what the
    charts use: the judged window, else the report's own)}."""
    first, last, n = _db.time_bounds(filters)
    judged = V.range_window_s(first, last, n, filters.since_ns, filters.until_ns)
    if judged is not None or not n or first is None or last is None:
        shown = judged or 60
    else:
        lo = filters.since_ns if filters.since_ns is not None else first
        hi = filters.until_ns if filters.until_ns is not None else last + 1
        shown = auto_window_s(n, max(hi - lo, 1) / 1e9)
    return {"requests": n, "judged_window_s": judged, "window_s": shown}


def window_s(_db: Bench, store: str, version: int, filters: Filters) -> int:
    """The window of every chart and of the spike detection under `filters` (see `detection`)."""
    return int(detection(_db, store, version, filters)["window_s"])


def cost_bucket_s(_db: Bench, store: str, version: int, filters: Filters) -> int:
    """The Cost page's cells: the report's window (`window_s`) rounded up to whole minutes, the GPU-time sweep's
    cells, so that the series sums the minutes stored with each materialized hour (analysis.cost.series_bucket_s)."""
    from analysis.cost import series_bucket_s

    return series_bucket_s(window_s(_db, store, version, filters))


@st.cache_data(show_spinner=False, max_entries=256)
def over_time(_db: Bench, store: str, version: int, filters: Filters,
              metrics: tuple[str, ...] = ("e2e", "ttft", "tpot")) -> pl.DataFrame:
    """analysis.engine.percentiles.percentile_series of `metrics` (e2e, TTFT and TPOT; the Spike page charts e2e
    only) over the filtered requests, in the report's windows: one row per window (`window_ns`, `window` a UTC
    datetime), <metric>_p50_ms / _p90_ms / _p99_ms and counts per outcome (weighted: the requests the stored ones
    stand for under sampling).

    A polars frame: the Overview draws it without importing pandas (a second of CPU on a first page).
    """
    win = window_s(_db, store, version, filters)  # the report's window, chosen once (not once per metric)
    frames: list[pl.DataFrame] = []
    for m in metrics:
        df = _db.series(filters, m, win)
        # counts are what the stored requests stand for (equal to the stored counts when unsampled)
        keep = [pl.col("window_start_ns")] + ([pl.col(f"{c}_weighted").alias(c) for c in
                                              ("requests", "ok", "errors", "timeouts", "cancelled")]
                                             if not frames else [])
        frames.append(df.select(keep + [pl.col(f"{q}_ms").alias(f"{m}_{q}_ms") for q in ("p50", "p90", "p99")]))
    out = frames[0]
    for f in frames[1:]:
        out = out.join(f, on="window_start_ns", how="left")
    out = out.rename({"window_start_ns": "window_ns", "errors": "error", "timeouts": "timeout"})
    return out.with_columns(window=pl.col("window_ns").cast(pl.Datetime("ns", "UTC")))


#: At most this many stale (live) hours, an unfiltered report reads the store as `tailscope report` does: see
#: `_report_source`. `tailscope collect` leaves two hours live (the current one and the one before).
LIVE_HOURS_IN_PLACE = 2


def _report_source(db: Workbench, filters: Filters) -> str | None:
    """Where a report call reads its requests. Without an attribute filter (a time range is the report's own
    since/until, the dimension values its `only`: `_report_only`) on a store with at most LIVE_HOURS_IN_PLACE stale
    hours: the store's own request facts (None), as `tailscope report` reads them (analysis.engine.percentiles.
    request_facts: the materialized hours in place, the few live hours' facts from the workbench's rows), with no
    copy of the requests. Otherwise `requests`, the cursor's filtered view of `req`, copied by the report, instead
    of rescanning the store's spans."""
    snap = db.snap
    if not filters.attributes and snap is not None and len(snap.stale) <= LIVE_HOURS_IN_PLACE:
        return None
    return "requests"


def _report_only(filters: Filters, source: str | None) -> dict[str, tuple[str, ...]] | None:
    """The dimension values a report reading the store's own facts (`source` None) keeps (analysis.report's `only`);
    None for a caller's source (already filtered)."""
    return None if source is not None else {d: getattr(filters, d) for d in FILTER_DIMENSIONS if getattr(filters, d)}


def report_of(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e") -> dict[str, Any]:
    """analysis.report.build_report over the filtered requests: the `tailscope report --json` contract.

    The report reads the request facts where `_report_source` says; stage shares come from the
    materialized files or `spans`.
    """
    # st.cache_data keys on the arguments as passed (a default left out is another key): pass them all
    return _report_of(_db, store, version, filters, metric)


@st.cache_data(show_spinner="Looking for spikes…", max_entries=128)
def _report_of(_db: Bench, store: str, version: int, filters: Filters, metric: str) -> dict[str, Any]:
    """The cached body of report_of, on the store's workbench or on ClickHouse."""
    win = detection(_db, store, version, filters)["judged_window_s"]
    try:
        return _db.report(filters, metric, win, True)
    except Exception as exc:  # a failing analysis degrades to a message on the page, not a traceback
        return {"spikes": [], "errors": [f"could not compute spikes because {str(exc).splitlines()[0]}"]}


def spikes(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e") -> list[dict[str, Any]]:
    """The report's spikes under `filters`, in time order."""
    found = report_of(_db, store, version, filters, metric).get("spikes", [])
    return sorted(found, key=lambda sp: spike_times_ns(sp)[0])


def spike_marks(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e") -> dict[str, Any]:
    """analysis.report.find_spikes over the filtered requests: the report's header and its spikes (window,
    counts, percentiles) without their explanations, in time order; what the Overview marks.

    The explanations are most of the rest of the report's cost; the Spike page reads them from
    `report_of` (the same spikes). On ClickHouse, the full report (`report_of`'s, computed once).
    """
    if not _db.can("spike_marks"):  # the full report, computed once (report_of's)
        full = report_of(_db, store, version, filters, metric)
        return {**full, "spikes": spikes(_db, store, version, filters, metric)}
    return _spike_marks(_db, store, version, filters, metric)


@st.cache_data(show_spinner="Looking for spikes…", max_entries=128)
def _spike_marks(_db: Bench, store: str, version: int, filters: Filters, metric: str) -> dict[str, Any]:
    """The cached body of spike_marks: the report without its explanations."""
    win = detection(_db, store, version, filters)["judged_window_s"]
    try:
        out = _db.report(filters, metric, win, False)
    except Exception as exc:  # a failing analysis degrades to a message on the page, not a traceback
        return {"spikes": [], "errors": [f"could not compute spikes because {str(exc).splitlines()[0]}"]}
    return {**out, "spikes": sorted(out.get("spikes", []), key=lambda sp: spike_times_ns(sp)[0])}


def explained_marks(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e") -> dict[str, Any]:
    """`spike_marks` taken from the full report (analysis.report.marks_of: the same answer): for a page that
    explains the spikes too, so that detection runs once, not once for the marks and once for the report."""
    full = report_of(_db, store, version, filters, metric)
    if "attributes" not in full:  # the report failed: its errors say why
        return {**full, "spikes": []}
    marks = cast(dict[str, Any], marks_of(cast(Any, full)))
    return {**marks, "spikes": sorted(marks["spikes"], key=lambda sp: spike_times_ns(sp)[0])}


def spike_verdict(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e",
                  explained: bool = False) -> dict[str, Any]:
    """The detected spikes under `filters` and whether detection could judge them at all (analysis.stats.verdicts).

    {"spikes" (spike_marks'), "judged", "reason" (why not, a sentence), "context" (when not judged under
    dimension filters: the spikes of the same time range without them)}. "No spike" is only ever said
    when `judged`. `explained`: the page explains the spikes too, so the marks are read from the full report
    (`explained_marks`).
    """
    marks = (explained_marks if explained else spike_marks)(_db, store, version, filters, metric)
    det = detection(_db, store, version, filters)
    why = V.not_judged(marks)
    out: dict[str, Any] = {"spikes": marks["spikes"], "judged": why is None, "reason": None, "context": [],
                           "marks": marks}
    if why is None:
        return out
    if det["judged_window_s"] is None:
        out["reason"] = (f"{det['requests']:,} requests match; a window's p99 is judged only from "
                         f"{V.JUDGED_WINDOW_REQUESTS:,} requests, and detection needs {V.MIN_JUDGED_WINDOWS} such "
                         f"windows (about {V.MIN_JUDGED_REQUESTS:,} requests in the range)")
    else:
        out["reason"] = why
    wide = Filters(filters.since_ns, filters.until_ns)
    if wide != filters:
        out["context"] = spike_marks(_db, store, version, wide, metric)["spikes"]
    return out


#: How an explained window stands against its baseline (analysis.stats.verdicts.against_baseline), and the rise
#: a spike needs.
against_baseline = V.against_baseline
MIN_RISE = SPIKE_MIN_RISE
#: Fewest (effective) requests a replica needs for its p99 to be judged against the fleet's (analysis.breakdowns).
MIN_REPLICA_REQUESTS = X.min_tail_requests()
#: Fewest requests a p99 needs to rest on MIN_TAIL requests beyond it (fewer: `p99_low_sample`, said beside a flag).
SOLID_P99_REQUESTS, MIN_TAIL = B.SOLID_P99_REQUESTS, B.MIN_TAIL


def spike_times_ns(spike: dict[str, Any]) -> tuple[int, int]:
    """A spike's start and end (ISO-8601 in the report) as integer ns."""
    start, end = parse_time(spike["start"]), parse_time(spike["end"])
    assert start is not None and end is not None
    return start, end


@st.cache_data(show_spinner="Explaining the window…", max_entries=128)
def explain(_db: Bench, store: str, version: int, filters: Filters, start_ns: int, end_ns: int,
            metric: str = "e2e") -> dict[str, Any]:
    """analysis.report.explain_window over the filtered requests: a detected spike's own report item, or
    any (brushed) window explained the same way against the report's baseline."""
    for sp in report_of(_db, store, version, filters, metric).get("spikes", []):
        if spike_times_ns(sp) == (start_ns, end_ns):  # explain_window would recompute this very item
            return {**sp, "detected": True}
    win = detection(_db, store, version, filters)["judged_window_s"]
    try:
        return _db.explain_window(filters, start_ns, end_ns, metric, win)
    except Exception as exc:
        return {"start": start_ns, "end": end_ns, "requests": 0, "p50_ms": None, "p99_ms": None,
                "baseline_p50_ms": None, "baseline_p99_ms": None, "excess_ms": None, "stages": [],
                "dimensions": [], "exemplars": [],
                "errors": [f"could not explain the window because {str(exc).splitlines()[0]}"]}


@st.cache_data(show_spinner=False, max_entries=128)
def shape(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e",
          by: tuple[str, ...] = B.TOKEN_COLUMNS) -> pd.DataFrame:
    """analysis.breakdowns.shape: requests and p50/p99 (ms) per token bucket (the report's buckets)."""
    return _db.shape(filters, metric, by)


def replicas(_db: Bench, store: str, version: int, filters: Filters, metric: str = "e2e") -> pd.DataFrame:
    """analysis.breakdowns.replicas: per replica counts, p50/p99 (ms) and the outlier flag."""
    # st.cache_data keys on the arguments as passed (the sidebar leaves the metric out): pass them all
    return _replicas(_db, store, version, filters, metric)


@st.cache_data(show_spinner=False, max_entries=128)
def _replicas(_db: Bench, store: str, version: int, filters: Filters, metric: str) -> pd.DataFrame:
    """The cached body of replicas, on the store's workbench or on ClickHouse."""
    return _db.replicas(filters, metric)


@st.cache_data(show_spinner=False, max_entries=128)
def outlier_explanations(_db: Bench, store: str, version: int, filters: Filters, metric: str) -> list[dict[str, Any]]:
    """analysis.stats.verdicts.outlier_explanations: the outlier replicas one tenant (model, version, service)
    explains."""
    try:
        return _db.outlier_explanations(filters, metric)
    except Exception:  # an explanation that fails leaves the outliers as the breakdown flags them
        return []


@st.cache_data(show_spinner=False, max_entries=128)
def exemplars(_db: Bench, store: str, version: int, filters: Filters, limit: int = 50,
              metric: str = "e2e", trace_ids: tuple[str, ...] | None = None) -> pd.DataFrame:
    """analysis.traces.slowest under `filters` (only `trace_ids`, when given), slowest first."""
    return _db.exemplars(filters, limit, metric, trace_ids)


@st.cache_data(show_spinner=False, max_entries=128)
def find_trace(_db: Bench, store: str, version: int, trace_id: str) -> pd.DataFrame:
    """analysis.traces.find_requests: the request rows of a trace id (or a unique prefix of 8+ hex digits)."""
    return _db.find_trace(trace_id)


@st.cache_data(show_spinner=False, max_entries=128)
def trace_spans(_db: Bench, store: str, version: int, trace_id: str, start_ns: int) -> pd.DataFrame:
    """analysis.traces.waterfall of one trace, reading only the segments of its hour and the next."""
    return _db.trace_spans(trace_id, start_ns)


@st.cache_resource(show_spinner="Reading the requests to replay…", max_entries=8)
def workload(_db: Bench, store: str, version: int, filters: Filters) -> Workload:
    """analysis.capacity.observed_workload of the filtered requests, kept: it memoizes the replica counts replayed.

    Shared (not copied) by the What-if and Capacity pages, so a new target, price or replica
    count reads nothing and replays at most one count.
    """
    return _db.workload(filters)


@st.cache_data(show_spinner="Replaying the queue…", max_entries=64)
def whatif(_db: Bench, store: str, version: int, filters: Filters, replicas: int, slots: int) -> dict[str, Any]:
    """analysis.capacity.predict_at: the filtered requests through `replicas` x `slots` FIFO servers, with the measured
    relation of service time to batch where the traces show it (as the Capacity page).

    Returns predict_at's dict with "error" None, or {"error": message} when the replay fails.
    """
    from analysis.capacity import predict_at

    try:
        return {**predict_at(workload(_db, store, version, filters), int(replicas), int(slots)), "error": None}
    except Exception as exc:  # a failing sub-analysis degrades to a message, not a traceback
        return {"error": f"could not replay the queue because {str(exc).splitlines()[0]}"}


# --- the SQL console ---------------------------------------------------------------------

@st.cache_resource(show_spinner=False, max_entries=2)
def sandbox(store: str, files: tuple[str, ...] = ()) -> SandboxConnection:
    """A sandboxed connection (analysis.engine.connect(sandbox=True)): only the store readable, config locked.
    `files` (the segments listed now) keys it: a new one once segments were written, merged or removed."""
    from analysis.engine.connect import connect

    return connect(Path(store), sandbox=True)


class RefusedQuery(QueryError, ValueError):
    """The SQL console accepts one SELECT (or WITH … SELECT) statement only; the message says why."""

    def __init__(self, what: str, sql: str = "") -> None:
        super().__init__(sql, what)


def check_read_only(sql: str) -> str:
    """`sql` when it is exactly one SELECT/WITH query; raise RefusedQuery (saying why) otherwise."""
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise RefusedQuery("type a query: one SELECT (or WITH … SELECT) over spans, requests, stages")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as exc:
        raise RefusedQuery(f"could not parse the query: {str(exc).splitlines()[0]}") from exc
    if len(statements) != 1:
        raise RefusedQuery(f"one statement at a time, please ({len(statements)} given)")
    first = text.split(None, 1)[0].upper()
    if statements[0].type != duckdb.StatementType.SELECT or (
            first not in ("SELECT", "WITH", "FROM", "VALUES", "TABLE") and not first.startswith("(")):
        raise RefusedQuery(f"only SELECT / WITH queries are allowed here, not {first}")
    return text


def run_sql(store: str, sql: str, timeout_s: float = SQL_TIMEOUT_S,
            limit: int = SQL_ROW_LIMIT) -> tuple[pd.DataFrame, bool]:
    """Run one read-only query in the sandbox; (first `limit` rows, truncated?).

    Raises RefusedQuery for anything but one SELECT, TimeoutError when it ran past `timeout_s`
    (interrupted, not left running), duckdb.Error when DuckDB rejects it (e.g. file access).
    """
    text = check_read_only(sql)
    cur = sandbox(store, tuple(str(f) for f in segment_files(Path(store)))).cursor()
    timed_out = threading.Event()

    def _fire() -> None:
        timed_out.set()
        cur.interrupt()

    timer = threading.Timer(timeout_s, _fire)
    timer.start()
    try:
        rel = cur.execute(text)
        names = [d[0] for d in rel.description or []]
        rows = rel.fetchmany(limit + 1)
    except duckdb.InterruptException as exc:
        raise TimeoutError(f"the query ran past {timeout_s:g} s and was interrupted; narrow it "
                           "(a WHERE on start, a LIMIT)") from exc
    except duckdb.Error:
        if timed_out.is_set():
            raise TimeoutError(f"the query ran past {timeout_s:g} s and was interrupted") from None
        raise
    finally:
        timer.cancel()
        cur.close()
    import pandas as pd

    return pd.DataFrame(rows[:limit], columns=names), len(rows) > limit


#: Example queries shown in the console.
SQL_EXAMPLES: dict[str, str] = {
    "p50 / p99 per replica": (
        "SELECT replica, count(*) AS requests,\n"
        "       round(quantile_cont(e2e_ns, 0.5) / 1e6) AS p50_ms,\n"
        "       round(quantile_cont(e2e_ns, 0.99) / 1e6) AS p99_ms\n"
        "FROM requests GROUP BY replica ORDER BY p99_ms DESC"
    ),
    "p99 per minute": (
        "SELECT time_bucket(INTERVAL 1 minute, start) AS minute, count(*) AS requests,\n"
        "       round(quantile_cont(e2e_ns, 0.99) / 1e6) AS p99_ms\n"
        "FROM requests GROUP BY 1 ORDER BY 1"
    ),
    **CHD.PORTABLE_SQL_EXAMPLES,
    "failures by replica": (
        "SELECT replica, status, count(*) AS n FROM requests\n"
        "WHERE status <> 'ok' GROUP BY ALL ORDER BY n DESC"
    ),
}


def prewarm(db: Workbench) -> None:
    """Compute the unfiltered overview's numbers (then set `db.overview_warmed`: a server answers from there), then
    the full spike report, into the query caches; then import what the other pages draw with (pandas, Altair), which
    the Overview does without.

    Runs in a background thread when the store opens ready (Workbench.warm) or once the critical
    paths of a big load are all computed, so the first visitor does not wait for them one by one.
    A page reaching a call that one of these threads is computing waits for its result (Streamlit's
    cache computes each key once), and one importing a module this thread is importing waits for it.
    """
    key = (db, str(db.store), db.version)
    f = Filters()
    # two threads: the spikes (the longest step) start at once, beside the sidebar's choices, the
    # summary and the series, each DuckDB query releasing the interpreter; the full report after
    # both, so it never delays the Overview's numbers (an empty store: nothing more to warm)
    with ThreadPoolExecutor(2, thread_name_prefix="tailscope-prewarm") as pool:
        marks = pool.submit(spike_marks, *key, f)
        numbers = pool.submit(lambda: choices(*key)["requests"] and (summary(*key, f), over_time(*key, f)))
        marks.result()
        any_rows = numbers.result()
    db.overview_warmed.set()  # the Overview's numbers are cached: a server answers from here (dashboard/server.py)
    if not any_rows:
        return
    report_of(*key, f)
    import altair  # noqa: F401
    import pandas  # noqa: F401


def prewarm_cost(db: Workbench) -> None:
    """After `prewarm`: sweep the GPU time of the hours not materialized for the unfiltered Cost page
    (`Workbench.keep_cost_runs`), kept with the store's state until a refresh changes it, as the materialized hours
    keep theirs in their cost files; the page then only joins it with the request facts."""
    f = Filters()
    db.keep_cost_runs(f, cost_bucket_s(db, str(db.store), db.version, f))


# --- alerts (tailscope watch) ---------------------------------------------------------------

@st.cache_data(show_spinner=False, max_entries=64, ttl=5)
def alerts(store: str, since_ns: int | None = None, until_ns: int | None = None) -> pl.DataFrame:
    """The alerts `tailscope watch` kept in the store (analysis.watch.alerts_frame), overlapping the range.

    Keyed by the store and range only, with a short ttl: alerts change without new segments.
    """
    from analysis.watch import alerts_frame
    return alerts_frame(store, since_ns, until_ns)


# --- cost and capacity (analysis.cost, analysis.capacity) ---------------------------------

def price_default(db: Bench) -> float | None:
    """The default USD per GPU-hour of the store's price table (STORE/prices.toml), if the engine has one."""
    from analysis.cost import prices_for

    if not db.can("prices"):
        return None
    store = db.store
    try:
        return prices_for(Path(store)).default
    except Exception:  # a broken price table is reported by the page that uses it
        return None


@st.cache_data(show_spinner="Sharing out GPU time…", max_entries=32)
def cost_summary(_db: Bench, store: str, version: int, filters: Filters, by: str,
                 gpu_hour_usd: float | None) -> dict[str, Any]:
    """analysis.cost.cost_table over the filters' time range (the `tailscope cost --json` shape), or {"error"}."""
    try:
        out = _db.cost(filters, by, gpu_hour_usd, None)
        assert isinstance(out, dict)
        return out
    except Exception as exc:  # a failing analysis degrades to a message on the page
        return {"error": f"could not compute the cost because {str(exc).splitlines()[0]}"}


@st.cache_data(show_spinner="Sharing out GPU time…", max_entries=32)
def cost_over_time(_db: Bench, store: str, version: int, filters: Filters, by: str, bucket_s: int,
                   gpu_hour_usd: float | None) -> pd.DataFrame:
    """analysis.cost.cost_series (GPU-seconds and USD per cell and key, idle and cold start as keys)."""
    df = _db.cost(filters, by, gpu_hour_usd, bucket_s)
    assert not isinstance(df, dict)
    return _in_seconds(df)


def _in_seconds(df: pd.DataFrame) -> pd.DataFrame:
    """The cost series with its GPU time in seconds too (the chart's unit)."""
    df["gpu_seconds"] = df["gpu_ns"] / 1e9
    return df


#: From this many requests in the time range the Cost and Capacity pages compute in the background: the page draws a
#: note at once and fills in the moment the work is done (below it, the page waits for it without a note).
BACKGROUND_REQUESTS = 100_000
#: While it waits, the page renews its note this often: each renewal is a point where a click elsewhere stops the page
#: (Streamlit stops a script at its next element), so the other pages stay usable; the work goes on meanwhile.
BACKGROUND_STEP_S = 0.25
#: How long a page waits for its background work before it leaves the note and stops (a rerun later reads the result).
BACKGROUND_MAX_S = 3600.0
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-page")
#: The warm-up's cost sweep, then its capacity curve (`Workbench.warm_cost`, `warm_capacity`): a thread of its own,
#: so that it never queues a page's job (the curve's replays run on the pages' pool, where the page finds them).
_WARM_COST = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-warm-cost")


def _quietly(work: Callable[[Any], None], db: Any) -> Callable[[], None]:
    """`work(db)` with any failure swallowed, for work done ahead of a page: a cache warm-up must never take the
    server down, and the page computes (and reports) whatever failed itself."""
    def run() -> None:
        with contextlib.suppress(Exception):
            work(db)

    return run


@st.cache_resource(show_spinner=False, max_entries=16)
def cost_started(_db: Bench, store: str, version: int, filters: Filters, by: str, bucket_s: int,
                 gpu_hour_usd: float | None, keys: tuple[str, ...] | None = None
                 ) -> Future[tuple[dict[str, Any], pd.DataFrame | None]]:
    """`cost_summary` and `cost_over_time` computed in a background thread (the sweep over a large range takes
    longer than a page should): a future the Cost page waits on (`finished`). Kept per filters and price. `keys`:
    the values of `by` whose totals the page shows (analysis.cost.cost_table's `selected`)."""
    def both() -> tuple[dict[str, Any], pd.DataFrame | None]:
        try:  # one sweep for both (analysis.cost.cost_page)
            res, df = _db.cost_page(filters, by, gpu_hour_usd, bucket_s, keys)
        except Exception as exc:  # a failing analysis degrades to a message on the page
            return {"error": f"could not compute the cost because {str(exc).splitlines()[0]}"}, None
        return (res, None) if not res["rows"] else (res, _in_seconds(df))

    return _POOL.submit(both)


@st.cache_resource(show_spinner=False, max_entries=16)
def capacity_started(_db: Bench, store: str, version: int, filters: Filters, target_p99_ms: float | None,
                     metric: str, gpu_hour_usd: float | None) -> Future[dict[str, Any]]:
    """`capacity_curve` computed in a background thread (each count is a replay of every request in the range): a
    future the Capacity page waits on (`finished`)."""
    return _POOL.submit(capacity_curve, _db, store, version, filters, target_p99_ms, metric, gpu_hour_usd)


def finished(job: Future[Any], requests_in_range: int, note: str) -> Any:
    """The job's result. From BACKGROUND_REQUESTS requests in the range, the page shows `note` until the job is done
    and then draws the result in the same run, renewing the note every BACKGROUND_STEP_S so that a click elsewhere
    stops the page meanwhile; after BACKGROUND_MAX_S the note stays and the page stops."""
    if requests_in_range < BACKGROUND_REQUESTS or job.done():
        return job.result()
    slot = st.empty()
    t0 = time.monotonic()
    while time.monotonic() - t0 < BACKGROUND_MAX_S:
        with contextlib.suppress(TimeoutError):
            result = job.result(timeout=BACKGROUND_STEP_S)
            slot.empty()
            return result
        slot.info(f"{note} The other pages stay usable meanwhile ({time.monotonic() - t0:,.0f} s so far).",
                  icon=":material/hourglass_top:")
    slot.info(f"{note} Still running after {BACKGROUND_MAX_S / 60:.0f} minutes: open the page again later.",
              icon=":material/hourglass_top:")
    st.stop()


@st.cache_data(show_spinner="Replaying the queue for each replica count…", max_entries=32)
def capacity_curve(_db: Bench, store: str, version: int, filters: Filters, target_p99_ms: float | None,
                   metric: str, gpu_hour_usd: float | None, max_replicas: int = 64) -> dict[str, Any]:
    """analysis.capacity.capacity_curve for 1..max_replicas over the filtered requests, or {"error"}."""
    from analysis.capacity import capacity_curve as curve
    from analysis.capacity import drawn_counts, load_kernel

    try:
        w = workload(_db, store, version, filters)
        counts = drawn_counts(max_replicas, w.observed_replicas, load_kernel() is not None)
        out = curve(w, counts, target_p99_ms=target_p99_ms, metric=metric, gpu_hour_usd=gpu_hour_usd)
    except Exception as exc:
        return {"error": f"could not replay the queue because {str(exc).splitlines()[0]}"}
    out["cold_start_ms"] = None if w.cold_start_ns is None else w.cold_start_ns / 1e6
    out["kernel"] = load_kernel() is not None
    return out


def capacity_target(summary_: dict[str, Any], metric: str) -> float:
    """The Capacity page's default p99 target (ms): the filtered requests' observed p99 of `metric` (e2e or ttft,
    from `summary`) in whole ms, as every latency on the page reads, rounded up: the observed p99 meets its own
    target (rounded down, a replay that reproduces the observed p99 missed it by a fraction of a ms and the page
    said no count holds it); 1,000 ms when there is none."""
    seen = summary_["e2e_p99_ms"] if metric == "e2e" else summary_["ttft_p99_ms"]
    return float(math.ceil(seen or 1000.0))


def page_price(db: Bench) -> float | None:
    """The Cost and Capacity pages' default USD per GPU-hour: the store's default price (`price_default`), None when
    it is unset or 0 (the pages then show GPU time only)."""
    price = price_default(db)
    return float(price) if price else None


def scale_up_counts(curve: dict[str, Any]) -> tuple[int, int]:
    """The Capacity page's default scale-up comparison, (start, top): from half to the fewest count for the target,
    else (none holds it) to the observed count (a comparison from one replica to itself says nothing)."""
    goal = curve["fewest_replicas"] or curve["observed_replicas"]
    start = max(1, goal // 2)
    return start, max(start, goal)


def prewarm_capacity(db: Bench) -> None:
    """The unfiltered Capacity page at its defaults (`capacity_target` for e2e, `page_price`): its curve
    (`capacity_started`, on the pages' pool, where the page's own call finds it) and then its scale-up comparison
    (`scale_up_counts`), into the query caches; nothing for no requests. Keyed by the store's version as the page's
    calls are: a refresh that changed the data leaves it unused, never shown."""
    key = (db, str(db.store), db.version)
    f = Filters()
    if not detection(*key, f)["requests"]:
        return
    usd = page_price(db)
    curve = capacity_started(*key, f, capacity_target(summary(*key, f), "e2e"), "e2e", usd).result()
    if "error" not in curve:
        capacity_scale_up(*key, f, *scale_up_counts(curve), usd)


def prewarm_cost_page(db: Bench) -> None:
    """The unfiltered Cost page at its defaults (grouped by the first of analysis.cost.COST_GROUPS, `page_price`):
    its table and series (`cost_started`, on the pages' pool, where the page's own call finds it); nothing for no
    requests. Keyed by the store's version as the page's calls are."""
    from analysis.cost import COST_GROUPS

    key = (db, str(db.store), db.version)
    f = Filters()
    if choices(*key)["requests"]:
        # every argument as the page passes it: Streamlit's caches key on the arguments as passed
        cost_started(*key, f, COST_GROUPS[0], cost_bucket_s(*key, f), page_price(db), None).result()


#: URL path of a page -> its unfiltered work, started when the page's HTML is asked for (`start_page_work`).
PAGE_WORK: dict[str, Any] = {"capacity": prewarm_capacity, "cost": prewarm_cost_page}
#: The thread that starts it (a page's own calls then find it computing: Streamlit's caches compute each key once).
_PAGE_WORK = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailscope-page-work")
#: each store's and page's job while queued or running: a burst of requests for its HTML queues it once, not once a
#: request (keyed by the workbench's id: the job holds the workbench, so the id is not reused while it may run)
_PAGE_JOBS: dict[tuple[int, str], Future[None]] = {}
_PAGE_JOBS_LOCK = threading.Lock()


def start_page_work(db: Bench, page: str) -> Future[None] | None:
    """Start `page`'s unfiltered work (`PAGE_WORK`) in the background, or None when it has none: called when a browser
    asks for the page's HTML without filters in its URL (dashboard/server.py), so that the work runs while the
    browser loads the app and opens its session, instead of after; nothing while the store's critical paths are
    still computed (the Capacity page replays nothing then, and the background pass warms the caches once they are
    done). A failure is left for the page to report. While the page's job is queued or running, that job is
    returned and nothing else is queued, so that whatever a client sends, the queue holds at most one job a page."""
    work = PAGE_WORK.get(page)
    if work is None or getattr(db, "pending", None):
        return None
    with _PAGE_JOBS_LOCK:
        job = _PAGE_JOBS.get((id(db), page))
        if job is None or job.done():
            job = _PAGE_JOBS[id(db), page] = _PAGE_WORK.submit(_quietly(work, db))
        return job


@st.cache_data(show_spinner="Replaying reactive scale-up…", max_entries=32)
def capacity_scale_up(_db: Bench, store: str, version: int, filters: Filters, replicas: int,
                      max_replicas: int, gpu_hour_usd: float | None) -> dict[str, Any]:
    """analysis.capacity.scale_up (reactive with the observed cold start against pre-scaling), or {"error"}."""
    from analysis.capacity import scale_up

    try:
        return scale_up(workload(_db, store, version, filters), replicas, max_replicas, gpu_hour_usd)
    except Exception as exc:
        return {"error": f"could not replay scale-up because {str(exc).splitlines()[0]}"}


_IMPORTED.set()
