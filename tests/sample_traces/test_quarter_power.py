"""The cold-start carrying study (`tests.sample_traces.quarter_power`) on two seeds: at full rate the cold start lifts
its 60 s window's p99 far beyond the 20 % rise and beyond the clean runs' largest window rise (the figures docs/demo.md
records for 60 seeds), and its counts are of the requests it names."""

from __future__ import annotations

import numpy as np

from tests.sample_traces.quarter_power import others_quantile, study


def test_at_full_rate_the_cold_start_stands_out_on_every_seed() -> None:
    got = study(2, 600.0, 60.0, 1.0)
    assert all(c >= 2.0 for c in got["cold"]), got
    assert min(got["cold"]) > max(got["null"]) and max(got["null"]) < 1.5, got
    assert all(a >= 10 for a in got["above"]), got  # of about 27 requests routed to the replica while it loads


def test_values_on_top_put_the_p99_at_the_others_quantile() -> None:
    """`--lift`'s rule against numpy's own p99 of the whole window, on random windows and event sizes."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(500, 3000))
        m = int(rng.integers(0, (n - 1) // 100 + 1))  # at most 0.01 (n - 1) on top: the p99 stays among the others
        others = rng.lognormal(0.0, float(rng.uniform(0.3, 2.0)), n - m)
        window = np.concatenate([others, others.max() + rng.uniform(1.0, 100.0, m)])
        assert np.quantile(window, 0.99) == np.quantile(others, others_quantile(n, m))
