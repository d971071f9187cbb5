"""Run every benchmark script at a small size: a smoke run that prints real figures (`make bench`).

    python -m benchmarks.run_all [--only NAME[,NAME]] [--full]

Each script runs in its own process, one after another, with the sizes below (the figures in
docs/benchmarks.md come from the full sizes: `--full`, or each script's own command line).
The load average is printed beside each run, since a shared machine changes the figures.
Exits non-zero when a script fails, naming it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

#: script -> the arguments of its small run (a few seconds to a minute on a quiet laptop)
SMALL: dict[str, list[str]] = {
    "bench_instrumentation": ["--requests", "100", "--rounds", "5"],
    "bench_views": ["--spans", "100000"],
    "bench_report": ["--spans", "100000"],
    "bench_dashboard": ["--spans", "200000"],
    "bench_collect": ["--quick", "--phoenix", ""],
    "bench_ingest_memory": ["--mib", "8"],
    "bench_grpc_unauth": ["--clients", "4", "--mib", "8", "--rounds", "1"],
    "bench_compact": ["--exports", "200"],
}


def load() -> str:
    """The 1-minute load average, or '?' where the platform has none."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scripts; return 0 when all of them succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated script names (default: all)")
    parser.add_argument("--full", action="store_true", help="each script's default (full) sizes")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SMALL)
    unknown = [n for n in names if n not in SMALL]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(SMALL)}")
    failed = []
    for name in names:
        cmd = [sys.executable, "-m", f"benchmarks.{name}", *([] if args.full else SMALL[name])]
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
