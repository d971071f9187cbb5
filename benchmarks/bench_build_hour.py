"""Time building one hour's request file (analysis.engine.materialize.build_hour) against a plain spans scan.

    python -m benchmarks.bench_build_hour --store STORE [--threads 2] [--repeat 2] [--save DIR] [--check DIR]
                                          [--sweep c|sql|both]
    python -m benchmarks.bench_build_hour --spans 2000000 [--dir DIR] [...]   # benchmarks.synthetic's store

`--store` measures a store as it is (each build writes its request hour into it, as the collector would);
`--spans` builds (or reuses by fingerprint, benchmarks.inputs) the synthetic store, two hours of spans.

In one process, alternating: the anchor `SELECT Replica, quantile_cont(Duration, 0.99) FROM spans
GROUP BY 1` over every span of the store, then each hour's build (it reads its hour and both
neighbours). Prints wall and CPU seconds (user + system of every thread of this process), the
hour's span count, the CPU ratio to the anchor and the load average before and after. --save copies
each hour's rows (sorted) to DIR; --check compares them with a DIR saved before (another version
of the model must give the same rows). --sweep: the critical-path sweep in C (build_hour's default when
the kernel is built), in the model's SQL, or both alternating within each run (each hour built twice).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import duckdb

from benchmarks.inputs import prepare
from benchmarks.synthetic import make_store

ANCHOR = "SELECT Replica, quantile_cont(Duration, 0.99) FROM spans GROUP BY 1"


def _load() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def _cpu() -> float:
    return time.process_time()  # user + system, all threads of this process


def main(argv: list[str] | None = None) -> None:
    """Build every hour of --store --repeat times beside the anchor; print one JSON line per run."""
    from analysis import connect
    from analysis.engine.materialize import build_hour, load_sweep, snapshot

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store", default=None, help="a store already built, measured as it is")
    parser.add_argument("--spans", type=int, default=None,
                        help="instead of --store: benchmarks.synthetic's store of this many spans under --dir")
    parser.add_argument("--dir", default=None, help="with --spans: where the store lives (default: a temp dir)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--save", default=None)
    parser.add_argument("--check", default=None)
    parser.add_argument("--sweep", choices=("c", "sql", "both"), default="c")
    args = parser.parse_args(argv)
    if (args.store is None) == (args.spans is None):
        parser.error("give --store STORE, or --spans N to build the synthetic store")
    if args.store:
        store = Path(args.store)
    else:  # by fingerprint (benchmarks.inputs): request hours an earlier run built are removed
        store = Path(args.dir or tempfile.mkdtemp(prefix="bench-build-hour-")) / f"store-{args.spans}"
        prepare(store, make_store, spans=args.spans)
    con = connect(store, threads=args.threads, memory_limit="4GB")
    con.execute("SET enable_progress_bar = false")
    bcon = duckdb.connect(":memory:")
    bcon.execute(f"SET threads = {args.threads}")
    bcon.execute("SET memory_limit = '4GB'")
    bcon.execute("SET enable_progress_bar = false")
    bcon.execute("SET preserve_insertion_order = false")
    same = True
    if args.sweep != "sql" and load_sweep() is None:
        parser.error("--sweep c needs the C kernel: python setup.py build_ext --inplace")
    sweeps = {"c": [True], "sql": [False], "both": [True, False]}[args.sweep]
    for run in range(args.repeat):
        snap = snapshot(store)
        t0, c0 = time.perf_counter(), _cpu()
        con.execute(ANCHOR).fetchall()
        anchor_cpu = round(_cpu() - c0, 3)
        row: dict[str, object] = {"run": run, "load_start": _load(),
                                  "anchor": [round(time.perf_counter() - t0, 3), anchor_cpu]}
        for hour, kernel in ((h, k) for h in sorted(snap.by_hour) for k in (sweeps if run % 2 == 0 else sweeps[::-1])):
            files = [str(f) for f in snap.by_hour[hour]]
            spans = (bcon.execute(f"SELECT count(*) FROM read_parquet({files})").fetchone() or (0,))[0]
            t0, c0 = time.perf_counter(), _cpu()
            path = build_hour(snap, hour, bcon, kernel=kernel)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            entry: dict[str, object] = {"spans": int(spans), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                                        "cpu_x_anchor": round(cpu / anchor_cpu, 1) if anchor_cpu else None}
            row[f"{hour}{'' if len(sweeps) == 1 else ('/c' if kernel else '/sql')}"] = entry
            sorted_rows = f"(SELECT * FROM read_parquet('{path}') ORDER BY ALL)"
            if args.save and run == 0 and kernel == sweeps[0]:
                Path(args.save).mkdir(parents=True, exist_ok=True)
                bcon.execute(f"COPY {sorted_rows} TO '{Path(args.save) / f'{hour}.parquet'}' (FORMAT parquet)")
            if args.check and run == 0:
                ref = Path(args.check) / f"{hour}.parquet"
                diff = bcon.execute(f"SELECT (SELECT count(*) FROM (SELECT * FROM {sorted_rows} EXCEPT ALL "
                                    f"SELECT * FROM read_parquet('{ref}'))) + (SELECT count(*) FROM (SELECT * FROM "
                                    f"read_parquet('{ref}') EXCEPT ALL SELECT * FROM {sorted_rows})), "
                                    f"(SELECT count(*) FROM read_parquet('{ref}'))").fetchone() or (None, None)
                entry["rows_differing"], entry["rows"] = diff[0], diff[1]
                same = same and diff[0] == 0
        row["load_end"] = _load()
        print(json.dumps(row), flush=True)
    if args.check:
        print(json.dumps({"same_rows_as_saved": same}))


if __name__ == "__main__":
    main()
