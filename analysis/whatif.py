"""What-if: replay observed arrivals and service times through a k-server FIFO queue.

Each request arrives at its observed start and needs its observed service time (its
latency minus the time it waited in the queue). Requests are served first come, first
served by k identical servers (replicas x concurrency slots): an event simulation with a
heap of the servers' free times, O(n log k). The prediction assumes service times do not
change with load (no batching slow-down, no cold starts), so it says how much of the tail
is queueing that more capacity would remove, not how a different batch size would run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from analysis.percentiles import parse_time, request_source
from analysis.spikes import quantile_sorted

I64 = npt.NDArray[np.int64]


def simulate(arrivals: Sequence[int] | I64, services: Sequence[int] | I64, servers: int) -> I64:
    """Latency (finish minus arrival) of each request through `servers` FIFO servers, in input order."""
    if servers < 1:
        raise ValueError("servers must be at least 1")
    arr = np.asarray(arrivals, dtype=np.int64)
    svc = np.asarray(services, dtype=np.int64)
    if arr.shape != svc.shape:
        raise ValueError("arrivals and services must have the same length")
    if np.any(svc < 0):
        raise ValueError("service times must be non-negative")
    order = np.argsort(arr, kind="stable")
    latency = np.empty(arr.size, dtype=np.int64)
    a_list = arr[order].tolist()
    s_list = svc[order].tolist()
    lat_sorted = [0] * arr.size
    free = [a_list[0] if a_list else 0] * min(servers, max(arr.size, 1))  # a heap: every server free at first
    for j, (a, s) in enumerate(zip(a_list, s_list, strict=True)):
        t = free[0]
        begin = a if a > t else t
        heapq.heapreplace(free, begin + s)
        lat_sorted[j] = begin + s - a
    latency[order] = np.asarray(lat_sorted, dtype=np.int64)
    return latency


def oracle(arrivals: Sequence[int], services: Sequence[int], servers: int) -> list[int]:
    """Tick-by-tick reference of `simulate` for small integer workloads (for tests)."""
    n = len(arrivals)
    order = sorted(range(n), key=lambda i: (arrivals[i], i))
    busy_until = [0] * servers
    waiting: list[int] = []
    nxt = 0
    latency = [0] * n
    done = 0
    t = min(arrivals) if n else 0
    while done < n:
        while nxt < n and arrivals[order[nxt]] <= t:
            waiting.append(order[nxt])
            nxt += 1
        for k in range(servers):
            while busy_until[k] <= t and waiting:
                i = waiting.pop(0)
                busy_until[k] = t + services[i]
                latency[i] = busy_until[k] - arrivals[i]
                done += 1
                if services[i] > 0:
                    break
        t += 1
    return latency


def predict(arrivals: I64, services: I64, servers: Sequence[int],
            replay: Callable[[I64, I64, int], I64] | None = None) -> list[dict[str, Any]]:
    """p50 / p99 latency (ms) predicted for each server count.

    `replay`: what replays (arrivals sorted); by default `simulate` (analysis.capacity.replay runs
    the C kernel, the same numbers).
    """
    run = replay or simulate
    out = []
    for k in servers:
        lat = np.sort(run(arrivals, services, int(k)).astype(np.float64))
        out.append({"servers": int(k), "p50_ms": round(quantile_sorted(lat, 0.5) / 1e6, 3),
                    "p99_ms": round(quantile_sorted(lat, 0.99) / 1e6, 3)})
    return out


def observed_requests(con: duckdb.DuckDBPyConnection, since: str | int | datetime | None = None,
                      until: str | int | datetime | None = None) -> tuple[I64, I64, npt.NDArray[np.float64], I64]:
    """The requests starting in [since, until), by arrival: (arrival ns, service ns, TTFT after the queue ns, end ns).

    Service = e2e minus critical-path queue wait (at least 0); TTFT after the queue = TTFT
    minus queue wait (at least 0; NaN without a TTFT). The one reader of the replayed workload
    (analysis.capacity.observed_workload builds on it).
    """
    src = request_source(con, "queue_wait")
    data = con.execute(
        f"SELECT start_ns, e2e_ns - coalesce(queue_wait_ns, 0) AS service_ns, "
        f"ttft_ns - coalesce(queue_wait_ns, 0) AS ttft_rest_ns, start_ns + e2e_ns AS end_ns FROM {src} "
        "WHERE ($1 IS NULL OR start_ns >= $1) AND ($2 IS NULL OR start_ns < $2) ORDER BY start_ns",
        [parse_time(since), parse_time(until)]).fetchnumpy()
    arrivals = np.asarray(data["start_ns"], dtype=np.int64)
    services = np.maximum(np.asarray(data["service_ns"], dtype=np.int64), 0)
    rest = data["ttft_rest_ns"]
    ttft_rest = (np.ma.filled(np.ma.masked_invalid(np.ma.asarray(rest, dtype=np.float64)), np.nan)
                 if isinstance(rest, np.ma.MaskedArray) else np.asarray(rest, dtype=np.float64))
    ttft_rest = np.where(np.isnan(ttft_rest), np.nan, np.maximum(ttft_rest, 0.0))
    return arrivals, services, ttft_rest, np.asarray(data["end_ns"], dtype=np.int64)


def _peak(starts: I64, durations: I64) -> int:
    ends = starts + durations
    times = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(starts.size, np.int64), -np.ones(ends.size, np.int64)])
    order = np.lexsort((delta, times))  # at a tie an end (-1) comes before a start (+1)
    return int(np.cumsum(delta[order]).max())


def whatif(con: duckdb.DuckDBPyConnection, servers: Sequence[int] = (), since: str | int | None = None,
           until: str | int | None = None) -> list[dict[str, Any]]:
    """Predicted p50 / p99 (ms) of the requests in range under each number of FIFO servers.

    With no `servers`, the observed peak of requests in service (k) and 1.25 k, 1.5 k, 2 k.
    """
    arrivals, services, _, ends = observed_requests(con, since, until)
    if not servers:
        k = max(1, _peak(ends - services, services)) if arrivals.size else 1
        servers = sorted({k, math.ceil(1.25 * k), math.ceil(1.5 * k), 2 * k})
    return predict(arrivals, services, servers)
