"""Reads of a store of many small segments: `tailscope sql` and `tailscope report --json` against DuckDB alone
on the same files and against the same spans stored as one file per hour (the anchor), all in the same run.

    .venv/bin/python -m benchmarks.bench_reads                     # 3,000 exports (the size docs/benchmarks.md records)
    .venv/bin/python -m benchmarks.bench_reads --exports 500 --dir /tmp/reads

The store is what `tailscope collect --no-compact` (or a compactor that has fallen behind) leaves when spaced-out
exports arrive: each export of 8 requests (7 spans each, from benchmarks.synthetic) is one segment per hour it
touches, its requests starting over 30 minutes that cross an hour boundary, none of it materialized. Both stores
are built through benchmarks.inputs (fingerprinted, reused under --dir). Each CLI figure is the second of two runs
(the first warms the page cache); DuckDB alone is the same scan in a fresh process with `read_parquet` over the
listed files.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.inputs import prepare
from benchmarks.synthetic import SPANS_PER_REQUEST, START_NS, request_table
from tracing.store import SegmentWriter, segment_files

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
print = functools.partial(print, flush=True)  # figures appear as they are measured
REQUESTS_PER_EXPORT = 8
SCAN = "SELECT count(*), sum(Duration), count(DISTINCT SpanName) FROM spans"
#: requests start in [LO_NS, LO_NS + 30 min): 20 minutes of one hour and 10 of the next
LO_NS = START_NS + 40 * 60 * 1_000_000_000
SPREAD_NS = 30 * 60 * 1_000_000_000


def _table(exports: int, seed: int) -> pa.Table:
    return request_table(np.random.default_rng(seed), exports * REQUESTS_PER_EXPORT, LO_NS, LO_NS + SPREAD_NS)


def make_small(store: Path, exports: int, seed: int = 1) -> None:
    """One segment per export (per hour it touches): 8 consecutive requests' spans each."""
    table = _table(exports, seed)
    writer = SegmentWriter(store, kind="bench")
    per = REQUESTS_PER_EXPORT * SPANS_PER_REQUEST
    for e in range(exports):
        writer.write(table.slice(e * per, per))


def make_anchor(store: Path, exports: int, seed: int = 1) -> None:
    """The same spans as `make_small`, one segment per hour."""
    SegmentWriter(store, kind="anchor").write(_table(exports, seed))


def cli(args: list[str], runs: int) -> float:
    """Seconds a CLI command takes (its last of `runs` runs: the first warms the page cache); it must succeed."""
    took = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([PYTHON, "-m", "tailscope", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
        took = time.perf_counter() - t0
    return took


def duckdb_alone(store: Path, runs: int) -> tuple[float, int]:
    """Seconds (the last of `runs`) of the same scan by DuckDB alone over the store's files, in a fresh process;
    and the files it read."""
    files = [str(f) for f in segment_files(store)]
    listing = Path(tempfile.mkstemp(suffix=".txt")[1])
    listing.write_text("\n".join(files))
    query = SCAN.replace("FROM spans", "FROM read_parquet(?)")
    code = ("import sys, duckdb; files = open(sys.argv[1]).read().split('\\n'); "
            "con = duckdb.connect(); con.execute('SET enable_progress_bar = false'); "
            f"con.execute({query!r}, [files]).fetchall()")
    try:
        took = 0.0
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run([PYTHON, "-c", code, str(listing)], check=True)
            took = time.perf_counter() - t0
    finally:
        listing.unlink()
    return took, len(files)


def main(argv: list[str] | None = None) -> None:
    """Build (or reuse) the two stores, time the reads and print them with their ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exports", type=int, default=3000, help="exports (segments per hour touched) in the store")
    p.add_argument("--runs", type=int, default=2, help="runs of each command; the last is timed")
    p.add_argument("--dir", type=Path, default=None, help="where the stores are kept (default: a new temp dir)")
    a = p.parse_args(argv)
    work = a.dir or Path(tempfile.mkdtemp(prefix="bench-reads-"))
    small, anchor = work / f"reads-small-{a.exports}", work / f"reads-anchor-{a.exports}"
    prepare(small, make_small, exports=a.exports)
    prepare(anchor, make_anchor, exports=a.exports)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min); {a.exports:,} exports of "
          f"{REQUESTS_PER_EXPORT * SPANS_PER_REQUEST} spans, {len(segment_files(small)):,} segments "
          f"against {len(segment_files(anchor))} (one an hour)")
    alone, files = duckdb_alone(small, a.runs)
    alone_anchor, _ = duckdb_alone(anchor, a.runs)
    for name, args in (("sql scan", ["sql", SCAN]), ("report", ["report", "--json", "--no-materialize"])):
        ours = cli([*args, "--store", str(small)], a.runs)
        base = cli([*args, "--store", str(anchor)], a.runs)
        line = f"{name:<9} {ours:7.2f} s   anchor (one file an hour) {base:6.2f} s   x{ours / base:.2f} the anchor"
        if name == "sql scan":
            line += (f";   DuckDB alone on the same {files:,} files {alone:6.2f} s "
                     f"(on the anchor's {alone_anchor:.2f} s)   x{ours / alone:.2f} DuckDB alone")
        print(line)


if __name__ == "__main__":
    main()
