"""The offline study of two routes around the quarter-sampled cold start (`tests.sample_traces.stage_scan`): its scan
finds a planted cluster where it is, and its stretch rises equal a plain loop's."""

from __future__ import annotations

import numpy as np

from tests.sample_traces.stage_scan import COLD_MINUTE, SEC, Best, scan, stretch_rises

MINUTE = 60 * SEC


def test_the_scan_finds_a_stage_entered_only_in_one_window() -> None:
    """20 one-minute windows of 100 requests; only 5 requests of window 3 spend any time in the stage: the pooled p99
    is 0, those 5 are the values above it, and their window alone is the best stretch at the smallest p-value."""
    start = np.repeat(np.arange(20, dtype=np.int64) * MINUTE, 100) + np.tile(np.arange(100, dtype=np.int64) * SEC // 2,
                                                                             20)
    values = np.zeros(start.size)
    values[300:305] = [1.0, 2.0, 3.0, 4.0, 5.0]  # window 3's first five requests
    assert scan(start, values, MINUTE) == Best(0.001, 3 * MINUTE, 1)
    assert scan(start, np.zeros(start.size), MINUTE) is None  # nothing above the threshold: no stretch


def test_stretch_rises_equal_a_plain_loop() -> None:
    """The largest p99 over the pooled p99 of every 4-minute stretch holding at least 500 values, and of those holding
    the cold start's minute, against numpy's p99 over plain masks."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        per_minute = rng.integers(80, 200, 30)
        start = np.concatenate([m * MINUTE + np.sort(rng.integers(0, MINUTE, c)) for m, c in enumerate(per_minute)])
        values = rng.lognormal(0.0, 1.0, start.size)
        minute = start // MINUTE
        pooled = np.quantile(values, 0.99)
        rises = {first: np.quantile(values[(minute >= first) & (minute < first + 4)], 0.99) / pooled
                 for first in range(27) if per_minute[first:first + 4].sum() >= 500}
        event = max([r for first, r in rises.items() if first <= COLD_MINUTE < first + 4], default=0.0)
        assert stretch_rises(start, values, 4) == (event, max(rises.values()))
