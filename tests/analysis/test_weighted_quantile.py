"""The weighted quantile: with whole weights it equals quantile_cont over the values repeated that many times;
with every weight 1 it is quantile_cont, bit for bit; the SQL form (percentile_series) equals the NumPy one."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import duckdb
import numpy as np
import pytest

from analysis.engine.percentiles import QUANTILES, effective_count, percentile_series, weighted_quantile_sorted
from analysis.stats.spikes import quantile_sorted

QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)


def expanded_quantile(values: list[float], weights: list[int], q: float) -> float:
    """Brute force: repeat each value `weight` times, sort, then quantile_cont (rank (N - 1) q, linear)."""
    flat = sorted(v for v, w in zip(values, weights, strict=True) for _ in range(w))
    h = (len(flat) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(flat) - 1)
    return flat[lo] + (h - lo) * (flat[hi] - flat[lo])


def _random_case(rng: random.Random) -> tuple[list[float], list[int]]:
    n = rng.randint(1, 40)
    pool = [float(rng.randint(0, 30)) for _ in range(rng.randint(1, 12))]  # ties on purpose
    values = sorted(rng.choice(pool) if rng.random() < 0.5 else rng.uniform(0, 1000) for _ in range(n))
    weights = [rng.choice([1, 1, 2, 3, 5, 10, 20, 64]) for _ in range(n)]
    return values, weights


def test_whole_weights_equal_the_expanded_quantile() -> None:
    rng = random.Random(5)
    for _ in range(3000):
        values, weights = _random_case(rng)
        for q in QS:
            got = weighted_quantile_sorted(np.array(values), np.array(weights, dtype=np.float64), q)
            assert got == pytest.approx(expanded_quantile(values, weights, q), rel=1e-12, abs=1e-9), (values,
                                                                                                        weights, q)


@pytest.mark.slow
def test_weights_of_one_are_the_unweighted_quantile_bit_for_bit() -> None:
    rng = random.Random(6)
    for _ in range(500):
        values = np.sort(np.array([rng.uniform(0, 1e9) for _ in range(rng.randint(1, 50))]))
        for q in QS:
            plain = quantile_sorted(values, q)  # what the analysis computed before weights existed
            assert weighted_quantile_sorted(values, np.ones(values.size), q) == plain
            assert weighted_quantile_sorted(values, None, q) == plain
            duck = duckdb.execute(f"SELECT quantile_cont(v, {q}) FROM (SELECT unnest(?::DOUBLE[]) AS v)",
                                  [values.tolist()]).fetchall()[0][0]
            assert plain == pytest.approx(duck, rel=1e-15)


def test_effective_count() -> None:
    assert effective_count(np.ones(7)) == 7.0
    assert effective_count(np.full(4, 10.0)) == 4.0
    assert effective_count(np.array([1.0, 3.0])) == pytest.approx(16 / 10)
    assert effective_count(None, 5) == 5.0


def _table(con: duckdb.DuckDBPyConnection, rows: Sequence[tuple[int, str | None, int, float, str]]) -> None:
    con.execute("CREATE OR REPLACE TABLE t (start_ns BIGINT, tenant VARCHAR, e2e_ns BIGINT, adjusted_count DOUBLE, "
                "status VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", [list(r) for r in rows])


def test_sql_series_equals_the_expanded_truth_per_window_and_group() -> None:
    rng = random.Random(7)
    con = duckdb.connect()
    for _ in range(12):
        rows = [(rng.randint(0, 5) * 60_000_000_000 + rng.randint(0, 59_000_000_000), rng.choice(["a", "b", None]),
                 rng.choice([rng.randint(1, 10), rng.randint(1, 10**9)]), float(rng.choice([1, 1, 2, 4, 10, 16])),
                 rng.choice(["ok", "ok", "ok", "error", "timeout"])) for _ in range(rng.randint(30, 300))]
        rows.append((0, "a", 5, 4.0, "ok"))  # at least one weight other than 1
        _table(con, rows)
        for include_failures in (True, False):
            frame = percentile_series(con, "e2e", window_s=60, by=["tenant"], source="t",
                                      include_failures=include_failures)
            for row in frame.iter_rows(named=True):
                mine = [r for r in rows if r[0] // 60_000_000_000 * 60_000_000_000 == row["window_start_ns"]
                        and r[1] == row["tenant"]]
                kept = sorted((r for r in mine if include_failures or r[4] == "ok"), key=lambda r: r[2])
                assert row["requests"] == len(mine)
                assert row["requests_weighted"] == sum(r[3] for r in mine)
                assert row["errors_weighted"] == sum(r[3] for r in mine if r[4] == "error")
                assert row["n"] == len(kept)
                assert row["n_weighted"] == sum(r[3] for r in kept)
                if not kept:
                    assert row["p50_ms"] is None
                    continue
                w = np.array([r[3] for r in kept])
                assert row["n_effective"] == pytest.approx(effective_count(w), rel=1e-12)
                for name, q in QUANTILES:
                    truth = expanded_quantile([float(r[2]) for r in kept], [int(r[3]) for r in kept], q)
                    assert row[f"{name}_ms"] == pytest.approx(truth / 1e6, rel=1e-12, abs=1e-12), (name, kept)
                    assert row[f"{name}_low_sample"] == (effective_count(w) * (1 - q) < 5)


def test_sql_series_equals_numpy_on_fractional_weights() -> None:
    rng = random.Random(8)
    con = duckdb.connect()
    for _ in range(10):
        rows = [(rng.randint(0, 59_000_000_000), "a", rng.randint(1, 10**8), rng.choice([1.0, 1.25, 2.5, 3.75, 100.5]),
                 "ok") for _ in range(rng.randint(2, 200))]
        _table(con, rows)
        row = percentile_series(con, "e2e", window_s=60, source="t").row(0, named=True)
        kept = sorted(rows, key=lambda r: r[2])
        values = np.array([float(r[2]) for r in kept])
        weights = np.array([r[3] for r in kept])
        for name, q in QUANTILES:
            want = weighted_quantile_sorted(values, weights, q)
            assert row[f"{name}_ms"] == pytest.approx(want / 1e6, rel=1e-12)


def test_unsampled_source_takes_the_unweighted_path() -> None:
    con = duckdb.connect()
    _table(con, [(i * 1_000_000, "a", 10 + i, 1.0, "ok") for i in range(50)])
    frame = percentile_series(con, "e2e", window_s=60, source="t")
    plain = con.execute("SELECT quantile_cont(e2e_ns, [0.5, 0.9, 0.99, 0.999]) FROM t").fetchall()[0][0]
    assert [frame.row(0, named=True)[f"{n}_ms"] for n, _ in QUANTILES] == [v / 1e6 for v in plain]
    assert frame.row(0, named=True)["n_effective"] == 50.0
