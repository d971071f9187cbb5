"""Benchmark `tailscope collect`: spans/s into queryable, fsynced segments, beside Arize Phoenix.

    .venv/bin/python -m benchmarks.bench_collect [--quick] [--phoenix phoenix-venv/bin/phoenix]
    .venv/bin/python -m benchmarks.bench_collect --peer-cost [--rounds 3]   # --record-peer on vs off only
    .venv/bin/python -m benchmarks.bench_collect --metrics-cost [--rounds 3]  # /metrics (span histograms) on vs off
    .venv/bin/python -m benchmarks.bench_collect --forward-cost             # CPU of --forward per span
    .venv/bin/python -m benchmarks.bench_collect --stages [1 3 8 32]         # CPU of each group-commit step
    .venv/bin/python -m benchmarks.bench_collect --compare CHECKOUT... [--spans 200000] [--connections 8]
                                               # one row against several checkouts' receivers, alternating

Runs the receiver as a child process (`tailscope collect`), then:
1. throughput from pre-encoded OTLP/HTTP protobuf bodies posted by an asyncio client over
   several keep-alive connections (the client runs on the same 2-core machine), for several
   body sizes and totals (how cost grows with size), checked by counting the stored spans;
2. the official OpenTelemetry OTLP exporters (HTTP and gRPC) end to end: ReadableSpans
   encoded by the exporter, sent, stored;
3. the added commit latency: the receiver's own submit-to-fsynced p99, and the client's p99;
4. Arize Phoenix (`phoenix serve`) fed the same bodies by the same client, when installed.

A 200 means fsynced: in the journal while several clients send, else in a segment
(docs/collect.md). Every row ends with the receiver stopped and the stored spans counted, so the
rate is also the rate into segments to within the last --journal-ms; the client's own CPU per span
(this process) is printed beside the receiver's.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks import exit_on_termination

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
STAGES = ("network", "queue_wait", "preprocess", "prefill", "decode", "streaming")

#: extra arguments given to every receiver this run starts (--receiver-arg)
RECEIVER_ARGS: list[str] = []


# --- spans and bodies --------------------------------------------------------------------


def sdk_spans(n_requests: int, seed: int = 1) -> list[ReadableSpan]:
    """Finished SDK spans: per request a root span and 6 stage spans with about 6 attributes."""
    rng = random.Random(seed)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-llm",
                                                        "service.instance.id": "replica-01"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench", "1.0")
    t0 = time.time_ns() - 3_600_000_000_000
    for i in range(n_requests):
        start = t0 + i * 1_000_000
        root = tracer.start_span("chat llama", start_time=start, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-3-8b",
            "gen_ai.usage.input_tokens": rng.randint(10, 4000), "gen_ai.usage.output_tokens": rng.randint(1, 900),
            "tailscope.tenant": f"tenant-{rng.randint(1, 20)}", "gen_ai.request.stream": True})
        from opentelemetry import trace

        ctx = trace.set_span_in_context(root)
        t = start
        for stage in STAGES:
            d = rng.randint(100_000, 5_000_000)
            child = tracer.start_span(stage, context=ctx, start_time=t, attributes={
                "tailscope.stage": stage, "batch.size": rng.randint(1, 64), "gpu.id": rng.randint(0, 7),
                "note": "x" * rng.randint(0, 12), "ratio": rng.random(), "retry": False})
            t += d
            child.end(end_time=t)
        root.end(end_time=t + 10_000)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def pb_bodies(total_spans: int, spans_per_body: int, seed: int = 2) -> list[bytes]:
    """Pre-encoded ExportTraceServiceRequest bodies with unique ids (spans from the SDK encoder)."""
    template = encode_spans(sdk_spans(50, seed)).resource_spans[0]
    pattern = list(template.scope_spans[0].spans)
    rng = random.Random(seed)
    bodies = []
    made = 0
    while made < total_spans:
        k = min(spans_per_body, total_spans - made)
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.CopyFrom(template.resource)
        ss = rs.scope_spans.add()
        ss.scope.CopyFrom(template.scope_spans[0].scope)
        trace_id = rng.randbytes(16)
        for j in range(k):
            src = pattern[(made + j) % len(pattern)]
            sp = ss.spans.add()
            sp.CopyFrom(src)
            if (made + j) % 7 == 0:
                trace_id = rng.randbytes(16)
            sp.trace_id = trace_id
            sp.span_id = rng.randbytes(8)
        bodies.append(req.SerializeToString())
        made += k
    return bodies


# --- the receivers -----------------------------------------------------------------------


class Collector:
    """`tailscope collect` in a child process on free loopback ports."""

    def __init__(self, store: Path, extra: Sequence[str] = (), root: Path = ROOT) -> None:
        self.store = store
        self.log = store.parent / f"{store.name}.log"
        # `root`: the checkout whose receiver runs (the CLI moved from analysis/ to tailscope/ on 2026-12-01)
        cli = "tailscope.cli" if (root / "tailscope" / "cli.py").exists() else "analysis.cli"
        self.proc = subprocess.Popen(
            [PYTHON, "-m", cli, "collect", "--store", str(store), "--http-port", "0",
             "--grpc-port", "0", *extra, *RECEIVER_ARGS], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))  # noqa: SIM115
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log.read_text()
            match = re.search(r"http=[^:]+:(\d+) grpc=[^:]+:(\d+)", text)
            if match:
                self.http_port, self.grpc_port = int(match.group(1)), int(match.group(2))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"collector exited: {text}")
            time.sleep(0.05)
        raise RuntimeError("collector did not start")

    def stop(self) -> str:
        """SIGTERM, wait, and return its console output (the last progress line has p99 commit)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        return self.log.read_text()

    def stored(self) -> int:
        """Spans in the store, counted through analysis.engine.connect."""
        from analysis.engine.connect import connect

        con = connect(self.store)
        try:
            return int(con.execute("SELECT count(*) FROM spans").fetchone()[0])  # type: ignore[index]
        finally:
            con.close()

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the receiver process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        """Peak resident memory of the receiver, MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0


# --- the asyncio client ------------------------------------------------------------------


async def _post_worker(host: str, port: int, path: str, bodies: list[bytes], next_index: list[int],
                       latencies: list[float], statuses: dict[int, int], content_type: str) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
            "Content-Length: {}\r\n\r\n")
    try:
        while True:
            i = next_index[0]
            if i >= len(bodies):
                return
            next_index[0] = i + 1
            body = bodies[i]
            for _attempt in range(100):  # bounded retries of 429/503
                t0 = time.perf_counter()
                writer.write(head.format(len(body)).encode() + body)
                status_line = await reader.readline()
                status = int(status_line.split()[1])
                length = 0
                retry_after = 1.0
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() == "retry-after":
                        retry_after = float(value)
                await reader.readexactly(length)
                statuses[status] = statuses.get(status, 0) + 1
                if status not in (429, 503):
                    latencies.append(time.perf_counter() - t0)
                    break
                await asyncio.sleep(min(retry_after, 0.2))
    finally:
        writer.close()


def post_bodies(port: int, bodies: list[bytes], connections: int, *, path: str = "/v1/traces",
                content_type: str = "application/x-protobuf") -> tuple[float, list[float], dict[int, int]]:
    """Post every body over `connections` keep-alive connections; (seconds, latencies, statuses)."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    next_index = [0]

    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(_post_worker("127.0.0.1", port, path, bodies, next_index, latencies,
                                            statuses, content_type) for _ in range(connections)))
        return time.perf_counter() - t0

    elapsed = asyncio.run(main())
    return elapsed, latencies, statuses


def q(values: Sequence[float], p: float) -> float:
    """The p quantile (linear interpolation) of `values`."""
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[int(p * 1000) - 1] if len(values) > 1 \
        else values[0]


# --- the runs ------------------------------------------------------------------------------


def run_throughput(work: Path, total: int, per_body: int, connections: int,
                   extra: Sequence[str] = (), tag: str = "", root: Path = ROOT) -> dict[str, float]:
    """Pre-encoded bodies into a fresh collector; spans/s until every 200 (= fsynced) is back."""
    bodies = _bodies(total, per_body)
    anchor = anchor_rate(bodies)
    # a fresh store per run: the bodies of a shape are the same bytes every time (fixed seed), so a
    # second run into the same store would only drop duplicates (no segment written: a third of the CPU)
    store = Path(tempfile.mkdtemp(prefix=f"tp-{total}-{per_body}-{connections}{tag}-", dir=work))
    collector = Collector(store, extra, root)
    cpu0 = collector.cpu_seconds()
    client0 = time.process_time()  # this process is the client (the bodies are encoded already)
    ticks0 = cpu_ticks()
    try:
        elapsed, lat, statuses = post_bodies(collector.http_port, bodies, connections)
        cpu = collector.cpu_seconds() - cpu0
        steal = steal_share(ticks0, cpu_ticks())
        client_cpu = time.process_time() - client0
        rss = collector.rss_mb()
    finally:
        log = collector.stop()
    stored = collector.stored()
    match = re.findall(r"p99 commit ([\d.]+) ms", log)
    final = re.search(r"stopped: ([\d,]+) spans stored in ([\d,]+) segment\(s\), ([\d,]+) duplicates", log)
    assert final is not None, f"no final line in the collector's log: {log[-300:]}"
    written, segments, duplicates = (int(g.replace(",", "")) for g in final.groups())
    # this run's receiver wrote every span itself, none dropped as already stored
    assert stored == total == written and duplicates == 0, \
        f"stored {stored} of {total} spans, written {written}, duplicates {duplicates} ({statuses})"
    return {"spans": total, "per_body": per_body, "connections": connections, "seconds": elapsed,
            "spans_per_s": total / elapsed, "mb_per_s": sum(map(len, bodies)) / elapsed / 1e6,
            "client_p50_ms": q(lat, 0.5) * 1000, "client_p99_ms": q(lat, 0.99) * 1000,
            "server_commit_p99_ms": float(match[-1]) if match else float("nan"),
            "cpu_us_per_span": cpu / total * 1e6, "client_cpu_us_per_span": client_cpu / total * 1e6,
            "rss_mb": rss, "refused": statuses.get(503, 0),
            # CPU per span falls with the group size (a group commit has a fixed cost): see docs/collect.md
            "spans_per_group": total / max(1, segments),
            "anchor_spans_per_s": anchor, "anchor_ratio": total / elapsed / anchor,
            "load": os.getloadavg()[0], "steal": steal}


def cpu_ticks() -> list[int]:
    """The machine's CPU time counters (/proc/stat's `cpu` line: user, nice, system, idle, iowait, irq, softirq,
    steal, ...); empty where there is no /proc."""
    try:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:9]]
    except OSError:
        return []


def steal_share(before: list[int], after: list[int]) -> float:
    """The share of the machine's CPU time its host took back (steal) between two `cpu_ticks`: on a virtual
    machine the same code's CPU per span moves with it (NaN where unknown)."""
    if len(before) < 8 or len(after) < 8:
        return float("nan")
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return delta[7] / sum(delta) if sum(delta) > 0 else float("nan")


def anchor_rate(bodies: list[bytes], seconds: float = 0.5) -> float:
    """Spans/s of this process decoding the row's bodies on one thread (C extraction and assembly, wall clock),
    measured just before a row: the machine's speed at that moment, so rows run at different loads compare
    by their ratio to it (a shared 2-core machine's load moves the absolute figures several-fold)."""
    from intake.otlp import decode_protobuf_base

    spans = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for body in bodies[:64]:
            spans += decode_protobuf_base(body)[0].num_rows
    return spans / (time.perf_counter() - t0)


@functools.lru_cache(maxsize=1)
def _bodies(total: int, per_body: int) -> list[bytes]:
    return pb_bodies(total, per_body)


def run_compare(work: Path, roots: list[Path], rounds: int, total: int, per_body: int, connections: int) -> None:
    """The same row against the receivers of several checkouts, in alternating order each round: on
    a shared machine the receiver's CPU per span of neighbouring runs is what can be compared."""
    print(f"compare: {total:,} spans in {per_body}-span bodies over {connections} connections, {rounds} rounds")
    print(f"{'round':>5} {'checkout':<40} {'spans/s':>9} {'us CPU/span':>11} {'spans/group':>11} "
          f"{'client p50':>10} {'client us/span':>14} {'ratio':>5} {'load':>5} {'steal':>5}")
    cpu: dict[Path, list[float]] = {root: [] for root in roots}
    for k in range(rounds):
        for i, root in enumerate(roots if k % 2 == 0 else roots[::-1]):
            r = run_throughput(work, total, per_body, connections, tag=f"-{k}-{i}", root=root)
            cpu[root].append(r["cpu_us_per_span"])
            print(f"{k:>5} {str(root)[-40:]:<40} {r['spans_per_s']:>9,.0f} {r['cpu_us_per_span']:>11.2f} "
                  f"{r['spans_per_group']:>11,.0f} {r['client_p50_ms']:>8.1f}ms {r['client_cpu_us_per_span']:>14.2f} "
                  f"{r['anchor_ratio']:>5.2f} {r['load']:>5.1f} {r['steal']:>5.1%}")
    for root, values in cpu.items():
        print(f"median CPU/span {statistics.median(values):.2f} us "
              f"(spread {min(values):.2f}-{max(values):.2f}): {root}")


def commit_stages(bodies_per_group: int, total: int = 200_000) -> None:
    """Thread CPU of each step of a group commit, run in this process on groups of
    `bodies_per_group` 512-span bodies (C extraction, assembly, promotion, engines, recognition,
    dedupe, Parquet write + fsync), per group and per span."""
    from intake.collect.commit import RecentKeys
    from intake.engines import normalize
    from intake.otlp import base_from_columns, new_builder, promote
    from intake.recognition import recognise
    from tracing.store import SegmentWriter, init_store

    builder = new_builder()
    if builder is None:
        raise SystemExit("the C decoder intake._otlpx is not built (python setup.py build_ext --inplace)")
    bodies = _bodies(total, 512)
    with tempfile.TemporaryDirectory(prefix="bench-stages-") as tmp:
        writer = SegmentWriter(init_store(Path(tmp)), kind="collect", durable=True)
        keys = RecentKeys(1_000_000)
        spent: dict[str, float] = {}

        def timed(name: str, fn: Any, *args: Any) -> Any:
            t0 = time.thread_time()
            out = fn(*args)
            spent[name] = spent.get(name, 0.0) + time.thread_time() - t0
            return out

        groups = spans = 0
        for i in range(0, len(bodies), bodies_per_group):
            for body in bodies[i:i + bodies_per_group]:
                timed("C extraction", builder.add, body, -1, "127.0.0.1")
            table = timed("assembly", base_from_columns, timed("assembly", builder.take))
            table = timed("promotion", promote, table)
            table = timed("engines", normalize, table)
            timed("recognition", recognise, table)
            kept, found = timed("dedupe", keys.filter, table)
            timed("dedupe", keys.add, found)
            timed("write+fsync", writer.write, kept.combine_chunks())
            groups += 1
            spans += kept.num_rows
    print(f"group commit steps, {spans // groups:,} spans a group, {groups} groups (thread CPU; load "
          f"{os.getloadavg()[0]:.1f}): total {sum(spent.values()) / groups * 1e3:.2f} ms a group, "
          f"{sum(spent.values()) / spans * 1e6:.2f} us a span")
    for name, seconds in spent.items():
        print(f"  {name:<13} {seconds / groups * 1e3:6.2f} ms a group {seconds / spans * 1e6:6.2f} us a span")


def run_light_latency(work: Path, n: int = 200, per_body: int = 512) -> dict[str, float]:
    """One connection, one request at a time: the latency a durable commit adds to a request."""
    bodies = pb_bodies(n * per_body, per_body, seed=9)
    collector = Collector(work / "latency")
    try:
        _, lat, _ = post_bodies(collector.http_port, bodies, 1)
    finally:
        log = collector.stop()
    match = re.findall(r"p99 commit ([\d.]+) ms", log)
    return {"client_p50_ms": q(lat, 0.5) * 1000, "client_p99_ms": q(lat, 0.99) * 1000,
            "server_commit_p99_ms": float(match[-1]) if match else float("nan")}


def run_exporter(work: Path, kind: str, n_requests: int, threads: int = 2) -> dict[str, float]:
    """The official OTLP exporter (`http` or `grpc`) sending 512-span batches end to end."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    spans = sdk_spans(n_requests, seed=5)
    batches = [spans[i:i + 512] for i in range(0, len(spans), 512)]
    collector = Collector(work / f"exp-{kind}")
    results: list[bool] = []
    try:
        def send(part: list[list[ReadableSpan]]) -> None:
            exporter = (HttpExporter(endpoint=f"http://127.0.0.1:{collector.http_port}/v1/traces")
                        if kind == "http" else GrpcExporter(endpoint=f"127.0.0.1:{collector.grpc_port}",
                                                            insecure=True))
            for batch in part:
                results.append(exporter.export(batch).value == 0)
            exporter.shutdown()

        t0 = time.perf_counter()
        workers = [threading.Thread(target=send, args=(batches[i::threads],)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
    finally:
        collector.stop()
    stored = collector.stored()
    assert all(results) and stored == len(spans), f"{kind}: stored {stored} of {len(spans)}"
    return {"spans": len(spans), "seconds": elapsed, "spans_per_s": len(spans) / elapsed}


def encode_rate(n_requests: int = 2000) -> float:
    """Spans/s of the official Python OTLP encoder alone (the exporters' ceiling)."""
    spans = sdk_spans(n_requests, seed=7)
    t0 = time.perf_counter()
    for i in range(0, len(spans), 512):
        encode_spans(spans[i:i + 512]).SerializeToString()
    return len(spans) / (time.perf_counter() - t0)


def run_phoenix(work: Path, phoenix_bin: str, total: int, per_body: int) -> dict[str, float] | str:
    """`phoenix serve` fed the same kind of bodies by the same client; spans/s until stored."""
    if not Path(phoenix_bin).exists():
        return f"not run: {phoenix_bin} not found (pip install arize-phoenix into a venv)"
    home = work / "phoenix"
    home.mkdir()
    port = 6006 + random.randint(100, 900)
    env = dict(os.environ, PHOENIX_WORKING_DIR=str(home), PHOENIX_PORT=str(port), PHOENIX_HOST="127.0.0.1",
               PHOENIX_GRPC_PORT=str(port + 1), PHOENIX_TELEMETRY_ENABLED="false")
    log = open(home / "phoenix.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([phoenix_bin, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
            if proc.poll() is not None:
                return f"not run: phoenix serve exited ({(home / 'phoenix.log').read_text()[-500:]})"
        else:
            return "not run: phoenix serve did not become healthy within 180 s"
        bodies = pb_bodies(total, per_body, seed=11)
        t0 = time.perf_counter()
        cpu0 = _cpu_tree(proc.pid)
        elapsed_post, _lat, statuses = post_bodies(port, bodies, 4)
        # Phoenix answers before it stores: poll its span count until all are there
        stored = 0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            stored = _phoenix_count(home)
            if stored >= total:
                break
            time.sleep(0.5)
        elapsed = time.perf_counter() - t0
        cpu = _cpu_tree(proc.pid) - cpu0
        return {"spans": total, "stored": stored, "seconds": elapsed, "spans_per_s": stored / elapsed,
                "post_seconds": elapsed_post, "refused_503": statuses.get(503, 0),
                "cpu_ms_per_span": cpu / max(1, stored) * 1000}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _phoenix_count(home: Path) -> int:
    import sqlite3

    db = home / "phoenix.db"
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute("SELECT count(*) FROM spans").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _cpu_tree(pid: int) -> float:
    total = 0.0
    tck = os.sysconf("SC_CLK_TCK")
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tck
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run_peer_cost(work: Path, rounds: int, total: int, per_body: int = 512, connections: int = 32) -> None:
    """`--record-peer` on against off, alternating in the same run: CPU per span and spans/s (the peer is
    added by the C builder, so the ratio should stay near 1)."""
    run_on_off(work, "--record-peer", ("--record-peer",), ("--no-record-peer",), rounds, total, per_body,
               connections)


def run_on_off(work: Path, name: str, on: Sequence[str], off: Sequence[str], rounds: int, total: int,
               per_body: int = 512, connections: int = 32) -> None:
    """A receiver option on against off, alternating in the same run: CPU per span and spans/s, medians and ratio."""
    print(f"{name} cost: {total:,} spans in {per_body}-span bodies over {connections} connections, "
          f"{rounds} alternating rounds")
    print(f"{'round':>5} {'mode':>4} {'spans/s':>9} {'us CPU/span':>11} {'load':>5}")
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    rate: dict[str, list[float]] = {"off": [], "on": []}
    for k in range(rounds):
        for mode in (("off", "on") if k % 2 == 0 else ("on", "off")):
            extra = on if mode == "on" else off
            r = run_throughput(work, total, per_body, connections, extra, tag=f"-{mode}-{k}")
            cpu[mode].append(r["cpu_us_per_span"])
            rate[mode].append(r["spans_per_s"])
            print(f"{k:>5} {mode:>4} {r['spans_per_s']:>9,.0f} {r['cpu_us_per_span']:>11.2f} {r['load']:>5.1f}")
    c_on, c_off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    r_on, r_off = statistics.median(rate["on"]), statistics.median(rate["off"])
    print(f"median CPU/span: on {c_on:.2f} us, off {c_off:.2f} us, ratio on/off {c_on / c_off:.2f}; median spans/s: "
          f"on {r_on:,.0f}, off {r_off:,.0f}, ratio on/off {r_on / r_off:.3f}")


def forward_cost(total: int) -> None:
    """CPU per span of `collect --forward`'s encoding (stored table -> OTLP protobuf -> gzip), in this
    process, against the decode + promote of the same spans as the anchor."""
    import gzip

    import pyarrow as pa

    from intake.collect.forward import BATCH_SPANS, to_request
    from intake.otlp import decode_protobuf_table

    bodies = pb_bodies(total, 512)
    c0 = time.process_time()
    table = pa.concat_tables([decode_protobuf_table(b)[0] for b in bodies])
    c1 = time.process_time()
    for lo in range(0, table.num_rows, BATCH_SPANS):
        gzip.compress(to_request(table.slice(lo, BATCH_SPANS)).SerializeToString(), compresslevel=1)
    c2 = time.process_time()
    decode_us, forward_us = (c1 - c0) / total * 1e6, (c2 - c1) / total * 1e6
    print(f"--forward cost, {total:,} spans: decode + promote {decode_us:.1f} us CPU/span (anchor), forward "
          f"encoding {forward_us:.1f} us CPU/span, ratio {forward_us / decode_us:.1f}; load {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> None:
    """Run every measurement and print figures and ratios."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a short run")
    ap.add_argument("--tiny", action="store_true", help="the smallest sizes that run every part (the test suite's "
                    "smoke run: figures meaningless)")
    ap.add_argument("--receiver-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for every receiver (repeat it), e.g. --receiver-arg=--journal-ms "
                         "--receiver-arg=0 to turn the journal off")
    ap.add_argument("--phoenix", default="phoenix-venv/bin/phoenix", help="phoenix executable ('' skips)")
    ap.add_argument("--connections", type=int, default=32,
                    help="client connections (a group commit holds what is in flight: about connections x body)")
    ap.add_argument("--peer-cost", action="store_true", help="only measure --record-peer on against off")
    ap.add_argument("--metrics-cost", action="store_true",
                    help="only measure /metrics (--metrics-port 0: span histograms) on against off")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of --peer-cost")
    ap.add_argument("--spans", type=int, default=200_000, help="spans per round of --peer-cost")
    ap.add_argument("--forward-cost", action="store_true", help="only measure the CPU of --forward's encoding")
    ap.add_argument("--stages", type=int, nargs="*", metavar="BODIES",
                    help="only time each step of a group commit in this process, groups of BODIES 512-span bodies")
    ap.add_argument("--compare", type=Path, nargs="+", metavar="CHECKOUT",
                    help="only run one row (--spans, --per-body, --connections) against the receivers of these "
                    "checkouts (each with its C decoder built), alternating for --rounds")
    ap.add_argument("--per-body", type=int, default=512, help="spans per body of --compare")
    args = ap.parse_args(argv)
    RECEIVER_ARGS.extend(args.receiver_arg)
    if args.stages is not None:
        for n in args.stages or [1, 3, 8, 32]:
            commit_stages(n, args.spans)
        return
    if args.forward_cost:
        forward_cost(args.spans)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-collect-"))
    if args.compare:
        try:
            run_compare(work, [p.resolve() for p in args.compare], args.rounds, args.spans, args.per_body,
                        args.connections)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    if args.peer_cost:
        try:
            run_peer_cost(work, args.rounds, args.spans, connections=args.connections)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    if args.metrics_cost:
        try:
            run_on_off(work, "/metrics", ("--metrics-port", "0"), (), args.rounds, args.spans,
                       connections=args.connections)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; work dir {work}")
        c = args.connections
        sizes = [(2_048, 512, 2)] if args.tiny else [(50_000, 512, c)] if args.quick else [
            (100_000, 512, c), (400_000, 512, c), (1_000_000, 512, c),
            (400_000, 512, 8), (400_000, 64, c), (400_000, 4096, 8)]
        best = 0.0
        print("\n1. pre-encoded OTLP/HTTP protobuf bodies, asyncio client over keep-alive connections "
              "-> fsynced journal, then segments (docs/collect.md)")
        print(f"{'spans':>9} {'per body':>8} {'conns':>5} {'s':>6} {'spans/s':>9} {'MB/s':>6} {'client p50':>10} "
              f"{'client p99':>10} {'commit p99':>10} {'us CPU/span':>11} {'client us/span':>14} {'RSS MB':>7} "
              f"{'spans/group':>11} {'anchor':>9} {'ratio':>5} {'load':>5} {'steal':>5}")
        print("   (anchor: spans/s of one thread of this process decoding the same bodies just before the row; "
              "ratio: spans/s / anchor)")
        for total, per_body, conns in sizes:
            r = run_throughput(work, total, per_body, conns)
            best = max(best, r["spans_per_s"]) if per_body == 512 else best
            print(f"{r['spans']:>9,.0f} {r['per_body']:>8,.0f} {conns:>5} {r['seconds']:>6.2f} "
                  f"{r['spans_per_s']:>9,.0f} "
                  f"{r['mb_per_s']:>6.1f} {r['client_p50_ms']:>8.1f}ms {r['client_p99_ms']:>8.1f}ms "
                  f"{r['server_commit_p99_ms']:>8.1f}ms {r['cpu_us_per_span']:>11.2f} "
                  f"{r['client_cpu_us_per_span']:>14.2f} {r['rss_mb']:>7.0f} "
                  f"{r['spans_per_group']:>11,.0f} {r['anchor_spans_per_s']:>9,.0f} {r['anchor_ratio']:>5.2f} "
                  f"{r['load']:>5.1f} {r['steal']:>5.1%}")
        light = run_light_latency(work, n=5 if args.tiny else 50 if args.quick else 200)
        print(f"\n2. added commit latency, one connection, 512-span requests one at a time: client p50 "
              f"{light['client_p50_ms']:.1f} ms, p99 {light['client_p99_ms']:.1f} ms; receiver submit-to-fsynced "
              f"p99 {light['server_commit_p99_ms']:.1f} ms")
        n_req = 80 if args.tiny else 1500 if args.quick else 8000
        enc = encode_rate(80 if args.tiny else 500 if args.quick else 2000)
        print(f"\n3. official exporters end to end (7 spans per request, 512-span batches, 2 threads); "
              f"encoder alone: {enc:,.0f} spans/s")
        for kind in ("http", "grpc"):
            r = run_exporter(work, kind, n_req)
            print(f"   OTLP/{kind:<4} exporter: {r['spans']:,.0f} spans in {r['seconds']:.2f} s = "
                  f"{r['spans_per_s']:,.0f} spans/s ({r['spans_per_s'] / enc:.2f} of the encoder's rate)")
        print("\n4. Arize Phoenix, same bodies, same client (4 connections)")
        ph = run_phoenix(work, args.phoenix, 2_000 if args.quick or args.tiny else 10_000, 512) if args.phoenix \
            else "not run (--phoenix '')"
        if isinstance(ph, str):
            print(f"   {ph}")
        else:
            print(f"   phoenix: {ph['stored']:,.0f}/{ph['spans']:,.0f} spans stored in {ph['seconds']:.1f} s = "
                  f"{ph['spans_per_s']:,.0f} spans/s (posting took {ph['post_seconds']:.1f} s, "
                  f"{ph['refused_503']:.0f} answers 503, {ph['cpu_ms_per_span']:.2f} ms CPU/span)")
            print(f"   ratio: tailscope collect (best 512-span figure above) {best:,.0f} spans/s / phoenix "
                  f"{ph['spans_per_s']:,.0f} spans/s = "
                  f"{best / max(ph['spans_per_s'], 1e-9):,.0f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    exit_on_termination()
    main()
