"""A spike's bounds from its culprit (analysis.stats.bounds) against plain references on random inputs: the Fisher
p-value against counting every draw of the urn (or exact fractions), and the stretch against the largest interval
that satisfies the rule's conditions, found by trying every interval."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from analysis.stats.bounds import culprit_stretch, over_represented_p


def urn_p(k: int, m: int, k_base: int, m_base: int) -> float:
    """P(at least k culprits among m requests drawn from the pooled ones), by listing every draw."""
    pooled = [1] * (k + k_base) + [0] * (m - k + m_base - k_base)
    draws = list(itertools.combinations(range(len(pooled)), m))
    return sum(1 for d in draws if sum(pooled[i] for i in d) >= k) / len(draws)


def fraction_p(k: int, m: int, k_base: int, m_base: int) -> Fraction:
    """The same p-value as a sum of exact fractions (the hypergeometric law written out)."""
    n, c = m + m_base, k + k_base
    return sum((Fraction(math.comb(c, j) * math.comb(n - c, m - j), math.comb(n, m)) for j in range(k, m + 1)),
               Fraction(0))


def test_the_p_value_counts_the_draws_of_the_urn() -> None:
    rng = random.Random(20261205)
    for _ in range(300):
        m, m_base = rng.randint(0, 7), rng.randint(0, 7)
        k, k_base = rng.randint(0, m), rng.randint(0, m_base)
        assert over_represented_p(k, m, k_base, m_base) == pytest.approx(urn_p(k, m, k_base, m_base), rel=1e-9)


def test_the_p_value_on_larger_counts_equals_exact_fractions() -> None:
    rng = random.Random(7)
    for _ in range(300):
        m, m_base = rng.randint(0, 300), rng.randint(1, 3000)
        k, k_base = rng.randint(0, m), rng.randint(0, m_base)
        got = over_represented_p(k, m, k_base, m_base)
        want = float(fraction_p(k, m, k_base, m_base))
        assert got == pytest.approx(want, rel=1e-7, abs=1e-300), (k, m, k_base, m_base)


def test_known_values() -> None:
    # a culprit 20 of 26 slow requests where the baseline had 2 of 36; the same share as the baseline's
    assert over_represented_p(20, 26, 2, 36) < 1e-8
    assert over_represented_p(0, 10, 0, 10) == 1.0
    assert over_represented_p(5, 10, 5, 10) > 0.5
    with pytest.raises(ValueError):
        over_represented_p(3, 2, 0, 5)


def reference_stretch(first: int, last: int, k: list[int], m: list[int], k_base: int, m_base: int,
                      in_base: list[bool], open_: list[bool], wins: list[int], alpha: float) -> tuple[int, int]:
    """The rule written as a search: the windows of [first, last] that pass fix the kept span [lo, hi]; the answer is
    the largest interval around it whose added windows are all open, pass and follow each other in time."""

    def passes(i: int) -> bool:
        kb, mb = (k_base - k[i], m_base - m[i]) if in_base[i] else (k_base, m_base)
        return float(fraction_p(k[i], m[i], kb, mb)) <= alpha

    kept = [i for i in range(first, last + 1) if passes(i)]
    if not kept:
        return first, last
    lo, hi = kept[0], kept[-1]
    best = (lo, hi)
    for a in range(0, lo + 1):
        for b in range(hi, len(k)):
            added = list(range(a, lo)) + list(range(hi + 1, b + 1))
            steps = list(range(a, lo)) + list(range(hi, b))  # each added window next in time to the one inside it
            if all(open_[i] and passes(i) for i in added) and all(wins[i + 1] - wins[i] == 1 for i in steps) \
                    and b - a > best[1] - best[0]:
                best = (a, b)
    return best


def test_the_stretch_equals_the_largest_interval_the_rule_allows() -> None:
    rng = np.random.default_rng(34)
    checked_moved = 0
    for _ in range(400):
        w = int(rng.integers(3, 12))
        m = rng.integers(0, 30, size=w)
        share = np.where(rng.random(w) < 0.4, 0.8, 0.1)  # windows where the culprit is heavy, and not
        k = rng.binomial(m, share)
        in_base = rng.random(w) < 0.6
        k_base = int(k[in_base].sum()) + int(rng.integers(0, 5))
        m_base = int(m[in_base].sum()) + k_base + int(rng.integers(5, 60))
        open_ = rng.random(w) < 0.85
        wins = np.cumsum(np.where(rng.random(w) < 0.9, 1, 2)).astype(np.int64)
        first = int(rng.integers(0, w))
        last = int(rng.integers(first, w))
        got = culprit_stretch(first, last, k.astype(np.int64), m.astype(np.int64), k_base, m_base, in_base, open_,
                              wins, 0.01)
        want = reference_stretch(first, last, k.tolist(), m.tolist(), k_base, m_base, in_base.tolist(),
                                 open_.tolist(), wins.tolist(), 0.01)
        assert got == want, (first, last, k.tolist(), m.tolist(), k_base, m_base)
        checked_moved += got != (first, last)
    assert checked_moved > 100  # the inputs exercise trimming and growing, not only the unchanged stretch
