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

from analysis.engine.percentiles import request_source

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
    src = request_source(con, "queue_wait")
    cond = "(?::BIGINT IS NULL OR start_ns >= ?) AND (?::BIGINT IS NULL OR start_ns < ?)"
    rows = con.execute(f"""
        WITH r AS (
            SELECT trace_id || ':' || span_id AS id, coalesce(replica, '') AS replica,
                   start_ns + coalesce(queue_wait_ns, 0) AS busy_ns, start_ns + e2e_ns AS end_ns,
                   greatest(e2e_ns - coalesce(queue_wait_ns, 0), 0) AS service_ns
            FROM {src} WHERE e2e_ns IS NOT NULL AND {cond}),
        m AS (SELECT id, replica, service_ns, (busy_ns + end_ns) // 2 AS mid_ns FROM r),
        b AS (SELECT m.id, any_value(m.service_ns) AS service_ns, count(*) AS batch
              FROM m JOIN r ON r.replica = m.replica AND r.busy_ns <= m.mid_ns AND r.end_ns > m.mid_ns
              GROUP BY m.id),
        cut AS (SELECT quantile_disc(batch, 0.25) AS lo, quantile_disc(batch, 0.75) AS hi FROM b),
        q AS (SELECT b.*, CASE WHEN batch <= lo THEN 1 WHEN batch >= hi THEN 4 END AS quarter FROM b, cut
              WHERE lo < hi)
        SELECT quarter, count(*), median(batch), median(service_ns) / 1e6
        FROM q WHERE quarter IS NOT NULL GROUP BY quarter ORDER BY quarter""", [since, since, until, until]).fetchall()
    if len(rows) != 2 or min(r[1] for r in rows) < MIN_REQUESTS:
        return None
    (_, n1, b1, s1), (_, n4, b4, s4) = rows
    if not s1:
        return None
    growth = float(s4) / float(s1) - 1
    return {"small_batch": float(b1), "large_batch": float(b4), "small_service_ms": float(s1),
            "large_service_ms": float(s4), "growth": growth, "grows": growth >= GROWTH,
            "growth_per_request": growth / (float(b4) - float(b1)) if b4 > b1 else 0.0, "compared": int(n1 + n4)}
