"""A tail slice (explain.tail_slice) is the slowest (1 - q) share of the rows, values tied at its cut taken earliest
first, checked against a plain sort on random values with many ties; and the same rows chosen on ClickHouse (chdb)
by analysis.clickhouse.report.tail_sql, which the stage shares' local baseline reads there, weighted or not."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from analysis.clickhouse.report import tail_sql
from analysis.stats import explain as X

SIZES = (0, 1, 9, 10, 11, 99, 100, 101, 150, 999, 1000, 1001, 2500)


def _draw(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n rows' values with many ties (a few distinct ones), their start order's positions among 3n, and weights."""
    values = np.asarray([float(rng.randrange(1, rng.choice([3, 20, 400]) + 1)) for _ in range(3 * n)])
    rows = np.asarray(sorted(rng.sample(range(3 * n), n)), dtype=np.int64)
    weights = np.asarray([rng.choice([1.0, 2.0, 0.5, 10 / 3]) for _ in range(3 * n)])
    return values, rows, weights


def _plain(values: np.ndarray, rows: np.ndarray, weights: np.ndarray | None) -> list[int]:
    """The rows sorted by value descending, then position; the first n / 100 of them rounded up (at least 10), or,
    weighted, up to the first whose running weight reaches a hundredth of the whole (at least 10): q = 0.99 read
    exactly, not 1 - 0.99 in floating point (a hair above 0.01)."""
    assert X.TAIL_Q == 0.99
    order = sorted(rows.tolist(), key=lambda r: (-values[r], r))
    if weights is None:
        k = max(10, (len(order) + 99) // 100)
    else:
        total = sum(weights[r] for r in order)  # the same order of additions as the running sum below
        running, k = 0.0, len(order)
        for i, r in enumerate(order):
            running += weights[r]
            if running >= total / 100:
                k = max(10, i + 1)
                break
    return sorted(order[:k])


def test_the_tail_is_a_hundredth_rounded_up_in_integers() -> None:
    # 1 - 0.99 is 0.010000000000000009 in floating point: its ceiling made 11 of 1,000 rows and 51 of 5,000
    assert [X.tail_size(n) for n in (0, 5, 10, 999, 1000, 1001, 1100, 5000, 5001, 123_456_700)] == \
        [0, 5, 10, 10, 10, 11, 11, 50, 51, 1_234_567]
    assert X.tail_share() == X.tail_share(0.99) == Fraction(1, 100) and X.tail_share(0.95) == Fraction(1, 20)
    assert X.tail_weight(10_000.0) == 100.0 and X.tail_weight(4_000.0) == 40.0


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_slice_is_the_slowest_rows_ties_taken_earliest_first(seed: int) -> None:
    rng = random.Random(seed)
    for n in SIZES:
        values, rows, weights = _draw(rng, n)
        assert sorted(X.tail_slice(values, rows).tolist()) == _plain(values, rows, None), n
        assert sorted(X.tail_slice(values, rows, weights=weights).tolist()) == _plain(values, rows, weights), n


@pytest.mark.slow
def test_clickhouse_chooses_the_same_rows(chdb_client: Any) -> None:
    rng = random.Random(7)
    chdb_client.command("CREATE TABLE tails (trace_id String, start_ns Int64, e2e_ns Int64, value Float64, "
                   "adjusted_count Float64, keep Bool) ENGINE = Memory")
    for n in SIZES:
        values, rows, weights = _draw(rng, n)
        kept = set(rows.tolist())
        chdb_client.command("TRUNCATE TABLE tails")
        if n:  # every drawn row, the rows' own kept: the others must be left out by the condition
            chdb_client.command("INSERT INTO tails VALUES " + ", ".join(
                f"('t{i}', {1_000 + 7 * i}, {int(values[i])}, {float(values[i])!r}, {float(weights[i])!r}, {i in kept})"
                for i in range(values.size)))
        for w in (None, weights):
            sql, k = tail_sql(chdb_client, "tails", "keep", "value", None if w is None else "adjusted_count")
            got = sorted(int(r["trace_id"][1:]) for r in chdb_client.query(sql).to_pylist())
            want = sorted(X.tail_slice(values, rows, weights=w).tolist())
            assert (got, k) == (want, len(want)), (n, w is None)
