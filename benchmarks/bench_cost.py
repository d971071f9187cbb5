"""Benchmark of `tailscope cost` and the capacity curve on bench_report's synthetic stores.

    python -m benchmarks.bench_cost [--spans 1000000,10000000] [--dir DIR] [--json]

Per store, in a fresh process (DuckDB memory_limit 4GB): the anchor (DuckDB's plain
p50/p99 of `Duration` per `SpanName` over the same Parquet files), the fair-share GPU-time
sweep with the cost table (`cost_table`), the `requests` view materialized once (what the
dashboard holds in memory; the replay needs each request's critical-path queue wait), the
observed workload read from it, and the capacity curve for 1 to 64 replicas with the C
kernel (`pip install`, which builds it from setup.py) and, for three points, with the Python loop.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_report import _peak_rss_mib, _timed, make_store
from tracing import schema as S


def run_one(store: Path) -> dict[str, Any]:
    """Time each step in this process; wall and CPU seconds."""
    import duckdb

    from analysis import connect
    from analysis.capacity import capacity_curve, load_kernel, observed_workload, point
    from analysis.cost import Prices, cost_table
    from analysis.whatif import simulate

    out: dict[str, Any] = {}
    glob = str(store / S.SEGMENT_GLOB)
    con0 = duckdb.connect()
    con0.execute("SET enable_progress_bar = false").fetchall()
    _, out["anchor_s"], out["anchor_cpu_s"] = _timed(lambda: con0.execute(
        "SELECT SpanName, quantile_cont(Duration, 0.5), quantile_cont(Duration, 0.99) "
        "FROM read_parquet(?) GROUP BY SpanName", [glob]).fetchall())
    con0.close()

    con = connect(store, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false").fetchall()
    table, out["cost_table_s"], out["cost_table_cpu_s"] = _timed(
        lambda: cost_table(con, by="tenant", prices=Prices(default=2.0)))
    tot = table["totals"]
    out["identity_holds"] = tot["allocated_ns"] + tot["cold_start_ns"] + tot["idle_ns"] == tot["observed_ns"]
    out["rows_sum_equals_allocated"] = sum(r["gpu_ns"] for r in table["rows"]) == tot["allocated_ns"]
    out["idle_share"] = round(tot["idle_share"], 4)
    con.close()

    con = connect(store, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false").fetchall()
    _, out["requests_materialize_s"], out["requests_materialize_cpu_s"] = _timed(lambda: con.execute(
        "CREATE TABLE req AS SELECT * FROM requests").fetchall())
    con.execute("CREATE OR REPLACE TEMP VIEW requests AS SELECT * FROM req").fetchall()
    w, out["workload_s"], _ = _timed(lambda: observed_workload(con))
    out["requests"] = w.size
    out["slots_per_replica"] = w.slots
    out["kernel"] = load_kernel() is not None
    # a reachable target: 10% above the p99 of 64 replicas (where queueing is gone)
    target = round(1.1 * (point(w, 64)["p99_ms"] or 0.0))
    curve, out["curve_1_64_s"], out["curve_1_64_cpu_s"] = _timed(
        lambda: capacity_curve(w, range(1, 65), target_p99_ms=target, gpu_hour_usd=2.0))
    out["target_p99_ms"] = target
    out["fewest_replicas"] = curve["fewest_replicas"]
    out["observed_replicas"] = w.observed_replicas
    out["per_point_ms"] = round(out["curve_1_64_s"] / 64 * 1000, 1)
    ks = [1, 8, 64]
    _, py_s, _ = _timed(lambda: [simulate(w.arrivals, w.services, k * w.slots) for k in ks])
    out["python_loop_per_point_ms"] = round(py_s / len(ks) * 1000, 1)
    _, c_s, _ = _timed(lambda: [point(w, k) for k in ks])
    out["kernel_per_point_ms_same_points"] = round(c_s / len(ks) * 1000, 1)
    out["peak_rss_mib"] = round(_peak_rss_mib(), 1)
    out["cost_vs_anchor_x"] = round(out["cost_table_s"] / max(out["anchor_s"], 1e-9), 1)
    with open("/proc/loadavg") as fh:
        out["loadavg_1m"] = float(fh.read().split()[0])
    return out


def main(argv: list[str] | None = None) -> None:
    """Build the stores (or reuse them) and print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", default="1000000,10000000")
    parser.add_argument("--dir", default=None, help="where the stores live (default: a temp dir)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(Path(args.one))))
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailscope-bench-"))
    results: dict[str, Any] = {}
    for count in (int(s) for s in args.spans.split(",")):
        store = base / f"store-{count}"
        if not store.exists():
            t = time.perf_counter()
            make_store(store, count)
            print(f"built {store} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_cost", "--one", str(store)],
                              check=True, capture_output=True, text=True)
        results[str(count)] = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for spans, r in results.items():
        print(f"{int(spans):,} spans, {r['requests']:,} requests, load {r['loadavg_1m']}: "
              f"anchor {r['anchor_s']} s; cost table {r['cost_table_s']} s ({r['cost_vs_anchor_x']}x anchor, "
              f"identity {'holds' if r['identity_holds'] else 'BROKEN'}); requests materialized "
              f"{r['requests_materialize_s']} s; curve 1-64 replicas {r['curve_1_64_s']} s "
              f"({r['per_point_ms']} ms/point, kernel={r['kernel']}); Python loop {r['python_loop_per_point_ms']} "
              f"ms/point vs kernel {r['kernel_per_point_ms_same_points']} ms/point; peak RSS {r['peak_rss_mib']} MiB")


if __name__ == "__main__":
    main()
