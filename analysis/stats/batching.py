"""Does a request's service time grow with the batch it was served in? The capacity replay applies it where it does.

Under continuous batching a replica serving more requests at once serves each more slowly, so a
replay that keeps each request's observed service time while packing the traffic on fewer replicas
is optimistic. `service_vs_batch` measures the relation in the traces: each request's batch is the
number of requests its replica was serving (past their queue wait) when it entered service, itself
included (`request_batches`), and the median service time is compared between the requests that
joined the smallest and the largest batch size joined by MIN_REQUESTS requests or more (`relation`).
Its uncertainty: each median's distribution-free 95% interval (order statistics of a binomial), the
growth per request of batch taken between the intervals' extremes (at least 90% together).
analysis.capacity scales each request's service time by `factor` when the whole interval shows growth.
"""

from __future__ import annotations

import math
from typing import Any, Final

import duckdb
import numpy as np
import numpy.typing as npt

from analysis.engine.percentiles import request_source
from tracing import schema as S

#: A median service time this much larger in the largest batches than in the smallest counts as growth
#: (10%: below it the replay's fixed service times are within the noise of a median).
GROWTH: Final = 0.10
#: Fewest requests in each of the two quarters compared.
MIN_REQUESTS: Final = 50
#: z of each median's two-sided 95% interval (the two together: at least 90%).
Z_MEDIAN: Final = 1.959964
#: Smallest service-time factor `factor` gives (a relation extrapolated below the smallest batch seen).
MIN_FACTOR: Final = 0.05


def request_batches(replica: npt.NDArray[Any], busy: npt.NDArray[np.int64],
                    end: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each request's batch: the batch it joined, how many requests its replica served (busy <= t < end) at the
    moment t it entered service, itself included (a request of no service counts itself).

    The moment it joined, not an average over its service: a long request overlaps more arrivals, so an
    average over its own service would grow with its own service time and overstate the relation.
    `replica`: any comparable codes, one per request; the requests in any order.
    """
    n = int(busy.size)
    batch = np.zeros(n, dtype=np.int64)
    if not n:
        return batch
    order = np.argsort(replica, kind="stable")
    r, b_all, e_all = replica[order], busy[order], end[order]
    cuts = np.flatnonzero(r[1:] != r[:-1]) + 1
    out = np.empty(n, dtype=np.int64)
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n], strict=True):  # one sweep per replica
        # an adaptive (stable) sort: requests read by arrival enter service and end nearly in that order, and it
        # sorts such runs several times faster than an arbitrary order (0.04 against 0.2 CPU-s at 1.4 M requests)
        b, e = np.sort(b_all[lo:hi], kind="stable"), np.sort(e_all[lo:hi], kind="stable")
        q = b_all[lo:hi]
        out[lo:hi] = np.searchsorted(b, q, side="right") - np.searchsorted(e, q, side="right")
    batch[order] = np.maximum(out, 1)
    return batch


def median_interval(x: npt.NDArray[np.float64]) -> tuple[float, float, float]:
    """Median and its distribution-free 95% interval: the order statistics of 1-based ranks n/2 - z sqrt(n)/2 and
    1 + n/2 + z sqrt(n)/2 (rounded outwards; n = 100: the 40th and 61st)."""
    n = int(x.size)
    half = Z_MEDIAN * math.sqrt(n) / 2
    lo = max(math.floor(n / 2 - half), 1) - 1
    hi = min(math.ceil(1 + n / 2 + half), n) - 1
    part = np.partition(x, [lo, hi])
    return float(np.median(x)), float(part[lo]), float(part[hi])


def relation(batch: npt.NDArray[np.int64], service_ns: npt.NDArray[Any]) -> dict[str, Any] | None:
    """The relation of service time to batch over requests given by the batch they joined and their service (ns).

    Compares the smallest and the largest batch size that MIN_REQUESTS requests or more joined (each size on
    its own: a quarter mixing sizes would put the smaller sizes' shorter services into the small side's median).
    Returns {"small_batch", "large_batch" (the two sizes), "small_service_ms", "large_service_ms" (their median
    service time), "growth" (large / small - 1), "grows" (growth >= GROWTH), "growth_per_request" (growth per
    request of batch between the two), "growth_per_request_low", "growth_per_request_high" (its interval from
    the medians' intervals), "shown" (the interval's low end above 0: the traces show growth), "compared"
    (requests in the two sizes)}; None when the traces cannot show it (fewer than two batch sizes with
    MIN_REQUESTS requests each, or no service at the small size).
    """
    if batch.size == 0:
        return None
    service = np.asarray(service_ns, dtype=np.float64)
    sizes, counts = np.unique(batch, return_counts=True)
    enough = sizes[counts >= MIN_REQUESTS]
    if enough.size < 2:
        return None
    b1, b4 = int(enough[0]), int(enough[-1])
    small, large = batch == b1, batch == b4
    s1, s1_lo, s1_hi = (v / 1e6 for v in median_interval(service[small]))
    s4, s4_lo, s4_hi = (v / 1e6 for v in median_interval(service[large]))
    if not s1 or not s1_lo:
        return None
    growth = s4 / s1 - 1
    low, high = (s4_lo / s1_hi - 1) / (b4 - b1), (s4_hi / s1_lo - 1) / (b4 - b1)
    return {"small_batch": float(b1), "large_batch": float(b4), "small_service_ms": s1, "large_service_ms": s4,
            "growth": growth, "grows": growth >= GROWTH, "growth_per_request": growth / (b4 - b1),
            "growth_per_request_low": low, "growth_per_request_high": high, "shown": low > 0,
            "compared": int(small.sum() + large.sum())}


def factor(relation_: dict[str, Any], batch: npt.NDArray[Any], growth_per_request: float | None = None
           ) -> npt.NDArray[np.float64]:
    """Service time at `batch` relative to the smallest batches', by the relation: 1 + g (batch - small batch).

    g: the relation's growth per request, or `growth_per_request` (an end of its interval); at least MIN_FACTOR.
    """
    g = relation_["growth_per_request"] if growth_per_request is None else growth_per_request
    f = 1.0 + g * (np.asarray(batch, dtype=np.float64) - relation_["small_batch"])
    return np.maximum(f, MIN_FACTOR)


def service_vs_batch(con: duckdb.DuckDBPyConnection, since: int | None = None,
                     until: int | None = None) -> dict[str, Any] | None:
    """The measured relation of service time to batch size over the requests starting in [since, until).

    `relation` of the requests' batches (`request_batches`) and service times; None when the traces
    cannot show it (no queue-wait column, too few requests per quarter, or a single batch size).
    """
    src = request_source(con, S.QUEUE_WAIT)
    cond = "(?::BIGINT IS NULL OR start_ns >= ?) AND (?::BIGINT IS NULL OR start_ns < ?)"
    cols = con.execute(f"""
        SELECT coalesce(replica, '') AS replica, start_ns + coalesce(queue_wait_ns, 0) AS busy_ns,
               start_ns + e2e_ns AS end_ns, greatest(e2e_ns - coalesce(queue_wait_ns, 0), 0) AS service_ns
        FROM {src} WHERE e2e_ns IS NOT NULL AND {cond}
        ORDER BY replica""", [since, since, until, until]).fetchnumpy()
    replica = np.asarray(cols["replica"])
    busy, end = np.asarray(cols["busy_ns"], dtype=np.int64), np.asarray(cols["end_ns"], dtype=np.int64)
    return relation(request_batches(replica, busy, end), np.asarray(cols["service_ns"], dtype=np.float64))
