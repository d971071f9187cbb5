"""The simulator's own percentile agrees with the analysis' owner of the convention, value for value."""

from __future__ import annotations

import math
import random

import numpy as np

from analysis.stats.spikes import quantile_sorted
from sample_traces.quantile import quantile


def test_known_values() -> None:
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert quantile([10.0, 20.0], 0.99) == 19.9
    assert quantile([7.0], 0.99) == 7.0
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.0) == 1.0
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 1.0) == 5.0
    assert math.isnan(quantile([], 0.5))


def test_equals_the_analysis_quantile_on_random_inputs() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        n = rng.randrange(1, 300)
        values = [rng.choice([rng.lognormvariate(5, 1.5), float(rng.randrange(50))]) for _ in range(n)]
        q = rng.choice([0.5, 0.9, 0.99, 0.999, rng.random()])
        assert quantile(values, q) == quantile_sorted(np.sort(np.asarray(values, dtype=np.float64)), q)
