"""Benchmark /metrics: the p99 error of the latency buckets on the demo, and a scrape of a large receiver.

    .venv/bin/python -m benchmarks.bench_metrics [--quick] [--dir DIR] [--sample demo|basic]

1. p99 error: the demo store's requests (`tailscope demo`'s sample, ingested here) in the report's
   120 s windows; per window the exact p99 (quantile_cont, the project's convention) against the
   p99 Prometheus' `histogram_quantile` gives from the buckets (linear inside the bucket), for
   BUCKETS_S (classic buckets, what tailscope exposes) and for a native-histogram schema 3
   (factor 2^(1/8)) as a comparison; for e2e, TTFT and the decode stage span.
2. scrape: SpanMetrics fed spans for 32 replicas x 4 models x 8 stages (request spans with two
   outcomes); the series count, the time to render /metrics in OpenMetrics, and one HTTP scrape.
   Anchor: prometheus_client's own labelled `Histogram` holding the same label sets and buckets,
   rendered by the same encoder in the same run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

from intake.collect.metrics import BUCKETS_S, SpanMetrics
from tracing import schema as S

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def bucket_quantile(values: np.ndarray, bounds: np.ndarray, q: float) -> float:
    """Prometheus' histogram_quantile over cumulative bucket counts of `values` (linear inside a bucket; the
    first bucket starts at 0; a rank in +Inf gives the last finite bound)."""
    counts = np.searchsorted(np.sort(values), bounds, side="right")  # cumulative, le
    total = values.size
    rank = q * total
    i = int(np.searchsorted(counts, rank, side="left"))
    if i >= bounds.size:
        return float(bounds[-1])
    lo = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0 if i == 0 else int(counts[i - 1])
    inside = int(counts[i]) - below
    return lo + (float(bounds[i]) - lo) * ((rank - below) / inside if inside else 1.0)


def native_bounds(lo_s: float = 1e-4, hi_s: float = 1200.0, schema: int = 3) -> np.ndarray:
    """Upper bounds of a native histogram's buckets of that schema (factor 2^(2^-schema)) over [lo_s, hi_s]."""
    factor = 2 ** (2.0 ** -schema)
    n = math.ceil(math.log(hi_s / lo_s) / math.log(factor))
    return lo_s * factor ** np.arange(1, n + 1)


def p99_errors(demo_store: Path, window_s: int = 120, min_requests: int = 100) -> None:
    """Per window of the sample: |bucket p99 - exact p99| / exact p99, classic and native schema 3."""
    window_ns = window_s * 1_000_000_000
    import duckdb

    from analysis.engine.connect import connect
    from analysis.engine.percentiles import request_facts

    con = connect(demo_store)
    facts = request_facts(con, with_ttft=True)
    frames = {
        "e2e": con.sql(f"SELECT start_ns, e2e_ns AS v FROM {facts}").fetchnumpy(),
        "ttft": con.sql(f"SELECT start_ns, ttft_ns AS v FROM {facts} WHERE ttft_ns IS NOT NULL").fetchnumpy(),
    }
    con.close()
    frames["decode span"] = duckdb.connect().sql(
        f"SELECT TimestampNs AS start_ns, Duration AS v FROM read_parquet('{demo_store}/spans/*/*/*.parquet') "
        "WHERE Stage = 'decode'").fetchnumpy()
    classic = np.array(BUCKETS_S)
    native = native_bounds()
    print(f"p99 error per {window_s} s window of the sample (exact: quantile_cont); classic = "
          f"{len(BUCKETS_S)} buckets, native = schema 3 ({native.size} buckets over 0.1 ms-20 min)")
    print(f"{'metric':<12} {'windows':>7} {'classic median':>14} {'classic max':>11} {'native median':>13} "
          f"{'native max':>10}")
    for name, f in frames.items():
        start = np.asarray(f["start_ns"], dtype=np.int64)
        v = np.asarray(f["v"], dtype=np.float64) / 1e9
        errs: dict[str, list[float]] = {"classic": [], "native": []}
        for w in np.unique(start // window_ns):
            x = v[(start // window_ns) == w]
            if x.size < min_requests:
                continue
            exact = float(np.quantile(x, 0.99))
            errs["classic"].append(abs(bucket_quantile(x, classic, 0.99) - exact) / exact)
            errs["native"].append(abs(bucket_quantile(x, native, 0.99) - exact) / exact)
        print(f"{name:<12} {len(errs['classic']):>7} {statistics.median(errs['classic']):>14.1%} "
              f"{max(errs['classic']):>11.1%} {statistics.median(errs['native']):>13.1%} {max(errs['native']):>10.1%}")


def big_table(replicas: int, models: int, per_combo: int, seed: int = 1) -> pa.Table:
    """Spans for every replica x model: request spans (ok and error) and one span per stage, random durations."""
    rng = np.random.default_rng(seed)
    rows_per = per_combo * (1 + len(S.ALL_STAGES))
    n = replicas * models * rows_per
    combo = np.repeat(np.arange(replicas * models), rows_per)
    kind = np.tile(np.repeat(np.arange(1 + len(S.ALL_STAGES)), per_combo), replicas * models)
    is_request = kind == 0
    stage = np.array([None, *S.ALL_STAGES], dtype=object)[kind]
    dur = (10 ** rng.uniform(6, 10.5, n)).astype(np.int64)
    return pa.table({
        "IsRequest": pa.array(is_request), "Stage": pa.array(stage.tolist(), pa.string()),
        "Outcome": pa.array([("error" if e else "ok") if r else None
                             for r, e in zip(is_request.tolist(), (rng.random(n) < 0.02).tolist(), strict=True)],
                            pa.string()),
        "ServiceName": pa.array(["llm"] * n), "Model": pa.array([f"model-{c % models}" for c in combo]),
        "ModelVersion": pa.array(["v1"] * n), "Replica": pa.array([f"replica-{c // models:02d}" for c in combo]),
        "Tenant": pa.array(["t"] * n), "Duration": pa.array(dur),
        "TraceId": pa.array([f"{i:032x}" for i in range(n)]),
        "TtftNs": pa.array(np.where(is_request, dur // 10, 0), pa.int64()).cast(pa.int64()),
        "OutputTokens": pa.array(np.where(is_request, 200, 0), pa.int64())})


def scrape(replicas: int, models: int, per_combo: int) -> None:
    """Series count and render / scrape time of /metrics for replicas x models x 8 stages, against the anchor."""
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.openmetrics.exposition import generate_latest

    from tailscope.commands.metrics import serve_metrics

    table = big_table(replicas, models, per_combo)
    metrics = SpanMetrics()
    t0 = time.perf_counter()
    metrics.observe(table)
    observe_s = time.perf_counter() - t0
    anchor_reg = CollectorRegistry()
    anchor = Histogram("anchor_seconds", "anchor", ["service", "stage", "model", "model_version", "replica"],
                       buckets=BUCKETS_S, registry=anchor_reg)
    for key in metrics.stage.series:  # the same label sets as the stage histogram, one observation each
        anchor.labels(*key).observe(1.0)

    def timed(fn: object, rounds: int = 5) -> float:
        out = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()  # type: ignore[operator]
            out.append(time.perf_counter() - t)
        return statistics.median(out)

    body = metrics.render(openmetrics=True)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    render_s = timed(lambda: metrics.render(openmetrics=True))
    anchor_body = generate_latest(anchor_reg)
    anchor_series = sum(1 for line in anchor_body.decode().splitlines() if line and not line.startswith("#"))
    anchor_s = timed(lambda: generate_latest(anchor_reg))
    server = serve_metrics([], "127.0.0.1", 0, renderers=[metrics.render])
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": OPENMETRICS})
        scrape_s = timed(lambda: urllib.request.urlopen(req, timeout=30).read())
    finally:
        server.stop()
    print(f"scrape: {replicas} replicas x {models} models x {len(S.ALL_STAGES)} stages, {table.num_rows:,} spans "
          f"observed in {observe_s * 1000:,.0f} ms")
    print(f"  label sets {metrics.series_count():,}; series (sample lines) {series:,}; body {len(body) / 1e6:.1f} MB")
    print(f"  render {render_s * 1000:,.0f} ms, HTTP scrape {scrape_s * 1000:,.0f} ms (median of 5)")
    print(f"  anchor: prometheus_client Histogram, {anchor_series:,} series, render {anchor_s * 1000:,.0f} ms; "
          f"per series ours/anchor {(render_s / series) / (anchor_s / anchor_series):.2f}")


def main(argv: list[str] | None = None) -> None:
    """Run both parts (the demo is ingested into a temporary store)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 replicas x 2 models, for a smoke run")
    ap.add_argument("--dir", type=Path, default=None, help="where the ingested sample is kept (default: a temp dir)")
    ap.add_argument("--sample", choices=("demo", "basic"), default="demo",
                    help="the committed sample whose p99 errors are measured (basic: the small one, 60 s windows)")
    args = ap.parse_args(argv)
    import hashlib

    from benchmarks.bench_watch import ingest_sample
    from benchmarks.inputs import prepare
    from sample_traces import generate

    traces = generate.DEMO_TRACES if args.sample == "demo" else generate.DATA_DIR / "basic.otlp.jsonl.gz"
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        store = (args.dir or Path(tmp)) / args.sample
        prepare(store, ingest_sample, traces=str(traces),
                traces_sha256=hashlib.sha256(traces.read_bytes()).hexdigest())
        if args.sample == "demo":
            p99_errors(store)
        else:
            p99_errors(store, window_s=60, min_requests=10)
    scrape(8 if args.quick else 32, 2 if args.quick else 4, 4)


if __name__ == "__main__":
    main()
