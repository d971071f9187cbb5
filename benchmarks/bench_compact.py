"""Compaction under a fleet's exports: files per hour while spans arrive and after the hour settles, read times
against the same spans stored as one file per hour (the anchor, same run), the receiver's rate with compaction
on against off.

    .venv/bin/python -m benchmarks.bench_compact                  # 1,500 exports a scenario (a few minutes)
    .venv/bin/python -m benchmarks.bench_compact --exports 3000   # the size docs/benchmarks.md records

Each export is one OTLP protobuf body of 8 requests (7 spans each: a request span and 6 stage spans,
from the OpenTelemetry SDK's encoder) from one of 16 replicas (service.instance.id), posted one after
another on one connection, as SDK BatchSpanProcessors spaced out in time do: every body is its own
segment. `tailscope collect` runs with its defaults (compaction on).

Scenarios:
  settled  spans in an hour that ended hours ago: files in that hour while they arrive, then the seconds
           until it holds at most 8 files; `report --json` and a `sql` scan of `spans` against the anchor.
  live     spans over the last 30 minutes: files per hour while they arrive; reads a minute after the last.
  rate     the same bodies posted by 16 connections at once, compaction on against --no-compact, and the
           receiver's peak RSS in both.
  memory   two settled hours of 64 large segments merged in this process: the peak RSS the merges add
           against compaction's memory budget (--compact-memory-mib).
  spread   (only with --only spread) --spread-exports (20,000) exports whose spans cover three hours that
           ended hours ago, posted by --senders (4) connections at once: files per hour while they arrive,
           the seconds until every hour holds at most 8, reads against the anchor.

    .venv/bin/python -m benchmarks.bench_compact --only spread    # the 20,000 exports (about 10 minutes)

Each scenario prints the compactor's own figures while spans arrived (from STORE/compaction.json):
merges per second, time and inputs per merge by level, the most small segments waiting at one level.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.bench_collect import Collector, post_bodies, sdk_spans
from benchmarks.bench_reads import cli
from intake.collect.config import COLLECT
from tracing.store import COMPACTION_STATE, HOUR_NS, SegmentWriter, list_store, segment_files

REPLICAS = 16
print = functools.partial(print, flush=True)  # figures appear as they are measured
REQUESTS_PER_EXPORT = 8


def bodies(n: int, lo_ns: int, hi_ns: int, seed: int = 3) -> list[bytes]:
    """`n` export bodies, each of 8 requests starting in [lo_ns, hi_ns) from one of 16 replicas."""
    spans = sdk_spans(40, seed)
    template = encode_spans(spans).resource_spans[0]
    pattern = list(template.scope_spans[0].spans)
    per_request = 7
    rng = random.Random(seed)
    out = []
    for i in range(n):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.CopyFrom(template.resource)
        for kv in rs.resource.attributes:
            if kv.key == "service.instance.id":
                kv.value.string_value = f"replica-{i % REPLICAS:02d}"
        ss = rs.scope_spans.add()
        ss.scope.CopyFrom(template.scope_spans[0].scope)
        for _ in range(REQUESTS_PER_EXPORT):
            k = rng.randrange(len(pattern) // per_request)
            group = pattern[k * per_request:(k + 1) * per_request]
            base = min(s.start_time_unix_nano for s in group)
            shift = rng.randrange(lo_ns, hi_ns) - base
            trace_id = rng.randbytes(16)
            ids = {s.span_id: rng.randbytes(8) for s in group}
            for src in group:
                sp = ss.spans.add()
                sp.CopyFrom(src)
                sp.trace_id = trace_id
                sp.span_id = ids[src.span_id]
                if src.parent_span_id:
                    sp.parent_span_id = ids.get(src.parent_span_id, src.parent_span_id)
                sp.start_time_unix_nano = src.start_time_unix_nano + shift
                sp.end_time_unix_nano = src.end_time_unix_nano + shift
        out.append(req.SerializeToString())
    return out


def files_per_hour(store: Path) -> int:
    """The most segments a reader reads in one hour partition."""
    return max((len(h.files) for h in list_store(store)), default=0)


class Watcher:
    """Samples files per hour every 0.25 s on a thread; `most` is the highest seen."""

    def __init__(self, store: Path) -> None:
        self.store, self.most, self._stop = store, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.most = max(self.most, files_per_hour(self.store))
            except OSError:
                continue

    def stop(self) -> int:
        """Stop sampling; the highest count seen."""
        self._stop.set()
        self._thread.join()
        self.most = max(self.most, files_per_hour(self.store))
        return self.most


def compactor_figures(store: Path, seconds: float) -> str:
    """The compactor's running figures from STORE/compaction.json: merges per second, time per merge by level,
    the most small segments seen waiting at one level, the seconds spent listing."""
    try:
        state = json.loads((store / COMPACTION_STATE).read_text())
    except (OSError, ValueError):
        return "no compaction.json"
    f = state.get("figures", {})
    merges = sum(f.get("merges_by_level", {}).values())
    levels = ", ".join(f"L{k}: {n} x {1000 * f['merge_s_by_level'][k] / n:.0f} ms ({f['inputs_by_level'][k] / n:.0f} "
                       f"inputs)" for k, n in sorted(f.get("merges_by_level", {}).items(), key=lambda kv: int(kv[0])))
    return (f"{merges} merges in {seconds:.0f} s ({merges / max(seconds, 1e-9):.1f}/s; {levels}); at most "
            f"{f.get('max_backlog', 0)} small segments waiting at one level; listing {f.get('list_s', 0):.1f} s, "
            f"longest pass {f.get('max_pass_s', 0):.1f} s")


def anchor_store(source: Path, target: Path) -> None:
    """The same spans as `source`, written as one segment per hour (what one ingested file makes)."""
    tables = [pq.read_table(f) for f in segment_files(source)]
    SegmentWriter(target, kind="anchor").write(pa.concat_tables(tables, promote_options="permissive"))


def reads(store: Path, anchor: Path) -> dict[str, float]:
    """report --json and a sql scan of `spans`, on the store and on the anchor."""
    scan = "SELECT count(*), sum(Duration), count(DISTINCT SpanName) FROM spans"
    out = {}
    for name, args in (("report", ["report", "--json", "--no-materialize"]), ("scan", ["sql", scan])):
        out[name] = cli([*args, "--store", str(store)], runs=2)
        out[f"{name}_anchor"] = cli([*args, "--store", str(anchor)], runs=2)
    return out


def once_each(store: Path, sent: int) -> None:
    """Every span sent is in the store exactly once (a reader's view)."""
    import duckdb

    files = [str(f) for f in segment_files(store)]
    con = duckdb.connect()
    row = con.execute("SELECT count(*), count(DISTINCT (TraceId, SpanId)) FROM read_parquet(?)", [files]).fetchone()
    assert row is not None
    n, distinct = row
    assert n == distinct == sent, f"{n} spans, {distinct} distinct, {sent} sent"


def scenario(work: Path, name: str, exports: int, lo_ns: int, hi_ns: int, settle: bool,
             senders: int = 1) -> dict[str, float]:
    store = work / name
    body = bodies(exports, lo_ns, hi_ns)
    sent = exports * REQUESTS_PER_EXPORT * 7
    c = Collector(store)
    watcher = Watcher(store)
    t0 = time.perf_counter()
    _, _, statuses = post_bodies(c.http_port, body, senders)
    assert set(statuses) == {200}, statuses
    arrive_s = time.perf_counter() - t0
    arriving_most = watcher.stop()
    print(f"  compactor while arriving: {compactor_figures(store, arrive_s)}")
    out: dict[str, float] = {"exports": exports, "arrive_s": arrive_s, "files_while_arriving": arriving_most,
                             "segments_written": len(list(store.glob("spans/*/*/*.parquet")))}
    if settle:
        t1 = time.perf_counter()
        for _ in range(600):  # at most 5 minutes
            if files_per_hour(store) <= 8:
                break
            time.sleep(0.5)
        out["settle_s"] = time.perf_counter() - t1
        out["files_settled"] = files_per_hour(store)
    else:
        time.sleep(60)  # "a minute after the last one"
        out["files_after_1min"] = files_per_hour(store)
    c.stop()
    once_each(store, sent)
    anchor = work / f"{name}-anchor"
    anchor_store(store, anchor)
    out.update(reads(store, anchor))
    return out


def rate(work: Path, exports: int, compact: bool) -> tuple[float, float]:
    """Spans/s stored while 16 connections post `exports` bodies of an ended hour (compaction on or off), and the
    receiver's peak RSS (MiB)."""
    store = work / f"rate-{'on' if compact else 'off'}"
    now = time.time_ns()
    body = bodies(exports, now - 4 * HOUR_NS, now - 3 * HOUR_NS, seed=5)
    c = Collector(store, [] if compact else ["--no-compact"])
    seconds, _, statuses = post_bodies(c.http_port, body, REPLICAS)
    peak = c.rss_mb()
    c.stop()
    assert set(statuses) == {200}, statuses
    return exports * REQUESTS_PER_EXPORT * 7 / seconds, peak


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def memory(work: Path) -> tuple[float, float, int]:
    """(MiB of segments, peak RSS the merges add to this process in MiB, merges): two hours of 64 segments of up to
    6,000 random spans each, merged as settled hours with the default policy (its memory budget)."""
    import random

    from intake.compact.merge import Compactor, Policy
    from tests.intake.compact_helpers import write_segments
    from tracing.store import init_store

    store = init_store(work / "memory")
    rng = random.Random(1)
    for hour in range(2):
        write_segments(store, rng, 64, hour=hour, max_spans=6000)
    size = sum(f.stat().st_size for f in segment_files(store)) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    base = _peak_rss_mib()
    with Compactor(store, Policy(quiet_s=0, durable=False)) as c:
        merges = c.run_once(time.time() + 60).merges
    return size, _peak_rss_mib() - base, merges


def main(argv: list[str] | None = None) -> None:
    """Run the scenarios and print their figures with the anchors' and the ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exports", type=int, default=1500, help="exports per scenario")
    p.add_argument("--only", choices=("settled", "live", "rate", "spread", "memory"), action="append",
                   help="scenarios to run (repeatable); default: settled, live, rate, memory")
    p.add_argument("--spread-exports", type=int, default=20_000, help="exports of the spread scenario")
    p.add_argument("--senders", type=int, default=4, help="connections posting at once in the spread scenario")
    a = p.parse_args(argv)
    only = set(a.only or ("settled", "live", "rate", "memory"))
    work = Path(tempfile.mkdtemp(prefix="bench-compact-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min); exports of {REQUESTS_PER_EXPORT * 7} spans "
          f"from {REPLICAS} replicas: {a.exports:,} a scenario posted one after another"
          + (f", {a.spread_exports:,} spread from {a.senders} senders" if "spread" in only else ""))
    try:
        now = time.time_ns()
        for name in ("settled", "live"):
            if name not in only:
                continue
            lo, hi = (now - 4 * HOUR_NS, now - 3 * HOUR_NS) if name == "settled" else (now - HOUR_NS // 2, now)
            r = scenario(work, name, a.exports, lo, hi, settle=name == "settled")
            after = (f"at most {r['files_settled']:.0f} per hour {r['settle_s']:.0f} s after the last export"
                     if name == "settled" else f"{r['files_after_1min']:.0f} per hour a minute after the last")
            print(f"{name}: {r['segments_written']:,.0f} segments written in {r['arrive_s']:.0f} s, at most "
                  f"{r['files_while_arriving']:.0f} files in an hour while they arrived, {after}")
            for read in ("report", "scan"):
                print(f"  {read:<6} {r[read]:6.2f} s   anchor (one file an hour) {r[read + '_anchor']:6.2f} s   "
                      f"ratio {r[read] / r[read + '_anchor']:.2f}x")
        if "spread" in only:
            r = scenario(work, "spread", a.spread_exports, now - 5 * HOUR_NS, now - 2 * HOUR_NS, settle=True,
                         senders=a.senders)
            print(f"spread: {a.spread_exports:,} exports over three hours from {a.senders} senders at once: "
                  f"{r['segments_written']:,.0f} segments written in {r['arrive_s']:.0f} s, at most "
                  f"{r['files_while_arriving']:.0f} files in an hour while they arrived, at most "
                  f"{r['files_settled']:.0f} per hour {r['settle_s']:.0f} s after the last export")
            for read in ("report", "scan"):
                print(f"  {read:<6} {r[read]:6.2f} s   anchor (one file an hour) {r[read + '_anchor']:6.2f} s   "
                      f"ratio {r[read] / r[read + '_anchor']:.2f}x")
        if "memory" in only:
            size, added, merges = memory(work)
            budget = COLLECT.compact_memory_mib.default
            print(f"memory: {merges} merges of {size:.0f} MiB of segments (64 a merge) added {added:.0f} MiB to this "
                  f"process's peak RSS; budget (--compact-memory-mib) {budget} MiB: {added / budget:.2f}x")
        if "rate" in only:
            (on, rss_on), (off, rss_off) = rate(work, a.exports, True), rate(work, a.exports, False)
            print(f"rate: {on:,.0f} spans/s with compaction, {off:,.0f} without (anchor): {on / off:.2f}x; "
                  f"receiver's peak RSS {rss_on:.0f} MiB with, {rss_off:.0f} MiB without (compaction's budget: "
                  f"{COLLECT.compact_memory_mib.default} MiB, --compact-memory-mib)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
