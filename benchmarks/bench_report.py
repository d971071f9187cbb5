"""Benchmark of `tailscope report`: a synthetic store of 1 M and 10 M spans, side by side with DuckDB.

Each request is 7 spans (the request, queue_wait, preprocess, generation with prefill and
decode, streaming) from 16 replicas over two hours; replica-05 decodes 2.5x slower for 15
minutes, so the report has one spike to explain. Columns are built with numpy and written
through `tracing.store.SegmentWriter`, so the files are what the store holds.

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
import binascii
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracing import schema as S
from tracing.store import SegmentWriter

START_NS = 1_763_647_200_000_000_000  # 2025-11-20T14:00:00Z
MS = 1_000_000
SPANS_PER_REQUEST = 7
DURATION_S = 7200
REPLICAS = 16
SPIKE_REPLICA = 5
SPIKE_START_S = 3600
SPIKE_LEN_S = 900


def _hex_ids(rng: np.random.Generator, n: int, nbytes: int) -> pa.Array:
    raw = rng.integers(0, 256, size=n * nbytes, dtype=np.uint8).tobytes()
    data = binascii.hexlify(raw)
    width = 2 * nbytes
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def _map_column(keys: list[str], values: pa.Array, n: int) -> pa.Array:
    """A MAP(VARCHAR, VARCHAR) column with the same keys on every row (values: n * len(keys))."""
    k = len(keys)
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32))
    key_arr = pa.array(np.tile(np.array(keys, dtype=object), n), type=pa.string())
    return pa.MapArray.from_arrays(offsets, key_arr, values.cast(pa.string()))


def _empty_lists(n: int, typ: pa.DataType) -> pa.Array:
    offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], type=typ.value_type))


def _request_table(rng: np.random.Generator, n: int, t_lo: int, t_hi: int) -> pa.Table:
    """Spans of `n` requests arriving uniformly in [t_lo, t_hi) ns, as one table in SPAN_SCHEMA."""
    t0 = np.sort(rng.integers(t_lo, t_hi, size=n, dtype=np.int64))
    replica = rng.integers(0, REPLICAS, size=n)
    input_tokens = (rng.lognormal(6.0, 0.8, size=n)).astype(np.int64) + 1
    output_tokens = (rng.lognormal(5.0, 0.7, size=n)).astype(np.int64) + 2
    queue = (rng.exponential(20.0, size=n) * MS).astype(np.int64)
    pre = ((1 + input_tokens / 500) * MS).astype(np.int64)
    prefill = ((15 + input_tokens * 0.05) * MS).astype(np.int64)
    per_token = rng.uniform(18, 24, size=n) * MS
    in_spike = ((t0 - START_NS) >= SPIKE_START_S * 1_000_000_000) & (
        (t0 - START_NS) < (SPIKE_START_S + SPIKE_LEN_S) * 1_000_000_000) & (replica == SPIKE_REPLICA)
    per_token = np.where(in_spike, per_token * 2.5, per_token)
    decode = (per_token * (output_tokens - 1)).astype(np.int64)
    tail = (rng.uniform(1, 4, size=n) * MS).astype(np.int64)
    t_queue = t0 + MS // 2
    t_pre = t_queue + queue
    t_gen = t_pre + pre
    t_dec = t_gen + prefill
    t_end_gen = t_dec + decode
    t_end = t_end_gen + tail
    failed = rng.random(n) < 0.01

    k = SPANS_PER_REQUEST
    total = n * k
    trace_ids = _hex_ids(rng, n, 16)
    span_ids = _hex_ids(rng, total, 8)
    idx = np.repeat(np.arange(n), k)
    trace_col = trace_ids.take(pa.array(idx))
    kind_of = np.tile(np.arange(k), n)  # 0 request, 1 queue, 2 pre, 3 gen, 4 prefill, 5 decode, 6 streaming
    starts = np.stack([t0, t_queue, t_pre, t_gen, t_gen, t_dec, t_dec], axis=1).reshape(-1)
    ends = np.stack([t_end, t_pre, t_gen, t_end_gen, t_dec, t_end_gen, t_end], axis=1).reshape(-1)
    # parents: request for 1,2,3,6; generation for 4,5
    pos = np.arange(total)
    parent_pos = np.where(np.isin(kind_of, (4, 5)), (pos // k) * k + 3, (pos // k) * k)
    parent = span_ids.take(pa.array(parent_pos))
    parent = pc.if_else(pa.array(kind_of == 0), pa.scalar(""), parent)
    names = np.array(["POST /v1/chat/completions", "queue_wait", "preprocess", "generation",
                      "prefill", "decode", "streaming"], dtype=object)
    name_col = pa.DictionaryArray.from_arrays(pa.array(kind_of.astype(np.int32)),
                                              pa.array(names.tolist())).cast(pa.string())
    stage_names: list[str | None] = [None, "queue_wait", "preprocess", "generation", "prefill", "decode",
                                     "streaming"]
    stage_col = pa.DictionaryArray.from_arrays(pa.array(kind_of.astype(np.int32)),
                                               pa.array(stage_names, type=pa.string())).cast(pa.string())
    is_req = kind_of == 0
    rep_names = pa.array([f"replica-{i:02d}" for i in range(REPLICAS)])
    replica_col = pa.DictionaryArray.from_arrays(pa.array(replica[idx].astype(np.int32)), rep_names).cast(pa.string())
    status = np.where(is_req & failed[idx], "Error", "Unset")
    outcome_np = np.where(failed[idx], "error", "ok").astype(object)
    outcome_np[~is_req] = None
    outcome = pa.array(outcome_np, type=pa.string())
    tenants = pa.array(["acme", "globex", "initech"])
    tenant_idx = rng.integers(0, 3, size=n)
    req_only = pa.array(~is_req)

    def req_value(arr: pa.Array) -> pa.Array:
        return pc.if_else(req_only, pa.scalar(None, arr.type), arr.take(pa.array(idx)))

    tenant_col = req_value(pa.DictionaryArray.from_arrays(pa.array(tenant_idx.astype(np.int32)),
                                                          tenants).cast(pa.string()))
    model_col = req_value(pa.array(np.full(n, "llama-3-8b", dtype=object), type=pa.string()))
    version_col = req_value(pa.array(np.full(n, "v1", dtype=object), type=pa.string()))
    in_col = req_value(pa.array(input_tokens))
    out_col = req_value(pa.array(output_tokens))
    # attributes: the request flag and stream flag on requests, the stage on stages (2 entries each)
    attr_keys = np.where(is_req[:, None], np.array([[S.ATTR_REQUEST, S.ATTR_STREAMING]], dtype=object),
                         np.array([[S.ATTR_STAGE, "thread.id"]], dtype=object)).reshape(-1)
    stage_vals = np.array(["true", *stage_names[1:]], dtype=object)[kind_of]
    attr_vals = np.stack([stage_vals, np.where(is_req, "true", "1")], axis=1).reshape(-1)
    attrs = pa.MapArray.from_arrays(pa.array(np.arange(0, total * 2 + 1, 2, dtype=np.int32)),
                                    pa.array(attr_keys, type=pa.string()), pa.array(attr_vals, type=pa.string()))
    resource_attrs = _map_column(["service.instance.id"], replica_col, total)
    cols: dict[str, Any] = {
        "Timestamp": pa.array(starts // 1000, type=pa.timestamp("us", tz="UTC")),
        "TimestampNs": pa.array(starts),
        "TraceId": trace_col,
        "SpanId": span_ids,
        "ParentSpanId": parent,
        "TraceState": pa.array(np.full(total, "", dtype=object), type=pa.string()),
        "SpanName": name_col,
        "SpanKind": pa.array(np.where(is_req, "Server", "Internal"), type=pa.string()),
        "ServiceName": pa.array(np.full(total, "llm-server", dtype=object), type=pa.string()),
        "ResourceAttributes": resource_attrs,
        "ScopeName": pa.array(np.full(total, "bench", dtype=object), type=pa.string()),
        "ScopeVersion": pa.array(np.full(total, "0.1", dtype=object), type=pa.string()),
        "SpanAttributes": attrs,
        "Duration": pa.array(ends - starts),
        "StatusCode": pa.array(status, type=pa.string()),
        "StatusMessage": pa.array(np.full(total, "", dtype=object), type=pa.string()),
        "Events": _empty_lists(total, S.SPAN_SCHEMA.field("Events").type),
        "Links": _empty_lists(total, S.SPAN_SCHEMA.field("Links").type),
        "Stage": stage_col,
        "IsRequest": pa.array(is_req),
        "Outcome": outcome,
        "Replica": replica_col,
        "Model": model_col,
        "ModelVersion": version_col,
        "Tenant": tenant_col,
        "InputTokens": in_col,
        "OutputTokens": out_col,
        "TtftNs": pa.nulls(total, pa.int64()),
        "AdjustedCount": pa.array(np.ones(total), pa.float64()),
    }
    return pa.Table.from_pydict(cols, schema=S.SPAN_SCHEMA)


def make_store(store: Path, spans: int, seed: int = 1, duration_s: int = DURATION_S) -> int:
    """Write a synthetic store of about `spans` spans over `duration_s` seconds; return the number of requests."""
    rng = np.random.default_rng(seed)
    n = spans // SPANS_PER_REQUEST
    writer = SegmentWriter(store, kind="bench")
    chunks = max(1, n // 150_000)
    edges = np.linspace(START_NS, START_NS + duration_s * 1_000_000_000, chunks + 1).astype(np.int64)
    per = np.diff(np.linspace(0, n, chunks + 1).astype(np.int64))
    for c in range(chunks):
        writer.write(_request_table(rng, int(per[c]), int(edges[c]), int(edges[c + 1])))
    return n


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


def stores(args: argparse.Namespace) -> Iterator[tuple[int, Path]]:
    """(span count, store) for each of --spans under --dir: built once (make_store), reused after."""
    if getattr(args, "store", None):
        for name in args.store.split(","):
            yield _stored_spans(Path(name)), Path(name)
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailscope-bench-"))
    for spans in (int(s) for s in args.spans.split(",")):
        store = base / f"store-{spans}"
        if not store.exists():
            t = time.perf_counter()
            make_store(store, spans)
            print(f"built {store} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        yield spans, store


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


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Any) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process) of fn()."""
    c, t = _cpu_s(), time.perf_counter()
    result = fn()
    return result, round(time.perf_counter() - t, 3), round(_cpu_s() - c, 3)


def anchor(store: Path) -> tuple[float, float]:
    """The anchor, (wall s, CPU s): DuckDB's plain p50/p99 of `Duration` per `SpanName` over the store's Parquet."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false").fetchall()
    _, wall, cpu = _timed(lambda: con.execute(
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
    series, out["series_s"], out["series_cpu_s"] = _timed(lambda: percentile_series(con, metric="e2e"))
    out["series_windows"] = series.height
    con.close()

    con = connect(store)
    con.execute("SET enable_progress_bar = false").fetchall()
    report, out["report_s"], out["report_cpu_s"] = _timed(lambda: build_report(con))
    out["requests"] = report["requests"]
    out["spikes"] = [(s["start"], s["end"], s["stages"][0]["stage"] if s["stages"] else None,
                      s["dimensions"][0]["value"] if s["dimensions"] else None) for s in report["spikes"]]
    out["errors"] = report.get("errors", [])
    out["peak_rss_mib"] = round(_peak_rss_mib(), 1)
    out["report_vs_duckdb_x"] = round(out["report_s"] / max(out["duckdb_p50_p99_per_name_s"], 1e-9), 1)
    out["report_vs_duckdb_cpu_x"] = round(out["report_cpu_s"] / max(out["duckdb_cpu_s"], 1e-9), 1)
    with open("/proc/loadavg") as fh:
        out["loadavg_1m"] = float(fh.read().split()[0])
    return out


_CLI_RUNNER = """
import resource, runpy, sys
sys.argv = ["tailscope.cli", *sys.argv[1:]]
try:
    runpy.run_module("tailscope.cli", run_name="__main__")
except SystemExit as exc:
    if exc.code:
        raise
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
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
        materialize_s = None
        if not args.store:  # the request hours materialized first, as `tailscope ingest` / `collect` leave a store
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import sys; from analysis.engine.materialize import materialize; "
                            "print(len(materialize(sys.argv[1])))", str(store)], check=True, env=os.environ.copy())
            materialize_s = round(time.perf_counter() - t, 3)
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
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results.items():
        print(name, r)


if __name__ == "__main__":
    main()
