"""An independent reference for the what-if replay (analysis.whatif.simulate, analysis.capacity.replay).

A k-server first-come-first-served queue stepped one time unit at a time, written from the rule alone
(not from the heap simulation): each server holds the work it has left; at every tick the requests that
arrived by then join the back of the line (ties in input order), then every idle server takes the head of
the line; a request's latency is the tick its work is done minus its arrival. A request of no work is
done the tick it starts and leaves its server idle for the next one in line. Only for small integer
workloads: it takes one step per tick.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


def fifo_latencies(arrivals: Sequence[int], services: Sequence[int], servers: int) -> list[int]:
    """Latency of each request (input order) through `servers` FIFO servers, tick by tick."""
    n = len(arrivals)
    if n == 0:
        return []
    by_arrival = sorted(range(n), key=lambda i: (arrivals[i], i))
    left = [0] * servers  # work each server has left, in ticks
    line: deque[int] = deque()
    latency: list[int | None] = [None] * n
    joined = 0
    tick = min(arrivals)
    while any(x is None for x in latency):
        while joined < n and arrivals[by_arrival[joined]] <= tick:
            line.append(by_arrival[joined])
            joined += 1
        for server in range(servers):
            while left[server] == 0 and line:
                i = line.popleft()
                left[server] = services[i]
                latency[i] = tick + services[i] - arrivals[i]
        left = [max(0, w - 1) for w in left]
        tick += 1
    return [int(x) for x in latency if x is not None]
