"""Time the SQL views: the `requests` view (critical path of every request) against a plain scan.

    python -m benchmarks.bench_views [--spans 1000000,10000000] [--dir DIR]

Builds (or reuses, under --dir) the same synthetic stores as bench_report, then in one
process per store times, side by side: the anchor (DuckDB p50/p99 of Duration per SpanName
over the same Parquet files), the full `requests` view (every request's critical-path stage
columns), and the `stages` view. Prints seconds, the ratio to the anchor, and growth with size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_report import make_store

QUERIES = {
    "anchor: p50/p99 per span name": "SELECT SpanName, quantile_cont(Duration, [0.5, 0.99]) FROM spans GROUP BY 1",
    "requests: every column of every request": "SELECT count(*), sum(decode_ns), sum(other_ns), "
                                               "sum(ttft_ns) FROM requests",
    "stages: p99 per stage": "SELECT stage, quantile_cont(critical_ns, 0.99) FROM stages GROUP BY 1",
}


def run_one(store: Path) -> dict[str, float]:
    """Seconds for each query on `store`, in this process."""
    from analysis import connect

    con = connect(store)
    out: dict[str, float] = {}
    for name, sql in QUERIES.items():
        t0 = time.perf_counter()
        con.execute(sql).fetchall()
        out[name] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> None:
    """Build the stores, time each in a fresh process, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", default="1000000,10000000")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        for name, seconds in run_one(Path(args.one)).items():
            print(f"{seconds:.3f}\t{name}")
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-views-"))
    results: dict[int, dict[str, float]] = {}
    for spans in (int(s) for s in args.spans.split(",")):
        store = base / f"store-{spans}"
        if not store.exists():
            make_store(store, spans)
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_views", "--one", str(store)],
                              capture_output=True, text=True, check=True)
        results[spans] = {name: float(sec) for sec, name in (line.split("\t") for line in done.stdout.splitlines())}
    for spans, row in results.items():
        anchor = row[next(iter(QUERIES))]
        print(f"{spans:>11,} spans")
        for name, seconds in row.items():
            print(f"  {seconds:8.2f} s  {seconds / anchor:6.1f}x anchor  {name}")
    sizes = sorted(results)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for name in QUERIES:
            growth = results[hi][name] / results[lo][name]
            print(f"growth {lo:,} -> {hi:,} spans ({hi / lo:.0f}x): {growth:.1f}x  {name}")


if __name__ == "__main__":
    main()
