"""Run every benchmark script at a small size: a smoke run that prints real figures (`make bench`).

    python -m benchmarks.run_all [--only NAME[,NAME]] [--full | --tiny] [--dir DIR]

Each script runs in its own process, one after another, with the sizes below (the figures in
docs/benchmarks.md come from the full sizes: `--full`, or each script's own command line).
`--tiny` runs each at the smallest size that still runs every part (what the test suite's smoke
test runs: the figures mean nothing, the point is that each script finishes and prints its table).
Inputs go under --dir (a new temporary directory by default). The load average is printed beside
each run, since a shared machine changes the figures. Exits non-zero when a script fails, naming it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: script -> the arguments of its small run (a few seconds to a minute on a quiet laptop); {dir}: a work directory
SMALL: dict[str, list[str]] = {
    "bench_instrumentation": ["--requests", "100", "--rounds", "5"],
    "bench_views": ["--spans", "100000", "--dir", "{dir}"],
    "bench_report": ["--spans", "100000", "--dir", "{dir}"],
    "bench_against": ["--ref", "HEAD", "--samples", "basic.otlp.jsonl.gz,incidents/slow_replica.otlp.jsonl.gz",
                      "--spans", "100000", "--runs", "3", "--dir", "{dir}"],
    "bench_attributes": ["--spans", "100000", "--dir", "{dir}"],
    "bench_attribute_choices": ["--spans", "100000", "--dir", "{dir}"],
    "bench_map": ["--spans", "100000", "--repeat", "1", "--dir", "{dir}"],
    "bench_cost": ["--spans", "100000", "--dir", "{dir}"],
    "bench_build_hour": ["--spans", "100000", "--dir", "{dir}"],
    "bench_detect": ["--sizes", "144000:24"],
    "bench_clickhouse": ["--spans", "100000", "--dir", "{dir}"],
    "bench_clickhouse_weighted": ["--rows", "100000", "--dir", "{dir}"],
    "bench_clickhouse_releases": ["--spans", "100000", "--releases", "24.8,25.8"],
    "bench_watch": ["--hours", "1,2", "--rate", "4", "--dir", "{dir}", "--incidents", "slow_replica"],
    "bench_dashboard": ["--spans", "200000", "--store", "{dir}/dashboard-store"],
    "bench_dashboard_browser": ["--store", "{dir}/demo-store", "--repeat", "1"],
    "bench_collect": ["--quick", "--phoenix", ""],
    "bench_ingest_memory": ["--mib", "8", "--dir", "{dir}"],
    "bench_grpc_unauth": ["--clients", "4", "--mib", "8", "--rounds", "1"],
    "bench_compact": ["--exports", "200"],
    "bench_reads": ["--exports", "300", "--dir", "{dir}"],
    "bench_metrics": ["--quick", "--dir", "{dir}"],
}

#: script -> the arguments of its tiny run (the smoke test in tests/benchmarks: every part, a second or two each)
TINY: dict[str, list[str]] = {
    "bench_instrumentation": ["--requests", "10", "--rounds", "1"],
    "bench_views": ["--spans", "7000", "--dir", "{dir}"],
    "bench_report": ["--spans", "7000", "--dir", "{dir}"],
    "bench_against": ["--ref", "HEAD", "--samples", "basic.otlp.jsonl.gz", "--catalogue-only", "--no-c",
                      "--dir", "{dir}"],
    "bench_attributes": ["--spans", "7000", "--attrs", "4", "--dir", "{dir}"],
    "bench_attribute_choices": ["--spans", "7000", "--attrs", "4", "--repeat", "1", "--dir", "{dir}"],
    "bench_compact": ["--exports", "20", "--only", "rate"],
    "bench_reads": ["--exports", "20", "--runs", "1", "--dir", "{dir}"],
    "bench_map": ["--spans", "7000", "--repeat", "1", "--dir", "{dir}"],
    "bench_cost": ["--spans", "7000", "--dir", "{dir}"],
    "bench_build_hour": ["--spans", "7000", "--dir", "{dir}", "--repeat", "1"],
    "bench_detect": ["--sizes", "20000:8"],
    "bench_clickhouse": ["--spans", "7000", "--dir", "{dir}"],
    "bench_clickhouse_weighted": ["--rows", "2000", "--dir", "{dir}"],
    "bench_clickhouse_releases": ["--spans", "7000", "--releases", "24.8"],
    "bench_watch": ["--hours", "1", "--rate", "0.5", "--dir", "{dir}", "--incidents", "slow_replica"],
    "bench_dashboard": ["--spans", "7000", "--store", "{dir}/dashboard-store", "--materialized", "--live-hours", "1",
                        "--drop-kept-cost"],
    "bench_dashboard_browser": ["--store", "{dir}/demo-store", "--repeat", "1", "--pages", "Overview,SQL"],
    "bench_collect": ["--tiny", "--phoenix", ""],
    "bench_ingest_memory": ["--mib", "0.25", "--dir", "{dir}"],
    "bench_grpc_unauth": ["--clients", "1", "--mib", "1", "--rounds", "1"],
    "bench_metrics": ["--quick", "--sample", "basic", "--dir", "{dir}"],
}


def load() -> str:
    """The 1-minute load average, or '?' where the platform has none."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def command(name: str, size: str, work: Path) -> list[str]:
    """The command line of one script at `size` ('small', 'tiny' or 'full'), its inputs under `work`."""
    args = {"small": SMALL, "tiny": TINY}.get(size, {}).get(name, [])
    return [sys.executable, "-m", f"benchmarks.{name}", *(a.replace("{dir}", str(work / name)) for a in args)]


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scripts; return 0 when all of them succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated script names (default: all)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="each script's default (full) sizes")
    size.add_argument("--tiny", action="store_true", help="the smallest sizes (the test suite's smoke run)")
    parser.add_argument("--dir", type=Path, default=None, help="where inputs are built (default: a temp dir)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SMALL)
    unknown = [n for n in names if n not in SMALL]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(SMALL)}")
    work = args.dir or Path(tempfile.mkdtemp(prefix="tailscope-bench-all-"))
    failed = []
    for name in names:
        cmd = command(name, "full" if args.full else "tiny" if args.tiny else "small", work)
        print(f"\n=== {' '.join(['python', *cmd[1:]])}   (load average {load()})", flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, check=False)
        print(f"=== {name}: {'ok' if done.returncode == 0 else f'FAILED ({done.returncode})'} "
              f"in {time.perf_counter() - t0:.1f} s (load average {load()})", flush=True)
        if done.returncode:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
