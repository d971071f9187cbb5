"""Capacity curve: the C kernel equals the Python replay and the tick oracle; the curve matches the replay oracle."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from analysis import connect
from analysis.capacity import (
    Workload,
    capacity_curve,
    load_kernel,
    observed_workload,
    point,
    reactive,
    replay,
    scale_up,
    zero_wait_servers,
)
from analysis.whatif import simulate
from tests.analysis.queue_oracle import fifo_latencies
from tests.factory import add_request, write
from tests.needs import need_c
from tracing.rows import SpanBatch

MS = 1_000_000


def test_kernel_matches_python_and_the_tick_oracle() -> None:
    kernel = load_kernel()
    need_c(kernel is not None, "the C replay kernel analysis._replay")
    assert kernel is not None
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 25)
        servers = rng.randint(1, 6)
        arrivals = sorted(rng.randint(0, 30) for _ in range(n))
        services = [rng.randint(0, 12) for _ in range(n)]
        got = replay(np.asarray(arrivals), np.asarray(services), servers, kernel).tolist()
        assert got == fifo_latencies(arrivals, services, servers) == simulate(arrivals, services, servers).tolist()
    big_a = np.sort(np.asarray([rng.randint(0, 10**9) for _ in range(20_000)], dtype=np.int64))
    big_s = np.asarray([rng.randint(0, 10**6) for _ in range(20_000)], dtype=np.int64)
    for k in (1, 3, 17):
        assert np.array_equal(replay(big_a, big_s, k, kernel), simulate(big_a, big_s, k))


def _store(tmp_path: Path) -> Path:
    batch = SpanBatch()
    rng = random.Random(3)
    t = 0
    for i in range(120):
        t += rng.randint(0, 40) * MS
        q = rng.randint(0, 30) * MS
        work = rng.randint(5, 50) * 4 * MS
        add_request(batch, i, t, t + q + work, [
            ("queue_wait", t, t + q), ("generation", t + q, t + q + work),
            ("prefill", t + q, t + q + work // 4, "generation"), ("decode", t + q + work // 4, t + q + work,
                                                                   "generation"),
        ], replica=f"r{i % 2}")
    add_request(batch, "load", 0, 500 * MS, [("model_load", 0, 300 * MS), ("generation", 300 * MS, 500 * MS)],
                replica="r0")
    write(tmp_path, batch)
    return tmp_path


def test_curve_points_equal_the_replay_oracle(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    w = observed_workload(con)
    rows = con.execute("SELECT start_ns, e2e_ns - queue_wait_ns, ttft_ns - queue_wait_ns FROM requests "
                       "ORDER BY start_ns").fetchall()
    base = rows[0][0]
    arrivals = [(r[0] - base) // MS for r in rows]  # whole ms: the tick oracle counts ticks
    services = [r[1] // MS for r in rows]
    assert all(r[1] % MS == 0 for r in rows)
    curve = capacity_curve(w, replicas=[1, 2, 3, 5], target_p99_ms=250.0, gpu_hour_usd=2.0)
    for p in curve["points"]:
        lat = np.sort(np.asarray(fifo_latencies(arrivals, services, p["servers"]), dtype=np.float64) * MS)
        assert p["p99_ms"] == round(float(np.quantile(lat, 0.99)) / 1e6, 3)
        assert p["p50_ms"] == round(float(np.quantile(lat, 0.5)) / 1e6, 3)
        assert p["gpu_usd_per_hour"] == 2.0 * p["replicas"]
        wait = np.asarray(fifo_latencies(arrivals, services, p["servers"])) - np.asarray(services)
        rest = np.asarray([np.nan if r[2] is None else r[2] // MS for r in rows], dtype=np.float64)
        ttft = (wait + rest) * MS
        ttft = np.sort(ttft[~np.isnan(ttft)])
        assert p["ttft_p99_ms"] == round(float(np.quantile(ttft, 0.99)) / 1e6, 3)
    p99s = [p["p99_ms"] for p in curve["points"]]
    assert p99s == sorted(p99s, reverse=True)
    fewest = next(p["replicas"] for p in curve["points"] if p["p99_ms"] <= 250.0)
    assert curve["fewest_replicas"] == fewest
    # bisection finds a count the curve skipped: 4 is not drawn
    every = capacity_curve(w, replicas=range(1, 6), target_p99_ms=curve["points"][2]["p99_ms"] - 0.001)
    want = next((p["replicas"] for p in every["points"] if p["p99_ms"] <= curve["points"][2]["p99_ms"] - 0.001),
                None)
    sparse = capacity_curve(w, replicas=[1, 5], target_p99_ms=curve["points"][2]["p99_ms"] - 0.001)
    assert sparse["fewest_replicas"] == want
    assert w.cold_start_ns == 300 * MS  # the one observed model_load


def test_reactive_scale_up_waits_for_the_cold_start() -> None:
    # one slot; four requests at 0 of 10 ns each; the second finds the slot busy and starts a replica
    # that serves from 25 ns: the fourth starts there (35) instead of behind the third (40)
    lat, added = reactive(np.asarray([0, 0, 0, 0]), np.asarray([10, 10, 10, 10]), 1, 1, 2, 25)
    assert added == [0]
    assert lat.tolist() == [10, 20, 30, 35]
    lat, added = reactive(np.asarray([0, 0, 0, 0]), np.asarray([10, 10, 10, 10]), 1, 1, 1, 25)
    assert (lat.tolist(), added) == ([10, 20, 30, 40], [])


def test_reactive_against_brute_force() -> None:
    rng = random.Random(8)
    for _ in range(200):
        n = rng.randint(1, 15)
        arrivals = sorted(rng.randint(0, 40) for _ in range(n))
        services = [rng.randint(1, 15) for _ in range(n)]
        slots, base, extra, delay = rng.randint(1, 2), rng.randint(1, 2), rng.randint(0, 2), rng.randint(0, 10)
        lat, added = reactive(np.asarray(arrivals), np.asarray(services), slots, base, base + extra, delay)
        # brute force: a list of servers (free time); same rule, linear scans
        free = [arrivals[0]] * (base * slots)
        want, adds, ready, count = [], [], -1, base
        for a, s in zip(arrivals, services, strict=True):
            if min(free) > a and a >= ready and count < base + extra:
                adds.append(a)
                count += 1
                ready = a + delay
                free += [ready] * slots
            i = free.index(min(free))
            begin = max(a, free[i])
            free[i] = begin + s
            want.append(begin + s - a)
        assert lat.tolist() == want and added == adds


def test_scale_up_report(tmp_path: Path) -> None:
    con = connect(_store(tmp_path))
    w = observed_workload(con)
    # every result it read is finished: DuckDB 2 refuses the relation API after a half-read execute()
    assert con.sql("SELECT 1").fetchall() == [(1,)]
    out = scale_up(w, 1, 3, gpu_hour_usd=1.0)
    assert out["cold_start_ms"] == 300.0 and out["cold_start_observed"]
    assert out["static"]["replicas"] == 1 and out["prescaled"]["replicas"] == 3
    assert 1.0 <= out["reactive"]["mean_replicas"] <= 3.0
    # the reactive p99 lies between pre-scaled (all replicas warm) and static (never scaled)
    assert out["prescaled"]["p99_ms"] <= out["reactive"]["p99_ms"] <= out["static"]["p99_ms"]


def test_zero_wait_servers_is_the_fewest_with_which_nobody_waits() -> None:
    rng = random.Random(21)
    for _ in range(400):
        n = rng.randint(1, 30)
        arrivals = sorted(rng.randint(0, 20) for _ in range(n))
        services = [rng.choice([0, 0, rng.randint(0, 15)]) for _ in range(n)]  # many zero-length, many ties
        want = next(k for k in range(1, n + 2) if fifo_latencies(arrivals, services, k) == services)
        assert zero_wait_servers(np.asarray(arrivals), np.asarray(services)) == want, (arrivals, services)


def _workload(rng: random.Random, n: int, slots: int, observed: int) -> Workload:
    arrivals = np.sort(np.asarray([rng.randint(0, 2_000) for _ in range(n)], dtype=np.int64)) * MS
    services = np.asarray([rng.randint(1, 200) for _ in range(n)], dtype=np.int64) * MS
    rest = np.asarray([np.nan if rng.random() < 0.1 else rng.randint(0, 50) * MS for _ in range(n)])
    return Workload(arrivals, services, rest, slots, observed, None, int(arrivals[-1] - arrivals[0]))


def test_every_curve_point_equals_its_own_replay() -> None:
    """Above the zero-wait count and from the memo, each point is what replaying that count gives."""
    rng = random.Random(4)
    for _ in range(12):
        w = _workload(rng, rng.randint(50, 400), rng.randint(1, 4), 3)
        curve = capacity_curve(w, range(1, 41), target_p99_ms=150.0, gpu_hour_usd=1.5)
        assert w.zero_wait_replicas < 40  # the cut-off is reached on these loads
        for p in curve["points"]:
            lat = simulate(w.arrivals, w.services, p["servers"])
            q50, q99 = np.quantile(lat, [0.5, 0.99])
            rows = ~np.isnan(w.ttft_rest)
            ttft = (lat - w.services)[rows] + w.ttft_rest[rows]
            assert (p["p50_ms"], p["p99_ms"]) == (round(float(q50) / 1e6, 3), round(float(q99) / 1e6, 3))
            assert p["ttft_p99_ms"] == round(float(np.quantile(ttft, 0.99)) / 1e6, 3)
            assert p["gpu_usd_per_hour"] == 1.5 * p["replicas"]
        assert point(w, 7, None)["gpu_usd_per_hour"] is None  # the memo holds no price


def test_the_answer_says_scale_down_up_or_keep() -> None:
    rng = random.Random(9)
    w = _workload(rng, 300, 2, 6)
    every = capacity_curve(w, range(1, 31))["points"]
    p99 = {p["replicas"]: p["p99_ms"] for p in every}

    def fewest(target: float) -> int | None:  # brute force over the curve
        return next((r for r in range(1, 31) if p99[r] <= target), None)

    cases = []
    for target in sorted(set(p99.values())):
        got = capacity_curve(w, range(1, 31), target_p99_ms=target, gpu_hour_usd=2.0)
        want = fewest(target)
        assert want is not None  # the target is one of the curve's p99s
        assert got["fewest_replicas"] == want
        adv = got["advice"]
        assert adv["fewest_replicas"] == want and adv["observed_replicas"] == 6
        assert adv["replicas_delta"] == want - 6 and adv["usd_per_hour_delta"] == (want - 6) * 2.0
        assert adv["change"] == ("scale down" if want < 6 else "scale up" if want > 6 else "keep")
        cases.append(adv["change"])
    assert {"scale down", "scale up"} <= set(cases)  # this workload shows both
    down = next(capacity_curve(w, range(1, 31), target_p99_ms=t, gpu_hour_usd=2.0)["advice"]
                for t in sorted(set(p99.values()), reverse=True))
    assert down["sentence"] == (f"scale down: {down['fewest_replicas']} replicas hold p99 end-to-end <= "
                                f"{max(p99.values()):,.0f} ms, {6 - down['fewest_replicas']} fewer than the 6 observed "
                                f"(${(6 - down['fewest_replicas']) * 2.0:,.2f}/h less)")
    none = capacity_curve(w, range(1, 31), target_p99_ms=min(p99.values()) - 1.0)["advice"]
    assert none["change"] == "none holds" and none["fewest_replicas"] is None
    assert capacity_curve(w, range(1, 31))["advice"] is None  # no target, no answer
