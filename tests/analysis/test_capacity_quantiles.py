"""The C kernel's quantiles of a replayed point (`point_stats`, bucketed order statistics) against numpy's
np.quantile of the same values, the capacity curve with the kernel against the same curve in Python, and the
observed slots read from the batches against a brute-force count."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from analysis import breakdowns as B
from analysis import connect
from analysis.capacity import Workload, capacity_curve, kernel_quantiles, load_kernel, observed_workload, scale_up
from tests.factory import add_request, write
from tests.needs import need_c
from tracing.rows import SpanBatch

MS = 1_000_000


def _ms(values: np.ndarray, qs: list[float]) -> list[float | None]:
    """The reference: numpy's linear quantiles, in ms rounded to 3 places (None for no values)."""
    if not values.size:
        return [None for _ in qs]
    return [round(float(x) / 1e6, 3) for x in np.quantile(values, qs, method="linear")]


def _values(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    """Latencies (int64 ns) of several shapes: spread, heavy ties, lognormal, two values, and a tight cluster far
    below a few huge outliers (the buckets split it over several rounds)."""
    if kind == 0:
        return rng.integers(0, 10**12, n)
    if kind == 1:
        return rng.integers(0, 5, n) * MS
    if kind == 2:
        return rng.lognormal(20, 2, n).astype(np.int64)
    if kind == 3:
        return 7 + rng.integers(0, 2, n)
    out = 10**9 + rng.integers(0, 3000, n)
    out[rng.integers(0, n, 3)] = 2**50
    return out


def test_kernel_quantiles_equal_numpy() -> None:
    lib = load_kernel()
    need_c(lib is not None and hasattr(lib, "point_stats"), "the C replay kernel analysis._replay")
    assert lib is not None
    rng = np.random.default_rng(11)
    qs, tqs = [0.5, 0.99, 0.0, 1.0, 0.123], [0.99, 0.5]
    for it in range(600):
        n = int(rng.integers(1, 300)) if it % 20 else int(rng.integers(5000, 40000))
        lat = _values(rng, it % 5, n)
        svc = (lat * rng.uniform(0, 1, n)).astype(np.int64)
        # every third: NaN (no TTFT), zeros of both signs, negatives
        rest = rng.choice([np.nan, 0.0, -0.0, 1.5, -3.25e6], n) if it % 3 == 0 else rng.lognormal(15, 3, n)
        ttft = ((lat - svc) + rest)[~np.isnan(rest)]
        got = kernel_quantiles(lat, svc, rest, qs, tqs, lib)
        assert got == (_ms(lat, qs), _ms(ttft, tqs)), (it, n)
    lat = np.array([3, 1, 2], dtype=np.int64) * MS
    assert kernel_quantiles(lat, lat, None, [0.5], [0.99], lib) == ([2.0], [None])  # no TTFTs asked for
    assert kernel_quantiles(lat, lat, np.full(3, np.nan), [0.99], [0.99], lib) == ([_ms(lat, [0.99])[0]], [None])


def _batch_workload(rng: random.Random, n: int, slots: int, growth: float) -> Workload:
    """A workload with a relation of service time to batch (observed at batch 1, so the base is the service)."""
    t, arrivals = 0, []
    for _ in range(n):
        t += rng.choice([0, 0, 1, 3, 10, 40]) * MS
        arrivals.append(t)
    a = np.asarray(arrivals, dtype=np.int64)
    services = np.asarray([rng.randint(1, 300) for _ in range(n)], dtype=np.int64) * MS
    rest = np.asarray([np.nan if rng.random() < 0.1 else rng.randint(0, 50) * MS for _ in range(n)])
    w = Workload(a, services, rest, slots, 4, None, int(a[-1] - a[0]) + 1)
    w.batches = np.ones(n, dtype=np.int64)
    w.relation = {"growth_per_request": growth, "growth_per_request_low": growth / 2,
                  "growth_per_request_high": growth * 1.5, "small_batch": 1.0, "large_batch": 2.0,
                  "small_service_ms": 1.0, "large_service_ms": 2.0, "shown": True}
    return w


def test_curve_with_the_kernel_equals_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every point (with the relation and the fixed-time comparison), the fewest counts and their interval, and the
    scale-up comparison: the same dicts from the C kernel (replays, quantiles, early stops) as from the Python loops
    and numpy."""
    lib = load_kernel()
    need_c(lib is not None and hasattr(lib, "point_stats"), "the C replay kernel analysis._replay")
    rng = random.Random(21)
    cases = [(_batch_workload(rng, rng.randint(200, 1500), rng.randint(1, 6), rng.uniform(0.02, 0.4)), counts)
             for counts in ([1, 2, 3, 4, 6, 8, 12, 16], list(range(1, 11)), [2, 5, 9, 20])]
    for w, counts in cases:
        def fresh(w: Workload = w) -> Workload:
            out = Workload(w.arrivals, w.services, w.ttft_rest, w.slots, w.observed_replicas, None, w.span_ns)
            out.batches, out.relation = w.batches, w.relation
            return out

        probe = capacity_curve(fresh(), counts)
        p99s = sorted({p["p99_ms"] for p in probe["points"]})
        for target in (p99s[0], p99s[len(p99s) // 2], p99s[-1] + 1.0):
            for metric in ("e2e", "ttft"):
                with_c = capacity_curve(fresh(), counts, target_p99_ms=target, metric=metric, gpu_hour_usd=2.0)
                with monkeypatch.context() as m:
                    m.setattr("analysis.capacity.load_kernel", lambda: None)
                    in_python = capacity_curve(fresh(), counts, target_p99_ms=target, metric=metric,
                                               gpu_hour_usd=2.0)
                assert with_c == in_python, (counts, target, metric)
                assert with_c["service"]["batch_relation_applied"]
        # the scale-up comparison below the curve: its reactive p99s from the kernel's order statistics
        start, top = counts[0], counts[-1]
        with_c = scale_up(fresh(), start, top, 2.0, cold_start_ns=30 * MS)
        with monkeypatch.context() as m:
            m.setattr("analysis.capacity.load_kernel", lambda: None)
            assert scale_up(fresh(), start, top, 2.0, cold_start_ns=30 * MS) == with_c, counts


def test_observed_slots_are_the_most_one_replica_served_at_once(tmp_path: Path) -> None:
    """The workload's slots (the largest observed batch) against a brute-force count over the stored rows and
    against analysis.breakdowns' SQL, on random stores with ties, zero-length services and queue waits."""
    rng = random.Random(8)
    for case in range(4):
        batch = SpanBatch()
        for i in range(rng.randint(5, 60)):
            t = rng.randint(0, 40) * MS
            q = rng.choice([0, 0, 1, 3]) * MS
            end = t + q + rng.choice([0, 1, 2, 5, 20]) * MS
            add_request(batch, i, t, end, [("queue_wait", t, t + q), ("generation", t + q, end)],
                        replica=f"r{rng.randint(0, 2)}")
        write(tmp_path / str(case), batch)
        con = connect(tmp_path / str(case))
        rows = con.execute("SELECT replica, start_ns + coalesce(queue_wait_ns, 0), end_ns FROM requests").fetchall()
        # at time t a replica serves its requests with busy <= t < end; the most at once is reached at some busy
        brute = max([1, *(sum(1 for r2, b2, e2 in rows if r2 == r and b2 <= b < e2) for r, b, _ in rows)])
        assert observed_workload(con).slots == brute == B.peak_concurrency(con)


def test_a_workload_keeps_replay_arrays_for_running_replays_and_one_set_once_idle() -> None:
    """`Workload.buffers`: a set returned while another replay runs is lent again (no fresh arrays); once no replay
    runs the workload keeps SPARE_BUFFERS sets, however many were lent at once."""
    from analysis.capacity import SPARE_BUFFERS

    w = Workload(np.arange(10, dtype=np.int64), np.ones(10, dtype=np.int64), np.zeros(10), 1, 1, None, 10)
    with w.buffers() as a:
        with w.buffers() as b:
            assert a[0] is not b[0] and a[0].shape == (10,)
        with w.buffers() as c:
            assert c[0] is b[0]  # b's set, kept while a's replay ran
        with w.buffers(), w.buffers(), w.buffers():
            pass
        assert len(w._spare) == 3  # every set returned while a's replay runs is kept
    assert len(w._spare) == SPARE_BUFFERS == 1
    kept = w._spare[0]
    with w.buffers() as d:
        assert d is kept  # reused, not fresh
    # the curve's parallel replays leave one set too
    capacity_curve(w, [1, 2, 3, 4])
    assert len(w._spare) == SPARE_BUFFERS
