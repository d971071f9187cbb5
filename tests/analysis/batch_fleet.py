"""Independent references for the batch-dependent capacity replay (analysis.capacity.replay_batched).

`batched_latencies`: a discrete-event replay written from the rule alone, with a list of the servers'
free times scanned (not a heap) and the requests in service counted by scanning every started request.

`reactive_latencies`: the same for reactive scale-up (analysis.capacity.reactive_batched), from its rule: a
replica starts when a request arrives to find every server busy and none starting; the requests in service
spread over the replicas serving then.

`fleet`: a simulated fleet whose service time truly grows with the batch: `replicas` replicas of `slots`
slots behind one FIFO line; a request begins when a slot is free, on the replica serving the fewest then
(ties: the lowest index), and runs work x (1 + growth x (its batch - 1)), its batch being that replica's
requests in service with it included. With `max_replicas` it scales up as the reactive replay does: a
replica starts when a request arrives to find every slot busy and none starting, and its slots are free
`cold_ns` later. The truth the capacity replay's predictions are compared with.
"""

from __future__ import annotations

from collections.abc import Sequence


def batched_latencies(arrivals: Sequence[int], base: Sequence[float], servers: int, replicas: int,
                      table: Sequence[float]) -> tuple[list[int], list[int]]:
    """(latency, service) of each request, arrivals ascending: begin at max(arrival, the earliest free server);
    batch = (requests in service then) // replicas + 1, at most len(table) - 1; service int(base * table[batch])."""
    free = [arrivals[0] if arrivals else 0] * servers
    started: list[tuple[int, int]] = []  # (begin, end) of every started request
    lat, svc = [], []
    for a, b in zip(arrivals, base, strict=True):
        i = min(range(servers), key=lambda x: free[x])
        begin = max(a, free[i])
        busy = sum(1 for (s, e) in started if s <= begin < e)
        batch = min(busy // replicas + 1, len(table) - 1)
        s = int(b * table[batch])
        free[i] = begin + s
        started.append((begin, begin + s))
        lat.append(begin + s - a)
        svc.append(s)
    return lat, svc


def reactive_latencies(arrivals: Sequence[int], base: Sequence[float], slots: int, replicas: int, max_replicas: int,
                       cold_ns: int, table: Sequence[float]) -> tuple[list[int], list[int], list[int]]:
    """(latency, service, replica start times) of each request, arrivals ascending: scale-up as above; batch =
    (requests in service at its begin) // (replicas serving then) + 1, at most len(table) - 1."""
    free = [arrivals[0] if arrivals else 0] * (replicas * slots)
    started: list[tuple[int, int]] = []
    added: list[int] = []
    ready_at: int | None = None  # when the last replica started serves
    lat, svc = [], []
    for a, b in zip(arrivals, base, strict=True):
        if min(free) > a and (ready_at is None or a >= ready_at) and replicas + len(added) < max_replicas:
            added.append(a)
            ready_at = a + cold_ns
            free += [ready_at] * slots
        i = min(range(len(free)), key=lambda x: free[x])
        begin = max(a, free[i])
        serving = replicas + len(added) - (1 if ready_at is not None and begin < ready_at else 0)
        busy = sum(1 for (s, e) in started if s <= begin < e)
        s = int(b * table[min(busy // serving + 1, len(table) - 1)])
        free[i] = begin + s
        started.append((begin, begin + s))
        lat.append(begin + s - a)
        svc.append(s)
    return lat, svc, added


def fleet(arrivals: Sequence[int], work: Sequence[int], replicas: int, slots: int,
          growth: float, max_replicas: int | None = None, cold_ns: int = 0) -> list[tuple[int, int, int]]:
    """(replica, begin, end) of each request (arrivals ascending) through the simulated fleet (module docstring)."""
    free = [[arrivals[0] if arrivals else 0] * slots for _ in range(replicas)]  # each slot's free time
    ready_at: int | None = None
    out = []
    for a, w in zip(arrivals, work, strict=True):
        if (max_replicas is not None and len(free) < max_replicas and min(min(r) for r in free) > a
                and (ready_at is None or a >= ready_at)):
            ready_at = a + cold_ns
            free.append([ready_at] * slots)
        begin = max(a, min(min(r) for r in free))
        open_ = [r for r in range(len(free)) if min(free[r]) <= begin]
        load = {r: sum(1 for t in free[r] if t > begin) for r in open_}
        r = min(open_, key=lambda x: (load[x], x))
        batch = load[r] + 1
        end = begin + round(w * (1 + growth * (batch - 1)))
        k = min(range(slots), key=lambda x: free[r][x])
        free[r][k] = end
        out.append((r, begin, end))
    return out
