"""Benchmark of `tailscope watch`: time to alert on the incident catalogue, and cost per tick as history grows.

1. Detection delay: every catalogue incident (sample_traces/data/incidents/) is ingested and
   replayed with the command's defaults (60 s windows evaluated 60 s after they close); per
   incident: windows from the incident start to the end of the window that fired, and to the
   end of the window that resolved after the incident ended.
2. Cost per tick: one synthetic store (16 replicas, 7 spans per request, benchmarks.bench_report's
   generator) grown to 1, 6 and 24 hours of history; at each size a fresh live watch starts near
   the end (reading its bounded lookback) and then evaluates 5 new windows. Beside it, the anchor:
   one DuckDB p99 over every request span of the store (what re-reading history each tick costs).
   "Fresh" means a new LiveWatch with no alert state; it runs in this process, so the watch's
   process-wide cache of segment time ranges (read from Parquet footers) keeps what earlier watches
   read: the segments of the newest hour are new at each size, but --positions' second and third
   runs find theirs cached, as a long-running `tailscope watch` does. The OS page cache is not dropped.

    python -m benchmarks.bench_watch [--hours 1,6,24] [--rate 16] [--dir DIR] [--skip-catalogue] [--incidents A,B]
    python -m benchmarks.bench_watch --positions --dir DIR [--hours 1,6,24] [--rate 16]

The incident stores are built, or reused under --dir by their fingerprint (benchmarks.inputs: the ingest
code and the sample's digest); the history is grown from nothing every run, then stamped, and --positions
refuses a history that other code or other --hours/--rate grew.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from analysis.engine.percentiles import parse_time
from analysis.watch import ALERTS_DIR, Config, LiveWatch, replay
from benchmarks.inputs import check, clear, prepare, record
from benchmarks.synthetic import SPANS_PER_REQUEST, START_NS, request_table
from intake.ingest import ingest_files
from sample_traces import generate
from sample_traces.incidents import CATALOGUE
from tracing.store import SegmentWriter, segment_files

NS = 1_000_000_000
SEGMENT_S = 300  # one segment per 5 minutes of history, as a receiver flushing often would leave (fewer, larger)


def ingest_sample(store: Path, traces: str, traces_sha256: str) -> None:
    """A store of one committed sample (its digest is a parameter, so a changed sample is a new input)."""
    ingest_files([Path(traces)], store)


def catalogue(root: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Replay every incident (or those named); windows from its start to the fire and from its end to the resolve."""
    cfg = Config()
    w, d = cfg.window_ns, cfg.delay_ns
    out = []
    for inc in CATALOGUE:
        if names and inc.name not in names:
            continue
        store = root / inc.name
        traces = generate.traces_path(generate.INCIDENTS_DIR, inc.name)
        prepare(store, ingest_sample, traces=str(traces), traces_sha256=hashlib.sha256(traces.read_bytes()).hexdigest())
        truth = json.loads(generate.truth_path(generate.INCIDENTS_DIR, inc.name).read_text())
        t0 = time.perf_counter()
        alerts = replay(store, replace(cfg, metric=truth.get("metric", cfg.metric)),  # the incident's latency
                        START_NS_SAMPLES, START_NS_SAMPLES + 600 * NS)
        took = time.perf_counter() - t0
        row: dict[str, Any] = {"scenario": inc.name, "alerts": len(alerts), "replay_s": round(took, 2)}
        if inc.stage is not None and alerts:
            a = alerts[0]
            start, end = truth["window"]["start_ns"], truth["window"]["end_ns"]
            fired = (parse_time(a["fired_at"]) or 0) - d
            resolved = (parse_time(a["resolved_at"]) or 0) - d if a["resolved_at"] else None
            row.update(fire_windows=(fired - start) / w, fire_s=((fired + d) - start) / NS,
                       resolve_windows=None if resolved is None else (resolved - end) / w,
                       stage=a["stage"], value=a["value"])
        out.append(row)
    return out


START_NS_SAMPLES = 1_763_647_200_000_000_000  # the samples start at 2025-11-20T14:00:00Z


def grow(store: Path, writer: SegmentWriter, rng: np.random.Generator, from_s: int, to_s: int, rate: float) -> int:
    """Append requests arriving in [from_s, to_s) seconds after START_NS; returns spans written."""
    spans = 0
    for lo in range(from_s, to_s, SEGMENT_S):
        n = int(rate * SEGMENT_S)
        writer.write(request_table(rng, n, START_NS + lo * NS, START_NS + (lo + SEGMENT_S) * NS))
        spans += n * SPANS_PER_REQUEST
    return spans


def tick_cost(store: Path, end_s: int, ticks: int = 5) -> dict[str, float]:
    """A fresh live watch near the end of the store: its start (lookback read) and `ticks` new windows."""
    cfg = Config()
    w, d = cfg.window_ns, cfg.delay_ns
    end_ns = START_NS + end_s * NS
    shutil.rmtree(store / ALERTS_DIR, ignore_errors=True)  # a fresh watch, not one catching up
    live = LiveWatch(store, cfg, lambda ev: None)
    t0 = time.perf_counter()
    live.step(end_ns - ticks * w + d)  # starts: reads the lookback (60 windows), evaluates the newest closed one
    start_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    live.step(end_ns + d)
    return {"start_s": start_s, "tick_s": (time.perf_counter() - t0) / ticks, "ticks": float(live.ticks)}


def anchor(store: Path) -> float:
    """Seconds of one p99 over every request span of the store (the cost of re-reading history)."""
    files = [str(f) for f in segment_files(store)]
    con = duckdb.connect()
    con.execute("SET memory_limit = '4GB'")
    t0 = time.perf_counter()
    con.execute("SELECT quantile_cont(Duration, 0.99) FROM read_parquet(?) WHERE IsRequest", [files]).fetchall()
    took = time.perf_counter() - t0
    con.close()
    return took


def positions(store: Path, hours: list[int]) -> None:
    """Tick cost after 1, 6, 24 ... hours of history in the same store (median of 3 fresh watches each)."""
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min); store of {len(segment_files(store))} segments")
    print(f"{'history':>8} {'start s':>8} {'tick s':>8} {'tick/first':>11} {'load':>5}")
    first = None
    for h in hours:
        runs = sorted((tick_cost(store, h * 3600) for _ in range(3)), key=lambda c: c["tick_s"])
        mid = runs[1]
        first = first or mid["tick_s"]
        print(f"{h:>7}h {mid['start_s']:>8.3f} {mid['tick_s']:>8.3f} {mid['tick_s'] / first:>11.2f} "
              f"{os.getloadavg()[0]:>5.1f}")


def main(argv: list[str] | None = None) -> None:
    """Run both parts and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_watch", description=__doc__.splitlines()[0])
    parser.add_argument("--hours", default="1,6,24")
    parser.add_argument("--rate", type=float, default=16.0, help="requests per second of the synthetic store")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--skip-catalogue", action="store_true")
    parser.add_argument("--positions", action="store_true",
                        help="reuse DIR/history (already grown to the largest size): tick cost at the end of each "
                             "hour count in that one store, median of 3 runs each")
    parser.add_argument("--incidents", default="", help="comma-separated catalogue incidents (default: all)")
    args = parser.parse_args(argv)
    grown = {"rate": args.rate, "hours": args.hours}
    if args.positions:
        if not args.dir:
            parser.error("--positions reads DIR/history, grown by a run with the same --dir, --hours and --rate")
        check(Path(args.dir) / "history", grow, **grown)  # refuses a history other code or parameters grew
        positions(Path(args.dir) / "history", [int(h) for h in args.hours.split(",")])
        return
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-watch-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min)")
    if not args.skip_catalogue:
        print("\n1. detection delay in replay (60 s windows, evaluated 60 s after they close)")
        print(f"{'scenario':24} {'alerts':>6} {'fire (windows)':>15} {'fire (s)':>9} {'resolve (windows)':>18} "
              f"{'stage':>11} {'value':>12} {'replay s':>9}")
        for r in catalogue(root / "catalogue", [n for n in args.incidents.split(",") if n]):
            print(f"{r['scenario']:24} {r['alerts']:>6} {r.get('fire_windows', '-')!s:>15} "
                  f"{r.get('fire_s', '-')!s:>9} {r.get('resolve_windows', '-')!s:>18} {r.get('stage', '-')!s:>11} "
                  f"{r.get('value', '-')!s:>12} {r['replay_s']:>9}")
    print("\n2. cost per tick against history (60 s windows, lookback 60 windows)")
    print(f"{'history':>8} {'spans':>12} {'segments':>9} {'start s':>8} {'tick s':>8} {'anchor s':>9} "
          f"{'tick/anchor':>12} {'tick/first tick':>16} {'load':>5}")
    store = root / "history"
    clear(store)  # grown from nothing every run (a history an earlier run grew is removed, anything else refused)
    writer = SegmentWriter(store, kind="bench")
    rng = np.random.default_rng(1)
    spans = 0
    done_s = 0
    first_tick = None
    for hours in (int(h) for h in args.hours.split(",")):
        spans += grow(store, writer, rng, done_s, hours * 3600, args.rate)
        done_s = hours * 3600
        cost = tick_cost(store, done_s)
        base = anchor(store)
        first_tick = first_tick or cost["tick_s"]
        print(f"{hours:>7}h {spans:>12,} {len(segment_files(store)):>9} {cost['start_s']:>8.3f} "
              f"{cost['tick_s']:>8.3f} {base:>9.3f} {cost['tick_s'] / base:>12.3f} "
              f"{cost['tick_s'] / first_tick:>16.2f} {os.getloadavg()[0]:>5.1f}")
    shutil.rmtree(store / ALERTS_DIR, ignore_errors=True)
    record(store, grow, grown)  # what --positions checks before it reads this history


if __name__ == "__main__":
    main()
