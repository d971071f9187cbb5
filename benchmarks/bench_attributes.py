"""Benchmark of the report with every attribute a candidate: the same spans with 40 extra request attributes and
without them (the anchor), each reported in a fresh process, in the same run.

The stores are benchmarks.synthetic's (16 replicas, one spike on replica-05, the same seed so the same requests);
the extra attributes are `synthetic.extra_attributes` (random, of 2 to 1,000 values, some ids, every
third a number), unrelated to latency. Each store is reported twice: as built (every hour computed on the fly
from the spans: `live`), then with its request hours materialized (as `tailscope ingest` / `collect` leave a
store, with each request's attribute values: `materialized`; the build's seconds and CPU seconds are
`materialize_s` / `materialize_cpu_s`). Prints, for each store and way, the report's wall and CPU seconds and
peak RSS (bench_report.run_one), the attributes considered and skipped, and the ratios with / without.

    python -m benchmarks.bench_attributes [--spans 1000000] [--attrs 40] [--dir DIR] [--json] [--only materialized]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_report import materialize_in_child, print_results
from benchmarks.inputs import prepare
from benchmarks.synthetic import make_store


def _one(store: Path) -> dict[str, Any]:
    """bench_report's figures of one store, in a fresh process (so its peak RSS is the report's own)."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_report", "--one", str(store)], check=True,
                          capture_output=True, text=True, env=os.environ.copy())
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _materialize(store: Path) -> tuple[float, float]:
    """(wall s, CPU s) of materializing every hour of `store` in a fresh process."""
    def children_cpu_s() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    c = children_cpu_s()
    wall = materialize_in_child(store)
    return wall, round(children_cpu_s() - c, 3)


def main(argv: list[str] | None = None) -> None:
    """Build both stores (or reuse them under --dir) and print the figures."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--attrs", type=int, default=40)
    ap.add_argument("--dir", default=None, help="where the stores live (default: a temp dir)")
    ap.add_argument("--only", choices=("live", "materialized"), default=None, help="measure one way only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailscope-bench-attrs-"))
    stores = {"without": base / f"store-{args.spans}", "with": base / f"store-{args.spans}-x{args.attrs}"}
    for name, store in stores.items():
        prepare(store, make_store, spans=args.spans, extra=args.attrs if name == "with" else 0)
    results: dict[str, Any] = {}
    ways = [w for w in ("live", "materialized") if args.only in (None, w)]
    for way in ways:
        for name, store in stores.items():  # the anchor first, then the store with attributes: the same minutes
            if way == "materialized":
                made = _materialize(store)
            results[f"{way}_{name}"] = _one(store)  # with the attributes its report considered and skipped
            if way == "materialized":
                results[f"{way}_{name}"]["materialize_s"], results[f"{way}_{name}"]["materialize_cpu_s"] = made
        w, wo = results[f"{way}_with"], results[f"{way}_without"]
        results[f"{way}_report_x"] = round(w["report_s"] / max(wo["report_s"], 1e-9), 2)
        results[f"{way}_report_cpu_x"] = round(w["report_cpu_s"] / max(wo["report_cpu_s"], 1e-9), 2)
        results[f"{way}_peak_rss_x"] = round(w["peak_rss_mib"] / max(wo["peak_rss_mib"], 1e-9), 2)
    results["spans"], results["extra_attributes"] = args.spans, args.attrs
    print_results(results, args.json)


if __name__ == "__main__":
    main()
