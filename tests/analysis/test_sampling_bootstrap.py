"""analysis.stats.sampling's bootstrap of a weighted quantile against a literal "draw in proportion to the adjusted
counts" reference, on random inputs (seeded), compared in distribution by a two-sample Kolmogorov-Smirnov test.

The critical distance is the asymptotic one at ALPHA, sqrt(-ln(ALPHA / 2) (m + n) / (2 m n)); with
discrete (tied) values the test is conservative. Equal weights (uniform sampling): the literal n
draws and the bootstrap are the same law. Unequal weights independent of the values: the bootstrap
has the law of n_eff (Kish) literal draws (the design effect of a weighted estimate is n / n_eff),
and n literal draws are too narrow (the reason the bootstrap does not draw that way).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.engine.percentiles import effective_count
from analysis.stats.sampling import bootstrap_quantiles, quantile_interval

ALPHA = 1e-3
DRAWS = 1000


def _literal(values: np.ndarray, weights: np.ndarray, q: float, m: int, seed: int) -> np.ndarray:
    """The quantile (`quantile_cont`) of m requests drawn with probability adjusted_count / total, each weighing 1."""
    rng = np.random.default_rng(seed)
    p = weights / weights.sum()
    return np.array([np.quantile(values[rng.choice(values.size, m, p=p)], q) for _ in range(DRAWS)])


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance: the largest gap between the two empirical CDFs."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / a.size
    fb = np.searchsorted(np.sort(b), grid, side="right") / b.size
    return float(np.abs(fa - fb).max())


def _critical(m: int, n: int) -> float:
    return math.sqrt(-math.log(ALPHA / 2) * (m + n) / (2 * m * n))


@pytest.mark.parametrize(("seed", "q"), [(1, 0.5), (2, 0.9), (3, 0.99)])
def test_equal_weights_are_the_literal_proportional_draw(seed: int, q: float) -> None:
    rng = np.random.default_rng(seed)
    values = np.sort(rng.lognormal(0, 1, 1500))
    weights = np.full(values.size, 4.0)
    ours = bootstrap_quantiles(values, weights, q, DRAWS, seed=seed)
    literal = _literal(values, weights, q, values.size, seed + 100)
    assert _ks(ours, literal) < _critical(DRAWS, DRAWS)


@pytest.mark.parametrize(("seed", "q"), [(4, 0.5), (5, 0.9)])
def test_unequal_weights_have_the_law_of_n_effective_literal_draws(seed: int, q: float) -> None:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0, 1, 3000)
    weights = rng.choice([1.0, 4.0, 40.0], values.size)
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    n_eff = round(effective_count(weights))
    assert n_eff < values.size / 2  # the weights vary enough for the two literal sizes to differ
    ours = bootstrap_quantiles(values, weights, q, DRAWS, seed=seed)
    as_many_as_effective = _literal(values, weights, q, n_eff, seed + 100)
    assert _ks(ours, as_many_as_effective) < _critical(DRAWS, DRAWS)
    # n literal draws ignore the design effect: clearly another, narrower law
    as_many_as_kept = _literal(values, weights, q, values.size, seed + 200)
    assert _ks(ours, as_many_as_kept) > _critical(DRAWS, DRAWS)
    assert np.std(as_many_as_kept) < np.std(ours)


def test_the_interval_is_the_central_share_of_the_draws() -> None:
    rng = np.random.default_rng(9)
    values = np.sort(rng.lognormal(0, 1, 500))
    weights = rng.choice([1.0, 3.0], values.size)
    draws = bootstrap_quantiles(values, weights, 0.9, 400, seed=7)
    lo, hi = quantile_interval(values, weights, 0.9, level=0.9, draws=400, seed=7)
    assert (lo, hi) == tuple(np.quantile(draws, [0.05, 0.95]))
    assert all(math.isnan(x) for x in quantile_interval(values[:0], None, 0.5))
