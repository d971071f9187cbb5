"""What-if replay: the heap simulator agrees with a tick-by-tick oracle, and known queues give known waits."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from analysis import connect
from analysis.whatif import predict, simulate, whatif
from tests.analysis.queue_oracle import fifo_latencies
from tests.factory import add_request, write
from tracing.rows import SpanBatch

MS = 1_000_000


def test_known_queues() -> None:
    assert simulate([0, 0, 0], [10, 10, 10], 1).tolist() == [10, 20, 30]
    assert simulate([0, 0, 0], [10, 10, 10], 2).tolist() == [10, 10, 20]
    assert simulate([0, 0, 0], [10, 10, 10], 5).tolist() == [10, 10, 10]
    # input order is kept even when arrivals are not sorted; ties keep input order (FIFO)
    assert simulate([5, 0, 0], [1, 4, 4], 1).tolist() == [4, 4, 8]
    assert simulate([], [], 3).tolist() == []
    with pytest.raises(ValueError):
        simulate([0], [1], 0)
    with pytest.raises(ValueError):
        simulate([0], [-1], 1)


def test_simulator_matches_tick_oracle_on_random_workloads() -> None:
    rng = random.Random(11)
    for _ in range(400):
        n = rng.randint(1, 25)
        servers = rng.randint(1, 5)
        arrivals = [rng.randint(0, 30) for _ in range(n)]
        services = [rng.randint(0, 12) for _ in range(n)]
        assert simulate(arrivals, services, servers).tolist() == fifo_latencies(arrivals, services, servers), (
            arrivals, services, servers)


def test_predict_reports_p50_p99_per_server_count() -> None:
    arrivals = np.zeros(4, dtype=np.int64)
    services = np.full(4, 10 * MS, dtype=np.int64)
    out = predict(arrivals, services, [1, 4])
    # one server: 10, 20, 30, 40 ms; four: all 10 ms
    assert out[0] == {"servers": 1, "p50_ms": 25.0, "p99_ms": pytest.approx(39.7)}
    assert out[1] == {"servers": 4, "p50_ms": 10.0, "p99_ms": 10.0}


def test_whatif_replays_the_store_without_its_queue_wait(tmp_path: Path) -> None:
    batch = SpanBatch()
    for i in range(3):  # three requests at once, 100 ms of work each, queued behind each other
        add_request(batch, i, 0, (i + 1) * 100 * MS, [
            ("queue_wait", 0, i * 100 * MS),
            ("generation", i * 100 * MS, (i + 1) * 100 * MS),
        ])
    write(tmp_path, batch)
    con = connect(tmp_path)
    one, three = whatif(con, [1, 3])
    assert one["p50_ms"] == 200.0  # the observed queue is replayed exactly
    assert three == {"servers": 3, "p50_ms": 100.0, "p99_ms": 100.0}
    # by default: the observed peak in service (one at a time here), then more
    assert [r["servers"] for r in whatif(con)] == [1, 2]
    assert whatif(con)[0] == one


def test_expand_gives_each_kept_request_its_adjusted_count_in_its_gap() -> None:
    """Whole weights: exactly w requests per kept one; the kept one where it was, the others inside the gap to
    the next kept request of its class, with the service of a kept request of that class."""
    from analysis.whatif import expand
    rng = np.random.default_rng(4)
    for trial in range(50):
        n = int(rng.integers(1, 60))
        arrivals = np.sort(rng.integers(0, 10**9, n))
        weights = rng.choice([1.0, 2.0, 5.0], n)
        classes = rng.integers(0, 3, n)
        src, at = expand(arrivals, weights, classes, seed=trial)
        assert at.size == int(weights.sum()) and np.all(np.diff(at) >= 0)
        assert set(at.tolist()) >= set(arrivals.tolist())  # every kept request is there, at its arrival
        for c in np.unique(classes):
            mine = np.flatnonzero(classes == c)
            got = at[classes[src] == c]  # the requests of class c (each copy takes a service of its class)
            assert got.size == int(weights[mine].sum()), trial
            last = arrivals[mine[-1]]
            gaps = np.diff(arrivals[mine])
            end = last + (gaps.mean() if gaps.size else 0)
            assert np.all((got >= arrivals[mine[0]]) & (got <= end)), trial


def test_expand_rounds_fractional_counts_without_bias() -> None:
    from analysis.whatif import expand
    rng = np.random.default_rng(5)
    weights = rng.uniform(1.0, 6.0, 20_000)
    src, _ = expand(np.arange(weights.size, dtype=np.int64) * 1000, weights, seed=3)
    frac = weights - np.floor(weights)
    sd = float(np.sqrt((frac * (1 - frac)).sum()))
    assert abs(src.size - weights.sum()) < 5 * sd  # a sum of independent Bernoulli(frac) on top of the floors
    per = np.bincount(src, minlength=weights.size)
    assert per.min() >= 1


def test_an_unsampled_store_replays_unexpanded_and_a_sampled_one_expanded(tmp_path: Path) -> None:
    from analysis.capacity import observed_workload
    from analysis.whatif import read_observed
    for name, attrs in (("plain", {}), ("ones", {"SampleRate": "1"}), ("quarter", {"SampleRate": "4"})):
        batch = SpanBatch()
        for i in range(40):
            add_request(batch, i, i * 10 * MS, i * 10 * MS + 25 * MS, [("queue_wait", i * 10 * MS, i * 10 * MS + MS)],
                        replica=f"r{i % 2}", attrs=attrs)
        write(tmp_path / name, batch)
    plain = read_observed(connect(tmp_path / "plain"))
    ones = read_observed(connect(tmp_path / "ones"))
    quarter = read_observed(connect(tmp_path / "quarter"))
    assert not plain.sampled and not ones.sampled and quarter.sampled
    assert plain.arrivals.tolist() == ones.arrivals.tolist() and plain.services.tolist() == ones.services.tolist()
    assert quarter.arrivals.size == 160 and quarter.stored == 40
    assert observed_workload(connect(tmp_path / "plain")).slots == observed_workload(connect(tmp_path / "ones")).slots


def test_peak_concurrency_of_arrays_is_the_stores() -> None:
    """analysis.whatif.peak_concurrency (the expanded workload's) against analysis.breakdowns' SQL on random rows."""
    import duckdb

    from analysis import breakdowns as B
    from analysis.whatif import peak_concurrency
    rng = np.random.default_rng(6)
    con = duckdb.connect()
    for _ in range(30):
        n = int(rng.integers(1, 40))
        s = rng.integers(0, 50, n)
        qw = rng.integers(0, 5, n)
        e = s + qw + rng.integers(0, 20, n)
        con.execute("CREATE OR REPLACE TABLE r AS SELECT unnest($s) AS start_ns, unnest($q) AS queue_wait_ns, "
                    "unnest($e) AS end_ns, 'a' AS replica", {"s": s.tolist(), "q": qw.tolist(), "e": e.tolist()})
        assert max(1, peak_concurrency(s + qw, e)) == B.peak_concurrency(con, "r")


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_requests_arriving_at_the_same_nanosecond_are_read_in_one_order(seed: int) -> None:
    """The replayed workload does not depend on the order rows are stored in: requests that arrive together are
    ordered by their other columns, so two stores of the same rows in other orders replay the same arrays."""
    import duckdb

    from analysis.whatif import read_observed
    rng = random.Random(seed)
    rows = [(rng.randrange(5) * MS, rng.randrange(1, 50) * MS, rng.randrange(3) * MS, rng.randrange(1, 9) * MS,
             f"r{rng.randrange(3)}", rng.choice([1.0, 4.0])) for _ in range(200)]  # 5 distinct arrivals: ties
    reads = []
    for order in (rows, rows[::-1], rng.sample(rows, len(rows))):
        con = duckdb.connect()
        con.execute("CREATE TABLE r (start_ns BIGINT, e2e_ns BIGINT, queue_wait_ns BIGINT, ttft_ns BIGINT, "
                    "replica VARCHAR, adjusted_count DOUBLE)")
        con.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?, ?)", order)
        con.execute("CREATE TEMP VIEW requests AS SELECT * FROM r")
        reads.append((read_observed(con), read_observed(con, replicas=True)))
    for weighted, plain in reads[1:]:
        for got, want in ((weighted, reads[0][0]), (plain, reads[0][1])):
            for name in ("arrivals", "services", "ttft_rest", "ends", "busy_from", "replica"):
                assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
