"""Time `tailscope map` on a store against `ingest`'s materialization of the same hours (the anchor).

    python -m benchmarks.bench_map [--spans 1000000] [--dir DIR] [--repeat 2] [--threads 2]

Two stores of the same spans, shaped as sample_traces.http_chat writes them (six pods; per request an
HTTP SERVER span and its tokenize / generate / stream_response children; over two hours), written
with tracing.store.SegmentWriter:
- native: the spans carry the convention (tailscope.request on the server span, tailscope.stage on
  the children), so `ingest` recognises them and materializes their hours: the anchor is that
  materialization (analysis.engine.materialize.materialize of every hour);
- plain: no convention; the measured step is what `tailscope map` does with the command line the docs
  show: save the mapping and rebuild every hour's requests with it.
Alternating, --repeat times each, in one process. Prints wall and CPU seconds (user + system of every
thread), the request count of each (they must agree), the ratio map / anchor and the load average.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

ROUTE = "/v1/chat/completions"
RULES = {"request": f'http.route == "{ROUTE}"',
         "stages": (("preprocess", 'name == "tokenize"'), ("generation", 'name == "generate"'),
                    ("streaming", 'name == "stream_response"'))}
HOUR_NS = 3_600_000_000_000


def _load() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def build(store: Path, spans: int, native: bool, seed: int = 1) -> None:
    """Write about `spans` spans (4 per request) into a new store (benchmarks.inputs' builder)."""
    from sample_traces.http_chat import PODS, T0
    from tracing import schema as S
    from tracing.rows import SpanBatch
    from tracing.store import SegmentWriter, init_store

    init_store(store)
    writer = SegmentWriter(store, kind="bench")
    rng = random.Random(seed)
    requests = spans // 4
    span_s = 2 * 3600 / requests
    batch = SpanBatch()
    ms = 1_000_000
    for i in range(requests):
        pod = PODS[i % len(PODS)]
        resource = {"service.name": "chat-api", "k8s.pod.name": pod}
        t0 = T0 + int(i * span_s * 1e9)
        tok = int(rng.uniform(3, 8) * ms)
        gen = int(rng.lognormvariate(5.99, 0.3) * ms)
        first = int(gen * 0.1)
        end = t0 + tok + gen + 6 * ms
        tid, root = f"{i + 1:032x}", f"{4 * i + 1:016x}"
        req_attrs = {"http.route": ROUTE, "http.request.method": "POST", "http.response.status_code": "200"}
        if native:
            req_attrs[S.ATTR_REQUEST] = "true"
        batch.append(trace_id=tid, span_id=root, parent_span_id="", name=f"POST {ROUTE}", kind="Server",
                     start_ns=t0, end_ns=end, service="chat-api", resource=resource, attrs=req_attrs)
        for k, (name, stage, s0, s1) in enumerate((
                ("tokenize", "preprocess", t0 + ms // 2, t0 + tok),
                ("generate", "generation", t0 + tok, t0 + tok + gen),
                ("stream_response", "streaming", t0 + tok + first, t0 + tok + gen + 2 * ms)), 2):
            batch.append(trace_id=tid, span_id=f"{4 * i + k:016x}", parent_span_id=root, name=name,
                         kind="Internal", start_ns=s0, end_ns=s1, service="chat-api", resource=resource,
                         attrs={S.ATTR_STAGE: stage} if native else {})
        if len(batch) >= 200_000:
            writer.write(batch.to_table())
            batch = SpanBatch()
    if len(batch):
        writer.write(batch.to_table())


def _drop_requests(store: Path) -> None:
    shutil.rmtree(store / "requests", ignore_errors=True)


def _count(store: Path) -> int:
    from analysis.engine.connect import connect

    con = connect(store)
    try:
        return int((con.execute("SELECT count(*) FROM requests").fetchone() or (0,))[0])
    finally:
        con.close()


def main(argv: list[str] | None = None) -> None:
    """Build both stores, then time the anchor and the map step alternately; print one JSON line per run."""
    from analysis.engine.materialize import materialize
    from analysis.mapping import rules as R
    from benchmarks.inputs import prepare

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-map-"))
    native, plain = base / "native", base / "plain"
    for store, is_native in ((native, True), (plain, False)):
        prepare(store, build, spans=args.spans, native=is_native)  # by fingerprint (benchmarks.inputs)
    mapping = R.Mapping(request=str(RULES["request"]), stages=tuple(RULES["stages"]))  # type: ignore[arg-type]
    best: dict[str, float] = {}
    for run in range(args.repeat):
        load0 = _load()
        out: dict[str, object] = {"run": run + 1, "spans": args.spans}
        for label, store in (("anchor_materialize", native), ("map", plain)):
            _drop_requests(store)
            R.reset(store)
            t0, c0 = time.perf_counter(), time.process_time()
            if label == "map":
                R.save(store, mapping)
            hours = materialize(store, threads=args.threads)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            best[label] = min(best.get(label, wall), wall)
            out[f"{label}_wall_s"], out[f"{label}_cpu_s"] = round(wall, 3), round(cpu, 3)
            out[f"{label}_hours"] = len(hours)
            out[f"{label}_requests"] = _count(store)
        out["same_requests"] = out["map_requests"] == out["anchor_materialize_requests"]
        out["ratio_wall"] = round(float(out["map_wall_s"]) / float(out["anchor_materialize_wall_s"]), 3)  # type: ignore[arg-type]
        out["ratio_cpu"] = round(float(out["map_cpu_s"]) / float(out["anchor_materialize_cpu_s"]), 3)  # type: ignore[arg-type]
        out["load_before"], out["load_after"] = load0, _load()
        print(json.dumps(out), flush=True)
    print(json.dumps({"best_anchor_wall_s": round(best["anchor_materialize"], 3), "best_map_wall_s":
                      round(best["map"], 3), "ratio_of_best": round(best["map"] / best["anchor_materialize"], 3)}))
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
