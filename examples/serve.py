"""Run the example server: N replica processes on consecutive ports, traces to a store or OTLP.

    python -m examples.serve --port 8100 --replicas 2 --store ts-store

Prints one `ready http://HOST:PORT replica-I` line per replica once it accepts requests
(`--port 0` gives every replica a free port of the system's choosing);
SIGINT / SIGTERM stop the replicas, which flush their traces before exiting.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import queue
import signal
import sys
from typing import Any

import tracing
from examples.model import ModelCosts, StandInModel
from examples.server import Replica, serve


def run_replica(index: int, host: str, port: int, store: str | None, exporters: str | None,
                max_batch: int, ready: Any) -> None:
    """One replica process: configure tracing, serve until SIGTERM / SIGINT, flush, exit."""
    telemetry = tracing.configure("example-llm", replica_id=f"replica-{index}", store=store, exporters=exporters,
                                  export_delay_ms=200, store_flush_s=1.0)
    replica = Replica(StandInModel(costs=ModelCosts()), max_batch=max_batch)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(replica, host, port, ready=lambda bound: ready.put((index, bound)), stop=stop)

    try:
        asyncio.run(main())
    finally:
        telemetry.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Start the replicas and wait for them; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m examples.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100,
                        help="port of replica 0; replica i listens on port+i (0: free ports, printed)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--store", default=None, help="segment store directory (default: $TAILSCOPE_STORE)")
    parser.add_argument("--exporters", default=None, help="store, otlp or both (default: $TAILSCOPE_EXPORTERS, store)")
    parser.add_argument("--max-batch", type=int, default=8)
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    ready: Any = ctx.Queue()
    procs = []
    for i in range(args.replicas):
        port = 0 if args.port == 0 else args.port + i
        proc = ctx.Process(target=run_replica, args=(i, args.host, port, args.store, args.exporters,
                                                     args.max_batch, ready), name=f"replica-{i}")
        proc.start()
        procs.append((proc, i))
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for proc, _ in procs:
            if proc.is_alive() and proc.pid is not None:
                proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bound: dict[int, int] = {}
    while len(bound) < len(procs):
        try:
            index, port = ready.get(timeout=0.1)
            bound[index] = port
        except queue.Empty:
            dead = [i for proc, i in procs if not proc.is_alive() and i not in bound]
            if dead:
                print(f"replica-{dead[0]} failed to start", file=sys.stderr, flush=True)
                stop(0, None)
                return 1
    for index in sorted(bound):
        print(f"ready http://{args.host}:{bound[index]} replica-{index}", flush=True)
    for proc, _ in procs:
        proc.join()
    return 0 if stopping or all(p.exitcode == 0 for p, _ in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
