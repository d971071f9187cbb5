"""Spike detection on hand-made windows: a tail-only rise is found and merged, anything else is not."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.spikes import (
    bootstrap_p_value,
    bootstrap_quantile,
    detect,
    draws_for,
    quantile_sorted,
)

SEC = 1_000_000_000
WINDOW = 60 * SEC
PER_WINDOW = 1000


def _base() -> np.ndarray:
    """The same 1,000 values in every window: 1.0 s .. ~3.7 s, a long-ish right tail."""
    return np.exp(np.linspace(0.0, 1.3, PER_WINDOW)) * 1e9


def _series(windows: int, change: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    starts, values = [], []
    for w in range(windows):
        v = change.get(w, _base())
        starts.append(w * WINDOW + np.arange(v.size, dtype=np.int64) * (WINDOW // v.size))
        values.append(v)
    return np.concatenate(starts), np.concatenate(values)


def _tail_times(factor: float, share: float = 0.03) -> np.ndarray:
    v = _base().copy()
    k = int(share * v.size)
    v[-k:] *= factor  # only the slowest 3 % get slower: p50 does not move
    return v


def test_quantile_convention() -> None:
    v = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    assert quantile_sorted(v, 0.5) == 30.0
    assert quantile_sorted(v, 0.9) == 46.0
    assert quantile_sorted(v, 0.99) == pytest.approx(49.6)
    assert np.isnan(quantile_sorted(np.array([]), 0.5))


def test_order_statistic_bootstrap_matches_plain_resampling() -> None:
    rng = np.random.default_rng(3)
    data = np.sort(rng.lognormal(0, 1, 400))
    fast = bootstrap_quantile(data, 0.99, 20_000, np.random.default_rng(1))
    idx = np.random.default_rng(2).integers(0, data.size, size=(4000, data.size))
    plain = np.quantile(data[idx], 0.99, axis=1)
    for q in (0.1, 0.5, 0.9):
        assert np.quantile(fast, q) == pytest.approx(np.quantile(plain, q), rel=0.05)
    assert fast.mean() == pytest.approx(plain.mean(), rel=0.03)
    # degenerate samples have a degenerate bootstrap
    assert set(bootstrap_quantile(np.full(50, 7.0), 0.99, 100, rng)) == {7.0}
    assert set(bootstrap_quantile(np.array([3.0]), 0.5, 10, rng)) == {3.0}


def test_bootstrap_p_value_separates_shifted_tails() -> None:
    base = np.sort(np.tile(_base(), 9))
    assert bootstrap_p_value(np.sort(_tail_times(3.0)), base, draws=5000) == pytest.approx(1 / 5001)
    assert bootstrap_p_value(np.sort(_base()), base, draws=5000) > 0.2
    assert draws_for(0.01 / 10) == 10_000 and draws_for(0.5) == 2000


def test_clean_series_has_no_spike() -> None:
    starts, values = _series(10, {})
    det = detect(starts, values, WINDOW)
    assert det.spikes == [] and det.note == ""
    assert det.judged.all() and det.baseline.all()
    assert det.baseline_p50_ns == quantile_sorted(_base(), 0.5)


def test_tail_spike_is_found_and_adjacent_windows_merge() -> None:
    starts, values = _series(10, {4: _tail_times(3.0), 5: _tail_times(3.0), 6: _tail_times(3.0)})
    det = detect(starts, values, WINDOW)
    assert len(det.spikes) == 1
    spike = det.spikes[0]
    assert (spike.start_ns, spike.end_ns, spike.requests, spike.windows) == (4 * WINDOW, 7 * WINDOW, 3000, 3)
    assert spike.p50_ns == quantile_sorted(_base(), 0.5) == spike.baseline_p50_ns
    assert spike.baseline_p99_ns == quantile_sorted(np.sort(np.tile(_base(), 7)), 0.99)  # 7 baseline windows
    pooled = np.sort(np.concatenate([_tail_times(3.0)] * 3))
    assert spike.p99_ns == quantile_sorted(pooled, 0.99)
    assert spike.p_value < 0.001
    assert det.baseline.tolist() == [True] * 4 + [False] * 3 + [True] * 3


def test_one_quieter_window_between_two_spike_windows_is_bridged() -> None:
    # window 5 rose a little (above the baseline, below the spike threshold): 3..6 is one spike
    starts, values = _series(10, {3: _tail_times(3.0), 4: _tail_times(3.0), 5: _tail_times(1.05),
                                  6: _tail_times(3.0)})
    spikes = detect(starts, values, WINDOW).spikes
    assert [(s.start_ns // WINDOW, s.end_ns // WINDOW) for s in spikes] == [(3, 7)]
    # a flat window in between keeps two spikes apart
    starts, values = _series(12, {2: _tail_times(3.0), 3: _base(), 4: _tail_times(2.0)})
    spikes = detect(starts, values, WINDOW).spikes
    assert sorted((s.start_ns // WINDOW, s.end_ns // WINDOW) for s in spikes) == [(2, 3), (4, 5)]
    assert spikes[0].start_ns == 2 * WINDOW  # the larger excess comes first


def test_a_whole_distribution_shift_is_not_a_tail_spike() -> None:
    starts, values = _series(10, {5: _base() * 1.5})  # p50 moves 50 %: a slowdown, not a tail spike
    assert detect(starts, values, WINDOW).spikes == []


def test_small_rise_and_too_few_requests_are_not_spikes() -> None:
    starts, values = _series(10, {5: _tail_times(1.1)})  # +10 % at p99: under MIN_RISE
    assert detect(starts, values, WINDOW).spikes == []
    small = [np.sort(np.resize(_base(), 100))] * 10
    starts = np.concatenate([w * WINDOW + np.arange(100, dtype=np.int64) for w in range(10)])
    det = detect(starts, np.concatenate(small), WINDOW)
    assert det.spikes == [] and "too few windows" in det.note
    det = detect(np.array([], dtype=np.int64), np.array([]), WINDOW)
    assert det.note == "no requests"


def test_shoulders_leave_the_baseline_but_the_core_is_reported_when_it_suffices() -> None:
    # window 7 rose a little right after the spike (its ramp down): out of the baseline, not in the spike
    starts, values = _series(10, {5: _tail_times(3.0), 6: _tail_times(3.0), 7: _tail_times(1.08)})
    det = detect(starts, values, WINDOW)
    assert [(s.start_ns // WINDOW, s.end_ns // WINDOW) for s in det.spikes] == [(5, 7)]
    assert det.baseline.tolist() == [True] * 5 + [False] * 3 + [True] * 2
    assert det.baseline_p99_ns == quantile_sorted(np.sort(np.tile(_base(), 7)), 0.99)
