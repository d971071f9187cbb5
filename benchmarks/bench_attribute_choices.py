"""Benchmark of the dashboard's attribute listing (the sidebar's attribute filter and the grouping pickers): the
attributes the report considers over every request, against the Overview's summary of the same requests (anchor),
in the same process.

One synthetic store (benchmarks.synthetic: 16 replicas; `--attrs` extra request attributes of 2 to 1,000 values,
some ids, every third a number) is listed three ways: as built (every value computed from the spans: `live`),
with its hours materialized (each request's values read from the files written with them, as the report reads
them: `materialized`), and on ClickHouse (chdb, the same spans exported: `clickhouse`). Each figure is the median
of `--repeat` calls, CPU seconds of the whole process (every thread) and wall seconds; the listings must be equal.

    python -m benchmarks.bench_attribute_choices [--spans 100000] [--attrs 40] [--repeat 3] [--dir DIR]
                                                  [--no-clickhouse]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.inputs import prepare
from benchmarks.synthetic import make_store


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(median CPU s, median wall s, the last result) of `repeat` calls after one untimed call (imports, caches)."""
    out = fn()
    cpu, wall = [], []
    for _ in range(repeat):
        c0, t0 = _cpu_s(), time.perf_counter()
        out = fn()
        cpu.append(_cpu_s() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(cpu), statistics.median(wall), out


def _bench_of(way: str, store: Path, work: Path) -> Any:
    """The dashboard's engine for `way`: the store's workbench, or the ClickHouse bench of its exported spans."""
    from dashboard import data

    if way != "clickhouse":
        wb = data.Workbench(store.resolve())
        wb.refresh()
        return wb
    from analysis import clickhouse as C
    from analysis.clickhouse.export import export_store
    from dashboard import clickhouse_data as CHD

    dsn = f"chdb:{work / 'chdb'}"
    client = C.open_client(dsn)
    try:
        export_store(store, client, C.DEFAULT_TABLE)
    finally:
        client.close()
    return CHD.open_bench(dsn, C.DEFAULT_TABLE)


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the store, list its attributes each way, print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--attrs", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--no-clickhouse", action="store_true")
    args = parser.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="tailscope-bench-attr-choices-"))
    work.mkdir(parents=True, exist_ok=True)
    live = work / "store"
    prepare(live, make_store, spans=args.spans, extra=args.attrs)
    materialized = work / "store-materialized"
    shutil.rmtree(materialized, ignore_errors=True)
    shutil.copytree(live, materialized)
    from analysis.engine.materialize import materialize
    from dashboard import data

    materialize(materialized)
    ways = [("live", live), ("materialized", materialized)] + ([] if args.no_clickhouse else [("clickhouse", live)])
    print(f"attribute listing, {args.spans:,} spans with {args.attrs} extra attributes; load "
          f"{os.getloadavg()[0]:.1f}; median of {args.repeat}")
    print(f"{'way':<14}{'summary CPU s':>14}{'listing CPU s':>14}{'x summary':>10}{'summary s':>11}{'listing s':>11}"
          f"{'keys':>6}")
    listed: dict[str, Any] = {}
    for way, store in ways:
        bench = _bench_of(way, store, work)
        try:
            s_cpu, s_wall, summary = _timed(partial(bench.summary, data.Filters()), args.repeat)
            a_cpu, a_wall, listed[way] = _timed(bench.attribute_choices, args.repeat)
        finally:
            if way == "clickhouse":
                bench.close()
        print(f"{way:<14}{s_cpu:>14.3f}{a_cpu:>14.3f}{a_cpu / max(s_cpu, 1e-9):>10.1f}{s_wall:>11.3f}{a_wall:>11.3f}"
              f"{len(listed[way]):>6}  ({summary['requests']:,} requests)")
    same = all(v == listed["live"] for v in listed.values())
    print(f"same listing every way: {same}")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
