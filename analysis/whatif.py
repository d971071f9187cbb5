"""What-if: replay observed arrivals and service times through a k-server FIFO queue.

Each request arrives at its observed start and needs its observed service time (its
latency minus the time it waited in the queue). Requests are served first come, first
served by k identical servers (replicas x concurrency slots): an event simulation with a
heap of the servers' free times, O(n log k). The prediction assumes service times do not
change with load (no batching slow-down, no cold starts), so it says how much of the tail
is queueing that more capacity would remove, not how a different batch size would run.

Sampled traces (`expand`): a kept request with adjusted count w stands for w arrivals, so the
replayed workload holds round(w) of it (seeded stochastic rounding: floor(w), plus one with
probability w - floor(w)) requests of its class (its replica and adjusted count: one stream,
sampled at one rate). The kept one arrives when it did; the others arrive uniformly at random
between it and the next kept request of its class (the mean such gap after the last one), each
with the service of a kept request of the class drawn at random. For a Poisson arrival stream
thinned at a constant rate, the requests the sampler dropped between two kept ones are, given
their number, uniform in that gap, and their services are draws from the stream's own: the
expansion draws the dropped requests from their law given the kept ones. (Repeating the kept
request's own service w times would make the copies run together and overstate the peak of
requests in service, the slots of analysis.capacity.) Where every weight is 1 nothing is
expanded.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import duckdb
import numpy as np
import numpy.typing as npt

from analysis.engine.percentiles import parse_time, request_source, weight_where
from analysis.stats.spikes import quantile_sorted
from tracing import schema as S

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
#: Seed of the expansion of a sampled workload: the same store and range replay the same arrivals.
EXPAND_SEED: Final = 0


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


def expand(arrivals: I64, weights: F64, classes: I64 | None = None, seed: int = EXPAND_SEED) -> tuple[I64, I64]:
    """The requests a sampled workload stands for (module docstring): (index of the kept request whose service each
    takes, its arrival ns), sorted by arrival (ties: the kept one first). `arrivals` sorted; `classes`: each
    request's class (read_observed: its replica and adjusted count, `classes_of`; default: its weight), whose
    gaps and services its copies take."""
    n = arrivals.size
    rng = np.random.default_rng(seed)
    whole = np.floor(weights)
    count = whole.astype(np.int64) + (rng.random(n) < weights - whole)
    count = np.maximum(count, 1)  # the kept request itself is always there (adjusted counts are >= 1)
    gap = np.zeros(n, dtype=np.float64)
    cls = np.unique(weights if classes is None else classes, return_inverse=True)[1].ravel()
    for c in np.unique(cls):
        idx = np.flatnonzero(cls == c)
        if idx.size > 1:
            g = np.diff(arrivals[idx]).astype(np.float64)
            gap[idx] = np.concatenate([g, [g.mean()]])
    slot = np.repeat(np.arange(n, dtype=np.int64), count)  # the kept request whose gap each copy falls in
    offset = np.floor(rng.random(slot.size) * gap[slot]).astype(np.int64)
    first = np.zeros(slot.size, dtype=bool)
    first[np.concatenate([[0], np.cumsum(count)[:-1]])] = True  # the kept request itself, where it was
    offset[first] = 0
    # the others are requests of the same stream: a kept request of the class drawn at random (not the one of
    # the gap each time, which would repeat its service w times over and overstate how many run at once)
    order_c = np.argsort(cls, kind="stable")
    starts = np.searchsorted(cls[order_c], cls)  # first member of each request's class in order_c
    sizes = np.bincount(cls)[cls]
    src = slot.copy()
    extra = ~first
    src[extra] = order_c[starts[slot[extra]] + (rng.random(int(extra.sum())) * sizes[slot[extra]]).astype(np.int64)]
    at = arrivals[slot] + offset
    order = np.lexsort((~first, slot, at))
    return src[order], at[order]


def classes_of(replica: I64, weights: F64) -> I64:
    """An integer per (replica, adjusted count): the streams `expand` fills (one replica, one sampling rate)."""
    keys = np.stack([replica.astype(np.float64), weights], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


@dataclass
class Observed:
    """The replayed requests, by arrival (expanded when sampled): arrival, service, TTFT after the queue, end (ns);
    when sampled (or `read_observed(replicas=True)`) also when each entered service (arrival + queue wait) and
    its replica (an integer code: by name order when sampled, a hash of the name otherwise)."""

    arrivals: I64
    services: I64
    ttft_rest: F64
    ends: I64
    busy_from: I64
    replica: I64
    sampled: bool
    stored: int


def read_observed(con: duckdb.DuckDBPyConnection, since: str | int | datetime | None = None,
                  until: str | int | datetime | None = None, seed: int = EXPAND_SEED,
                  replicas: bool = False) -> Observed:
    """The requests starting in [since, until), by arrival, each sampled one expanded into what it stands for.

    Service = e2e minus critical-path queue wait (at least 0); TTFT after the queue = TTFT
    minus queue wait (at least 0; NaN without a TTFT). The one reader of the replayed workload.
    `replicas`: read each request's replica and service start also where nothing is sampled.
    """
    src = request_source(con, S.QUEUE_WAIT)
    lo, hi = parse_time(since), parse_time(until)
    where = "($1 IS NULL OR start_ns >= $1) AND ($2 IS NULL OR start_ns < $2)"
    weight = weight_where(con, src, where, [lo, hi])
    extra = (", start_ns + coalesce(queue_wait_ns, 0) AS busy_ns, coalesce(replica, '') AS replica, "
             "adjusted_count::DOUBLE AS w") if weight else ""  # unsampled: the query as it always was ...
    if replicas and not weight:  # ... unless asked for the replicas (the capacity replay's batches): an integer per
        # replica (its name's 63-bit hash) groups them without a million strings to read and sort
        extra = (", start_ns + coalesce(queue_wait_ns, 0) AS busy_ns, "
                 "(hash(coalesce(replica, '')) >> 1)::BIGINT AS replica_code")
    # by arrival, then by every column read: requests that arrive together come in one order whatever order the store
    # holds them in (the replay and the expansion of sampled requests depend on it)
    data = con.execute(
        f"SELECT start_ns, e2e_ns - coalesce(queue_wait_ns, 0) AS service_ns, "
        f"ttft_ns - coalesce(queue_wait_ns, 0) AS ttft_rest_ns, start_ns + e2e_ns AS end_ns{extra} FROM {src} "
        f"WHERE {where} ORDER BY ALL", [lo, hi]).fetchnumpy()
    arrivals = np.asarray(data["start_ns"], dtype=np.int64)
    services = np.maximum(np.asarray(data["service_ns"], dtype=np.int64), 0)
    rest = data["ttft_rest_ns"]
    ttft_rest = (np.ma.filled(np.ma.masked_invalid(np.ma.asarray(rest, dtype=np.float64)), np.nan)
                 if isinstance(rest, np.ma.MaskedArray) else np.asarray(rest, dtype=np.float64))
    ttft_rest = np.where(np.isnan(ttft_rest), np.nan, np.maximum(ttft_rest, 0.0))
    ends = np.asarray(data["end_ns"], dtype=np.int64)
    if weight is None:  # replicas and service starts are read by SQL where nothing is sampled (capacity)
        none = np.zeros(0, dtype=np.int64)
        if replicas:
            return Observed(arrivals, services, ttft_rest, ends, np.asarray(data["busy_ns"], dtype=np.int64),
                            np.asarray(data["replica_code"], dtype=np.int64), False, int(arrivals.size))
        return Observed(arrivals, services, ttft_rest, ends, none, none, False, int(arrivals.size))
    busy = np.asarray(data["busy_ns"], dtype=np.int64)
    replica = np.unique(np.asarray(data["replica"], dtype=object).astype(str), return_inverse=True)[1]
    weights = np.asarray(data["w"], dtype=np.float64)
    src_i, at = expand(arrivals, weights, classes_of(replica, weights), seed)
    shift = at - arrivals[src_i]
    return Observed(at, services[src_i], ttft_rest[src_i], ends[src_i] + shift, busy[src_i] + shift,
                    replica[src_i].astype(np.int64), True, int(arrivals.size))


def observed_requests(con: duckdb.DuckDBPyConnection, since: str | int | datetime | None = None,
                      until: str | int | datetime | None = None) -> tuple[I64, I64, F64, I64]:
    """The requests starting in [since, until), by arrival: (arrival ns, service ns, TTFT after the queue ns, end ns).

    `read_observed` without the rest: expanded by their adjusted counts when sampled.
    """
    o = read_observed(con, since, until)
    return o.arrivals, o.services, o.ttft_rest, o.ends


def _peak(starts: I64, durations: I64) -> int:
    return peak_concurrency(starts, starts + durations)


def peak_concurrency(starts: I64, ends: I64) -> int:
    """Most intervals [start, end) open at once (0 when none); one ending where another starts is not counted twice."""
    if not starts.size:
        return 0
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
