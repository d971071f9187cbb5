"""Time the SQL views: `requests` (on the fly and materialized) against a plain scan of `spans`.

    python -m benchmarks.bench_views [--spans 2000000,10000000] [--dir DIR] [--threads 2] [--stored-only]

Builds (or reuses, under --dir, by fingerprint: benchmarks.inputs) the synthetic stores of
benchmarks.synthetic (two hours of spans), then
in one fresh process per store times, side by side:

- the anchor: `SELECT replica, quantile_cont(Duration, 0.99) FROM spans GROUP BY 1`;
- requests p99 per replica and a 5-minute slice (literal start_ns bounds) with no hour
  materialized (everything on the fly);
- the build of each hour's request file (analysis.engine.materialize), seconds and spans per hour;
- the same queries once every hour is materialized, `requests_between` for the slice, and
  `stages`; then the same through the public CLI (`python -m tailscope.cli sql ...`, a new process).

Prints seconds and the ratio to the anchor of the same run; the machine's load average beside them.
With --stored-only the on-the-fly queries are skipped: the materialized figures alone, with each
query's CPU seconds too (the hours are built in the run all the same: a store is always measured as
its generator built it, request files of earlier runs removed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.inputs import prepare
from benchmarks.synthetic import START_NS, make_store

SLICE_LO = START_NS + 3600 * 1_000_000_000 + 600 * 1_000_000_000  # 15:10:00
SLICE_HI = SLICE_LO + 300 * 1_000_000_000
ANCHOR = "SELECT Replica, quantile_cont(Duration, 0.99) FROM spans GROUP BY 1"
P99 = "SELECT replica, quantile_cont(e2e_ns, 0.99) FROM requests GROUP BY 1"
SLICE = f"SELECT replica, quantile_cont(e2e_ns, 0.99) FROM requests WHERE start_ns >= {SLICE_LO} " \
        f"AND start_ns < {SLICE_HI} GROUP BY 1"
BETWEEN = f"SELECT replica, quantile_cont(e2e_ns, 0.99) FROM requests_between({SLICE_LO}, {SLICE_HI}) GROUP BY 1"
STAGES = "SELECT stage, quantile_cont(critical_ns, 0.99) FROM stages GROUP BY 1"


def _load() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


CPU: dict[str, float] = {}


def _time(con: Any, sql: str) -> tuple[float, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    rows = con.execute(sql).fetchall()
    CPU[sql] = round(time.process_time() - c0, 3)  # all threads of this process
    return round(time.perf_counter() - t0, 3), sorted(rows, key=str)


def run_one(store: Path, threads: int, stored_only: bool = False) -> dict[str, Any]:
    """Figures for one store, in this process (the store's request files are removed first unless stored_only)."""
    from analysis import connect
    from analysis.engine.materialize import build_hour, snapshot

    if not stored_only:
        shutil.rmtree(store / "requests", ignore_errors=True)
    out: dict[str, Any] = {"load_1m_start": _load()}
    con = connect(store, threads=threads, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false")
    out["anchor_s"], _ = _time(con, ANCHOR)
    live_p99 = live_slice = None
    if not stored_only:
        out["live_p99_per_replica_s"], live_p99 = _time(con, P99)
        out["live_slice_s"], live_slice = _time(con, SLICE)
        out["live_between_s"], _ = _time(con, BETWEEN)
    snap = snapshot(store)
    builds = []
    import duckdb

    bcon = duckdb.connect(":memory:")
    bcon.execute(f"SET threads = {threads}")
    bcon.execute("SET memory_limit = '4GB'")
    bcon.execute("SET enable_progress_bar = false")
    for hour in snap.stale:
        spans = bcon.execute(f"SELECT count(*) FROM read_parquet({[str(f) for f in snap.by_hour[hour]]})").fetchone()
        t0, c0 = time.perf_counter(), time.process_time()
        build_hour(snap, hour, bcon)
        builds.append({"hour": hour, "spans": int(spans[0]) if spans else 0,
                       "build_s": round(time.perf_counter() - t0, 3),
                       "build_cpu_s": round(time.process_time() - c0, 3)})  # all threads of this process
    out["builds"] = builds
    con = connect(store, threads=threads, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false")
    out["anchor2_s"], _ = _time(con, ANCHOR)
    out["stored_p99_per_replica_s"], stored_p99 = _time(con, P99)
    out["stored_slice_s"], stored_slice = _time(con, SLICE)
    out["stored_between_s"], _ = _time(con, BETWEEN)
    out["stored_stages_s"], _ = _time(con, STAGES)
    if stored_only:
        out["cpu"] = {"anchor": CPU[ANCHOR], "p99_per_replica": CPU[P99], "slice": CPU[SLICE],
                        "between": CPU[BETWEEN]}
    else:
        out["same_answers"] = stored_p99 == live_p99 and stored_slice == live_slice
    anchor = min(out["anchor_s"], out["anchor2_s"])
    for key in list(out):
        if key.endswith("_s") and not key.startswith("anchor"):
            out[key.removesuffix("_s") + "_x"] = round(out[key] / anchor, 2)
    out["load_1m_end"] = _load()
    return out


def _cli(store: Path, sql: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tailscope.cli", "sql", sql, "--store", str(store)], check=True,
                   capture_output=True, text=True, env=os.environ.copy())
    return round(time.perf_counter() - t0, 3)


def main(argv: list[str] | None = None) -> None:
    """Build the stores, time each in a fresh process, then through the CLI; print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", default="2000000,10000000")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stored-only", action="store_true")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(Path(args.one), args.threads, args.stored_only)))
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-views-"))
    results: dict[str, Any] = {}
    for spans in (int(s) for s in args.spans.split(",")):
        store = base / f"store-{spans}"
        prepare(store, make_store, spans=spans)  # by fingerprint: built, or reused as built (benchmarks.inputs)
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_views", "--one", str(store),
                               "--threads", str(args.threads), *(["--stored-only"] if args.stored_only else [])],
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        # through the public CLI, each a new process (startup included), every hour materialized now
        row["cli_anchor_s"] = _cli(store, ANCHOR)
        row["cli_p99_per_replica_s"] = _cli(store, P99)
        row["cli_slice_s"] = _cli(store, SLICE)
        row["cli_p99_per_replica_x"] = round(row["cli_p99_per_replica_s"] / row["cli_anchor_s"], 2)
        row["cli_slice_x"] = round(row["cli_slice_s"] / row["cli_anchor_s"], 2)
        results[str(spans)] = row
        print(json.dumps({str(spans): row}), flush=True)


if __name__ == "__main__":
    main()
