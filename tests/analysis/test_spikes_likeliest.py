"""The likeliest stretch of a run (spikes._Scan.likeliest) against a reference written from the rule: of the stretches
of consecutive windows inside the grown run that hold the whole core, the one with the largest scan statistic (the
first from the left, then the shortest, on a tie), a stretch longer than the scan's longest not among them; the core
itself when none is.
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats.spikes import _Scan, _xlogx_table, tail_ratio


def reference(k: np.ndarray, n: np.ndarray, s: np.ndarray, core: tuple[int, int], grown: tuple[int, int],
              max_len: int) -> list[int]:
    """Every admissible stretch scored from the windows' own counts, the best kept."""
    total_k, total_n = int(k.sum()), int(n.sum())
    best, arg = None, list(range(core[0], core[1] + 1))
    for a in range(grown[0], core[0] + 1):
        for b in range(core[1], grown[1] + 1):
            if b - a + 1 > max_len:
                continue
            ratio = float(tail_ratio(int(k[a:b + 1].sum()), int(n[a:b + 1].sum()), float(s[a:b + 1].sum()),
                                     total_k, total_n))
            if best is None or ratio > best:
                best, arg = ratio, list(range(a, b + 1))
    return arg


@pytest.mark.parametrize("seed", range(4))
def test_likeliest_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(250):
        w = int(rng.integers(3, 14))
        n = rng.integers(50, 800, size=w)
        k = rng.binomial(n, rng.uniform(0.005, 0.04, size=w))
        s = np.array([rng.exponential(rng.uniform(0.5, 3.0), size=int(x)).sum() for x in k])
        if k.sum() == 0:
            continue
        s *= k.sum() / max(s.sum(), 1e-9)  # the scores' mean is 1 over all the values above the threshold
        lo, hi = sorted(int(x) for x in rng.integers(0, w, size=2))
        c0, c1 = sorted(int(x) for x in rng.integers(lo, hi + 1, size=2))
        max_len = int(rng.integers(1, w + 1))
        scan = _Scan(position=np.arange(w), ck=np.concatenate([[0], np.cumsum(k)]),
                     cn=np.concatenate([[0], np.cumsum(n)]), cs=np.concatenate([[0.0], np.cumsum(s)]),
                     total_k=int(k.sum()), total_n=int(n.sum()), max_len=max_len, null_max=np.zeros(1),
                     table=_xlogx_table(int(k.sum())))
        got = scan.likeliest(list(range(c0, c1 + 1)), list(range(lo, hi + 1)))
        assert got == reference(k, n, s, (c0, c1), (lo, hi), max_len), (k, n, (c0, c1), (lo, hi), max_len)


def test_a_diluting_shoulder_is_cut() -> None:
    """Core window 2; the grown run 1-3, whose window 3 holds fewer values above the threshold than expected: the
    likeliest stretch is 1-2."""
    n = np.array([500, 500, 500, 500, 500])
    k = np.array([3, 9, 12, 2, 4])
    s = k.astype(float)
    s[1:3] *= 1.5
    s *= k.sum() / s.sum()
    scan = _Scan(position=np.arange(5), ck=np.concatenate([[0], np.cumsum(k)]), cn=np.concatenate([[0], np.cumsum(n)]),
                 cs=np.concatenate([[0.0], np.cumsum(s)]), total_k=int(k.sum()), total_n=int(n.sum()), max_len=2,
                 null_max=np.zeros(1), table=_xlogx_table(int(k.sum())))
    assert scan.likeliest([2], [1, 2, 3]) == [1, 2]
