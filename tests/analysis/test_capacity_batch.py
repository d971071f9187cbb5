"""The capacity replay with the measured relation of service time to batch: the C kernel and the Python loop against
an independent discrete-event reference, the relation's parts against brute force, and the prediction against a
simulated fleet whose service time truly grows with the batch (seeds 1-5)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from analysis import connect
from analysis.capacity import (
    Workload,
    capacity_curve,
    load_kernel,
    observed_workload,
    point,
    point_batched,
    predict_at,
    reactive,
    reactive_batched,
    reactive_batched_py,
    replay_batched,
    replay_batched_py,
    scale_up,
)
from analysis.stats import batching
from tests.analysis.batch_fleet import batched_latencies, fleet, reactive_latencies
from tests.factory import add_request, write
from tests.needs import need_c
from tracing.rows import SpanBatch

MS = 1_000_000
GAP_MS = 30
N_REQUESTS = 5000
GROWTH = 0.15  # the simulated fleet's service time: work x (1 + GROWTH x (batch - 1))


def test_batched_replay_equals_the_discrete_event_reference() -> None:
    kernel = load_kernel()
    need_c(kernel is not None and hasattr(kernel, "batch_replay"), "the C replay kernel analysis._replay")
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(1, 30)
        replicas, slots = rng.randint(1, 4), rng.randint(1, 4)
        arrivals = sorted(rng.randint(0, 40) for _ in range(n))
        base = [rng.choice([0.0, rng.uniform(0, 15)]) for _ in range(n)]
        table = [0.0] + [1 + rng.uniform(-0.3, 0.8) * (b - 1) for b in range(1, slots + 1)]
        a, b, t = np.asarray(arrivals, dtype=np.int64), np.asarray(base), np.asarray(table)
        want = batched_latencies(arrivals, base, replicas * slots, replicas, table)
        for got in (replay_batched(a, b, replicas * slots, replicas, t, kernel),
                    replay_batched_py(a, b, replicas * slots, replicas, t)):
            assert (got[0].tolist(), got[1].tolist()) == want


def test_the_one_heap_kernel_equals_the_two_heap_loop_on_long_queues() -> None:
    """The kernel keeps one heap (the ends in service) where the Python loop keeps the servers' free times beside
    it: the same numbers on thousands of requests through up to 64 servers, with ties, waits and idle spells."""
    kernel = load_kernel()
    need_c(kernel is not None and hasattr(kernel, "batch_replay"), "the C replay kernel analysis._replay")
    rng = np.random.default_rng(11)
    for case in range(12):
        n = int(rng.integers(500, 3000))
        replicas, slots = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        a = np.sort(rng.integers(0, n * int(rng.integers(1, 40)), n)).astype(np.int64)
        b = np.where(rng.random(n) < 0.05, 0.0, rng.uniform(1, 400, n))
        t = np.asarray([0.0] + [1 + 0.2 * (k - 1) for k in range(1, slots + 1)])
        got = replay_batched(a, b, replicas * slots, replicas, t, kernel)
        want = replay_batched_py(a, b, replicas * slots, replicas, t)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist(), case


def test_reactive_batched_equals_the_discrete_event_reference() -> None:
    """Scale-up with the relation (the C kernel and the Python loop) against the reference's scans; without a table,
    the fixed-time `reactive`, as the reference with a table of ones."""
    kernel = load_kernel()
    need_c(kernel is not None and hasattr(kernel, "reactive_replay"), "the C replay kernel analysis._replay")
    rng = random.Random(17)
    for _ in range(400):
        n = rng.randint(1, 30)
        replicas, slots, extra, cold = rng.randint(1, 3), rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 20)
        arrivals = sorted(rng.randint(0, 40) for _ in range(n))
        base = [rng.choice([0.0, rng.uniform(0, 15)]) for _ in range(n)]
        table = [0.0] + [1 + rng.uniform(-0.3, 0.8) * (b - 1) for b in range(1, slots + 1)]
        want = reactive_latencies(arrivals, base, slots, replicas, replicas + extra, cold, table)
        args = (np.asarray(arrivals), np.asarray(base), slots, replicas, replicas + extra, cold, np.asarray(table))
        for lat, svc, added in (reactive_batched(*args, kernel=kernel), reactive_batched_py(*args)):
            assert (lat.tolist(), svc.tolist(), added) == want
        whole = [int(b) for b in base]
        want = reactive_latencies(arrivals, whole, slots, replicas, replicas + extra, cold, [1.0] * (slots + 1))
        for lat, svc, added in (reactive_batched(np.asarray(arrivals), np.asarray(whole), slots, replicas,
                                                 replicas + extra, cold, kernel=kernel),
                                reactive_batched_py(np.asarray(arrivals), np.asarray(whole), slots, replicas,
                                                    replicas + extra, cold)):
            assert (lat.tolist(), svc.tolist(), added) == want
        fixed = reactive(np.asarray(arrivals), np.asarray(whole), slots, replicas, replicas + extra, cold)
        assert (fixed[0].tolist(), fixed[1]) == (want[0], want[2])


def test_whatif_prediction_equals_the_reference_at_any_slots() -> None:
    """`predict_at` (the What-if page) with the relation applied, at slot counts other than the observed: the p99 of
    the reference replay of s / f(b_obs) with f(b) = 1 + g (b - small batch); and the fixed-time p99 beside it."""
    rng = np.random.default_rng(5)
    n, observed_slots = 800, 3
    arrivals = np.sort(rng.integers(0, 30 * 10**9, n)).astype(np.int64)
    w = Workload(arrivals, rng.integers(10**8, 10**9, n).astype(np.int64), np.zeros(n), observed_slots, 4, None,
                 30 * 10**9)
    w.batches = rng.integers(1, observed_slots + 1, n).astype(np.int64)
    w.services = (w.services * (1 + 0.25 * (w.batches - 1))).astype(np.int64)
    w.relation = batching.relation(w.batches, w.services)
    assert w.relation is not None and w.relation["shown"]
    g, small = w.relation["growth_per_request"], w.relation["small_batch"]
    base = [s / max(1 + g * (b - small), 0.05) for s, b in zip(w.services.tolist(), w.batches.tolist(), strict=True)]
    for replicas, slots in ((1, 1), (2, 3), (2, 5), (3, 2)):
        table = [max(1 + g * (b - small), 0.05) for b in range(slots + 1)]
        lat, _ = batched_latencies(arrivals.tolist(), base, replicas * slots, replicas, table)
        got = predict_at(w, replicas, slots)
        assert got["service"]["applied"] and got["servers"] == replicas * slots
        assert got["p99_ms"] == round(float(np.quantile(np.asarray(lat, dtype=np.float64), 0.99)) / 1e6, 3)
        fixed = np.asarray(batched_latencies(arrivals.tolist(), w.services.tolist(), replicas * slots, replicas,
                                             [1.0] * (slots + 1))[0], dtype=np.float64)
        assert got["fixed"]["p99_ms"] == round(float(np.quantile(fixed, 0.99)) / 1e6, 3)
    assert predict_at(w, 2, 3, service="fixed")["fixed"] is None


def test_no_growth_replays_the_fixed_service_times() -> None:
    """g = 0: every factor is 1, so the batched point is the fixed one exactly."""
    rng = np.random.default_rng(3)
    n = 2000
    arrivals = np.sort(rng.integers(0, 10**9, n)).astype(np.int64)
    w = Workload(arrivals, rng.integers(0, 10**7, n).astype(np.int64), np.zeros(n), 3, 4, None, 10**9)
    w.batches = rng.integers(1, 4, n).astype(np.int64)
    w.relation = batching.relation(w.batches, w.services)
    for r in (1, 2, 5):
        got, fixed = point_batched(w, r, 0.0), point(w, r)
        assert {k: got[k] for k in ("p50_ms", "p99_ms", "ttft_p99_ms")} == \
            {k: fixed[k] for k in ("p50_ms", "p99_ms", "ttft_p99_ms")}


def test_request_batches_count_the_replica_when_each_joined() -> None:
    rng = random.Random(11)
    for _ in range(100):
        n = rng.randint(1, 40)
        rep = np.asarray([rng.randint(0, 2) for _ in range(n)], dtype=np.int64)
        busy = np.asarray([rng.randint(0, 50) for _ in range(n)], dtype=np.int64)
        end = busy + np.asarray([rng.randint(0, 20) for _ in range(n)], dtype=np.int64)
        want = [max(1, sum(1 for j in range(n) if rep[j] == rep[i] and busy[j] <= busy[i] < end[j]))
                for i in range(n)]
        assert batching.request_batches(rep, busy, end).tolist() == want


def test_relation_known_answer_and_interval() -> None:
    """Services 100 ms in batches of 1 and 130 ms in batches of 4, all alike: growth 30%, 10% per request, the
    interval collapsed on it; shuffled noise widens it around the median and keeps the median's rank."""
    batch = np.asarray([1] * 200 + [2] * 100 + [4] * 200, dtype=np.int64)
    service = np.asarray([100 * MS] * 200 + [115 * MS] * 100 + [130 * MS] * 200, dtype=np.float64)
    rel = batching.relation(batch, service)
    assert rel is not None
    assert (rel["small_batch"], rel["large_batch"]) == (1.0, 4.0)
    assert rel["growth"] == pytest.approx(0.3) and rel["growth_per_request"] == pytest.approx(0.1)
    assert rel["growth_per_request_low"] == pytest.approx(0.1) == rel["growth_per_request_high"]
    assert rel["shown"] and rel["compared"] == 400
    x = np.arange(1, 101, dtype=np.float64)  # ranks: the 95% interval of the median of 1..100 is [40, 61]
    mid, lo, hi = batching.median_interval(np.random.default_rng(1).permutation(x))
    assert (mid, lo, hi) == (50.5, 40.0, 61.0)
    assert batching.relation(np.ones(500, dtype=np.int64), service[:500]) is None  # one batch size


def _fleet_store(tmp_path: Path, seed: int) -> tuple[Path, list[int], list[int]]:
    """A store of a simulated fleet of 8 replicas x 4 slots whose service grows GROWTH per request of batch,
    ~33 requests/s of lognormal work (median 400 ms): about 15 to 20 of its 32 slots busy."""
    rng = random.Random(seed)
    arrivals, work, t = [], [], 0
    for _ in range(N_REQUESTS):
        t += int(rng.expovariate(1 / GAP_MS) * MS)  # ~22 requests/s
        arrivals.append(t)
        work.append(int(rng.lognormvariate(np.log(400), 0.5) * MS))
    batch = SpanBatch()
    for i, (a, (r, begin, end)) in enumerate(zip(arrivals, fleet(arrivals, work, 8, 4, GROWTH), strict=True)):
        add_request(batch, (seed, i), a, end, [("queue_wait", a, begin), ("generation", begin, end)],
                    replica=f"r{r}")
    write(tmp_path, batch)
    return tmp_path, arrivals, work


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_fewer_replicas_predicted_closer_with_the_relation(tmp_path: Path, seed: int) -> None:
    """8 replicas observed; at 4, 5 and 6 the replay with the measured relation is closer to the fleet's own p99
    than the one with fixed service times. (At 7 of 8 both are within a few per cent and either can be closer.)"""
    store, arrivals, work = _fleet_store(tmp_path, seed)
    w = observed_workload(connect(store))
    assert w.observed_replicas == 8 and w.slots == 4
    curve = capacity_curve(w, [4, 5, 6], target_p99_ms=None)
    assert curve["service"]["batch_relation_applied"]
    rel = curve["service"]["relation"]
    assert rel["small_batch"] == 1.0  # so the true growth per request of batch is the fleet's GROWTH exactly
    assert rel["growth_per_request_low"] <= GROWTH <= rel["growth_per_request_high"]
    for p, fixed in zip(curve["points"], curve["service"]["fixed_points"], strict=True):
        truth = _p99(arrivals, fleet(arrivals, work, p["replicas"], 4, GROWTH))
        assert abs(p["p99_ms"] - truth) < abs(fixed["p99_ms"] - truth), (p["replicas"], p, fixed, truth)
    # the What-if page's prediction (any slots; 6 a replica: the relation extrapolated past the observed 4)
    for replicas, slots in ((5, 4), (6, 3), (4, 6)):
        got = predict_at(w, replicas, slots)
        truth = _p99(arrivals, fleet(arrivals, work, replicas, slots, GROWTH))
        assert abs(got["p99_ms"] - truth) < abs(got["fixed"]["p99_ms"] - truth), (replicas, slots, got, truth)
    # reactive scale-up from 4 to 8 replicas with a 20 s cold start, against the fleet scaling up the same way
    up = scale_up(w, 4, 8, cold_start_ns=20_000 * MS)
    assert up["service"]["batch_relation_applied"] and up["fixed"] is not None
    truth = _p99(arrivals, fleet(arrivals, work, 4, 4, GROWTH, max_replicas=8, cold_ns=20_000 * MS))
    assert abs(up["reactive"]["p99_ms"] - truth) < abs(up["fixed"]["reactive"]["p99_ms"] - truth), (up, truth)


def _p99(arrivals: list[int], ends: list[tuple[int, int, int]]) -> float:
    """p99 latency (ms) of the fleet's requests."""
    lat = np.asarray([e - a for a, (_, _, e) in zip(arrivals, ends, strict=True)], dtype=np.float64)
    return float(np.quantile(lat, 0.99)) / 1e6


def test_fewest_counts_equal_the_first_count_meeting_the_target() -> None:
    """The fewest count (with the relation, at its interval's ends, and fixed) is the first count on the full curve
    whose p99 meets the target, for every target the curves take."""
    rng = np.random.default_rng(9)
    n, slots = 1500, 3
    arrivals = np.sort(rng.integers(0, 60 * 10**9, n)).astype(np.int64)
    w = Workload(arrivals, rng.integers(10**8, 2 * 10**9, n).astype(np.int64), np.zeros(n), slots, 6, None, 60 * 10**9)
    w.batches = rng.integers(1, slots + 1, n).astype(np.int64)
    w.services = (w.services * (1 + 0.2 * (w.batches - 1))).astype(np.int64)  # a relation the traces show
    w.relation = batching.relation(w.batches, w.services)
    assert w.relation is not None and w.relation["shown"]
    counts = list(range(1, 17))
    rel = w.relation
    curves = {g: [point_batched(w, r, g)["p99_ms"] for r in counts]
              for g in (rel["growth_per_request"], rel["growth_per_request_low"], rel["growth_per_request_high"])}
    fixed = [point(w, r)["p99_ms"] for r in counts]
    for target in sorted({v for c in (*curves.values(), fixed) for v in c})[::9]:
        got = capacity_curve(w, counts, target_p99_ms=target)
        g, lo, hi = curves.values()
        assert got["fewest_replicas"] == _first(counts, g, target)
        assert got["service"]["fewest_interval"] == [_first(counts, lo, target), _first(counts, hi, target)]
        assert got["service"]["fixed_fewest_replicas"] == _first(counts, fixed, target)


def _first(counts: list[int], p99: list[float], target: float) -> int | None:
    return next((r for r, v in zip(counts, p99, strict=True) if v <= target), None)


@pytest.mark.parametrize("kernel", [True, False])
def test_fewest_count_is_the_first_meeting_the_target_where_p99_rises_with_replicas(
        kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the relation p99 can rise when a replica is added (a request that no longer waits joins a larger
    batch), so no bisection: the fewest count, at g and at its interval's ends, is the first of 1 .. the largest
    whose p99 by the reference replay meets the target, counts the curve does not draw included; with the C
    kernel (whose replays stop once sure to miss) and without it, on random workloads, some with a rising p99."""
    if kernel:
        lib = load_kernel()
        need_c(lib is not None and hasattr(lib, "batch_exceeds"), "the C replay kernel analysis._replay")
    else:
        monkeypatch.setattr("analysis.capacity.load_kernel", lambda: None)
    rng = np.random.default_rng(33)
    for _ in range(60):
        n, slots = int(rng.integers(4, 30)), int(rng.integers(2, 5))
        arrivals = np.sort(rng.integers(0, 60, n) * MS).astype(np.int64)
        w = Workload(arrivals, (rng.integers(1, 40, n) * MS).astype(np.int64),
                     (rng.integers(0, 3, n) * MS).astype(np.float64), slots, 3, None, 60_000 * MS)
        w.batches = rng.integers(1, slots + 1, n).astype(np.int64)
        g = float(rng.uniform(0.1, 1.5))
        lo_g, hi_g = g * float(rng.uniform(0.3, 1.0)), g * float(rng.uniform(1.0, 2.0))
        w.relation = {"growth_per_request": g, "growth_per_request_low": lo_g, "growth_per_request_high": hi_g,
                      "small_batch": 1.0, "large_batch": float(slots), "small_service_ms": 1.0,
                      "large_service_ms": 2.0, "shown": True}
        largest = 6
        curves: dict[tuple[float, str], list[float]] = {}
        for x in (g, lo_g, hi_g):
            f_obs = np.maximum(1.0 + x * (w.batches.astype(np.float64) - 1.0), batching.MIN_FACTOR)
            table = np.maximum(1.0 + x * (np.arange(slots + 1, dtype=np.float64) - 1.0), batching.MIN_FACTOR)
            base = (w.services / f_obs).tolist()
            for metric in ("e2e", "ttft"):
                curves[(x, metric)] = []
            for r in range(1, largest + 1):
                lat, svc = batched_latencies(arrivals.tolist(), base, r * slots, r, table.tolist())
                ttft = np.asarray(lat, dtype=np.float64) - np.asarray(svc) + w.ttft_rest
                curves[(x, "e2e")].append(round(float(np.quantile(np.asarray(lat, np.float64), 0.99)) / 1e6, 3))
                curves[(x, "ttft")].append(round(float(np.quantile(ttft, 0.99)) / 1e6, 3))
        for metric in ("e2e", "ttft"):
            for target in sorted({v for (_, m), c in curves.items() if m == metric for v in c})[::2]:
                got = capacity_curve(_fresh(w), [1, 2, 4, largest], target_p99_ms=target, metric=metric)
                first = [next((r for r, v in enumerate(curves[(x, metric)], 1) if v <= target), None)
                         for x in (g, lo_g, hi_g)]
                assert got["fewest_replicas"] == first[0], (metric, target, curves)
                assert got["service"]["fewest_interval"] == first[1:], (metric, target, curves)


@pytest.mark.parametrize("kernel", [True, False])
def test_a_rising_p99_does_not_hide_the_fewest_count(kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A known case (found by a random search with the reference replay): with 2 slots and growth 1.2 per request of
    batch, p99 is 66, 74, 37 and 34 us at 1-4 replicas. For a 66 us target the fewest count is 1; a bisection
    over 1-4 (or from the drawn counts 2 and 4) would say 3."""
    if kernel:
        lib = load_kernel()
        need_c(lib is not None and hasattr(lib, "batch_exceeds"), "the C replay kernel analysis._replay")
    else:
        monkeypatch.setattr("analysis.capacity.load_kernel", lambda: None)
    us = 1000
    arrivals = np.array([5, 5, 6, 7, 23, 24, 30, 35, 38], dtype=np.int64) * us
    services = np.array([22, 5, 1, 18, 3, 11, 35, 4, 17], dtype=np.int64) * us
    w = Workload(arrivals, services, np.zeros(arrivals.size), 2, 2, None, 40 * us)
    w.batches = np.ones(arrivals.size, dtype=np.int64)  # observed at the smallest batch: base = service
    w.relation = {"growth_per_request": 1.2, "growth_per_request_low": 1.2, "growth_per_request_high": 1.2,
                  "small_batch": 1.0, "large_batch": 2.0, "small_service_ms": 1.0, "large_service_ms": 2.0,
                  "shown": True}
    lat = [batched_latencies(arrivals.tolist(), services.tolist(), 2 * r, r, [1.0, 1.0, 2.2])[0] for r in (1, 2, 3, 4)]
    assert [round(float(np.quantile(np.asarray(x, np.float64), 0.99)) / 1e6, 3) for x in lat] == [
        0.066, 0.074, 0.037, 0.034]
    got = capacity_curve(w, [2, 4], target_p99_ms=0.066)
    assert [p["p99_ms"] for p in got["points"]] == [0.074, 0.034]
    assert got["fewest_replicas"] == 1 and got["service"]["fewest_interval"] == [1, 1]


def _fresh(w: Workload) -> Workload:
    """The same requests and relation in a new Workload (nothing replayed yet)."""
    out = Workload(w.arrivals, w.services, w.ttft_rest, w.slots, w.observed_replicas, w.cold_start_ns, w.span_ns)
    out.batches, out.relation = w.batches, w.relation
    return out
