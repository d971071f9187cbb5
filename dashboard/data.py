"""The dashboard's one data-access module: the store, its cached connection and every query.

The `requests` view (critical path per request) is costly to compute over millions of
spans, so the workbench materializes it once into an in-memory DuckDB table and, on a
refresh, recomputes only the hour partitions whose segments changed (plus the hour before,
whose requests may have children there). Segments are immutable Parquet files written by
rename, so refreshing while `tailscope collect` writes never locks or half-reads the store.

Pages call the functions below with a `Filters`; queries are cached with `st.cache_data`
keyed by the store, its data version and the filters (the connection `_db` is unhashed).
Each call runs on its own `.cursor()`: a DuckDB connection is not thread-safe, and
Streamlit runs each session in its own thread.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import streamlit as st

from analysis.views import VIEW_SQL, spans_sql
from tracing import schema as S
from tracing.errors import StoreError
from tracing.store import default_store, require_store, segment_files

HOUR_NS = 3_600_000_000_000
#: Latency metrics a page can chart: label → column of the `requests` view.
METRICS: dict[str, str] = {"end-to-end": "e2e_ns", "TTFT": "ttft_ns", "TPOT": "tpot_ns"}
#: Analysis metric names (analysis.report) for each column.
METRIC_NAMES: dict[str, str] = {"e2e_ns": "e2e", "ttft_ns": "ttft", "tpot_ns": "tpot"}
#: Critical-path stage columns of `requests`, in display order (they sum to e2e_ns).
STAGE_COLUMNS: tuple[str, ...] = tuple(f"{s}_ns" for s in S.CRITICAL_PATH_COLUMNS)
FILTER_DIMENSIONS: tuple[str, ...] = ("service", "model", "replica", "tenant")
#: Request-level columns handed to analysis.report as its request facts.
FACT_COLUMNS: tuple[str, ...] = ("trace_id", "span_id", "start_ns", "e2e_ns", "status", "replica", "service", "model",
                                 "model_version", "tenant", "input_tokens", "output_tokens", "ttft_ns", "tpot_ns")
#: Seconds a SQL console query may run before it is interrupted.
SQL_TIMEOUT_S = 10.0
SQL_ROW_LIMIT = 5_000
#: A (re)load reading more segment bytes than this shows request facts first (see Workbench.refresh).
QUICK_LOAD_BYTES = int(os.environ.get("TAILSCOPE_DASHBOARD_QUICK_BYTES", 64 * 1024 * 1024))


# --- where the store is ------------------------------------------------------------------

def store_path(argv: list[str] | None = None) -> Path:
    """The store: `--store DIR` passed after `streamlit run app.py --`, else $TAILSCOPE_STORE, else default."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--store", default=None)
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return Path(args.store).expanduser() if args.store else default_store()


# --- filters -----------------------------------------------------------------------------

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

    def where(self, alias: str = "") -> tuple[str, list[Any]]:
        """A SQL condition (never empty) and its parameters for the `requests` columns."""
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
        return " AND ".join(parts), params

    def narrowed(self, since_ns: int | None, until_ns: int | None) -> Filters:
        """The same filters over a sub-range of time."""
        return Filters(since_ns, until_ns, self.service, self.model, self.replica, self.tenant)


# --- the workbench: one materialized connection per store -------------------------------

def _hour_of(path: Path) -> int:
    """The hour (ns since epoch) of a segment's partition directory dt=YYYY-MM-DD/hr=HH."""
    day = path.parent.parent.name.removeprefix("dt=")
    hour = int(path.parent.name.removeprefix("hr="))
    return int(pd.Timestamp(day, tz="UTC").value) + hour * HOUR_NS


def _list_source(files: list[Path]) -> str:
    quoted = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
    return f"read_parquet([{quoted}], union_by_name = true)"


def _requests_sql(files: list[Path]) -> list[str]:
    """Statements creating the analysis views over exactly `files` (in the current connection)."""
    stmts = [f"CREATE OR REPLACE TEMP VIEW spans AS {spans_sql(_list_source(files))}"]
    stmts += [f"CREATE OR REPLACE TEMP VIEW {name} AS {sql}" for name, sql in VIEW_SQL.items()]
    return stmts


@dataclass
class Workbench:
    """An in-memory DuckDB database holding table `req` (the materialized `requests` view).

    `version` changes whenever `refresh()` found new or changed segments; it keys the caches.
    """

    store: Path
    con: duckdb.DuckDBPyConnection = field(default_factory=lambda: duckdb.connect(":memory:"))
    version: int = 0
    segments: dict[int, frozenset[tuple[str, int]]] = field(default_factory=dict)
    files: dict[int, list[Path]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_refresh_s: float = 0.0
    last_refresh_took_s: float = 0.0
    pending: set[int] = field(default_factory=set)
    worker: threading.Thread | None = None
    worker_error: str | None = None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for this thread (a DuckDB connection is not thread-safe)."""
        return self.con.cursor()

    def refresh(self) -> bool:
        """Pick up segments written since the last refresh; True when the data changed.

        Small changes are computed exactly at once. A large load (the first open of a big
        store) first fills the request facts (analysis.percentiles.request_facts: one scan, no
        stage columns) so every page can render within seconds, and computes the critical paths
        hour by hour, newest first, in a background thread (`pending` holds the hours left).
        """
        with self.lock:
            t0 = time.perf_counter()
            files = segment_files(self.store)
            by_hour: dict[int, list[Path]] = {}
            for f in files:
                by_hour.setdefault(_hour_of(f), []).append(f)
            seen: dict[int, frozenset[tuple[str, int]]] = {}
            for hour, fs in by_hour.items():
                seen[hour] = frozenset((f.name, _size(f)) for f in fs)
            first = self.version == 0
            changed = {h for h in set(seen) | set(self.segments) if seen.get(h) != self.segments.get(h)}
            if not first and not changed:
                self.last_refresh_s = time.time()
                return False
            redo = changed | {h - HOUR_NS for h in changed if h - HOUR_NS in by_hour}
            read = sorted({f for h in redo | {h + HOUR_NS for h in redo} for f in by_hour.get(h, [])})
            quick = sum(max(_size(f), 0) for f in read) > QUICK_LOAD_BYTES
            cur = self.con.cursor()
            try:
                cur.execute("BEGIN")
                if first:
                    cur.execute(_empty_req_sql())
                if redo:
                    cur.execute("DELETE FROM req WHERE (start_ns // ?) * ? IN (SELECT unnest(?))",
                                [HOUR_NS, HOUR_NS, sorted(redo)])
                if read and quick:
                    _insert_facts(cur, read, sorted(redo))
                elif read:
                    _insert_exact(cur, read, sorted(redo))
                cur.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
                raise
            finally:
                cur.close()
            self._make_views(bool(files))
            self.segments = seen
            self.files = by_hour
            self.pending = (self.pending - redo) | (redo & set(by_hour) if quick else set())
            self.version += 1
            self.last_refresh_s = time.time()
            self.last_refresh_took_s = time.perf_counter() - t0
        if self.pending:
            self._start_worker()
        return True

    def _start_worker(self) -> None:
        if self.worker is not None and self.worker.is_alive():
            return
        self.worker = threading.Thread(target=self._compute_pending, name="tailscope-critical-path", daemon=True)
        self.worker.start()

    def _compute_pending(self) -> None:
        """Replace the facts-only rows of each pending hour (newest first) with the exact `requests` rows."""
        while True:
            with self.lock:
                if not self.pending:
                    break
                hour = max(self.pending)
                files = self.files.get(hour, []) + self.files.get(hour + HOUR_NS, [])
                signature = (self.segments.get(hour), self.segments.get(hour + HOUR_NS))
            work = self.con.cursor()
            try:
                work.execute("CREATE TEMP TABLE exact_rows AS SELECT * FROM main.req LIMIT 0")
                _insert_exact(work, files, [hour], into="exact_rows")
                with self.lock:
                    if hour not in self.pending or signature != (self.segments.get(hour),
                                                                 self.segments.get(hour + HOUR_NS)):
                        continue  # a refresh recomputed or changed this hour meanwhile
                    work.execute("BEGIN")
                    work.execute("DELETE FROM main.req WHERE (start_ns // ?) * ? = ?", [HOUR_NS, HOUR_NS, hour])
                    work.execute("INSERT INTO main.req BY NAME SELECT * FROM exact_rows")
                    work.execute("COMMIT")
                    self.pending.discard(hour)
                    self.version += 1
            except duckdb.Error as exc:  # keep the facts rows; say why on the pages
                with self.lock:
                    self.pending.discard(hour)
                    self.worker_error = f"could not compute the critical paths of one hour because {exc}"
            finally:
                work.close()
        with contextlib.suppress(Exception):  # a cache warm-up must never take the server down
            prewarm(self)

    def loading_note(self) -> str | None:
        """A sentence for the pages while critical paths are still being computed, else None."""
        if self.pending:
            hours = len(self.pending)
            return (f"Critical paths (stage columns) are still being computed for {hours} hour(s) of data, "
                    "newest first; stage breakdowns fill in as they finish. Refresh, or turn Live on, to update.")
        return self.worker_error

    def _make_views(self, has_files: bool) -> None:
        """The documented views on the main connection: `requests` over the table, `spans` over the store."""
        glob = str(self.store / S.SEGMENT_GLOB).replace("'", "''")
        if has_files:
            source = f"read_parquet('{glob}', union_by_name = true)"
            self.con.execute(f"CREATE OR REPLACE VIEW spans AS {spans_sql(source)}")
        else:
            self.con.register("_empty_spans_arrow", S.SPAN_SCHEMA.empty_table())
            self.con.execute("CREATE OR REPLACE TABLE _empty_spans AS SELECT * FROM _empty_spans_arrow")
            self.con.unregister("_empty_spans_arrow")
            self.con.execute(f"CREATE OR REPLACE VIEW spans AS {spans_sql('_empty_spans')}")
        self.con.execute("CREATE OR REPLACE VIEW requests AS SELECT * FROM req")
        self.con.execute("CREATE OR REPLACE VIEW stages AS " + VIEW_SQL["stages"])

    def files_for(self, start_ns: int) -> list[Path]:
        """Segment files that can hold spans of a request starting at `start_ns` (its hour and the next)."""
        hour = (start_ns // HOUR_NS) * HOUR_NS
        return self.files.get(hour, []) + self.files.get(hour + HOUR_NS, [])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # compacted away between glob and stat
        return -1


def _insert_exact(cur: duckdb.DuckDBPyConnection, files: list[Path], hours: list[int], into: str = "req") -> None:
    """Insert the exact `requests` rows (analysis views over `files`) that start in `hours`."""
    for stmt in _requests_sql(files):
        cur.execute(stmt)
    cur.execute(f"INSERT INTO {into} BY NAME SELECT *, true AS critical_path FROM requests "
                "WHERE (start_ns // ?) * ? IN (SELECT unnest(?))", [HOUR_NS, HOUR_NS, hours])


def _insert_facts(cur: duckdb.DuckDBPyConnection, files: list[Path], hours: list[int]) -> None:
    """Insert request facts (no stage columns) of the requests starting in `hours`: one scan of `files`."""
    from analysis.percentiles import request_facts

    cur.execute(f"CREATE OR REPLACE TEMP VIEW spans AS {spans_sql(_list_source(files))}")
    facts = request_facts(cur, with_ttft=True)
    cur.execute(f"""
        INSERT INTO req BY NAME
        SELECT *, make_timestamp(start_ns // 1000) AS start, start_ns + e2e_ns AS end_ns, false AS critical_path
        FROM "{facts}" WHERE (start_ns // ?) * ? IN (SELECT unnest(?))""", [HOUR_NS, HOUR_NS, hours])
    cur.execute(f'DROP TABLE "{facts}"')


def _empty_req_sql() -> str:
    """CREATE TABLE req with the `requests` view's columns and no rows."""
    con = duckdb.connect(":memory:")
    try:
        con.register("_e", S.SPAN_SCHEMA.empty_table())
        con.execute(f"CREATE VIEW spans AS {spans_sql('_e')}")
        for name, sql in VIEW_SQL.items():
            con.execute(f"CREATE VIEW {name} AS {sql}")
        cols = con.execute("DESCRIBE requests").fetchall()
    finally:
        con.close()
    return ("CREATE OR REPLACE TABLE req (" + ", ".join(f'"{c[0]}" {c[1]}' for c in cols)
            + ", critical_path BOOLEAN)")


@st.cache_resource(show_spinner="Loading the store…")
def workbench(store: str) -> Workbench:
    """The workbench of `store`, loaded once per server process and shared by every session."""
    wb = Workbench(require_store(Path(store)).resolve())
    wb.refresh()
    return wb


def open_store() -> Workbench:
    """The workbench of the configured store; shows an error and stops the page if it is not a store."""
    path = store_path()
    try:
        return workbench(str(path))
    except StoreError as exc:
        st.error(f"{exc}")
        st.stop()
        raise  # unreachable: st.stop() raises


@contextlib.contextmanager
def _cursor(db: Workbench, filters: Filters | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor whose `requests` (and so `stages`) shows only the rows `filters` keeps."""
    cur = db.cursor()
    try:
        if filters is not None:
            cond, params = filters.where()
            cur.execute(f"CREATE TEMP VIEW requests AS SELECT * FROM main.req WHERE {_inline(cond, params)}")
        yield cur
    finally:
        cur.close()


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


def _df(cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
    return cur.execute(sql, params or []).df()


# --- queries -----------------------------------------------------------------------------

@st.cache_data(show_spinner=False, max_entries=64)
def choices(_db: Workbench, store: str, version: int) -> dict[str, Any]:
    """Time bounds and the distinct values of each filter dimension, over the whole store."""
    with _cursor(_db) as cur:
        lo, hi, n = cur.execute("SELECT min(start_ns), max(start_ns), count(*) FROM req").fetchone() or (None, None, 0)
        out: dict[str, Any] = {"min_ns": lo, "max_ns": hi, "requests": n}
        for dim in FILTER_DIMENSIONS:
            rows = cur.execute(f"SELECT DISTINCT {dim} FROM req WHERE {dim} IS NOT NULL ORDER BY 1").fetchall()
            out[dim] = [r[0] for r in rows]
    return out


def bucket_seconds(since_ns: int | None, until_ns: int | None, target: int = 90) -> int:
    """A round window length giving about `target` windows over the range."""
    if since_ns is None or until_ns is None or until_ns <= since_ns:
        return 60
    span_s = (until_ns - since_ns) / 1e9
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span_s / step <= target:
            return step
    return 86400


@st.cache_data(show_spinner=False, max_entries=256)
def summary(_db: Workbench, store: str, version: int, filters: Filters) -> dict[str, Any]:
    """Counts per outcome and overall p50/p90/p99 of e2e, TTFT and TPOT (ms) under `filters`."""
    cond, params = filters.where()
    pcts = ", ".join(
        f"quantile_cont({c}, {q}) / 1e6 AS {c.removesuffix('_ns')}_p{int(q * 100)}_ms"
        for c in METRICS.values() for q in (0.5, 0.9, 0.99)
    )
    outcomes = ", ".join(f"count(*) FILTER (WHERE status = '{o}') AS {o}" for o in S.OUTCOMES)
    with _cursor(_db) as cur:
        rel = cur.execute(f"SELECT count(*) AS requests, {outcomes}, {pcts} FROM req WHERE {cond}", params)
        names = [d[0] for d in rel.description or []]
        row = rel.fetchone() or ()
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in zip(names, row, strict=True)}


@st.cache_data(show_spinner=False, max_entries=256)
def over_time(_db: Workbench, store: str, version: int, filters: Filters, bucket_s: int) -> pd.DataFrame:
    """Per window of `bucket_s`: p50/p90/p99 in ms of e2e, TTFT, TPOT and counts per outcome."""
    cond, params = filters.where()
    step = bucket_s * 1_000_000_000
    pcts = ", ".join(
        f"quantile_cont({c}, {q}) / 1e6 AS {c.removesuffix('_ns')}_p{int(q * 100)}_ms"
        for c in METRICS.values() for q in (0.5, 0.9, 0.99)
    )
    outcomes = ", ".join(f"count(*) FILTER (WHERE status = '{o}') AS {o}" for o in S.OUTCOMES)
    with _cursor(_db) as cur:
        df = _df(cur, f"""
            SELECT (start_ns // {step}) * {step} AS window_ns, count(*) AS requests, {outcomes}, {pcts}
            FROM req WHERE {cond} GROUP BY 1 ORDER BY 1""", params)
    df["window"] = pd.to_datetime(df["window_ns"], unit="ns", utc=True)
    return df


@st.cache_data(show_spinner=False, max_entries=128)
def spikes(_db: Workbench, store: str, version: int, filters: Filters, metric: str = "e2e_ns") -> list[dict[str, Any]]:
    """Detected spikes of `metric` under `filters`, in time order, in the `tailscope report --json` shape.

    Uses analysis.report.build_report when it is installed; else a plain rule (window p99 above
    twice the median window p99 while p50 stays within 25%) so the pages still point somewhere.
    """
    report = report_of(_db, store, version, filters, metric)
    found = list(report.get("spikes", [])) if report is not None else _fallback_spikes(_db, filters, metric)
    return sorted(found, key=lambda sp: spike_times_ns(sp)[0])


def _facts_names(cur: duckdb.DuckDBPyConnection) -> list[str]:
    """Names under which analysis.percentiles looks for its per-connection request facts table.

    The report computes request facts from `spans` unless the table already exists; handing it
    the filtered, materialized rows skips a full scan of the store on every filter change.
    """
    from analysis import percentiles as P

    namer = getattr(P, "_facts_table", None)
    if callable(namer):
        return [str(namer(cur, True))]
    return [str(P.REQUESTS_TABLE)]


@st.cache_data(show_spinner="Looking for spikes…", max_entries=128)
def report_of(_db: Workbench, store: str, version: int, filters: Filters,
              metric: str = "e2e_ns") -> dict[str, Any] | None:
    """analysis.report.build_report over the filtered requests (None when that module is absent).

    The report reads its request facts from a per-connection table; this cursor hands it the
    already materialized, filtered rows instead of rescanning the store. Under filters the
    cursor's `spans` is narrowed to the filtered traces as well, so the numbers stay right
    (only slower) should the report ever compute its facts from `spans` itself.
    """
    try:
        from analysis.report import build_report
    except ImportError:
        return None
    with _cursor(_db, filters) as cur:
        if cur.execute("SELECT count(*) FROM requests").fetchone() == (0,):
            return {"spikes": [], "requests": 0, "errors": []}
        try:
            if filters != Filters():  # whatever the report reads from `spans` must be filtered too
                db_name = (cur.execute("SELECT current_database()").fetchone() or ("memory",))[0]
                cur.execute(f'CREATE TEMP VIEW spans AS SELECT * FROM "{db_name}".main.spans '
                            "WHERE TraceId IN (SELECT trace_id FROM requests)")
            for table in _facts_names(cur):
                cur.execute(f'CREATE TEMP TABLE "{table}" AS SELECT {", ".join(FACT_COLUMNS)} FROM requests')
            result: dict[str, Any] = build_report(cur, metric=METRIC_NAMES[metric], window_s=None,
                                                  since=filters.since_ns, until=filters.until_ns,
                                                  include_failures=True)
        except Exception as exc:  # a failing analysis degrades to a message on the page, not a traceback
            return {"spikes": [], "errors": [f"could not compute spikes because {str(exc).splitlines()[0]}"]}
    return result


def _fallback_spikes(db: Workbench, filters: Filters, metric: str) -> list[dict[str, Any]]:
    bucket = bucket_seconds(*_range(db, filters))
    df = over_time(db, str(db.store), db.version, filters, bucket)
    col = f"{metric.removesuffix('_ns')}_p99_ms"
    p50 = f"{metric.removesuffix('_ns')}_p50_ms"
    df = df[df["requests"] >= 20].dropna(subset=[col])
    if len(df) < 4:
        return []
    base99, base50 = float(df[col].median()), float(df[p50].median())
    hot = (df[col] > 2 * base99) & (df[p50] < 1.25 * base50)
    out: list[dict[str, Any]] = []
    step = bucket * 1_000_000_000
    for w, is_hot in zip(df["window_ns"], hot, strict=True):
        if not is_hot:
            continue
        if out and out[-1]["end"] == int(w):
            out[-1]["end"] = int(w) + step
        else:
            out.append({"start": int(w), "end": int(w) + step})
    for s in out:
        s.update(window_stats(db, str(db.store), db.version, filters, s["start"], s["end"], metric))
        s["baseline_p99_ms"], s["baseline_p50_ms"] = base99, base50
    return out


def _range(db: Workbench, filters: Filters) -> tuple[int | None, int | None]:
    c = choices(db, str(db.store), db.version)
    return (filters.since_ns if filters.since_ns is not None else c["min_ns"],
            filters.until_ns if filters.until_ns is not None else c["max_ns"])


def spike_times_ns(spike: dict[str, Any]) -> tuple[int, int]:
    """A spike's start and end as integer ns (the report gives ns integers or ISO-8601 strings)."""
    def _ns(v: Any) -> int:
        if isinstance(v, (int, float)):
            return int(v)
        return int(pd.Timestamp(v).value if pd.Timestamp(v).tzinfo else pd.Timestamp(v, tz="UTC").value)
    return _ns(spike["start"]), _ns(spike["end"])


@st.cache_data(show_spinner=False, max_entries=256)
def window_stats(_db: Workbench, store: str, version: int, filters: Filters, start_ns: int, end_ns: int,
                 metric: str = "e2e_ns") -> dict[str, Any]:
    """Requests, p50 and p99 (ms) of `metric` in [start_ns, end_ns) under `filters`."""
    cond, params = filters.narrowed(start_ns, end_ns).where()
    with _cursor(_db) as cur:
        n, p50, p99 = cur.execute(
            f"SELECT count(*), quantile_cont({metric}, 0.5) / 1e6, quantile_cont({metric}, 0.99) / 1e6 "
            f"FROM req WHERE {cond}", params).fetchone() or (0, None, None)
    return {"requests": int(n), "p50_ms": p50, "p99_ms": p99}


@st.cache_data(show_spinner=False, max_entries=128)
def stage_breakdown(_db: Workbench, store: str, version: int, filters: Filters, start_ns: int, end_ns: int,
                    metric: str = "e2e_ns") -> pd.DataFrame:
    """Mean critical-path ms per stage in the tail (≥ p99) of the window vs the same slice outside it.

    `share` is each stage's part of the tail's excess over the baseline tail (sums to 1 when the
    tail grew); the baseline is every other request under `filters`.
    """
    cond, params = filters.where()
    cols = [c for c in STAGE_COLUMNS if c != "generation_ns"] + ["generation_ns"]
    means = ", ".join(f"avg({c}) / 1e6 AS {c}" for c in cols)
    with _cursor(_db) as cur:
        df = _df(cur, f"""
            WITH f AS (SELECT *, start_ns >= ? AND start_ns < ? AS inside FROM req WHERE {cond}),
                 q AS (SELECT inside, quantile_cont({metric}, 0.99) AS p99 FROM f GROUP BY inside)
            SELECT f.inside, count(*) AS n, {means}
            FROM f JOIN q USING (inside) WHERE f.{metric} >= q.p99 GROUP BY f.inside""",
                 [start_ns, end_ns, *params])
    rows = []
    tail = df[df["inside"]]
    base = df[~df["inside"]]
    for c in cols:
        t = float(tail[c].iloc[0]) if len(tail) else float("nan")
        b = float(base[c].iloc[0]) if len(base) else float("nan")
        rows.append({"stage": c.removesuffix("_ns"), "tail_ms": t, "baseline_ms": b, "excess_ms": t - b})
    out = pd.DataFrame(rows)
    out = out[(out["tail_ms"].fillna(0) > 0) | (out["baseline_ms"].fillna(0) > 0)]
    total = out["excess_ms"].clip(lower=0).sum()
    out["share"] = out["excess_ms"].clip(lower=0) / total if total > 0 else 0.0
    return out.reset_index(drop=True)


@st.cache_data(show_spinner=False, max_entries=128)
def dimension_contrast(_db: Workbench, store: str, version: int, filters: Filters, start_ns: int,
                       end_ns: int, metric: str = "e2e_ns") -> pd.DataFrame:
    """Each dimension value's share among the window's tail (≥ p99) vs the window overall, and
    the window's p99 without it (counterfactual), ranked by how much removing it lowers p99."""
    cond, params = filters.narrowed(start_ns, end_ns).where()
    dims = ["replica", "model_version", "tenant", "model"]
    union = " UNION ALL ".join(f"SELECT '{d}' AS dimension, {d}::VARCHAR AS value, {metric} AS v, tail FROM w"
                               for d in dims)
    bucket_union = " UNION ALL ".join(
        f"SELECT '{d}_bucket' AS dimension, "
        f"CASE WHEN {d} IS NULL THEN NULL ELSE (2 ** floor(log2(greatest({d}, 1))))::BIGINT::VARCHAR || '–' || "
        f"(2 ** (floor(log2(greatest({d}, 1))) + 1))::BIGINT::VARCHAR END AS value, {metric} AS v, tail FROM w"
        for d in ("input_tokens", "output_tokens"))
    with _cursor(_db) as cur:
        df = _df(cur, f"""
            WITH w0 AS (SELECT * FROM req WHERE {cond} AND {metric} IS NOT NULL),
                 p AS (SELECT quantile_cont({metric}, 0.99) AS p99, count(*) AS n FROM w0),
                 w AS (SELECT w0.*, w0.{metric} >= p.p99 AS tail FROM w0, p),
                 d AS ({union} UNION ALL {bucket_union}),
                 per AS (SELECT dimension, value, count(*) AS requests, count(*) FILTER (WHERE tail) AS tail_requests
                         FROM d WHERE value IS NOT NULL GROUP BY ALL),
                 tot AS (SELECT count(*) FILTER (WHERE tail) AS tail_n, count(*) AS n FROM w)
            SELECT per.dimension, per.value, per.requests, per.tail_requests,
                   per.tail_requests / greatest(tot.tail_n, 1) AS tail_share,
                   per.requests / greatest(tot.n, 1) AS share,
                   (SELECT quantile_cont(x.v, 0.99) FROM d x WHERE x.dimension = per.dimension
                        AND x.value IS DISTINCT FROM per.value) / 1e6 AS p99_without_ms,
                   (SELECT p99 FROM p) / 1e6 AS p99_ms
            FROM per, tot""", params)
    if df.empty:
        return df
    df["lift"] = df["tail_share"] / df["share"].where(df["share"] > 0)
    df["p99_drop_ms"] = df["p99_ms"] - df["p99_without_ms"]
    df = df[(df["requests"] < df["requests"].groupby(df["dimension"]).transform("sum"))]
    return df.sort_values(["p99_drop_ms", "lift"], ascending=False).reset_index(drop=True)


@st.cache_data(show_spinner=False, max_entries=64)
def dimension_pairs(_db: Workbench, store: str, version: int, filters: Filters, start_ns: int, end_ns: int,
                    metric: str = "e2e_ns", top: int = 10) -> pd.DataFrame:
    """Pairs of dimension values over-represented in the window's tail (support ≥ 5 tail requests)."""
    cond, params = filters.narrowed(start_ns, end_ns).where()
    pairs = [("replica", "tenant"), ("replica", "model_version"), ("model_version", "tenant")]
    union = " UNION ALL ".join(
        f"SELECT '{a} × {b}' AS pair, {a}::VARCHAR || ' × ' || {b}::VARCHAR AS value, tail FROM w" for a, b in pairs)
    with _cursor(_db) as cur:
        df = _df(cur, f"""
            WITH w0 AS (SELECT * FROM req WHERE {cond} AND {metric} IS NOT NULL),
                 p AS (SELECT quantile_cont({metric}, 0.99) AS p99 FROM w0),
                 w AS (SELECT w0.*, w0.{metric} >= p.p99 AS tail FROM w0, p),
                 tot AS (SELECT count(*) FILTER (WHERE tail) AS tail_n, count(*) AS n FROM w)
            SELECT pair, value, count(*) AS requests, count(*) FILTER (WHERE tail) AS tail_requests,
                   count(*) FILTER (WHERE tail) / greatest(any_value(tot.tail_n), 1) AS tail_share,
                   count(*) / greatest(any_value(tot.n), 1) AS share
            FROM ({union}) x, tot WHERE value IS NOT NULL GROUP BY pair, value
            HAVING count(*) FILTER (WHERE tail) >= 5""", params)
    if df.empty:
        return df
    df["lift"] = df["tail_share"] / df["share"]
    return df.sort_values("lift", ascending=False).head(top).reset_index(drop=True)


@st.cache_data(show_spinner=False, max_entries=128)
def exemplars(_db: Workbench, store: str, version: int, filters: Filters, limit: int = 50,
              metric: str = "e2e_ns") -> pd.DataFrame:
    """The slowest requests under `filters` (the tail's exemplars), slowest first."""
    cond, params = filters.where()
    stages = ", ".join(f"{c} / 1e6 AS {c.removesuffix('_ns')}_ms" for c in STAGE_COLUMNS)
    with _cursor(_db) as cur:
        return _df(cur, f"""
            SELECT trace_id, start, replica, model, tenant, status, {metric} / 1e6 AS latency_ms,
                   input_tokens, output_tokens, {stages}
            FROM req WHERE {cond} AND {metric} IS NOT NULL ORDER BY {metric} DESC LIMIT {int(limit)}""", params)


@st.cache_data(show_spinner=False, max_entries=128)
def find_trace(_db: Workbench, store: str, version: int, trace_id: str) -> pd.DataFrame:
    """The request rows of one trace id (a full id, or a unique prefix of at least 8 hex digits)."""
    tid = trace_id.strip().lower()
    with _cursor(_db) as cur:
        if len(tid) >= 32:
            return _df(cur, "SELECT * FROM req WHERE trace_id = ?", [tid])
        if len(tid) < 8:
            return _df(cur, "SELECT * FROM req WHERE false")
        return _df(cur, "SELECT * FROM req WHERE starts_with(trace_id, ?) LIMIT 20", [tid])


@st.cache_data(show_spinner=False, max_entries=128)
def trace_spans(_db: Workbench, store: str, version: int, trace_id: str, start_ns: int) -> pd.DataFrame:
    """Every span of one trace with its offset from the request start (ms) and its critical-path stretch.

    `crit_start_ms`/`crit_end_ms` bound the stretch where this stage span owns the critical path
    (same rule as the `requests` view, which `critical_ms` sums to); null for non-stage spans.
    """
    files = _db.files_for(start_ns)
    if not files:
        return pd.DataFrame()
    con = duckdb.connect(":memory:")
    try:
        quoted = trace_id.replace("'", "''")
        source = f"(SELECT * FROM {_list_source(files)} WHERE TraceId = '{quoted}')"
        con.execute(f"CREATE TABLE t AS {spans_sql(source)}")
        con.execute("CREATE VIEW spans AS SELECT * FROM t")
        for name, sql in VIEW_SQL.items():
            con.execute(f"CREATE VIEW {name} AS {sql}")
        spans = con.execute("""
            SELECT SpanId AS span_id, ParentSpanId AS parent_span_id, SpanName AS name, Stage AS stage,
                   IsRequest AS is_request, TimestampNs AS start_ns, EndNs AS end_ns, Duration AS duration_ns,
                   Replica AS replica, StatusCode AS status_code
            FROM t ORDER BY TimestampNs, EndNs DESC""").df()
        crit = con.execute("""
            SELECT SpanId AS span_id, s0, x1 FROM _stage_l1
            UNION ALL SELECT SpanId, s0, x1 FROM _stage_l2""").df()
        yielding = con.execute(f"""
            SELECT SpanId AS span_id, s0, e0 FROM _stage_l1_all
            WHERE stage IN ({", ".join("'" + s + "'" for s in S.YIELDING_STAGES)})""").df()
    finally:
        con.close()
    if spans.empty:
        return spans
    root = spans[spans["is_request"].fillna(False).astype(bool)]
    t0 = int(root["start_ns"].min()) if len(root) else int(spans["start_ns"].min())
    spans["start_ms"] = (spans["start_ns"] - t0) / 1e6
    spans["end_ms"] = (spans["end_ns"] - t0) / 1e6
    spans["duration_ms"] = spans["duration_ns"] / 1e6
    stretch: dict[str, list[tuple[int, int]]] = {}
    child_parent = dict(zip(spans["span_id"], spans["parent_span_id"], strict=True))
    owners = [(str(r.span_id), int(r.s0), int(r.x1)) for r in crit.itertuples() if r.x1 > r.s0]
    # a parent stage owns its stretch minus its children's stretches
    for sid, s0, x1 in owners:
        kids = sorted((a, b) for k, a, b in owners if child_parent.get(k) == sid)
        stretch[sid] = _subtract([(s0, x1)], kids)
    busy = sorted((s0, x1) for sid, s0, x1 in owners if child_parent.get(sid) not in dict.fromkeys(stretch))
    for r in yielding.itertuples():
        stretch[str(r.span_id)] = _subtract([(int(r.s0), int(r.e0))], busy)
    spans["critical_ms"] = [sum(b - a for a, b in stretch.get(s, [])) / 1e6 for s in spans["span_id"]]
    spans["critical_stretches"] = [[((a - t0) / 1e6, (b - t0) / 1e6) for a, b in stretch.get(s, [])]
                                   for s in spans["span_id"]]
    return spans


def _subtract(base: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intervals of `base` not covered by `holes`."""
    out = base
    for h0, h1 in holes:
        nxt: list[tuple[int, int]] = []
        for a, b in out:
            if h1 <= a or h0 >= b:
                nxt.append((a, b))
                continue
            if a < h0:
                nxt.append((a, h0))
            if h1 < b:
                nxt.append((h1, b))
        out = nxt
    return [(a, b) for a, b in out if b > a]


@st.cache_data(show_spinner=False, max_entries=128)
def shape(_db: Workbench, store: str, version: int, filters: Filters, metric: str = "e2e_ns") -> pd.DataFrame:
    """Requests per (input-token bucket, output-token bucket), powers of two, with p50/p99 in ms."""
    cond, params = filters.where()
    with _cursor(_db) as cur:
        return _df(cur, f"""
            SELECT (2 ** floor(log2(greatest(input_tokens, 1))))::BIGINT AS input_lo,
                   (2 ** floor(log2(greatest(output_tokens, 1))))::BIGINT AS output_lo,
                   count(*) AS requests,
                   quantile_cont({metric}, 0.5) / 1e6 AS p50_ms, quantile_cont({metric}, 0.99) / 1e6 AS p99_ms
            FROM req WHERE {cond} AND input_tokens IS NOT NULL AND output_tokens IS NOT NULL
              AND {metric} IS NOT NULL
            GROUP BY ALL ORDER BY 1, 2""", params)


@st.cache_data(show_spinner=False, max_entries=128)
def shape_by_bucket(_db: Workbench, store: str, version: int, filters: Filters, column: str,
                    metric: str = "e2e_ns") -> pd.DataFrame:
    """p50/p99 (ms) and counts per power-of-two bucket of `column` (input_tokens or output_tokens)."""
    if column not in ("input_tokens", "output_tokens"):
        raise ValueError(f"column must be input_tokens or output_tokens, not {column!r}")
    cond, params = filters.where()
    with _cursor(_db) as cur:
        return _df(cur, f"""
            SELECT (2 ** floor(log2(greatest({column}, 1))))::BIGINT AS lo,
                   (2 ** (floor(log2(greatest({column}, 1))) + 1))::BIGINT AS hi, count(*) AS requests,
                   quantile_cont({metric}, 0.5) / 1e6 AS p50_ms, quantile_cont({metric}, 0.99) / 1e6 AS p99_ms
            FROM req WHERE {cond} AND {column} IS NOT NULL AND {metric} IS NOT NULL GROUP BY ALL ORDER BY 1""",
                   params)


@st.cache_data(show_spinner=False, max_entries=128)
def replicas(_db: Workbench, store: str, version: int, filters: Filters, metric: str = "e2e_ns") -> pd.DataFrame:
    """Per replica: counts per outcome and p50/p99 (ms); `outlier` marks a p99 far above the fleet's.

    Outlier rule: p99 more than 3 robust deviations (1.4826 × MAD of replica p99s) above their
    median, and at least 20% above it.
    """
    cond, params = filters.where()
    outcomes = ", ".join(f"count(*) FILTER (WHERE status = '{o}') AS {o}" for o in S.OUTCOMES)
    with _cursor(_db) as cur:
        df = _df(cur, f"""
            SELECT coalesce(replica, '(none)') AS replica, count(*) AS requests, {outcomes},
                   quantile_cont({metric}, 0.5) / 1e6 AS p50_ms, quantile_cont({metric}, 0.99) / 1e6 AS p99_ms
            FROM req WHERE {cond} GROUP BY 1 ORDER BY 1""", params)
    if df.empty:
        df["outlier"] = pd.Series(dtype=bool)
        return df
    med = df["p99_ms"].median()
    mad = (df["p99_ms"] - med).abs().median() * 1.4826
    df["outlier"] = (df["p99_ms"] > med + 3 * max(mad, 1e-9)) & (df["p99_ms"] > 1.2 * med)
    return df


@st.cache_data(show_spinner=False, max_entries=64)
def concurrency(_db: Workbench, store: str, version: int, filters: Filters) -> int:
    """Most requests one replica was seen serving at once (after their queue wait): its slots."""
    cond, params = filters.where()
    with _cursor(_db) as cur:
        row = cur.execute(f"""
            WITH ev AS (
                SELECT replica, start_ns + queue_wait_ns AS t, 1 AS d FROM req WHERE {cond}
                UNION ALL SELECT replica, end_ns AS t, -1 AS d FROM req WHERE {cond})
            SELECT max(n) FROM (SELECT sum(d) OVER (PARTITION BY replica ORDER BY t, d
                                                    ROWS UNBOUNDED PRECEDING) AS n FROM ev)""",
                          [*params, *params]).fetchone()
    return max(1, int(row[0])) if row and row[0] is not None else 1


@st.cache_data(show_spinner="Replaying the queue…", max_entries=64)
def whatif(_db: Workbench, store: str, version: int, filters: Filters, servers: int) -> dict[str, Any]:
    """Predicted p50/p99 (ms) of the filtered requests through `servers` FIFO servers (analysis.whatif).

    Returns {"p50_ms", "p99_ms", "error"}; a failing replay gives an error message instead.
    """
    out: dict[str, Any] = {"p50_ms": None, "p99_ms": None, "error": None}
    try:
        from analysis.whatif import whatif as replay
    except ImportError:
        out["error"] = "the queue replay (analysis.whatif) is not installed in this build"
        return out
    with _cursor(_db, filters) as cur:
        try:
            res = replay(cur, [int(servers)], since=filters.since_ns, until=filters.until_ns)
        except Exception as exc:  # a failing sub-analysis degrades to a message, not a traceback
            out["error"] = f"could not replay the queue because {str(exc).splitlines()[0]}"
            return out
    if res:
        out["p50_ms"], out["p99_ms"] = res[0]["p50_ms"], res[0]["p99_ms"]
    return out


# --- the SQL console ---------------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def sandbox(store: str) -> duckdb.DuckDBPyConnection:
    """A sandboxed connection (analysis.connect(sandbox=True)): only the store readable, config locked."""
    from analysis.connect import connect

    return connect(Path(store), sandbox=True)


class RefusedQuery(ValueError):
    """The SQL console accepts one SELECT (or WITH … SELECT) statement only."""


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
    cur = sandbox(store).cursor()
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
    "critical path per stage": (
        "SELECT stage, round(sum(critical_ns) / 1e9, 1) AS total_s,\n"
        "       round(avg(critical_ns) / 1e6, 1) AS mean_ms\n"
        "FROM stages GROUP BY stage ORDER BY total_s DESC"
    ),
    "slowest requests": (
        "SELECT trace_id, start, replica, round(e2e_ns / 1e6) AS e2e_ms, status\n"
        "FROM requests ORDER BY e2e_ns DESC LIMIT 20"
    ),
    "failures by replica": (
        "SELECT replica, status, count(*) AS n FROM requests\n"
        "WHERE status <> 'ok' GROUP BY ALL ORDER BY n DESC"
    ),
}


@st.cache_data(show_spinner=False, max_entries=256)
def baseline_stats(_db: Workbench, store: str, version: int, filters: Filters, start_ns: int, end_ns: int,
                   metric: str = "e2e_ns") -> dict[str, Any]:
    """Requests, p50 and p99 (ms) of `metric` under `filters` outside [start_ns, end_ns): the baseline."""
    cond, params = filters.where()
    with _cursor(_db) as cur:
        n, p50, p99 = cur.execute(
            f"SELECT count(*), quantile_cont({metric}, 0.5) / 1e6, quantile_cont({metric}, 0.99) / 1e6 "
            f"FROM req WHERE {cond} AND NOT (start_ns >= ? AND start_ns < ?)",
            [*params, start_ns, end_ns]).fetchone() or (0, None, None)
    return {"requests": int(n), "p50_ms": p50, "p99_ms": p99}


def explain_window(db: Workbench, filters: Filters, start_ns: int, end_ns: int, spike: dict[str, Any] | None,
                   baseline_p99_ms: float | None, metric: str = "e2e_ns") -> dict[str, pd.DataFrame]:
    """Stages, single dimensions and pairs explaining a window, in one shape for the spike page.

    A detected spike uses the report's own explanation (analysis.explain: tail vs baseline,
    multiple-testing guard, counterfactual p99); a brushed window falls back to the plain SQL
    contrast of this module. Dimension frames: dimension, value, tail_share, baseline_share,
    support, p99_without_ms, explained.
    """
    key = (db, str(db.store), db.version)
    cols = ["dimension", "value", "tail_share", "baseline_share", "support", "p99_without_ms", "explained"]
    if spike and spike.get("stages"):
        stages = pd.DataFrame(spike["stages"])
    else:
        stages = stage_breakdown(*key, filters, start_ns, end_ns, metric)
    if spike and spike.get("dimensions"):
        dims = pd.DataFrame(spike["dimensions"])
        for c in cols:
            if c not in dims.columns:
                dims[c] = None
        dims = dims[cols]
        pair = dims["dimension"].astype(str).str.contains("&")
        dims["dimension"] = dims["dimension"].astype(str).str.replace("&", " × ")
        dims["value"] = dims["value"].astype(str).str.replace("&", " × ")
        return {"stages": stages, "dimensions": dims[~pair].reset_index(drop=True),
                "pairs": dims[pair].reset_index(drop=True)}
    mine = dimension_contrast(*key, filters, start_ns, end_ns, metric)
    if not mine.empty:
        p99 = mine["p99_ms"].iloc[0]
        excess = (p99 - baseline_p99_ms) if baseline_p99_ms is not None else None
        mine = mine.rename(columns={"share": "baseline_share", "tail_requests": "support"})
        mine["explained"] = ((p99 - mine["p99_without_ms"]) / excess).clip(0, 1) if excess and excess > 0 else None
        mine = mine[(mine["tail_share"] >= 1.5 * mine["baseline_share"]) & (mine["support"] >= 5)]
    pairs = dimension_pairs(*key, filters, start_ns, end_ns, metric)
    if not pairs.empty:
        pairs = pairs.rename(columns={"pair": "dimension", "share": "baseline_share", "tail_requests": "support"})
        pairs["p99_without_ms"] = None
        pairs["explained"] = None
    empty = pd.DataFrame(columns=cols)
    return {"stages": stages,
            "dimensions": mine[cols].reset_index(drop=True) if not mine.empty else empty,
            "pairs": pairs[cols].reset_index(drop=True) if not pairs.empty else empty}


def prewarm(db: Workbench) -> None:
    """Compute the unfiltered overview's numbers (and its spike report) into the query caches.

    Runs in the background thread once the critical paths are all computed, so the first
    visitor after a big load does not wait for the report (about 2 s on 10 million spans).
    """
    key = (db, str(db.store), db.version)
    f = Filters()
    c = choices(*key)
    if not c["requests"]:
        return
    summary(*key, f)
    over_time(*key, f, bucket_seconds(c["min_ns"], c["max_ns"]))
    spikes(*key, f, "e2e_ns")


# --- cost and capacity (analysis.cost, analysis.capacity) ---------------------------------

def price_default(store: str) -> float | None:
    """The default USD per GPU-hour of the store's price table (STORE/prices.toml), if it has one."""
    from analysis.cost import prices_for

    try:
        return prices_for(Path(store)).default
    except Exception:  # a broken price table is reported by the page that uses it
        return None


@st.cache_data(show_spinner="Sharing out GPU time…", max_entries=32)
def cost_summary(_db: Workbench, store: str, version: int, filters: Filters, by: str,
                 gpu_hour_usd: float | None) -> dict[str, Any]:
    """analysis.cost.cost_table over the filters' time range (the `tailscope cost --json` shape), or {"error"}."""
    from analysis.cost import cost_table, prices_for

    with _cursor(_db) as cur:
        try:
            return cost_table(cur, by=by, since=filters.since_ns, until=filters.until_ns,
                              prices=prices_for(Path(store), None, gpu_hour_usd), facts="req")
        except Exception as exc:  # a failing analysis degrades to a message on the page
            return {"error": f"could not compute the cost because {str(exc).splitlines()[0]}"}


@st.cache_data(show_spinner="Sharing out GPU time…", max_entries=32)
def cost_over_time(_db: Workbench, store: str, version: int, filters: Filters, by: str, bucket_s: int,
                   gpu_hour_usd: float | None) -> pd.DataFrame:
    """analysis.cost.cost_series (GPU-seconds and USD per cell and key, idle and cold start as keys)."""
    from analysis.cost import cost_series, prices_for

    with _cursor(_db) as cur:
        frame = cost_series(cur, by=by, bucket_s=bucket_s, since=filters.since_ns, until=filters.until_ns,
                            prices=prices_for(Path(store), None, gpu_hour_usd), facts="req")
    df = frame.to_pandas()
    df["gpu_seconds"] = df["gpu_ns"] / 1e9
    return df


@st.cache_data(show_spinner="Replaying the queue for each replica count…", max_entries=32)
def capacity_curve(_db: Workbench, store: str, version: int, filters: Filters, target_p99_ms: float | None,
                   metric: str, gpu_hour_usd: float | None, max_replicas: int = 64) -> dict[str, Any]:
    """analysis.capacity.capacity_curve for 1..max_replicas over the filtered requests, or {"error"}."""
    from analysis.capacity import capacity_curve as curve
    from analysis.capacity import load_kernel, observed_workload

    with _cursor(_db, filters) as cur:
        try:
            w = observed_workload(cur, filters.since_ns, filters.until_ns)
            counts = range(1, max_replicas + 1) if load_kernel() is not None else sorted(
                {1, 2, 4, 8, 16, 32, max_replicas, w.observed_replicas})
            out = curve(w, counts, target_p99_ms=target_p99_ms, metric=metric, gpu_hour_usd=gpu_hour_usd)
        except Exception as exc:
            return {"error": f"could not replay the queue because {str(exc).splitlines()[0]}"}
    out["cold_start_ms"] = None if w.cold_start_ns is None else w.cold_start_ns / 1e6
    out["kernel"] = load_kernel() is not None
    return out


@st.cache_data(show_spinner="Replaying reactive scale-up…", max_entries=32)
def capacity_scale_up(_db: Workbench, store: str, version: int, filters: Filters, replicas: int,
                      max_replicas: int, gpu_hour_usd: float | None) -> dict[str, Any]:
    """analysis.capacity.scale_up (reactive with the observed cold start against pre-scaling), or {"error"}."""
    from analysis.capacity import observed_workload, scale_up

    with _cursor(_db, filters) as cur:
        try:
            w = observed_workload(cur, filters.since_ns, filters.until_ns)
            return scale_up(w, replicas, max_replicas, gpu_hour_usd)
        except Exception as exc:
            return {"error": f"could not replay scale-up because {str(exc).splitlines()[0]}"}
