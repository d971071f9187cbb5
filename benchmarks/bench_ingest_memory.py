"""Peak memory of `tailscope ingest` on one large OTLP/JSON line, as a ratio of the input size.

    .venv/bin/python -m benchmarks.bench_ingest_memory [--mib 93] [--dir DIR]

Writes one OTLP/JSON document of about `--mib` MiB on a single line (the Collector file
exporter's shape: one resource, one scope, SDK-like spans with attributes and events), then
ingests it in a fresh child process per decoder and prints the child's peak RSS (VmHWM),
its growth over the interpreter with the modules imported, and both as multiples of the input.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.inputs import prepare

ROOT = Path(__file__).resolve().parent.parent
#: The document's name inside its input directory.
DOCUMENT = "one-line.json"
STAGES = ("queue_wait", "prefill", "decode", "streaming")


def _attr(key: str, value: object) -> dict[str, object]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def span_json(rng: random.Random, trace: str, parent: str, stage: str | None, t0: int) -> dict[str, object]:
    """One OTLP/JSON span like the SDK's: ids in hex, times as decimal strings, six attributes."""
    start = t0 + rng.randint(0, 5_000_000)
    attrs = ([_attr("tailscope.stage", stage)] if stage else
             [_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.request.model", "llama-3-8b"),
              _attr("tailscope.tenant", f"tenant-{rng.randint(1, 20)}")])
    attrs += [_attr("batch.size", rng.randint(1, 64)), _attr("ratio", rng.random()), _attr("retry", False),
              _attr("note", "x" * rng.randint(0, 24))]
    span: dict[str, object] = {
        "traceId": trace, "spanId": rng.randbytes(8).hex(), "parentSpanId": parent,
        "name": stage or "chat llama-3-8b", "kind": 1 if stage else 2,
        "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + rng.randint(100_000, 9_000_000)),
        "attributes": attrs, "status": {"code": 0}}
    if rng.random() < 0.2:
        span["events"] = [{"timeUnixNano": str(start + 1000), "name": "token",
                           "attributes": [_attr("index", rng.randint(0, 900))]}]
    return span


def big_document(target_bytes: int, seed: int = 3) -> bytes:
    """One ExportTraceServiceRequest of about `target_bytes` of compact JSON, without a newline."""
    rng = random.Random(seed)
    t0 = 1_780_000_000_000_000_000
    spans: list[dict[str, object]] = []
    size = 0
    while size < target_bytes:
        trace = rng.randbytes(16).hex()
        root = span_json(rng, trace, "", None, t0)
        group = [root] + [span_json(rng, trace, str(root["spanId"]), s, t0) for s in STAGES]
        size += sum(len(json.dumps(s, separators=(",", ":"))) + 1 for s in group)
        spans.extend(group)
        t0 += 1_000_000
    doc = {"resourceSpans": [{"resource": {"attributes": [_attr("service.name", "bench-llm"),
                                                          _attr("service.instance.id", "replica-01")]},
                              "scopeSpans": [{"scope": {"name": "bench", "version": "1.0"}, "spans": spans}]}]}
    return json.dumps(doc, separators=(",", ":")).encode()


CHILD = """
import os, sys, time
from pathlib import Path
import intake.ingest as I
def hwm():
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
mode = sys.argv[3]
if mode == 'whole':
    I.STREAM_JSON_BYTES = float('inf')  # every line through json.loads of the whole line
base = hwm()
t0 = time.process_time()
report = I.ingest_files([Path(sys.argv[1])], Path(sys.argv[2]))
print(base, hwm(), report.spans_written, time.process_time() - t0)
"""


def measure(path: Path, store: Path, mode: str) -> tuple[int, int, int, float]:
    """(baseline RSS, peak RSS, spans written, CPU s) of ingesting `path` in a fresh child process."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(store), mode], cwd=ROOT, check=True,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    base, peak, spans, cpu = out.split()
    return int(base), int(peak), int(spans), float(cpu)


def main(argv: list[str] | None = None) -> None:
    """Write the document, ingest it with each decoder in a child process, print peaks and ratios."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=93.0, help="size of the one-line document, MiB")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (a temporary one by default)")
    args = ap.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-ingest-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(work, args.mib)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def write_document(path: Path, mib: float) -> None:
    """The input: DOCUMENT in directory `path`, one OTLP/JSON line of about `mib` MiB."""
    path.mkdir(parents=True, exist_ok=True)
    (path / DOCUMENT).write_bytes(big_document(int(mib * (1 << 20))) + b"\n")


def run(work: Path, mib: float) -> None:
    """Write the document in `work` (or reuse it by fingerprint: benchmarks.inputs); print one row per decoder."""
    prepare(work / f"one-line-{mib:g}mib", write_document, mib=mib)
    doc = work / f"one-line-{mib:g}mib" / DOCUMENT
    size = doc.stat().st_size
    print(f"input: {size / (1 << 20):.1f} MiB on one line; load {os.getloadavg()[0]:.1f}")
    print(f"{'decoder':>10} {'peak MiB':>9} {'growth MiB':>10} {'peak/input':>10} {'growth/input':>12} "
          f"{'spans':>9} {'CPU s':>6}")
    for mode in ("whole", "streaming"):
        store = Path(tempfile.mkdtemp(prefix=f"store-{mode}-", dir=work))
        base, peak, spans, cpu = measure(doc, store, mode)
        shutil.rmtree(store, ignore_errors=True)
        print(f"{mode:>10} {peak / (1 << 20):>9.0f} {(peak - base) / (1 << 20):>10.0f} {peak / size:>10.1f} "
              f"{(peak - base) / size:>12.1f} {spans:>9,} {cpu:>6.1f}")


if __name__ == "__main__":
    main()
