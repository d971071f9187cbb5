"""Capacity what-if with money: p99 (e2e, TTFT) and GPU cost per hour against the replica count.

The replay is analysis.whatif's: each request keeps its observed arrival and its service
time (e2e minus critical-path queue wait) and waits first come, first served for one of
replicas x slots servers. Predicted TTFT = predicted wait + observed (TTFT - queue wait).
The curve runs the replay once per replica count below the first count at which no request
waits (`zero_wait_servers`, exact, from one sort); every larger count gives the same latencies
(each request starts at its arrival), so those points are computed once. A Workload keeps the
points it has replayed, so a new target, metric or price replays nothing. The C kernel (built
by `pip install` from setup.py) makes a replay 0.1-0.25 s on 1.4 M requests (measured under load); the
Python loop of analysis.whatif.simulate gives the same numbers without it.

Service time against batch (`replay_batched`): where the traces show service time growing with the
batch (analysis.stats.batching: the whole interval of the growth per request of batch above 0), the
curve applies it. Each request's observed service s was served in its observed batch b_obs; it is
replayed as s x f(b) / f(b_obs), f(b) = 1 + g (b - small batch), b the batch it joins in the replayed
fleet: m requests in service when it begins, spread evenly over the replicas, so b = m // replicas + 1
(at most the slots). g is the measured growth per request; the fewest replicas is also found at the
ends of g's interval. Otherwise the service times stay fixed and the curve says why. The What-if page's
prediction (`predict_at`, any slots per replica) and the scale-up comparison replay the same way
(`service_model` decides for all three).

Scale-up (`reactive`): start from `replicas` and, whenever a request arrives to find every
slot busy and no replica already starting, start one more (up to `max_replicas`); it serves
after `cold_start_ns`, taken from the observed model_load spans (their median). Added
replicas stay up to the end of the range (no scale-down), so its GPU cost is an upper bound.
Pre-scaling is the static curve: the replicas are there before the traffic. With the relation
(`reactive_batched`), a request's batch spreads the requests in service over the replicas serving
when it begins (a replica in its cold start serves nothing).
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import math
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Final

import duckdb
import numpy as np
import numpy.typing as npt

from analysis import breakdowns as B
from analysis.engine.percentiles import parse_time
from analysis.kernel import load_kernel
from analysis.stats import batching
from analysis.whatif import peak_concurrency, read_observed, simulate
from tracing import schema as S

I64 = npt.NDArray[np.int64]
#: Version of the capacity JSON shape (`capacity_curve`): 2 adds the service model (`service`).
CAPACITY_VERSION: Final = 2


def replay(arrivals: I64, services: I64, servers: int, kernel: ctypes.CDLL | None = None,
           checked: bool = False, out: I64 | None = None) -> I64:
    """Latency of each request through `servers` FIFO servers; arrivals sorted ascending (the C kernel's input).

    `checked`: the caller has already verified sorted arrivals and non-negative services (a Workload). `out`: where
    the C kernel writes the latencies (a Workload's `buffers`), else a new array.
    """
    if servers < 1:
        raise ValueError("servers must be at least 1")
    lib = kernel if kernel is not None else load_kernel()
    if lib is None:
        return simulate(arrivals, services, servers)
    a = np.ascontiguousarray(arrivals, dtype=np.int64)
    s = np.ascontiguousarray(services, dtype=np.int64)
    if not checked and a.size and np.any(np.diff(a) < 0):
        raise ValueError("arrivals must be sorted")
    if not checked and np.any(s < 0):
        raise ValueError("service times must be non-negative")
    out = np.empty(a.size, dtype=np.int64) if out is None else out
    heap = np.empty(max(1, min(servers, a.size)), dtype=np.int64)
    p = ctypes.POINTER(ctypes.c_int64)
    rc = lib.fifo_replay(a.ctypes.data_as(p), s.ctypes.data_as(p), a.size, int(servers), out.ctypes.data_as(p),
                         heap.ctypes.data_as(p))
    if rc != 0:
        raise ValueError("the replay kernel refused its input")
    return out


def zero_wait_servers(arrivals: I64, services: I64) -> int:
    """Fewest FIFO servers with which no request waits (arrivals sorted): 1 + the most still in service at an arrival.

    With no request waiting, every request starts at its arrival a and ends at e = a + s, so
    request j finds busy exactly the earlier requests i < j with e_i > a_j (each the last on its
    own server), and it waits iff those fill every server. Counted with one sort of the ends:
    #{i < j: e_i <= a_j} = #{all i: e_i <= a_j} - #{i >= j: a_i = a_j, s_i = 0}.
    #{all i: e_i <= a_j} for every j at once: the ends and the arrivals, both sorted, merged by one stable sort (the
    ends first among equals), a_j's place in it less j. Both sorts are adaptive ones (a stable sort of runs already
    in order: the ends run nearly in arrival order), a few times cheaper here than a sort of arbitrary order and a
    binary search per arrival.
    """
    n = int(arrivals.size)
    if n == 0:
        return 1
    a = np.asarray(arrivals, dtype=np.int64)
    s = np.asarray(services, dtype=np.int64)
    merged = np.argsort(np.concatenate([np.sort(a + s, kind="stable"), a]), kind="stable")
    place = np.empty(2 * n, dtype=np.int64)
    place[merged] = np.arange(2 * n)
    ended = place[n:] - np.arange(n)
    zeros_from = np.concatenate([np.cumsum((s == 0)[::-1])[::-1], [0]])  # zero-service requests at index >= j
    group_end = np.searchsorted(a, a, side="right")  # first index after a_j's tie group
    ended_before = ended - (zeros_from[:n] - zeros_from[group_end])
    return int((np.arange(n) - ended_before).max()) + 1


def replay_batched(arrivals: I64, base: npt.NDArray[np.float64], servers: int, replicas: int,
                   table: npt.NDArray[np.float64], kernel: ctypes.CDLL | None = None,
                   out: tuple[I64, I64] | None = None) -> tuple[I64, I64]:
    """Latency and service of each request through `servers` FIFO servers when service depends on the batch joined.

    Request j begins at max(arrival, the earliest free server); with m requests in service then its batch is
    b = min(m // replicas + 1, len(table) - 1) and its service int(base[j] * table[b]). Arrivals sorted. `out`: as
    `replay`'s, for both.
    """
    if servers < 1 or replicas < 1 or table.size < 2:
        raise ValueError("need servers >= 1, replicas >= 1 and a table of at least 2 factors")
    a = np.ascontiguousarray(arrivals, dtype=np.int64)
    b = np.ascontiguousarray(base, dtype=np.float64)
    t = np.ascontiguousarray(table, dtype=np.float64)
    lib = kernel if kernel is not None else load_kernel()
    if lib is None or not hasattr(lib, "batch_replay"):
        return replay_batched_py(a, b, servers, replicas, t)
    lat, svc = out if out is not None else (np.empty(a.size, dtype=np.int64), np.empty(a.size, dtype=np.int64))
    m = max(1, min(servers, a.size))
    heap, ends = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    p, d = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)
    rc = lib.batch_replay(a.ctypes.data_as(p), b.ctypes.data_as(d), a.size, int(servers), int(replicas),
                          t.ctypes.data_as(d), t.size, lat.ctypes.data_as(p), svc.ctypes.data_as(p),
                          heap.ctypes.data_as(p), ends.ctypes.data_as(p))
    if rc != 0:
        raise ValueError("the replay kernel refused its input")
    return lat, svc


def replay_batched_py(a: I64, base: npt.NDArray[np.float64], servers: int, replicas: int,
                       table: npt.NDArray[np.float64]) -> tuple[I64, I64]:
    """`replay_batched` in Python (no C kernel): the same loop, the same numbers."""
    a_list, b_list, tab = a.tolist(), base.tolist(), table.tolist()
    top = len(tab) - 1
    lat, svc = [0] * len(a_list), [0] * len(a_list)
    free = [a_list[0] if a_list else 0] * max(1, min(servers, len(a_list)))
    ends: list[int] = []
    for j, (arr, bj) in enumerate(zip(a_list, b_list, strict=True)):
        t = free[0]
        begin = arr if arr > t else t
        while ends and ends[0] <= begin:
            heapq.heappop(ends)
        s = int(bj * tab[min(len(ends) // replicas + 1, top)])
        heapq.heapreplace(free, begin + s)
        heapq.heappush(ends, begin + s)
        lat[j], svc[j] = begin + s - arr, s
    return np.asarray(lat, dtype=np.int64), np.asarray(svc, dtype=np.int64)


#: Sets of replay arrays (`Workload.buffers`) a workload keeps once no replay runs: one set is 24 bytes a request
#: (34 MiB at 1.4 M requests), as much as the workload's own arrays; a cache of workloads holds no more.
SPARE_BUFFERS = 1


class Workload:
    """The observed requests in a range, sorted by arrival: arrival, service and TTFT-after-queue (ns)."""

    def __init__(self, arrivals: I64, services: I64, ttft_rest: npt.NDArray[np.float64], slots: int,
                 observed_replicas: int, cold_start_ns: int | None, span_ns: int) -> None:
        self.arrivals = np.ascontiguousarray(arrivals, dtype=np.int64)
        self.services = np.ascontiguousarray(services, dtype=np.int64)
        if self.arrivals.size and np.any(np.diff(self.arrivals) < 0):
            raise ValueError("arrivals must be sorted")
        if np.any(self.services < 0):
            raise ValueError("service times must be non-negative")
        self.ttft_rest = ttft_rest
        self.ttft_rows = np.flatnonzero(~np.isnan(ttft_rest))  # requests with a TTFT
        self.ttft_all = self.ttft_rows.size == ttft_rest.size
        self.slots, self.observed_replicas = slots, observed_replicas
        self.cold_start_ns, self.span_ns = cold_start_ns, span_ns
        self.points: dict[int, dict[str, Any]] = {}  # replicas -> `point` without a price (a memo)
        #: (replicas, slots, g) -> a replay's point: with the relation (g), or with fixed service times (g None) at
        #: another slot count than `slots` (the What-if page's)
        self.replays: dict[tuple[int, int, float | None], dict[str, Any]] = {}
        self.batches: I64 | None = None  # each request's observed batch (analysis.stats.batching.request_batches)
        self.relation: dict[str, Any] | None = None  # the measured relation of service time to batch
        self.sampled = False  # expanded from sampled traces (analysis.whatif.expand) ...
        self.stored = int(self.arrivals.size)  # ... of this many stored requests
        #: (replicas, g, metric) -> (p99 ms, True) of a replay with the relation, or (x, False): its p99 is above x
        #: (`batched_meets`: the search for the fewest count, at counts the curve does not draw)
        self.checks: dict[tuple[int, float, str], tuple[float | None, bool]] = {}
        self._zero_wait: int | None = None
        self._scaled: dict[float, npt.NDArray[np.float64]] = {}  # g -> scaled_services (every count replays it)
        self._spare: list[tuple[I64, I64, I64]] = []  # `buffers` not in use
        self._borrowed = 0  # `buffers` lent now
        self._spare_lock = threading.Lock()

    @contextlib.contextmanager
    def buffers(self) -> Iterator[tuple[I64, I64, I64]]:
        """Three arrays of `size` int64 for one replay's latencies, services and TTFTs (`kernel_quantiles`), lent to
        one thread at a time and kept for the next replay: fresh arrays of millions cost more in page faults than
        the quantiles that read them. While replays run (a curve's, one per core) every returned set is kept for the
        next; once none runs, SPARE_BUFFERS sets stay, however many threads replayed at once."""
        with self._spare_lock:
            got = self._spare.pop() if self._spare else None
            self._borrowed += 1
        if got is None:
            got = (np.empty(self.size, np.int64), np.empty(self.size, np.int64), np.empty(self.size, np.int64))
        try:
            yield got
        finally:
            with self._spare_lock:
                self._borrowed -= 1
                self._spare.append(got)
                if not self._borrowed:
                    del self._spare[SPARE_BUFFERS:]

    @property
    def zero_wait_replicas(self) -> int:
        """Fewest replicas (of `slots` servers) with which no request waits; every larger count replays the same."""
        if self._zero_wait is None:
            self._zero_wait = -(-zero_wait_servers(self.arrivals, self.services) // self.slots)
        return self._zero_wait

    @property
    def size(self) -> int:
        """Number of requests."""
        return int(self.arrivals.size)


def observed_workload(con: duckdb.DuckDBPyConnection, since: str | int | datetime | None = None,
                      until: str | int | datetime | None = None) -> Workload:
    """The requests starting in [since, until) (analysis.whatif.observed_requests), the observed slots and cold start.

    Slots: the most requests one replica served at once (analysis.breakdowns.peak_concurrency's count). Each
    request's observed batch (analysis.stats.batching.request_batches) counts its replica's requests in service when
    it began, so the largest batch is that count, taken from the rows read instead of a second query (a window over
    every request: 1.6 CPU-s at 10 M spans); a replica NULL and one named '' are one replica here, as in the batches.
    For sampled traces the same count over the expanded workload (analysis.whatif.expand). Also the relation of
    service time to batch (analysis.stats.batching).
    """
    lo, hi = parse_time(since), parse_time(until)
    o = read_observed(con, lo, hi, replicas=True)
    arrivals, services, ttft_rest = o.arrivals, o.services, o.ttft_rest
    where = "(?::BIGINT IS NULL OR start_ns >= ?) AND (?::BIGINT IS NULL OR start_ns < ?)"
    batches = (batching.request_batches(o.replica, o.busy_from, o.ends) if o.replica.size == arrivals.size
               else None)
    if o.sampled:  # the slots of the expanded workload: the most one replica served at once
        slots = max([1, *(peak_concurrency(o.busy_from[o.replica == r], o.ends[o.replica == r])
                          for r in np.unique(o.replica))])
    elif batches is not None and batches.size:
        slots = int(batches.max())  # each at least 1
    else:
        slots = B.peak_concurrency(con, "requests", where, [lo, lo, hi, hi])
    row = con.execute(f"SELECT count(DISTINCT replica) FROM requests WHERE {where}", [lo, lo, hi, hi]).fetchall()[0]
    replicas = max(1, int(row[0])) if row[0] else 1
    load = con.execute(
        f"SELECT quantile_cont(Duration, 0.5) FROM spans WHERE Stage = '{S.MODEL_LOAD}' "
        "AND ($1 IS NULL OR TimestampNs >= $1) AND ($2 IS NULL OR TimestampNs < $2)", [lo, hi]).fetchall()[0]
    cold = round(float(load[0])) if load[0] is not None else None
    span = (int(arrivals[-1] - arrivals[0]) if arrivals.size else 0)
    if lo is not None and hi is not None:
        span = hi - lo
    w = Workload(arrivals, services, ttft_rest, slots, replicas, cold, max(span, 1))
    w.sampled, w.stored = o.sampled, o.stored
    if batches is not None:
        w.batches = batches
        w.relation = batching.relation(batches, services)
    return w


def _q_ms(values: npt.NDArray[Any], qs: Sequence[float]) -> list[float | None]:
    """quantile_cont (linear) of the non-NaN values at each q, in ms; by partition, not a full sort."""
    v = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    if not v.size:
        return [None for _ in qs]
    return [round(float(x) / 1e6, 3) for x in np.quantile(v, list(qs), method="linear")]


def _p99_ms(values: npt.NDArray[np.float64]) -> float | None:
    return _q_ms(values, [0.99])[0]


def point(w: Workload, replicas: int, gpu_hour_usd: float | None = None,
          kernel: ctypes.CDLL | None = None) -> dict[str, Any]:
    """p50 / p99 e2e and p99 TTFT (ms) with `replicas` x slots FIFO servers, and the GPU cost per hour.

    Kept in `w.points`; from `w.zero_wait_replicas` on, the one no-wait replay serves every count.
    """
    replicas = int(replicas)
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    base = w.points.get(replicas)
    if base is None:
        at = replicas if replicas < w.zero_wait_replicas else w.zero_wait_replicas
        base = w.points.get(at)
        if base is None:
            base = replayed(w, at, kernel)
            w.points[at] = base
        if at != replicas:
            base = {**base, "replicas": replicas, "servers": replicas * w.slots}
            w.points[replicas] = base
    return {**base, "gpu_usd_per_hour": None if gpu_hour_usd is None else replicas * gpu_hour_usd}


def replayed(w: Workload, replicas: int, kernel: ctypes.CDLL | None) -> dict[str, Any]:
    """`point` without its price: one replay through replicas x slots servers."""
    if not _has_stats(kernel):
        return _latencies(w, replicas, replay(w.arrivals, w.services, replicas * w.slots, kernel, checked=True),
                          w.services)
    with w.buffers() as (lat, _, tvals):
        lat = replay(w.arrivals, w.services, replicas * w.slots, kernel, checked=True, out=lat)
        return _latencies(w, replicas, lat, w.services, tvals=tvals)


def service_model(w: Workload, service: str = "auto") -> dict[str, Any]:
    """Which service times the curve replays, and the assumption in words (the headline's "If ...").

    `service`: "auto" applies the measured relation where the traces show growth (its interval above 0),
    "fixed" keeps the observed service times. Returns {"applied", "assumption", "relation"}.
    """
    if service not in ("auto", "fixed"):
        raise ValueError("service must be auto or fixed")
    rel = w.relation
    if service == "fixed":
        return {"applied": False, "assumption": "service times stay as observed", "relation": rel}
    if rel is None:
        return {"applied": False, "relation": None, "assumption": (
            "service times stay as observed (the traces cannot show how service time changes with the batch: "
            f"fewer than two batch sizes joined by {batching.MIN_REQUESTS} requests or more each)")}
    g, lo, hi = rel["growth_per_request"], rel["growth_per_request_low"], rel["growth_per_request_high"]
    span = f"{g:+.1%} per request of batch, 90% interval {lo:+.1%} to {hi:+.1%}"
    if not rel["shown"]:
        return {"applied": False, "relation": rel, "assumption": (
            f"service times stay as observed (the traces do not show growth with the batch: {span})")}
    return {"applied": True, "relation": rel, "assumption": (
        f"service time grows with the batch as measured in the traces ({span}; median "
        f"{rel['small_service_ms']:,.0f} ms in batches of {rel['small_batch']:,.0f}, {rel['large_service_ms']:,.0f} "
        f"ms in batches of {rel['large_batch']:,.0f})")}


def point_batched(w: Workload, replicas: int, g: float, gpu_hour_usd: float | None = None,
                  kernel: ctypes.CDLL | None = None, slots: int | None = None) -> dict[str, Any]:
    """`point` with service times scaled by the measured relation (growth per request of batch `g`): `replay_batched`.

    `slots`: per replica (default: the observed `w.slots`; a batch is at most this). Kept in `w.replays`. Needs
    `w.relation` and `w.batches` (observed_workload).
    """
    replicas, slots = int(replicas), int(slots or w.slots)
    if replicas < 1 or slots < 1:
        raise ValueError("replicas and slots must be at least 1")
    if w.relation is None or w.batches is None:
        raise ValueError("the workload has no measured relation of service time to batch")
    base = w.replays.get((replicas, slots, g))
    if base is None:
        with w.buffers() as (lat, svc, tvals):
            lat, svc = replay_batched(w.arrivals, scaled_services(w, g), replicas * slots, replicas,
                                      batch_table(w, g, slots), kernel, (lat, svc))
            base = _latencies(w, replicas, lat, svc, slots, tvals)
        w.replays[(replicas, slots, g)] = base
    return {**base, "gpu_usd_per_hour": None if gpu_hour_usd is None else replicas * gpu_hour_usd}


def scaled_services(w: Workload, g: float) -> npt.NDArray[np.float64]:
    """Each request's service at the smallest batch size by the relation (growth `g`): s / f(b_obs)."""
    assert w.relation is not None and w.batches is not None
    got = w._scaled.get(g)
    if got is None:
        got = w._scaled[g] = w.services / batching.factor(w.relation, w.batches, g)
    return got


def batch_table(w: Workload, g: float, slots: int | None = None) -> npt.NDArray[np.float64]:
    """f(b) for b = 0 .. slots (the replays' batch -> service factor); b = 0 is never used."""
    assert w.relation is not None
    return batching.factor(w.relation, np.arange(int(slots or w.slots) + 1), g)


def _fixed_at(w: Workload, replicas: int, slots: int, kernel: ctypes.CDLL | None = None) -> dict[str, Any]:
    """`point` (fixed service times) at `slots` per replica: the memo of `point` when they are the observed slots."""
    if slots == w.slots:
        return point(w, replicas, None, kernel)
    base = w.replays.get((replicas, slots, None))
    if base is None:
        with w.buffers() as (lat, _, tvals):
            lat = replay(w.arrivals, w.services, replicas * slots, kernel, checked=True, out=lat)
            base = _latencies(w, replicas, lat, w.services, slots, tvals)
        w.replays[(replicas, slots, None)] = base
    return {**base, "gpu_usd_per_hour": None}


def predict_at(w: Workload, replicas: int, slots: int | None = None, service: str = "auto",
               kernel: ctypes.CDLL | None = None) -> dict[str, Any]:
    """The What-if page's prediction: p50 / p99 e2e and p99 TTFT (ms) with `replicas` x `slots` FIFO servers.

    The same replay as the capacity curve (`service_model`): with the measured relation of service time to batch
    where the traces show it (`point_batched`), else with fixed service times. Returns the point with
    "service" ({"applied", "assumption", "relation"}) and "fixed" (the fixed-time point when the relation was
    applied, else None).
    """
    slots = int(slots or w.slots)
    model = service_model(w, service)
    fixed = _fixed_at(w, replicas, slots, kernel)
    if not model["applied"]:
        return {**fixed, "service": model, "fixed": None}
    got = point_batched(w, replicas, model["relation"]["growth_per_request"], None, kernel, slots)
    return {**got, "service": model, "fixed": fixed}


def _latencies(w: Workload, replicas: int, lat: I64, services: I64, slots: int | None = None,
               tvals: I64 | None = None) -> dict[str, Any]:
    """A point's p50 / p99 e2e and p99 TTFT (ms) from replayed latencies and the services they ran (`tvals`: the
    kernel's scratch for the TTFTs)."""
    got = _kernel_q_ms(w, lat, services, [0.5, 0.99], 0.99, tvals)
    if got is not None:
        (p50, p99), ttft_p99 = got
    else:
        p50, p99 = _q_ms(lat, [0.5, 0.99])
        if w.ttft_all:
            ttft = (lat - services) + w.ttft_rest
        else:
            ttft = (lat[w.ttft_rows] - services[w.ttft_rows]) + w.ttft_rest[w.ttft_rows]
        ttft_p99 = _q_ms(ttft, [0.99])[0]
    return {"replicas": replicas, "servers": replicas * int(slots or w.slots), "p50_ms": p50, "p99_ms": p99,
            "ttft_p99_ms": ttft_p99}


def _ranks(n: int, q: float) -> tuple[int, int, float]:
    """numpy's linear quantile of n > 0 sorted values at q: the two ranks it interpolates between and the weight."""
    virtual = (n - 1) * q
    lo = min(max(math.floor(virtual), 0), n - 1)
    return lo, min(lo + 1, n - 1), virtual - lo


def _lerp_ms(lo: float, hi: float, gamma: float, dtype: type) -> float:
    """`_q_ms`'s value between two order statistics: numpy's own interpolation (the same rounding), in ms."""
    return round(float(np.quantile(np.array([lo, hi], dtype=dtype), [gamma], method="linear")[0]) / 1e6, 3)


def _has_stats(kernel: ctypes.CDLL | None) -> bool:
    """Whether `kernel` (else the loaded one) has `point_stats` (a library built before it has not)."""
    lib = kernel if kernel is not None else load_kernel()
    return lib is not None and hasattr(lib, "point_stats")


def kernel_quantiles(lat: I64, services: I64, ttft_rest: npt.NDArray[np.float64] | None, qs: Sequence[float],
                     ttft_qs: Sequence[float], kernel: ctypes.CDLL, tvals: I64 | None = None,
                     ttft_count: int | None = None) -> tuple[list[float], list[float | None]]:
    """numpy's linear quantiles (ms, as `_q_ms`) of `lat` at `qs` and of the TTFTs (lat - services) + ttft_rest
    (where ttft_rest is not NaN) at `ttft_qs`, from the C kernel's order statistics (`point_stats`): no copy of the
    values is sorted or partitioned, so a point of millions of requests costs a few passes over them. `tvals`: the
    kernel's scratch for the TTFTs (lat.size int64), else a new array; `ttft_count`: how many ttft_rest are not NaN,
    when the caller knows."""
    n = int(lat.size)
    lat = np.ascontiguousarray(lat, dtype=np.int64)
    svc = np.ascontiguousarray(services, dtype=np.int64)
    rest = None if ttft_rest is None or not ttft_qs else np.ascontiguousarray(ttft_rest, dtype=np.float64)
    nt = 0 if rest is None else ttft_count if ttft_count is not None else int(np.count_nonzero(~np.isnan(rest)))
    lat_r = [_ranks(n, q) for q in qs]
    ttft_r = [_ranks(nt, q) for q in ttft_qs] if nt else []
    ranks = np.array([k for r in lat_r for k in r[:2]] or [0], dtype=np.int64)
    tranks = np.array([k for r in ttft_r for k in r[:2]] or [0], dtype=np.int64)
    out, tout = np.empty(ranks.size, dtype=np.int64), np.empty(tranks.size, dtype=np.float64)
    if tvals is None or tvals.size < n:
        tvals = np.empty(max(n, 1) if rest is not None else 1, np.int64)
    p, d = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)
    rc = kernel.point_stats(lat.ctypes.data_as(p), svc.ctypes.data_as(p),
                            None if rest is None else rest.ctypes.data_as(d), n, ranks.ctypes.data_as(p), len(lat_r),
                            tranks.ctypes.data_as(p), len(ttft_r), out.ctypes.data_as(p), tout.ctypes.data_as(d),
                            tvals.ctypes.data_as(p))
    if rc != nt:
        raise ValueError("the quantile kernel refused its input")
    got = [_lerp_ms(int(out[2 * i]), int(out[2 * i + 1]), r[2], np.int64) for i, r in enumerate(lat_r)]
    tgot: list[float | None] = [_lerp_ms(float(tout[2 * i]), float(tout[2 * i + 1]), r[2], np.float64)
                                for i, r in enumerate(ttft_r)]
    return got, tgot if nt else [None for _ in ttft_qs]


def _kernel_q_ms(w: Workload, lat: I64, services: I64, qs: Sequence[float], ttft_q: float | None,
                 tvals: I64 | None = None) -> tuple[list[float | None], float | None] | None:
    """`kernel_quantiles` of a replay of `w` (e2e at `qs`, TTFT at `ttft_q`), or None without the C kernel (or for
    no requests): the caller's numpy path gives the same numbers."""
    lib = load_kernel()
    if lib is None or not hasattr(lib, "point_stats") or not lat.size:
        return None
    got, tgot = kernel_quantiles(lat, services, w.ttft_rest, qs, [] if ttft_q is None else [ttft_q], lib, tvals,
                                 int(w.ttft_rows.size))
    return list(got), (tgot[0] if tgot else None)


def _fewest(meets: Any, counts: Sequence[int], scan: bool = True) -> int | None:
    """Fewest count in 1 .. counts[-1] that meets the target when p99 does not rise with the count (fixed service
    times: waits through FIFO servers only shrink when servers are added): bisection, narrowed by the curve's own
    points first when `scan` (they are replayed anyway); None when the largest misses it."""
    if not counts or not meets(counts[-1]):
        return None
    lo, hi = 0, counts[-1]  # meets(hi), not meets(lo) (0 replicas serve nothing)
    for r in counts if scan else ():
        if meets(r):
            hi = r
            break
        lo = r
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _fewest_scanned(meets: Any, largest: int) -> int | None:
    """Fewest count in 1 .. largest that meets the target, whatever the curve's shape: with the batch relation p99
    can rise when a replica is added (a request that no longer waits may join a larger batch), so every count is
    tried in turn (`batched_meets` stops a replay once its p99 is sure to miss)."""
    return next((r for r in range(1, largest + 1) if meets(r)), None)


def _replay_p99s(w: Workload, lat: I64, services: I64) -> tuple[float | None, float | None]:
    """p99 (ms) of e2e and of TTFT from replayed latencies and the services they ran: the C kernel's order statistics
    where built (`_kernel_q_ms`: no sorted copy of millions of values), else numpy's quantiles (the same numbers)."""
    got = _kernel_q_ms(w, lat, services, [0.99], 0.99)
    if got is not None:
        return got[0][0], got[1]
    return _p99_ms(lat.astype(np.float64)), _p99_ms((lat - services).astype(np.float64) + w.ttft_rest)


def _metric_p99(w: Workload, lat: I64, services: I64, metric: str, tvals: I64 | None = None) -> float | None:
    """p99 (ms) of e2e or TTFT from replayed latencies and the services they ran (as `_latencies`)."""
    got = _kernel_q_ms(w, lat, services, [0.99] if metric == "e2e" else [], None if metric == "e2e" else 0.99,
                       tvals)
    if got is not None:
        return got[0][0] if metric == "e2e" else got[1]
    if metric == "e2e":
        return _q_ms(lat, [0.99])[0]
    rows = slice(None) if w.ttft_all else w.ttft_rows
    return _q_ms((lat[rows] - services[rows]) + w.ttft_rest[rows], [0.99])[0]


def batched_meets(w: Workload, replicas: int, g: float, target_p99_ms: float, metric: str = "e2e",
                  kernel: ctypes.CDLL | None = None) -> bool:
    """Whether `metric`'s p99 with the relation `g` at `replicas` (observed slots) is at most the target (ms), as
    `point_batched`'s rounded p99 compares: read from its point when replayed, else one replay that, for e2e with
    the C kernel, stops once more latencies are above the target than the 99th percentile's rank allows
    (`batch_exceeds`). Kept in `w.checks`: the p99, or a value it is known to exceed."""
    replicas = int(replicas)
    done = w.replays.get((replicas, w.slots, g))
    if done is not None:
        v = done["p99_ms" if metric == "e2e" else "ttft_p99_ms"]
        return v is not None and v <= target_p99_ms  # type: ignore[no-any-return]
    key = (replicas, g, metric)
    known = w.checks.get(key)
    if known is not None:
        value, exact = known
        if exact:
            return value is not None and value <= target_p99_ms
        if target_p99_ms <= value:  # type: ignore[operator]
            return False
    lib = kernel if kernel is not None else load_kernel()
    base, table = scaled_services(w, g), batch_table(w, g)
    early = metric == "e2e" and lib is not None and hasattr(lib, "batch_exceeds") and math.isfinite(target_p99_ms)
    with w.buffers() as (lat, svc, tvals):
        if early and w.size:
            # v[k] > limit (k = the 99th percentile's lower rank, numpy's linear rule) puts p99 above the target by
            # more than its rounding (0.0005 ms), so a miss is sure once n - k latencies exceed the limit
            limit = math.floor((target_p99_ms + 0.001) * 1e6) + 1
            allowed = w.size - math.floor(0.99 * (w.size - 1))
            a = np.ascontiguousarray(w.arrivals, dtype=np.int64)
            ends = np.empty(max(1, min(replicas * w.slots, a.size)), dtype=np.int64)
            p, d = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)
            b, t = np.ascontiguousarray(base, dtype=np.float64), np.ascontiguousarray(table, dtype=np.float64)
            rc = lib.batch_exceeds(a.ctypes.data_as(p), b.ctypes.data_as(d), a.size,  # type: ignore[union-attr]
                                   replicas * w.slots, replicas, t.ctypes.data_as(d), t.size, limit, allowed,
                                   lat.ctypes.data_as(p), svc.ctypes.data_as(p), ends.ctypes.data_as(p))
            if rc < 0:
                raise ValueError("the replay kernel refused its input")
            if rc == 1:
                w.checks[key] = (target_p99_ms, False)
                return False
        else:
            lat, svc = replay_batched(w.arrivals, base, replicas * w.slots, replicas, table, lib, (lat, svc))
        value = _metric_p99(w, lat, svc, metric, tvals)
    w.checks[key] = (value, True)
    return value is not None and value <= target_p99_ms


def drawn_counts(max_replicas: int, observed_replicas: int, kernel: bool = True) -> list[int]:
    """The replica counts a curve is drawn at: every count to 16, then every 4th, the largest and the observed
    count (with the measured batch relation each count is a replay of its own, and the curve flattens); without
    the C kernel only powers of two. The fewest count for a target is exact whichever are drawn (bisection)."""
    if not kernel:
        return sorted({1, 2, 4, 8, 16, 32, max_replicas, observed_replicas})
    return sorted({*range(1, min(16, max_replicas) + 1), *range(20, max_replicas + 1, 4), max_replicas,
                   observed_replicas})


def capacity_curve(w: Workload, replicas: Sequence[int] = tuple(range(1, 65)), target_p99_ms: float | None = None,
                   metric: str = "e2e", gpu_hour_usd: float | None = None, service: str = "auto") -> dict[str, Any]:
    """The curve of `point` over `replicas` and the fewest replicas whose p99 (`metric`: e2e or ttft) meets the target.

    `service` (`service_model`): "auto" replays with the measured relation of service time to batch where the
    traces show it (`point_batched`; then also the fixed-time curve, `fixed_points`, and the fewest count at the
    ends of the relation's interval, `fewest_interval`), "fixed" with the observed service times.
    Waits through FIFO servers only shrink when servers are added, so with fixed service times p99 does not rise
    with the count: the fewest count is found by bisection over 1 .. max(replicas) (points outside the curve are
    replayed too). With the relation it can rise (a request that no longer waits may join a larger batch), so
    every count from 1 is tried in turn (`batched_meets`: a replay stops once it is sure to miss). None when no
    count up to the largest meets it.
    """
    if metric not in ("e2e", "ttft"):
        raise ValueError("metric must be e2e or ttft")
    model = service_model(w, service)
    col = "p99_ms" if metric == "e2e" else "ttft_p99_ms"
    counts = sorted({int(r) for r in replicas})
    parallel = load_kernel() is not None  # the C kernel releases the GIL: one replay per core

    def under(v: float | None) -> bool:
        return v is not None and target_p99_ms is not None and v <= target_p99_ms

    rel = model["relation"] if model["applied"] else None

    def fewest_at(g: float) -> int | None:
        """The fewest count with the relation at growth g: scanned, not bisected (p99 may rise)."""
        return _fewest_scanned(lambda r: batched_meets(w, r, g, float(target_p99_ms), metric),  # type: ignore[arg-type]
                               counts[-1] if counts else 0)

    # every replay the answer needs, at once (one per core): the searches at the ends of the relation's interval
    # first (each a chain of replays, one after the other), then the fixed-time counts up to the first without a
    # wait and, with the relation, every count of the curve; the points are then read from the workload's memos
    ends: dict[str, int | None] = {}
    jobs: list[Any] = []
    if rel is not None and target_p99_ms is not None:
        jobs += [lambda end=end: ends.__setitem__(end, fewest_at(rel[end]))
                 for end in ("growth_per_request_low", "growth_per_request_high")]
    jobs += [lambda r=r: point(w, r) for r in sorted({min(r, w.zero_wait_replicas) for r in counts} - set(w.points))]
    if rel is not None:
        jobs += [lambda r=r: point_batched(w, r, rel["growth_per_request"]) for r in counts]
    if parallel and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
            for done in [pool.submit(job) for job in jobs]:
                done.result()
    else:
        for job in jobs:
            job()
    fixed_points = [point(w, r, gpu_hour_usd) for r in counts]
    fixed_fewest = (_fewest(lambda r: under(point(w, r)[col]), counts) if target_p99_ms is not None else None)
    points, fewest, interval = fixed_points, fixed_fewest, None
    if rel is not None:
        points = [point_batched(w, r, rel["growth_per_request"], gpu_hour_usd) for r in counts]
        fewest = None
        if target_p99_ms is not None:
            fewest = fewest_at(rel["growth_per_request"])
            interval = [ends["growth_per_request_low"], ends["growth_per_request_high"]]
    return {"version": CAPACITY_VERSION, "requests": w.size, "sampled": w.sampled, "stored_requests": w.stored,
            "slots_per_replica": w.slots,
            "observed_replicas": w.observed_replicas, "metric": metric, "target_p99_ms": target_p99_ms,
            "fewest_replicas": fewest, "gpu_hour_usd": gpu_hour_usd, "points": points,
            "service": {"batch_relation_applied": model["applied"], "assumption": model["assumption"],
                        "relation": model["relation"], "fewest_interval": interval,
                        "fixed_points": fixed_points if model["applied"] else None,
                        "fixed_fewest_replicas": fixed_fewest},
            "advice": advice(w.observed_replicas, fewest, counts[-1] if counts else 0, target_p99_ms, metric,
                             gpu_hour_usd)}


#: Each replayed metric's name in a sentence (the Capacity page's choices too).
METRIC_NAMES = {"e2e": "end-to-end", "ttft": "TTFT"}


def advice(observed: int, fewest: int | None, largest: int, target_p99_ms: float | None, metric: str,
           gpu_hour_usd: float | None) -> dict[str, Any] | None:
    """What the fewest count means against the observed fleet: scale down, scale up or keep, in a sentence.

    `change` is "scale down" when fewer replicas than observed hold the target (by how many and,
    with a price, what that saves per hour), "scale up" when more are needed, "keep" when the
    observed count is the fewest, "none holds" when no count up to `largest` does.
    """
    if target_p99_ms is None:
        return None
    goal = f"p99 {METRIC_NAMES.get(metric, metric)} <= {target_p99_ms:,.0f} ms"
    out: dict[str, Any] = {"change": None, "observed_replicas": observed, "fewest_replicas": fewest,
                           "replicas_delta": None, "usd_per_hour_delta": None}
    if fewest is None:
        out["change"] = "none holds"
        out["sentence"] = f"no count up to {largest} replicas holds {goal} on the observed traffic"
        return out
    delta = fewest - observed
    out["replicas_delta"] = delta
    out["usd_per_hour_delta"] = None if gpu_hour_usd is None else delta * gpu_hour_usd
    money = "" if gpu_hour_usd is None else f" (${abs(delta) * gpu_hour_usd:,.2f}/h {'less' if delta < 0 else 'more'})"
    if delta < 0:
        out["change"] = "scale down"
        out["sentence"] = (f"scale down: {fewest} replicas hold {goal}, {-delta} fewer than the {observed} "
                           f"observed{money}")
    elif delta > 0:
        out["change"] = "scale up"
        out["sentence"] = f"scale up: {goal} needs {fewest} replicas, {delta} more than the {observed} observed{money}"
    else:
        out["change"] = "keep"
        out["sentence"] = f"keep: the {observed} observed replicas are the fewest that hold {goal}"
    return out


def reactive(arrivals: I64, services: I64, slots: int, replicas: int, max_replicas: int,
             cold_start_ns: int) -> tuple[I64, list[int]]:
    """Replay with reactive scale-up: latencies and the start times of the replicas added.

    Arrivals sorted ascending. At an arrival that finds every slot busy, with no replica
    starting and fewer than `max_replicas`, one replica starts; its `slots` servers are free
    from arrival + `cold_start_ns`. The waiting request takes the earliest free server (FIFO).
    """
    lat, _, added = reactive_batched(arrivals, services, slots, replicas, max_replicas, cold_start_ns)
    return lat, added


def reactive_batched(arrivals: I64, base: npt.NDArray[Any], slots: int, replicas: int, max_replicas: int,
                     cold_start_ns: int, table: npt.NDArray[np.float64] | None = None,
                     kernel: ctypes.CDLL | None = None) -> tuple[I64, I64, list[int]]:
    """`reactive` with a service time that depends on the batch joined (as `replay_batched`): latency and service
    of each request, and the start times of the replicas added. Arrivals sorted ascending.

    Without `table` each request runs its service `base` (integers) as observed. With it, request j beginning
    with m requests in service joins a batch of b = min(m // ready + 1, len(table) - 1), `ready` the replicas
    serving then (a replica still in its cold start serves nothing), and runs int(base[j] * table[b]).
    The C kernel's `reactive_replay` when built, else `reactive_batched_py`: the same numbers.
    """
    if replicas < 1 or slots < 1 or max_replicas < replicas or cold_start_ns < 0:
        raise ValueError("need replicas >= 1, slots >= 1, max_replicas >= replicas, cold_start_ns >= 0")
    if table is not None and np.asarray(table).size < 2:
        raise ValueError("need a table of at least 2 factors")
    lib = kernel if kernel is not None else load_kernel()
    if lib is None or not hasattr(lib, "reactive_replay"):
        return reactive_batched_py(arrivals, base, slots, replicas, max_replicas, cold_start_ns, table)
    a = np.ascontiguousarray(arrivals, dtype=np.int64)
    n, cap = int(a.size), max_replicas * slots
    s = np.ascontiguousarray(base, dtype=np.int64) if table is None else np.zeros(1, dtype=np.int64)
    b = np.ascontiguousarray(base, dtype=np.float64) if table is not None else np.zeros(1)
    t = np.ascontiguousarray(table if table is not None else np.zeros(2), dtype=np.float64)
    lat, svc = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    added, nadded = np.empty(max_replicas, dtype=np.int64), np.zeros(1, dtype=np.int64)
    heap, ends = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
    p, d = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)
    rc = lib.reactive_replay(a.ctypes.data_as(p), s.ctypes.data_as(p), b.ctypes.data_as(d), n, int(slots),
                             int(replicas), int(max_replicas), int(cold_start_ns),
                             t.ctypes.data_as(d) if table is not None else None, t.size, lat.ctypes.data_as(p),
                             svc.ctypes.data_as(p), added.ctypes.data_as(p), nadded.ctypes.data_as(p),
                             heap.ctypes.data_as(p), ends.ctypes.data_as(p))
    if rc != 0:
        raise ValueError("the replay kernel refused its input")
    return lat, svc, added[:int(nadded[0])].tolist()


def reactive_batched_py(arrivals: I64, base: npt.NDArray[Any], slots: int, replicas: int, max_replicas: int,
                        cold_start_ns: int, table: npt.NDArray[np.float64] | None = None
                        ) -> tuple[I64, I64, list[int]]:
    """`reactive_batched` in Python (no C kernel): the same loop, the same numbers."""
    a_list = np.asarray(arrivals, dtype=np.int64).tolist()
    b_list = (np.asarray(base, dtype=np.int64) if table is None else np.asarray(base, dtype=np.float64)).tolist()
    tab = None if table is None else np.asarray(table, dtype=np.float64).tolist()
    top = 0 if tab is None else len(tab) - 1
    lat, svc = [0] * len(a_list), [0] * len(a_list)
    start = a_list[0] if a_list else 0
    free = [start] * (replicas * slots)
    ends: list[int] = []  # the ends of the requests in service (with a table)
    added: list[int] = []
    ready_at = -1  # when the replica being started serves (-1: none starting)
    count = replicas
    for j, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
        if free[0] > a and a >= ready_at and count < max_replicas:
            added.append(a)
            count += 1
            ready_at = a + cold_start_ns
            for _ in range(slots):
                heapq.heappush(free, ready_at)
        t = free[0]
        begin = a if a > t else t
        if tab is None:
            s = b
        else:
            while ends and ends[0] <= begin:
                heapq.heappop(ends)
            ready = count - 1 if begin < ready_at else count
            s = int(b * tab[min(len(ends) // ready + 1, top)])
            heapq.heappush(ends, begin + s)
        heapq.heapreplace(free, begin + s)
        lat[j], svc[j] = begin + s - a, s
    return np.asarray(lat, dtype=np.int64), np.asarray(svc, dtype=np.int64), added


def scale_up(w: Workload, replicas: int, max_replicas: int, gpu_hour_usd: float | None = None,
             cold_start_ns: int | None = None, service: str = "auto") -> dict[str, Any]:
    """Reactive scale-up from `replicas` (cold start: observed, or `cold_start_ns`) against pre-scaling.

    Returns p99 e2e / TTFT and GPU cost per hour for: reactive, static at `replicas`, static at
    `max_replicas` (pre-scaled). The reactive cost counts each added replica from its start
    (including its cold start) to the end of the range. `service` as in `capacity_curve`: with the measured
    relation of service time to batch where the traces show it ("service" says which, "fixed" then holds
    the same comparison with fixed service times; else None).
    """
    model = service_model(w, service)
    delay = cold_start_ns if cold_start_ns is not None else (w.cold_start_ns or 0)
    if model["applied"]:
        g = model["relation"]["growth_per_request"]
        lat, svc, added = reactive_batched(w.arrivals, scaled_services(w, g), w.slots, replicas, max_replicas,
                                           delay, batch_table(w, g))
        static, prescaled = point_batched(w, replicas, g, gpu_hour_usd), point_batched(w, max_replicas, g, gpu_hour_usd)
    else:
        lat, svc, added = reactive_batched(w.arrivals, w.services, w.slots, replicas, max_replicas, delay)
        static, prescaled = point(w, replicas, gpu_hour_usd), point(w, max_replicas, gpu_hour_usd)
    end = int(w.arrivals[0]) + w.span_ns if w.size else 0
    replica_ns = replicas * w.span_ns + sum(max(0, end - t) for t in added)
    hours = w.span_ns / 3.6e12
    mean_replicas = replica_ns / w.span_ns
    p99, ttft_p99 = _replay_p99s(w, lat, svc)
    return {
        "cold_start_ms": round(delay / 1e6, 3), "cold_start_observed": w.cold_start_ns is not None,
        "reactive": {"replicas": replicas, "max_replicas": max_replicas, "added": len(added),
                     "p99_ms": p99, "ttft_p99_ms": ttft_p99,
                     "mean_replicas": round(mean_replicas, 3),
                     "gpu_usd_per_hour": None if gpu_hour_usd is None else mean_replicas * gpu_hour_usd},
        "static": static,
        "prescaled": prescaled,
        "hours": hours,
        "service": {"batch_relation_applied": model["applied"], "assumption": model["assumption"]},
        "fixed": (scale_up(w, replicas, max_replicas, gpu_hour_usd, cold_start_ns, "fixed")
                  if model["applied"] else None),
    }
