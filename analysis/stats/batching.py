"""Does a request's service time grow with the batch it was served in? The capacity replay assumes not.

Under continuous batching a replica serving more requests at once serves each more slowly, so a
replay that keeps each request's observed service time while packing the traffic on fewer replicas
is optimistic. `service_vs_batch` measures the relation in the traces: each request's batch is the
number of requests its replica was serving (past their queue wait) at the midpoint of its service,
and the median service time is compared between the requests in the smallest batches (at most the
batch sizes' first quartile) and in the largest (at least their third quartile).
"""

from __future__ import annotations

from typing import Any, Final

import duckdb
import numpy as np

from analysis.engine.percentiles import request_source
from tracing import schema as S

#: A median service time this much larger in the largest batches than in the smallest counts as growth
#: (10%: below it the replay's fixed service times are within the noise of a median).
GROWTH: Final = 0.10
#: Fewest requests in each of the two quarters compared.
MIN_REQUESTS: Final = 50


def service_vs_batch(con: duckdb.DuckDBPyConnection, since: int | None = None,
                     until: int | None = None) -> dict[str, Any] | None:
    """The measured relation of service time to batch size over the requests starting in [since, until).

    Returns {"small_batch", "large_batch" (median batch of the bottom and top quarter by batch),
    "small_service_ms", "large_service_ms" (their median service time), "growth" (large / small - 1),
    "grows" (growth >= GROWTH), "growth_per_request" (growth per request of batch between the two),
    "compared" (requests in the two quarters)}; None when the traces cannot show it (no queue-wait
    column, fewer than MIN_REQUESTS requests per quarter, or a single batch size).
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
    service = np.asarray(cols["service_ns"], dtype=np.float64)
    batch = np.zeros(busy.size, dtype=np.int64)
    cuts = np.flatnonzero(replica[1:] != replica[:-1]) + 1 if busy.size else np.zeros(0, dtype=np.int64)
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, busy.size], strict=True):  # one sweep per replica
        b, e = np.sort(busy[lo:hi]), np.sort(end[lo:hi])
        mid = (busy[lo:hi] + end[lo:hi]) // 2  # serving: busy <= mid < end
        batch[lo:hi] = np.searchsorted(b, mid, side="right") - np.searchsorted(e, mid, side="right")
    if batch.size == 0:
        return None
    small_cut, large_cut = np.quantile(batch, [0.25, 0.75], method="inverted_cdf")
    small, large = batch <= small_cut, batch >= large_cut
    if small_cut >= large_cut or min(int(small.sum()), int(large.sum())) < MIN_REQUESTS:
        return None
    b1, b4 = float(np.median(batch[small])), float(np.median(batch[large]))
    s1, s4 = float(np.median(service[small])) / 1e6, float(np.median(service[large])) / 1e6
    n1, n4 = int(small.sum()), int(large.sum())
    if not s1:
        return None
    growth = s4 / s1 - 1
    return {"small_batch": b1, "large_batch": b4, "small_service_ms": s1, "large_service_ms": s4, "growth": growth,
            "grows": growth >= GROWTH, "growth_per_request": growth / (b4 - b1) if b4 > b1 else 0.0,
            "compared": n1 + n4}
