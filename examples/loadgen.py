"""Load generator for the example server: concurrent clients, each request one traced client call.

    python -m examples.loadgen --url http://127.0.0.1:8100 --url http://127.0.0.1:8101 -n 200 -c 8

Prompts and answer lengths vary (powers of two), tenants rotate; requests go to the URLs
round-robin. Prints the count per status and client-side p50 / p99 in ms.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tracing
from tracing.client import ClientResult, post_json


def make_payload(i: int, rng: random.Random, stream_ratio: float) -> dict[str, Any]:
    """The i-th request body: a prompt of 2^k words, 2^j tokens to generate, a rotating tenant."""
    words = 2 ** rng.randint(2, 8)
    return {"prompt": " ".join(f"w{k}" for k in range(words)), "max_tokens": 2 ** rng.randint(2, 6),
            "stream": rng.random() < stream_ratio, "tenant": f"tenant-{i % 3}"}


def run(urls: list[str], n: int, concurrency: int, stream_ratio: float = 0.8, seed: int = 0,
        timeout: float = 60.0) -> list[ClientResult | BaseException]:
    """Send `n` requests with `concurrency` threads; returns results (or the exception) in order."""
    rng = random.Random(seed)
    payloads = [make_payload(i, rng, stream_ratio) for i in range(n)]

    def one(i: int) -> ClientResult | BaseException:
        try:
            return post_json(urls[i % len(urls)] + "/v1/completions", payloads[i], timeout=timeout)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(n)))


def main(argv: list[str] | None = None) -> int:
    """Run the load and print a summary."""
    parser = argparse.ArgumentParser(prog="python -m examples.loadgen", description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", required=True, help="replica base URL (repeatable)")
    parser.add_argument("-n", "--requests", type=int, default=100)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--stream-ratio", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", default=None, help="also store the client spans in this store")
    args = parser.parse_args(argv)
    telemetry = tracing.configure("example-loadgen", replica_id="loadgen", store=args.store,
                                  exporters="store" if args.store else "none")
    results = run(args.url, args.requests, args.concurrency, args.stream_ratio, args.seed)
    telemetry.shutdown()
    statuses = Counter(r.status if isinstance(r, ClientResult) else type(r).__name__ for r in results)
    ms = sorted(r.duration_ns / 1e6 for r in results if isinstance(r, ClientResult) and r.status == 200)
    print("status counts:", dict(statuses))
    if ms:
        p50 = ms[len(ms) // 2]
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        print(f"client latency ms: p50 {p50:.1f}  p99 {p99:.1f}  (n={len(ms)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
