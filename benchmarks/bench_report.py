"""Benchmark of `tailscope report`: a synthetic store of 1 M and 10 M spans, side by side with DuckDB.

The stores are benchmarks.synthetic's (7 spans per request, 16 replicas over two hours, one
slow-replica spike), built under --dir by benchmarks.inputs.prepare: reused only when their
fingerprint (the generator's code and parameters) is the running code's, and always as built
(request hours an earlier run materialized are removed first, so the materialization is timed
from nothing every run).

    python -m benchmarks.bench_report [--spans 1000000,10000000] [--dir DIR] [--json]
    python -m benchmarks.bench_report --store STORE[,STORE...] [--json]   # stores already built, read only
    python -m benchmarks.bench_report --store STORE[,...] --cli-ab BASE_TREE [--runs 7]   # against another tree

With --cli-ab, only `tailscope report --json` through the CLI, alternating between this source tree and
BASE_TREE (an exported copy of another commit, bytecode compiled), --runs times each: the median and
smallest wall time and CPU seconds of each, their ratios, and whether the two JSON outputs are identical.

Otherwise it prints, per store: the time to materialize the request hours (as `ingest` leaves a store;
not with --store, whose stores are read as they are and never written), the full report time,
CPU seconds and peak RSS (each in a fresh process, in Python and through
`python -m tailscope.cli report`), one percentile series, and DuckDB's plain p50/p99 per span
name over the same Parquet files (the anchor).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.inputs import prepare
from benchmarks.synthetic import make_store
from tracing import schema as S


def bench_args(doc: str | None, argv: list[str] | None) -> argparse.Namespace:
    """The options every store benchmark takes: --spans, --dir, --json (and --one STORE, its child process)."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--spans", default="1000000,10000000")
    parser.add_argument("--dir", default=None, help="where the stores live (default: a temp dir)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None,
                        help="comma-separated stores already built: measured as they are (read only), none built")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cli-ab", default=None, metavar="BASE_TREE",
                        help="with --store: the CLI report alternated with another source tree (see the module doc)")
    parser.add_argument("--runs", type=int, default=7, help="runs of each tree with --cli-ab")
    return parser.parse_args(argv)


def cli_ab(store: Path, base: Path, runs: int) -> dict[str, Any]:
    """`tailscope report --json` on `store` through the CLI of this tree and of `base`, alternating (so both see
    the same machine load): wall and CPU seconds of each run, medians, ratios and whether the outputs match."""
    trees = {"this": Path(__file__).resolve().parents[1], "base": base.resolve()}
    runs_of: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    outputs: dict[str, set[str]] = {name: set() for name in trees}
    for _ in range(runs):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree))
            t, c = time.perf_counter(), _children_cpu_s()
            done = subprocess.run([sys.executable, "-m", "tailscope", "report", "--store", str(store), "--json",
                                   "--no-materialize"], cwd=tree, env=env, check=True, capture_output=True, text=True)
            runs_of[name].append((time.perf_counter() - t, _children_cpu_s() - c))
            outputs[name].add(done.stdout)
    out: dict[str, Any] = {"store": str(store), "runs": runs}
    for name, xs in runs_of.items():
        walls, cpus = sorted(x[0] for x in xs), sorted(x[1] for x in xs)
        out[name] = {"wall_median_s": round(walls[len(walls) // 2], 3), "wall_min_s": round(walls[0], 3),
                     "cpu_median_s": round(cpus[len(cpus) // 2], 3), "walls_s": [round(x[0], 2) for x in xs]}
    out["wall_median_ratio"] = round(out["this"]["wall_median_s"] / out["base"]["wall_median_s"], 3)
    out["cpu_median_ratio"] = round(out["this"]["cpu_median_s"] / out["base"]["cpu_median_s"], 3)
    out["json_identical"] = len(outputs["this"] | outputs["base"]) == 1
    with open("/proc/loadavg") as fh:
        out["loadavg_1m_after"] = float(fh.read().split()[0])
    return out


def stores(args: argparse.Namespace, keep: tuple[str, ...] = ()) -> Iterator[tuple[int, Path]]:
    """(span count, store) for each of --spans under --dir, as benchmarks.synthetic builds it (benchmarks.inputs:
    built, or reused when its fingerprint is the running code's, with what earlier runs added removed except
    under the top-level directories `keep`)."""
    if getattr(args, "store", None):
        for name in args.store.split(","):
            print(f"{name}: given with --store, measured as it is (no fingerprint: whatever built it)", file=sys.stderr)
            yield _stored_spans(Path(name)), Path(name)
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailscope-bench-"))
    for spans in (int(s) for s in args.spans.split(",")):
        store = base / f"store-{spans}"
        prepare(store, make_store, keep=keep, spans=spans)
        yield spans, store


def materialize_in_child(store: Path) -> float:
    """Materialize every request hour of `store` in a fresh process (as `tailscope ingest` leaves a store); seconds.

    Builds every hour stale for the code running now (`stores` removed what earlier runs materialized, unless
    asked to keep it: then the hours already built by this code are left as they are)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sys; from analysis.engine.materialize import materialize; "
                    "materialize(sys.argv[1])", str(store)], check=True, env=os.environ.copy())
    return round(time.perf_counter() - t, 3)


def _stored_spans(store: Path) -> int:
    """The spans of a store already built, from its segments' Parquet footers (no column is read)."""
    import duckdb

    con = duckdb.connect()
    try:
        row = con.execute("SELECT sum(num_rows) FROM parquet_file_metadata(?)",
                          [str(store / S.SEGMENT_GLOB)]).fetchone()
    finally:
        con.close()
    return int(row[0]) if row and row[0] is not None else 0


def reset_peak_rss() -> None:
    """Start this process's peak resident memory (VmHWM) again from its current size (Linux: clear_refs 5), so
    peak_rss_mib gives the peak of what runs next; nothing where that is not available."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, MiB: VmHWM, its own since exec. (ru_maxrss is not: Linux keeps
    it across exec, so a child started by a parent that had just built a 1 M-span store reported the parent's peak.)"""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Any) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process) of fn()."""
    c, t = _cpu_s(), time.perf_counter()
    result = fn()
    return result, round(time.perf_counter() - t, 3), round(_cpu_s() - c, 3)


def anchor(store: Path) -> tuple[float, float]:
    """The anchor, (wall s, CPU s): DuckDB's plain p50/p99 of `Duration` per `SpanName` over the store's Parquet."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false").fetchall()
    _, wall, cpu = timed(lambda: con.execute(
        "SELECT SpanName, quantile_cont(Duration, 0.5), quantile_cont(Duration, 0.99) "
        "FROM read_parquet(?) GROUP BY SpanName", [str(store / S.SEGMENT_GLOB)]).fetchall())
    con.close()
    return wall, cpu


def run_one(store: Path) -> dict[str, Any]:
    """Time, in this process: DuckDB's p50/p99 per span name, one percentile series, the full report.

    Wall time and CPU time (user + system, all threads) of each: on a shared machine the CPU time
    is the steadier figure, and wall ~ CPU / 2 on two idle cores.
    """

    from analysis import connect
    from analysis.engine.percentiles import percentile_series
    from analysis.report import build_report

    out: dict[str, Any] = {}
    out["duckdb_p50_p99_per_name_s"], out["duckdb_cpu_s"] = anchor(store)

    con = connect(store)
    con.execute("SET enable_progress_bar = false").fetchall()
    series, out["series_s"], out["series_cpu_s"] = timed(lambda: percentile_series(con, metric="e2e"))
    out["series_windows"] = series.height
    con.close()

    con = connect(store)
    con.execute("SET enable_progress_bar = false").fetchall()
    report, out["report_s"], out["report_cpu_s"] = timed(lambda: build_report(con))
    out["requests"] = report["requests"]
    out["spikes"] = [(s["start"], s["end"], s["stages"][0]["stage"] if s["stages"] else None,
                      s["dimensions"][0]["value"] if s["dimensions"] else None) for s in report["spikes"]]
    out["errors"] = report.get("errors", [])
    attrs = report.get("attributes") or {}
    out["attributes"] = {"considered": len(attrs.get("considered", [])), "skipped": len(attrs.get("skipped", []))}
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    out["report_vs_duckdb_x"] = round(out["report_s"] / max(out["duckdb_p50_p99_per_name_s"], 1e-9), 1)
    out["report_vs_duckdb_cpu_x"] = round(out["report_cpu_s"] / max(out["duckdb_cpu_s"], 1e-9), 1)
    with open("/proc/loadavg") as fh:
        out["loadavg_1m"] = float(fh.read().split()[0])
    return out


_CLI_RUNNER = """
import runpy, sys
sys.argv = ["tailscope.cli", *sys.argv[1:]]
try:
    runpy.run_module("tailscope.cli", run_name="__main__")
except SystemExit as exc:
    if exc.code:
        raise
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")), file=sys.stderr)
"""


def main(argv: list[str] | None = None) -> None:
    """Build the stores (or reuse them) and print the figures."""
    args = bench_args(__doc__, argv)
    if args.one:
        print(json.dumps(run_one(Path(args.one))))
        return
    if args.cli_ab:
        if not args.store:
            raise SystemExit("--cli-ab compares stores already built: give them with --store")
        for store in args.store.split(","):
            print(json.dumps(cli_ab(Path(store), Path(args.cli_ab), args.runs), indent=2 if args.json else None))
        return
    results: dict[str, Any] = {}
    for spans, store in stores(args):
        # the request hours materialized first, as `tailscope ingest` / `collect` leave a store
        materialize_s = None if args.store else materialize_in_child(store)
        # a fresh process per store, so peak RSS is the report's own
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_report", "--one", str(store)],
                              check=True, capture_output=True, text=True, env=os.environ.copy())
        results[str(spans)] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[str(spans)]["materialize_s"] = materialize_s
        # the public CLI (`python -m tailscope.cli report`), a new process: wall time, CPU time and peak RSS
        # (a store given with --store is read as it is: --no-materialize, so the run writes nothing)
        t, c = time.perf_counter(), _children_cpu_s()
        cli = subprocess.run([sys.executable, "-c", _CLI_RUNNER, "report", "--store", str(store),
                              *(["--no-materialize"] if args.store else [])], check=True,
                             capture_output=True, text=True, env=os.environ.copy())
        results[str(spans)]["cli_report_s"] = round(time.perf_counter() - t, 3)
        results[str(spans)]["cli_report_cpu_s"] = round(_children_cpu_s() - c, 3)
        results[str(spans)]["cli_report_peak_rss_mib"] = round(int(cli.stderr.strip().splitlines()[-1]) / 1024, 1)
    keys = list(results)
    if len(keys) >= 2:
        lo, hi = results[keys[0]], results[keys[-1]]
        results["growth_report_x"] = round(hi["report_s"] / max(lo["report_s"], 1e-9), 2)
        results["growth_series_x"] = round(hi["series_s"] / max(lo["series_s"], 1e-9), 2)
        results["growth_report_cpu_x"] = round(hi["report_cpu_s"] / max(lo["report_cpu_s"], 1e-9), 2)
    print_results(results, args.json)


def print_results(results: dict[str, Any], as_json: bool) -> None:
    """The figures: indented JSON, or one line per entry."""
    if as_json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results.items():
        print(name, r)


if __name__ == "__main__":
    main()
