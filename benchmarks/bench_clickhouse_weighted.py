"""Benchmark of the weighted breakdowns and series on a sampled ClickHouse table: computed on the server (one row
per window, replica or bucket back) against the anchor, the same figures computed by analysis' in-memory code over
every request's row pulled to the client (what ran before), same run, same table.

    python -m benchmarks.bench_clickhouse_weighted [--rows 1000000[,10000000]] [--dir DIR] [--json]

The table is a facts table in chdb (MergeTree; one hour, 8 replicas, one request in ten failed, adjusted counts 1, 2
and 4, lognormal latencies, token counts uniform). Prints per function: rows received, wall time, both ways, their
ratio, and whether the two answers are equal.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.bench_clickhouse import Counting

TABLE = "bench_weighted"


def make_table(client: Any, rows: int, seed: int = 1) -> None:
    """The sampled facts table (see the module docstring)."""
    rng = np.random.default_rng(seed)
    client.command(f"DROP TABLE IF EXISTS {TABLE}")
    client.command(f"CREATE TABLE {TABLE} (start_ns Int64, status String, replica Nullable(String), "
                   "e2e_ns Nullable(Int64), ttft_ns Nullable(Int64), tpot_ns Nullable(Int64), "
                   "input_tokens Nullable(Int64), output_tokens Nullable(Int64), adjusted_count Float64) "
                   "ENGINE = MergeTree ORDER BY start_ns")
    client.insert_arrow(TABLE, pa.table({
        "start_ns": rng.integers(0, 3_600 * 10**9, rows), "status": rng.choice(["ok"] * 9 + ["error"], rows),
        "replica": rng.choice([f"replica-{i:02d}" for i in range(8)], rows),
        "e2e_ns": rng.lognormal(19, 0.5, rows).astype(np.int64),
        "ttft_ns": rng.lognormal(17, 0.5, rows).astype(np.int64),
        "tpot_ns": rng.lognormal(15, 0.5, rows).astype(np.int64), "input_tokens": rng.integers(1, 4_000, rows),
        "output_tokens": rng.integers(1, 1_000, rows), "adjusted_count": rng.choice([1.0, 2.0, 4.0], rows)}))


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run(rows: int, root: Path) -> list[dict[str, Any]]:
    """Each function both ways on a fresh table of `rows` requests."""
    from analysis import breakdowns as B
    from analysis.clickhouse import breakdowns as CB
    from analysis.clickhouse import open_client
    from analysis.clickhouse import report as CR
    from analysis.engine import percentiles as P

    inner = open_client(f"chdb:{root / f'chdb-{rows}'}")
    make_table(inner, rows)
    cases: list[tuple[str, Callable[[Any], Any], Callable[[duckdb.DuckDBPyConnection], Any]]] = [
        ("summary", lambda c: CB.summary(c, TABLE), lambda con: B.summary(con, "pulled")),
        ("replicas", lambda c: CB.replicas(c, TABLE), lambda con: B.replicas(con, source="pulled")),
        ("shape", lambda c: CB.shape(c, TABLE), lambda con: B.shape(con, source="pulled")),
        ("series by replica, 1 min", lambda c: CR.percentile_series(c, window_s=60, by=("replica",), facts=TABLE),
         lambda con: P.percentile_series(con, window_s=60, by=("replica",), source="pulled")),
    ]
    out = []
    for name, server, memory in cases:
        client = Counting(inner)
        got, server_s = _timed(lambda: server(client))  # noqa: B023 - called at once
        pull = Counting(inner)

        def anchor() -> Any:
            con = duckdb.connect(":memory:")
            con.register("pulled", pull.query(f"SELECT * FROM {TABLE}"))  # noqa: B023 - called at once
            return memory(con)  # noqa: B023

        want, anchor_s = _timed(anchor)
        equal = got == want if isinstance(got, dict) else got.equals(want)
        out.append({"rows": rows, "function": name, "server_rows_back": client.rows, "server_s": round(server_s, 3),
                    "anchor_rows_back": pull.rows, "anchor_s": round(anchor_s, 3),
                    "ratio": round(server_s / max(anchor_s, 1e-9), 2), "equal": bool(equal)})
    inner.close()
    with open("/proc/loadavg") as fh:
        load = float(fh.read().split()[0])
    for r in out:
        r["loadavg_1m"] = load
    return out


def main(argv: list[str] | None = None) -> None:
    """Run each size and print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="1000000")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="tailscope-bench-chw-"))
    results = [r for n in args.rows.split(",") for r in run(int(n), root)]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'requests':>10} {'function':<26} {'rows back':>9} {'server s':>8} {'anchor rows':>11} {'anchor s':>8} "
          f"{'ratio':>5} {'equal':>5} {'load':>5}")
    for r in results:
        print(f"{r['rows']:>10,} {r['function']:<26} {r['server_rows_back']:>9,} {r['server_s']:>8.3f} "
              f"{r['anchor_rows_back']:>11,} {r['anchor_s']:>8.3f} {r['ratio']:>5.2f} {r['equal']!s:>5} "
              f"{r['loadavg_1m']:>5.1f}")


if __name__ == "__main__":
    main()
