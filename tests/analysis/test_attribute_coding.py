"""The shortcuts of the attribute path against plain counts on random inputs: distinct values counted by hashes,
a stored attribute's codes gathered from its hours' runs without making them, a single's baseline counts taken
as its whole counts less the rows outside the baseline, and an attribute's counts from its hours' counts."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from analysis.engine.attribute_values import strings
from analysis.stats import attributes as A
from analysis.stats import explain as X


def _texts(rng: random.Random, n: int, pool: int) -> list[str]:
    return [f"v{rng.randrange(pool)}" + ("é" if rng.random() < 0.1 else "") for _ in range(n)]


@pytest.mark.parametrize("seed", range(1, 6))
def test_distinct_values_counted_by_hashes_equal_a_plain_count(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20):
        texts = _texts(rng, rng.randint(0, 3000), rng.choice([1, 5, 300, 10**6]))
        assert A.count_distinct(strings(texts)) == len(set(texts))
    # the merge of hours' values: each hour's distinct values, an id seen in two hours counted once
    hours = [sorted(set(_texts(rng, 2000, 5000))) for _ in range(3)]
    parts = [A.Part(np.arange(len(h), dtype=np.int64), np.arange(len(h), dtype=np.int64), strings(h)) for h in hours]
    assert A.merged_values(parts).distinct == len(set().union(*map(set, hours)))


def _reference(codes: list[int], rows: list[int], slots: int) -> list[int]:
    """Rows per code (the missing ones, -1, in the last slot) over `rows`, plainly."""
    seen = Counter(codes[r] for r in rows)
    return [seen.get(c, 0) for c in range(slots - 1)] + [seen.get(-1, 0)]


@pytest.mark.parametrize("seed", range(1, 6))
def test_lazy_codes_and_the_baseline_counts_equal_plain_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 400))
    labels = [f"x{i}" for i in range(int(rng.integers(1, 9)))]
    # runs of positions (an hour's rows each), some of the frame outside every run
    cuts = np.sort(rng.choice(np.arange(1, n), size=4, replace=False))
    bounds = [(0, int(cuts[0])), (int(cuts[1]), int(cuts[2])), (int(cuts[3]), n)]
    want = [-1] * n
    runs: list[A.Run] = []
    for a, b in bounds:
        d = int(rng.integers(1, 6))
        hour = rng.integers(0, d + 1, size=b - a).astype(np.int16)  # d: no value
        lut = np.append(rng.integers(0, len(labels), size=d), -1).astype(np.int64)
        runs.append((a, b, hour, lut))
        for i, c in enumerate(hour.tolist()):
            want[a + i] = int(lut[c])
    lazy = A.LazyCoded.of("k", labels, [None] * len(labels), [None] * len(labels), n, runs)
    rows = rng.permutation(n)[: int(rng.integers(0, n))].astype(np.int64)
    assert lazy.at(rows).tolist() == [want[r] for r in rows.tolist()]  # gathered without making the codes
    assert "codes" not in lazy.__dict__
    plain = X.Coded("k", np.array(want, dtype=np.int64), labels, lazy.lo, lazy.hi)
    base = np.sort(rng.permutation(n)[: int(rng.integers(n // 2 + 1, n + 1))]).astype(np.int64)
    outside = np.setdiff1d(np.arange(n), base).astype(np.int64)
    slots = len(labels) + 1
    assert X.base_counts(lazy, base, outside, slots).tolist() == _reference(want, base.tolist(), slots)
    assert X.base_counts(plain, base, None, slots).tolist() == _reference(want, base.tolist(), slots)
    assert lazy.codes.tolist() == want  # made when read


@pytest.mark.parametrize("seed", range(1, 6))
def test_an_attribute_coded_from_parts_counts_its_rows(seed: int) -> None:
    rng = random.Random(seed)
    n = 500
    positions = sorted(rng.sample(range(n), 300))
    texts = _texts(rng, 300, rng.choice([3, 40]))
    numeric = rng.random() < 0.5
    values = [str(rng.choice([0, 1, 3, 17, 100])) for _ in positions] if numeric else texts
    coded, distinct, is_number = A.code_values("k", np.array(positions, dtype=np.int64), pa.array(values), n)
    assert is_number == numeric and distinct == len(set(values))
    got = dict(zip(positions, values, strict=True))
    labels = [coded.labels[c] if c >= 0 else None for c in coded.codes.tolist()]
    if not numeric:
        assert labels == [got.get(i) for i in range(n)] and coded.labels == sorted(set(values))
    assert coded.counts is not None
    assert coded.counts.tolist() == _reference(coded.codes.tolist(), list(range(n)), len(coded.labels) + 1)
