"""Spike detection: windows whose p99 rose significantly against a robust baseline while p50 held.

The method, in order (constants below; the same for every store, never tuned per incident):

1. Per window: n, p50, p99 (`quantile_cont` convention). Windows with fewer than
   `MIN_TAIL` values beyond the p99 are not judged (their p99 is an extreme value).
2. Robust level of the series: the median of the window p99s. Windows whose p99 sits more
   than MIN_RISE above it are "elevated"; every other judged window is baseline, and the
   baseline p50 / p99 are computed over all its requests pooled (so a spike does not
   raise its own baseline).
3. A window is a candidate when its p99 exceeds the baseline p99 by at least MIN_RISE.
4. Candidate windows that touch (or are one window apart, that window's p99 also above the
   baseline) merge into one run (the core). Its shoulders, the touching windows whose p99 is
   above the baseline p99 at all, are taken out of the baseline, which is pooled again.
5. Each run is judged on its requests pooled (the core; if that falls short, the core with
   its shoulders): its p99 must still rise by MIN_RISE, its p50 stay within P50_TOLERANCE,
   and a bootstrap of both p99s (run and baseline resampled independently) must give a
   one-sided p-value below ALPHA / (number of judged windows) (Bonferroni). Never a t-test
   on a percentile.

The bootstrap of a quantile does not redraw n values: the k-th order statistic of a
resample is F_n^-1(U_(k)) with U_(k) ~ Beta(k, n + 1 - k) (and U_(k+1) follows from it),
which is the same distribution at O(B) cost after one sort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from analysis.percentiles import MIN_TAIL

#: Relative rise of p99 over the baseline p99 below which nothing is a spike.
MIN_RISE: Final = 0.2
#: Largest relative move of a window's p50 against the baseline p50 for a tail spike.
P50_TOLERANCE: Final = 0.1
#: Family-wise significance level over all judged windows.
ALPHA: Final = 0.01
#: Fewest bootstrap resamples per test (more when the Bonferroni level needs them).
BOOTSTRAP: Final = 2000
#: Fewest baseline windows for any judgement.
MIN_BASELINE_WINDOWS: Final = 3

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass
class Spike:
    """One spike: [start_ns, end_ns) with its own and the baseline's p50 / p99 (ns)."""

    start_ns: int
    end_ns: int
    requests: int
    p50_ns: float
    p99_ns: float
    baseline_p50_ns: float
    baseline_p99_ns: float
    p_value: float
    windows: int

    @property
    def excess_ns(self) -> float:
        """Spike p99 minus baseline p99."""
        return self.p99_ns - self.baseline_p99_ns


@dataclass
class Detection:
    """What detection saw: the per-window table, the baseline, and the spikes (largest excess first)."""

    window_ns: int
    window_start_ns: I64
    n: I64
    p50_ns: F64
    p99_ns: F64
    judged: npt.NDArray[np.bool_]
    baseline: npt.NDArray[np.bool_]
    candidate: npt.NDArray[np.bool_]
    significant: npt.NDArray[np.bool_]
    p_value: F64
    baseline_p50_ns: float
    baseline_p99_ns: float
    spikes: list[Spike] = field(default_factory=list)
    note: str = ""


def quantile_sorted(sorted_values: F64, q: float) -> float:
    """`quantile_cont` of sorted values (rank (n - 1) q, linear interpolation); nan when empty."""
    n = sorted_values.size
    if n == 0:
        return math.nan
    h = (n - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return float(sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo]))


def bootstrap_quantile(sorted_values: F64, q: float, draws: int, rng: np.random.Generator) -> F64:
    """`draws` bootstrap replicates of the `quantile_cont` of sorted values, from the order statistics' law.

    Exactly the law of the quantile of n values redrawn with replacement: the k-th smallest
    of the resample is F_n^-1(U) with U ~ Beta(k, n + 1 - k), and the next one is
    U + (1 - U) * Beta(1, n - k).
    """
    n = sorted_values.size
    if n == 0:
        return np.full(draws, np.nan)
    if n == 1:
        return np.full(draws, float(sorted_values[0]))
    h = (n - 1) * q
    k = math.floor(h)  # 0-based rank of the lower order statistic
    frac = h - k
    u1 = rng.beta(k + 1, n - k, size=draws)
    lower = sorted_values[np.clip(np.ceil(u1 * n).astype(np.int64) - 1, 0, n - 1)]
    if frac == 0 or k + 1 >= n:
        return lower.astype(np.float64)
    u2 = u1 + (1 - u1) * rng.beta(1, n - k - 1, size=draws)
    upper = sorted_values[np.clip(np.ceil(u2 * n).astype(np.int64) - 1, 0, n - 1)]
    return (lower + frac * (upper - lower)).astype(np.float64)


def bootstrap_p_value(spike_sorted: F64, base_sorted: F64, q: float = 0.99, draws: int = BOOTSTRAP,
                      seed: int = 0) -> float:
    """One-sided bootstrap p-value that the spike's quantile q exceeds the baseline's.

    Both samples are resampled independently; p = (1 + #{d* <= 0}) / (draws + 1) where d* is the
    resampled difference of the two quantiles (the percentile bootstrap test).
    """
    if spike_sorted.size == 0 or base_sorted.size == 0:
        return 1.0
    rng = np.random.default_rng(seed)
    d_star = bootstrap_quantile(spike_sorted, q, draws, rng) - bootstrap_quantile(base_sorted, q, draws, rng)
    return float((1 + np.count_nonzero(d_star <= 0)) / (draws + 1))


def draws_for(level: float) -> int:
    """Resamples enough to resolve a p-value below `level` (at least BOOTSTRAP, at most 2 million)."""
    return int(min(max(BOOTSTRAP, math.ceil(10 / level)), 2_000_000))


def _window_quantiles(sorted_by_win_values: F64, starts: I64, counts: I64, q: float) -> F64:
    h = (counts - 1) * q
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    a = sorted_by_win_values[starts + lo]
    b = sorted_by_win_values[starts + hi]
    return a + (h - lo) * (b - a)


def detect(start_ns: I64, values: F64, window_ns: int, *, seed: int = 0) -> Detection:
    """Find p99 spikes with a flat p50 in (start_ns, value) pairs cut into windows of window_ns."""
    start_ns = np.asarray(start_ns, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(values)
    start_ns, values = start_ns[keep], values[keep]
    win_all = start_ns // window_ns
    if win_all.size and np.all(win_all[1:] >= win_all[:-1]):  # rows in time order: sort within windows
        first = np.concatenate([[0], np.flatnonzero(win_all[1:] != win_all[:-1]) + 1])
        wins = win_all[first]
        counts = np.diff(np.append(first, win_all.size))
        v_sorted = values.copy()
        for a, c in zip(first.tolist(), counts.tolist(), strict=True):
            v_sorted[a:a + c].sort()
    else:
        order = np.lexsort((values, win_all))
        v_sorted = values[order]
        wins, first, counts = np.unique(win_all[order], return_index=True, return_counts=True)
    counts = counts.astype(np.int64)
    first = first.astype(np.int64)
    m = wins.size
    empty_f = np.zeros(m, dtype=np.float64)
    det = Detection(window_ns=window_ns, window_start_ns=(wins * window_ns).astype(np.int64), n=counts,
                    p50_ns=empty_f.copy(), p99_ns=empty_f.copy(), judged=np.zeros(m, bool),
                    baseline=np.zeros(m, bool), candidate=np.zeros(m, bool), significant=np.zeros(m, bool),
                    p_value=np.ones(m), baseline_p50_ns=math.nan, baseline_p99_ns=math.nan)
    if m == 0:
        det.note = "no requests"
        return det
    det.p50_ns = _window_quantiles(v_sorted, first, counts, 0.5)
    det.p99_ns = _window_quantiles(v_sorted, first, counts, 0.99)
    det.judged = counts * (1 - 0.99) >= MIN_TAIL
    if det.judged.sum() < MIN_BASELINE_WINDOWS + 1:
        det.note = (f"too few windows with enough requests to judge a p99 ({int(det.judged.sum())} windows "
                    f"with >= {int(MIN_TAIL / 0.01)} requests)")
        return det
    med = float(np.median(det.p99_ns[det.judged]))
    elevated = det.p99_ns > (1 + MIN_RISE) * med
    det.baseline = det.judged & ~elevated
    if det.baseline.sum() < MIN_BASELINE_WINDOWS:
        det.note = "too few baseline windows (the p99 is high nearly everywhere)"
        return det
    base_sorted = _pool(det, v_sorted, counts)
    det.candidate = det.judged & (det.p99_ns >= (1 + MIN_RISE) * det.baseline_p99_ns)
    cores = _runs(det)
    # shoulders: a run grows into the touching windows whose p99 is above the baseline p99 at all,
    # and those windows leave the baseline (a spike's ramp must not raise its own baseline)
    grown = _merge_touching(det, [(core, _grow(det, core)) for core in cores])
    shoulders = np.zeros(det.n.size, dtype=bool)
    for _, ext in grown:
        shoulders[ext] = True
    if (det.baseline & ~shoulders).sum() >= MIN_BASELINE_WINDOWS and shoulders.any():
        det.baseline &= ~shoulders
        base_sorted = _pool(det, v_sorted, counts)
        det.candidate = det.judged & (det.p99_ns >= (1 + MIN_RISE) * det.baseline_p99_ns)
    level = ALPHA / int(det.judged.sum())
    for i in np.flatnonzero(det.candidate):
        w_sorted = v_sorted[first[i]:first[i] + counts[i]]
        det.p_value[i] = bootstrap_p_value(w_sorted, base_sorted, 0.99, seed=seed + int(i))
    for core, ext in grown:
        for run in ([core, ext] if ext != core else [core]):  # the shoulders only when the core alone falls short
            spike = _judge(det, run, v_sorted, first, counts, base_sorted, level, seed)
            if spike is not None:
                det.significant[run] = True
                det.spikes.append(spike)
                break
    det.spikes.sort(key=lambda sp: (-sp.excess_ns, sp.start_ns))
    return det


def _pool(det: Detection, v_sorted: F64, counts: I64) -> F64:
    """Sorted values of the baseline windows; sets the baseline p50 / p99."""
    base_sorted = np.sort(v_sorted[np.repeat(det.baseline, counts)])
    det.baseline_p50_ns = quantile_sorted(base_sorted, 0.5)
    det.baseline_p99_ns = quantile_sorted(base_sorted, 0.99)
    return base_sorted


def _judge(det: Detection, run: list[int], v_sorted: F64, first: I64, counts: I64, base_sorted: F64,
           level: float, seed: int) -> Spike | None:
    """The run as a spike if its pooled p99 rose enough and significantly with a flat p50, else None."""
    vals = np.sort(np.concatenate([v_sorted[first[i]:first[i] + counts[i]] for i in run]))
    p50 = quantile_sorted(vals, 0.5)
    p99 = quantile_sorted(vals, 0.99)
    if p99 < (1 + MIN_RISE) * det.baseline_p99_ns:
        return None
    if abs(p50 - det.baseline_p50_ns) > P50_TOLERANCE * abs(det.baseline_p50_ns):
        return None
    p_value = bootstrap_p_value(vals, base_sorted, 0.99, draws=draws_for(level), seed=seed + 7919 + run[0])
    if p_value >= level:
        return None
    return Spike(start_ns=int(det.window_start_ns[run[0]]), end_ns=int(det.window_start_ns[run[-1]] + det.window_ns),
                 requests=int(vals.size), p50_ns=p50, p99_ns=p99, baseline_p50_ns=det.baseline_p50_ns,
                 baseline_p99_ns=det.baseline_p99_ns, p_value=p_value, windows=len(run))


def _grow(det: Detection, run: list[int]) -> list[int]:
    """The run plus the touching judged windows (either side, repeatedly) whose p99 is above the baseline p99."""
    wins = det.window_start_ns // det.window_ns
    lo, hi = run[0], run[-1]
    while lo > 0 and wins[lo] - wins[lo - 1] == 1 and det.judged[lo - 1] \
            and det.p99_ns[lo - 1] > det.baseline_p99_ns:
        lo -= 1
    while hi < wins.size - 1 and wins[hi + 1] - wins[hi] == 1 and det.judged[hi + 1] \
            and det.p99_ns[hi + 1] > det.baseline_p99_ns:
        hi += 1
    return list(range(lo, hi + 1))


def _merge_touching(det: Detection, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """Join (core, grown) runs whose grown ranges overlap or touch."""
    wins = det.window_start_ns // det.window_ns
    out: list[tuple[list[int], list[int]]] = []
    for core, ext in pairs:
        if out and wins[ext[0]] - wins[out[-1][1][-1]] <= 1:
            pc, pe = out[-1]
            out[-1] = (list(range(pc[0], core[-1] + 1)), list(range(pe[0], max(pe[-1], ext[-1]) + 1)))
        else:
            out.append((core, ext))
    return out


def _runs(det: Detection) -> list[list[int]]:
    """Runs of candidate windows that touch, bridging one window between two whose p99 also rose."""
    wins = det.window_start_ns // det.window_ns
    runs: list[list[int]] = []
    for i in (int(x) for x in np.flatnonzero(det.candidate)):
        if runs:
            last = runs[-1][-1]
            gap = int(wins[i] - wins[last])
            bridge = gap == 2 and i - last == 2 and bool(det.p99_ns[last + 1] > det.baseline_p99_ns)
            if gap == 1 or bridge:
                runs[-1].extend(range(last + 1, i + 1))
                continue
        runs.append([i])
    return runs
