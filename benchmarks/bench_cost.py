"""Benchmark of `tailscope cost` and the capacity curve on bench_report's synthetic stores.

    python -m benchmarks.bench_cost [--spans 1000000,10000000] [--dir DIR] [--json]
    python -m benchmarks.bench_cost --store STORE[,STORE...] [--json]   # stores already built, read as they are

The stores are built (or reused) as bench_report's are (benchmarks.inputs: by fingerprint), then their
request hours are materialized, as `tailscope ingest` leaves a store (hours an earlier run materialized with
this code are kept, so a process reading the store meanwhile keeps them; stale ones are built). Per store, in
a fresh process (DuckDB memory_limit 4GB): the anchor (DuckDB's plain
p50/p99 of `Duration` per `SpanName` over the same Parquet files), the fair-share GPU-time
sweep with the cost table (`cost_table`), the `requests` view copied into a table once (what
the dashboard holds in memory; the replay needs each request's critical-path queue wait), the
observed workload read from it, and the capacity curve for 1 to 64 replicas: first on a fresh
workload, then again with another target (what the dashboard does when the target changes),
against the same curve replayed at every count (the way before the zero-wait cut-off, in the
same run), whose points must be identical. Replays use the C kernel (`pip install` builds it
from setup.py); the Python loop is timed at two counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from analysis.engine.materialize import REQUESTS_DIR
from benchmarks.bench_report import anchor, bench_args, materialize_in_child, peak_rss_mib, stores, timed


def run_one(store: Path) -> dict[str, Any]:
    """Time each step in this process; wall and CPU seconds."""
    from analysis import connect
    from analysis.capacity import (
        Workload,
        batch_table,
        capacity_curve,
        drawn_counts,
        load_kernel,
        observed_workload,
        predict_at,
        reactive_batched,
        reactive_batched_py,
        replay,
        replayed,
        scale_up,
        scaled_services,
    )
    from analysis.cost import Prices, cost_page, cost_series, cost_table
    from analysis.whatif import simulate

    out: dict[str, Any] = {}
    out["anchor_s"], out["anchor_cpu_s"] = anchor(store)

    con = connect(store, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false").fetchall()
    table, out["cost_table_s"], out["cost_table_cpu_s"] = timed(
        lambda: cost_table(con, by="tenant", prices=Prices(default=2.0)))
    tot = table["totals"]
    out["identity_holds"] = tot["allocated_ns"] + tot["cold_start_ns"] + tot["idle_ns"] == tot["observed_ns"]
    out["rows_sum_equals_allocated"] = sum(r["gpu_ns"] for r in table["rows"]) == tot["allocated_ns"]
    out["allocated_ns"] = tot["allocated_ns"]
    out["idle_share"] = round(tot["idle_share"], 4)
    # the series the Cost page draws beside the table (one-minute cells: whole stored minutes)
    series, out["cost_series_s"], out["cost_series_cpu_s"] = timed(
        lambda: cost_series(con, by="tenant", bucket_s=60, prices=Prices(default=2.0)))
    out["series_sum_equals_allocated"] = int(series.filter(~series["key"].is_in(["(idle)", "(cold start)"]))[
        "gpu_ns"].sum()) == tot["allocated_ns"]
    # both as the Cost page computes them: one sweep cut at the series' grid (cost_page), the same table and series
    page, out["cost_page_s"], out["cost_page_cpu_s"] = timed(
        lambda: cost_page(con, by="tenant", bucket_s=60, prices=Prices(default=2.0)))
    out["cost_page_equal"] = page[0] == table and page[1].equals(series)
    con.close()

    con = connect(store, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false").fetchall()
    _, out["requests_table_s"], out["requests_table_cpu_s"] = timed(lambda: con.execute(
        "CREATE TABLE req AS SELECT * FROM requests").fetchall())
    con.execute("CREATE OR REPLACE TEMP VIEW requests AS SELECT * FROM req").fetchall()
    w, out["workload_s"], out["workload_cpu_s"] = timed(lambda: observed_workload(con))
    out["requests"] = w.size
    out["slots_per_replica"] = w.slots
    out["observed_replicas"] = w.observed_replicas
    out["kernel"] = load_kernel() is not None

    def fresh() -> Workload:
        return Workload(w.arrivals, w.services, w.ttft_rest, w.slots, w.observed_replicas, w.cold_start_ns, w.span_ns)

    # the anchor of the curve: every count replayed, one per core (the curve before the zero-wait cut-off)
    every_w = fresh()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        every, out["every_count_replayed_s"], out["every_count_replayed_cpu_s"] = timed(
            lambda: list(pool.map(lambda k: replayed(every_w, k, None), range(1, 65))))
    # a reachable target: 10% above the p99 of 64 replicas (where queueing is gone)
    target = round(1.1 * (every[-1]["p99_ms"] or 0.0))
    curve_w = fresh()
    curve, out["curve_1_64_s"], out["curve_1_64_cpu_s"] = timed(
        lambda: capacity_curve(curve_w, range(1, 65), target_p99_ms=target, gpu_hour_usd=2.0))
    out["zero_wait_replicas"] = curve_w.zero_wait_replicas
    out["counts_replayed"] = min(64, curve_w.zero_wait_replicas)
    out["identical_to_every_count_replayed"] = all(
        {k: v for k, v in p.items() if k != "gpu_usd_per_hour"} == e for p, e in zip(curve["points"], every,
                                                                                    strict=True))
    _, out["curve_new_target_s"], out["curve_new_target_cpu_s"] = timed(
        lambda: capacity_curve(curve_w, range(1, 65), target_p99_ms=2 * target, gpu_hour_usd=3.0))
    out["target_p99_ms"] = target
    # the curve as the dashboard draws it: with the measured relation of service time to batch where the traces show
    # it (every count replayed, and the fewest count at the two ends of the relation's interval); `fresh` workloads
    # above carry no relation, so they replay fixed service times
    batched, out["curve_1_64_batch_relation_s"], out["curve_1_64_batch_relation_cpu_s"] = timed(
        lambda: capacity_curve(w, range(1, 65), target_p99_ms=target, gpu_hour_usd=2.0))
    out["batch_relation_applied"] = batched["service"]["batch_relation_applied"]
    # the same at the counts the Capacity page draws (analysis.capacity.drawn_counts), on a fresh workload with the
    # relation
    drawn_w = fresh()
    drawn_w.relation, drawn_w.batches = w.relation, w.batches
    drawn = drawn_counts(64, w.observed_replicas)
    _, out["curve_drawn_batch_relation_s"], out["curve_drawn_batch_relation_cpu_s"] = timed(
        lambda: capacity_curve(drawn_w, drawn, target_p99_ms=target, gpu_hour_usd=2.0))
    out["drawn_counts"] = len(drawn)
    out["batch_relation"] = batched["service"]["assumption"]
    # the What-if page's prediction at half the observed replicas and the scale-up comparison from there, as the
    # dashboard runs them (with the relation where applied), on the workload the curve above left its replays on
    half = max(1, w.observed_replicas // 2)
    _, out["whatif_s"], out["whatif_cpu_s"] = timed(lambda: predict_at(w, half, w.slots + 1))
    up, out["scale_up_s"], out["scale_up_cpu_s"] = timed(lambda: scale_up(w, half, w.observed_replicas))
    out["scale_up_added"] = up["reactive"]["added"]
    if w.relation is not None:  # the scale-up replay with the relation: the C kernel against the Python loop
        g = w.relation["growth_per_request"]
        base, table = scaled_services(w, g), batch_table(w, g)
        args = (w.arrivals, base, w.slots, half, w.observed_replicas, w.cold_start_ns or 0, table)
        c_up, out["reactive_batched_kernel_s"], out["reactive_batched_kernel_cpu_s"] = timed(
            lambda: reactive_batched(*args))
        py_up, out["reactive_batched_python_s"], out["reactive_batched_python_cpu_s"] = timed(
            lambda: reactive_batched_py(*args))
        out["reactive_batched_equal"] = all(
            (x == y).all() if hasattr(x, "all") else x == y for x, y in zip(c_up, py_up, strict=True))
    out["fewest_replicas"] = curve["fewest_replicas"]
    out["advice"] = curve["advice"]["sentence"] if curve["advice"] else None
    ks = [1, 8]
    _, py_s, _ = timed(lambda: [simulate(w.arrivals, w.services, k * w.slots) for k in ks])
    out["python_loop_per_replay_ms"] = round(py_s / len(ks) * 1000, 1)
    _, c_s, _ = timed(lambda: [replay(w.arrivals, w.services, k * w.slots, checked=True) for k in ks])
    out["kernel_per_replay_ms"] = round(c_s / len(ks) * 1000, 1)
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    out["cost_vs_anchor_x"] = round(out["cost_table_s"] / max(out["anchor_s"], 1e-9), 1)
    out["curve_vs_every_count_x"] = round(out["curve_1_64_cpu_s"] / max(out["every_count_replayed_cpu_s"], 1e-9), 3)
    with open("/proc/loadavg") as fh:
        out["loadavg_1m"] = float(fh.read().split()[0])
    return out


def main(argv: list[str] | None = None) -> None:
    """Build the stores (or reuse them) and print the figures."""
    args = bench_args(__doc__, argv)
    if args.one:
        print(json.dumps(run_one(Path(args.one))))
        return
    results: dict[str, Any] = {}
    # the store's materialized hours are kept (another process may be reading them): the hours built by other code
    # have another key, so materializing rebuilds exactly those
    for spans, store in stores(args, keep=(REQUESTS_DIR,)):
        # the request hours materialized first (untimed here; bench_report times it), as `tailscope ingest` leaves
        # a store: every hour stale for the code running now is built
        if not args.store:
            materialize_in_child(store)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_cost", "--one", str(store)],
                              check=True, capture_output=True, text=True)
        results[str(spans)] = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for count, r in results.items():
        print(f"{int(count):,} spans, {r['requests']:,} requests, load {r['loadavg_1m']}: "
              f"anchor {r['anchor_s']} s / {r['anchor_cpu_s']} CPU-s; "
              f"cost table {r['cost_table_s']} s / {r['cost_table_cpu_s']} CPU-s "
              f"({r['cost_vs_anchor_x']}x anchor, identity {'holds' if r['identity_holds'] else 'BROKEN'}); "
              f"cost series {r['cost_series_s']} s / {r['cost_series_cpu_s']} CPU-s; "
              f"both in one sweep (the Cost page) {r['cost_page_s']} s / {r['cost_page_cpu_s']} CPU-s "
              f"(the same table and series: {r['cost_page_equal']}); "
              f"workload {r['workload_s']} s; curve 1-64 {r['curve_1_64_s']} s / {r['curve_1_64_cpu_s']} CPU-s "
              f"({r['counts_replayed']} counts replayed; every count: {r['every_count_replayed_s']} s / "
              f"{r['every_count_replayed_cpu_s']} CPU-s; identical: {r['identical_to_every_count_replayed']}); "
              f"new target {r['curve_new_target_s']} s; curve 1-64 with the batch relation "
              f"{r['curve_1_64_batch_relation_s']} s / {r['curve_1_64_batch_relation_cpu_s']} CPU-s "
              f"(applied: {r['batch_relation_applied']}; at the {r['drawn_counts']} counts the page draws: "
              f"{r['curve_drawn_batch_relation_s']} s / {r['curve_drawn_batch_relation_cpu_s']} CPU-s); "
              f"kernel {r['kernel_per_replay_ms']} ms/replay, Python "
              f"{r['python_loop_per_replay_ms']} ms/replay; what-if {r['whatif_s']} s / {r['whatif_cpu_s']} CPU-s; "
              f"scale-up {r['scale_up_s']} s / {r['scale_up_cpu_s']} CPU-s"
              + (f" (its replay with the relation: kernel {r['reactive_batched_kernel_cpu_s']} CPU-s, Python "
                 f"{r['reactive_batched_python_cpu_s']} CPU-s, equal: {r['reactive_batched_equal']})"
                 if "reactive_batched_equal" in r else "")
              + f"; peak RSS {r['peak_rss_mib']} MiB")


if __name__ == "__main__":
    main()
