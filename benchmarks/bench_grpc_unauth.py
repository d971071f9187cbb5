"""Memory of `tailscope collect --token-file` while unauthenticated gRPC clients send large messages.

    .venv/bin/python -m benchmarks.bench_grpc_unauth [--clients 8] [--mib 60] [--rounds 3] [--root DIR]

Starts the receiver from `--root` (this checkout by default; give another checkout to compare)
with a token file and a 64 MiB message cap, lets `--clients` threads each send `--rounds`
messages of `--mib` MiB at once without the token (or with it: `--with-token`), and prints the
answers, how long each took, and the receiver's resident memory: before, its peak (VmHWM), after.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from benchmarks import exit_on_termination

ROOT = Path(__file__).resolve().parent.parent
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def main(argv: list[str] | None = None) -> None:
    """Run the probe once and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--mib", type=float, default=60.0, help="message size, MiB (under the 64 MiB cap)")
    ap.add_argument("--rounds", type=int, default=3, help="messages each client sends, one after another")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose receiver runs")
    ap.add_argument("--with-token", action="store_true",
                    help="send the token (the messages are not OTLP, so the answer is INVALID_ARGUMENT): "
                    "what authenticated senders can make the receiver hold")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-grpc-unauth-"))
    (work / "token").write_text("the-token\n")
    log = work / "collect.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailscope.cli", "collect", "--store", str(work / "store"), "--http-port", "-1",
         "--grpc-port", "0", "--token-file", str(work / "token"), "--max-body-mib", "64", "--quiet"],
        cwd=args.root, env=dict(os.environ, PYTHONPATH=str(args.root)), stdout=subprocess.DEVNULL,
        stderr=open(log, "w"))  # noqa: SIM115
    try:
        port = 0
        for _ in range(1200):
            match = re.search(r"grpc=[^:]+:(\d+)", log.read_text())
            if match:
                port = int(match.group(1))
                break
            if proc.poll() is not None:
                raise RuntimeError(log.read_text())
            time.sleep(0.1)
        time.sleep(1.0)
        before = _status_kib(proc.pid, "VmRSS")
        hwm_before = _status_kib(proc.pid, "VmHWM")
        body = os.urandom(int(args.mib * (1 << 20)))
        codes: list[str] = []
        seconds: list[float] = []

        metadata = [("authorization", "Bearer the-token")] if args.with_token else []

        def client() -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[
                    ("grpc.max_send_message_length", 128 << 20)]) as channel:
                call = channel.unary_unary(EXPORT)
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    try:
                        call(body, timeout=120, metadata=metadata)
                        codes.append("OK")
                    except grpc.RpcError as exc:
                        codes.append(exc.code().name)  # type: ignore[attr-defined]
                    seconds.append(time.perf_counter() - t0)

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        time.sleep(1.0)
        after = _status_kib(proc.pid, "VmRSS")
        peak = _status_kib(proc.pid, "VmHWM")
        counts = {c: codes.count(c) for c in sorted(set(codes))}
        print(f"root {args.root}; {args.clients} clients x {args.rounds} messages of {args.mib:g} MiB "
              f"{'with' if args.with_token else 'without'} the token; load {os.getloadavg()[0]:.1f}")
        print(f"  answers: {counts}; each {min(seconds):.2f}-{max(seconds):.2f} s; all in {wall:.1f} s")
        print(f"  receiver RSS: before {before / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB "
              f"(peak before the probe {hwm_before / 1024:.0f}), after {after / 1024:.0f} MiB; "
              f"peak growth {(peak - hwm_before) / 1024:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    exit_on_termination()
    main()
