"""Dashboard benchmark: every page render and filter change on a 10-million-span store, driving the app.

The app is driven with Streamlit's AppTest (the same script runner the server uses, without a
browser): one session imports the dashboard (as the first session of a server just started does),
opens the store and renders the Overview (complete: summary, series and
the report's spikes marked; on a store nothing materialized, request facts first and the
critical paths in the background), then the Spike page, whose explanations a warm-up thread
computes after the Overview's spikes; the time until every background step is done is
reported apart. Then the query caches are cleared (st.cache_data is process-wide: the first
session and the warm-up filled it) and a second session renders each page once, then changes filters.

    python -m benchmarks.bench_dashboard [--store DIR] [--spans 10000000] [--keep] [--materialized [--live-hours N]]
        [--pages overview,spike,...] [--first-only] [--drop-kept-cost]

`--materialized` first writes every stale hour's request file (analysis.engine.materialize, timed), as
`tailscope collect` does for settled hours: the pages then read the hours in place; `--live-hours N` leaves the
last N hours live (removing their files if written), as collect leaves the current hour and the one before.
`--first-only` stops after the first session's Overview (a run short enough to alternate two trees many times);
`--drop-kept-cost` empties the Cost page's live GPU-time sweep, which the store's warm-up keeps, before the second
session too (the page's first visit after a refresh brought new spans).
The measured session is cold: every result cache of the dashboard is emptied before it (`clear_caches` prints
what it clears and what stays warm).

Without --store it builds a synthetic incident store (tests/dashboard/incident_store.py:
8 replicas, 7 spans per request over 6 hours, replica-05 slow for 54 minutes) under the
system temp directory, and removes it afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamlit.components.v2.component_manager import BidiComponentManager
    from streamlit.testing.v1 import AppTest

    from dashboard.data import Workbench

APP = Path(__file__).parents[1] / "dashboard" / "app.py"
PAGES: tuple[str, ...] = ("overview", "spike", "alerts", "traces", "shape", "replicas", "whatif", "capacity", "cost",
                          "sql")
PAGE_LIMIT_S = 3.0
FILTER_LIMIT_S = 1.0


def build_store(store: Path, spans: int) -> float:
    """Write the synthetic incident store; seconds taken."""
    from tests.dashboard.incident_store import SPANS_PER_REQUEST, write_incident_store

    t0 = time.perf_counter()
    write_incident_store(store, requests=spans // SPANS_PER_REQUEST + 1, duration_s=6 * 3600.0,
                         chunk=200_000)
    return time.perf_counter() - t0


def _cpu_s() -> float:
    """CPU seconds (user + system, all threads) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(label: str, results: list[tuple[str, float, float]], limit: float, fn: object) -> None:
    t0, c0 = time.perf_counter(), _cpu_s()
    at = fn()  # type: ignore[operator]
    took, cpu = time.perf_counter() - t0, _cpu_s() - c0
    if at.exception:
        raise RuntimeError(f"{label}: {[e.message for e in at.exception]}")
    results.append((label, took, limit))
    print(f"  {label:<44} {took:7.3f} s  {cpu:6.2f} CPU-s  {'ok' if took < limit else 'OVER ' + str(limit) + ' s'}",
          flush=True)


def materialize_store(store: Path, live_hours: int = 0) -> tuple[int, int]:
    """Write every stale hour's request file of `store` (analysis.engine.materialize), as `tailscope collect` does
    for settled hours, but leave the last `live_hours` hours live (their files removed if written), as collect
    leaves the current hour and the one before; (hours written, hours left live)."""
    from analysis.engine.materialize import HOUR_NS, materialize, remove_hour, snapshot

    snap = snapshot(store)
    last = max([*snap.stale, *snap.fresh], default=0)
    for hour in [last - i * HOUR_NS for i in range(live_hours)]:
        remove_hour(store, hour)
    # an hour is settled once the next one ended: the last N hours stay live
    written = materialize(store, settled_before_ns=last - (live_hours - 2) * HOUR_NS if live_hours else None)
    return len(written), len(snapshot(store).stale)


def anchor(store: Path) -> None:
    """The plain `spans` scan the figures are compared with, in this process, and the load average."""
    from analysis.engine.connect import connect

    con = connect(store)
    t0, c0 = time.perf_counter(), _cpu_s()
    con.execute("SELECT SpanName, quantile_cont(Duration, 0.5), quantile_cont(Duration, 0.99) "
                "FROM spans GROUP BY 1").fetchall()
    print(f"  anchor (spans scan, p50/p99 per span name)   {time.perf_counter() - t0:7.3f} s  "
          f"{_cpu_s() - c0:6.2f} CPU-s  load average {os.getloadavg()[0]:.1f}", flush=True)
    con.close()


def server_components() -> BidiComponentManager:
    """Streamlit's component discovery, done once and timed: a server does it at start-up, before any
    session, while AppTest does it in the first run of each AppTest (it reads every installed package's
    metadata: 0.5-2 s here), which would otherwise count in the first page's time."""
    from streamlit.components.v2.component_manager import BidiComponentManager

    t0, c0 = time.perf_counter(), _cpu_s()
    manager = BidiComponentManager()
    manager.discover_and_register_components(start_file_watching=False)
    print(f"  {'(server start-up: component discovery)':<44} {time.perf_counter() - t0:7.3f} s  "
          f"{_cpu_s() - c0:6.2f} CPU-s", flush=True)
    return manager


def _session(components: BidiComponentManager, timeout: float) -> AppTest:
    """A new AppTest session of the app, with the server's discovered components."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=timeout)
    at._bidi_component_manager = components  # what AppTest's first run would discover again
    return at


def clear_caches(drop_kept_cost: Workbench | None = None) -> str:
    """Empty the dashboard's result caches, as a server just started holds them, but for the opened store; a
    sentence saying what was cleared and what stays warm. `drop_kept_cost`: a workbench whose live hours' GPU-time
    sweep, kept by the store's warm-up for the Cost page (`Workbench.cost_runs`), is emptied too, as a refresh that
    brought new spans empties it (Live mode: the Cost page's first visit after new data).

    st.cache_data is process-wide (the first session and the store's warm-up thread filled it); the
    st.cache_resource entries of dashboard.data hold results too (the replayed requests, the Cost and Capacity
    pages' background jobs, the SQL console's sandbox). The warm-up thread was joined before: nothing fills
    the caches again (it runs when a store opens; dashboard/server.py's start-up thread only imports modules).
    """
    import streamlit as st

    from dashboard import data

    st.cache_data.clear()
    kept = {"workbench", "clickhouse_bench"}  # the opened store (its connection and the live hours' rows)
    resources = sorted(name for name, fn in vars(data).items() if name not in kept
                       and type(getattr(fn, "_info", None)).__name__ == "CachedResourceFuncInfo")
    for name in resources:
        getattr(data, name).clear()
    sweeps = "the live hours' GPU-time sweep of the store's warm-up (Workbench.cost_runs)"
    dropped = drop_kept_cost is not None
    if drop_kept_cost is not None:
        drop_kept_cost.cost_runs = data.KeptCostRuns()
    return (f"st.cache_data cleared; st.cache_resource cleared: {', '.join(resources)}"
            f"{'; emptied: ' + sweeps if dropped else ''}; kept: the opened store (data.workbench)"
            f"{'' if dropped else ', ' + sweeps}; DuckDB's and the OS's file caches stay warm (the store was just "
            "read)")


def run(store: Path, pages: tuple[str, ...] = PAGES, first_only: bool = False,
        drop_kept_cost: bool = False) -> list[tuple[str, float, float]]:
    """Drive the app over `store`; (what, seconds, limit) per measurement. `pages`: the pages the second session
    renders after the Overview (every page by default); `first_only`: only the first session's Overview;
    `drop_kept_cost`: the second session also without the warm-up's live GPU-time sweep (`clear_caches`)."""
    os.environ["TAILSCOPE_STORE"] = str(store)
    anchor(store)
    components = server_components()
    results: list[tuple[str, float, float]] = []
    t_open = time.perf_counter()
    at = _session(components, 3600)
    # the app's own modules are imported by the first session, as in a server just started
    assert "dashboard.data" not in sys.modules, "the first session must import the dashboard itself"
    heavy = [m for m in ("pandas", "altair") if m not in sys.modules]
    _timed("open store: first overview (complete)", results, float("inf"), at.run)
    print(f"  (of {' and '.join(heavy) or 'nothing'} not loaded before it, the first overview imported: "
          f"{', '.join(m for m in heavy if m in sys.modules) or 'none'})", flush=True)
    if first_only:
        return results
    from dashboard import data
    _timed("then page spike (explanations: warm-up thread)", results, float("inf"),
           at.switch_page("app_pages/spike.py").run)
    wb = data.workbench(str(store))  # the same cached workbench the app opened
    for thread in (wb.worker, wb.warmer):  # the critical paths (a store not materialized), the warm-up
        if thread is not None:
            thread.join()
    for step in (wb.cost_warm, wb.capacity_warm):  # the warm-up's last steps: the live hours' GPU-time sweep for
        if step is not None:  # the Cost page, then the Capacity page's curve (else it could refill a cleared cache)
            step.result()
    report = data.report_of(wb, str(store), wb.version, data.Filters()) or {}
    print(f"  (store: {wb.con.execute('SELECT count(*) FROM req').fetchone()} requests; spikes found: "
          f"{[(s['start'], s['end']) for s in report.get('spikes', [])]}; notes: {report.get('errors')})",
          flush=True)
    took = time.perf_counter() - t_open
    results.append(("open store: every background step done", took, float("inf")))
    print(f"  {'open store: every background step done':<44} {took:7.3f} s", flush=True)
    # a second session with cold caches (what a visitor meets when nobody asked for these pages and filters yet)
    print(f"  (cold: {clear_caches(wb if drop_kept_cost else None)})", flush=True)
    at = _session(components, 600)
    _timed("page overview (new session, cold query caches)", results, PAGE_LIMIT_S, at.run)
    for page in [p for p in PAGES[1:] if p in pages]:
        # a large range's work (Cost, Capacity) runs in the background while the page shows a note; the page draws
        # its result in the same run the moment it is done, so this is the time until the page is filled in
        _timed(f"page {page} (cold query caches)", results, PAGE_LIMIT_S, at.switch_page(f"app_pages/{page}.py").run)
    at.switch_page("app_pages/overview.py").run()
    ms = at.multiselect(key="f_replica")
    _timed("filter: replica = replica-05 (overview)", results, FILTER_LIMIT_S, ms.select("replica-05").run)
    ms = at.multiselect(key="f_replica")
    _timed("filter: + replica-02 (overview)", results, FILTER_LIMIT_S, ms.select("replica-02").run)
    lo, hi = at.slider(key="f_time").value
    _timed("filter: time range, first half (overview)", results, FILTER_LIMIT_S,
           at.slider(key="f_time").set_value((lo, lo + (hi - lo) / 2)).run)
    at.multiselect(key="f_replica").unselect("replica-05").unselect("replica-02").run()
    at.switch_page("app_pages/replicas.py").run()
    _timed("filter: tenant = acme (replicas)", results, FILTER_LIMIT_S,
           at.multiselect(key="f_tenant").select("acme").run)
    at.switch_page("app_pages/spike.py").run()
    models = [w for w in at.multiselect if w.key == "f_model"]  # shown when the store has several models
    if models:
        model = "mistral-7b" if "mistral-7b" in models[0].options else models[0].options[-1]
        _timed(f"filter: model = {model} (spike)", results, FILTER_LIMIT_S,
               at.multiselect(key="f_model").select(model).run)
        at.multiselect(key="f_model").unselect(model).run()
    at.multiselect(key="f_tenant").unselect("acme").run()
    at.switch_page("app_pages/whatif.py").run()
    _timed("what-if: replica slider to 4", results, PAGE_LIMIT_S, at.slider(key="whatif_replicas").set_value(4).run)
    return results


def main() -> None:
    """Build or reuse a store, drive the app, print a table (markdown) of the timings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--materialized", action="store_true",
                        help="materialize every stale hour first (as `tailscope collect` does for settled hours)")
    parser.add_argument("--pages", default=",".join(PAGES),
                        help="the pages the second session renders after the Overview, comma-separated (default: all)")
    parser.add_argument("--live-hours", type=int, default=0, metavar="N",
                        help="with --materialized: leave the last N hours live (their request files removed if "
                             "written), as `tailscope collect` leaves the current hour and the one before")
    parser.add_argument("--drop-kept-cost", action="store_true",
                        help="the second session also without the live hours' GPU-time sweep the store's warm-up "
                             "kept for the Cost page, as after a refresh that brought new spans (Live mode)")
    parser.add_argument("--first-only", action="store_true",
                        help="stop after the first session's Overview (the server's first complete page)")
    args = parser.parse_args()
    tmp: Path | None = None
    store = args.store
    if store is None or not store.exists():
        if store is None:
            tmp = Path(tempfile.mkdtemp(prefix="tailscope-bench-dashboard-"))
            store = tmp / "store"
        print(f"building a {args.spans:,}-span store in {store} …", flush=True)
        print(f"  built in {build_store(store, args.spans):.1f} s", flush=True)
    if args.materialized:
        t0, c0 = time.perf_counter(), _cpu_s()
        hours, live = materialize_store(store, args.live_hours)
        print(f"  materialized {hours} stale hour(s) in {time.perf_counter() - t0:.1f} s, {_cpu_s() - c0:.1f} CPU-s; "
              f"live (not materialized): {live} hour(s)", flush=True)
    try:
        results = run(store, tuple(args.pages.split(",")), args.first_only, args.drop_kept_cost)
        anchor(store)  # again, before the store is removed: the load may have changed during the run
    finally:
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    from benchmarks.bench_report import peak_rss_mib

    print(f"  peak RSS of the whole run (VmHWM): {peak_rss_mib():,.0f} MiB", flush=True)
    print("\n| measurement | seconds | limit |\n|---|---:|---:|")
    for label, took, limit in results:
        print(f"| {label} | {took:.2f} | {'–' if limit == float('inf') else f'< {limit:g} s'} |")


if __name__ == "__main__":
    main()
