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
   baseline) merge into one run (the core). Its shoulders are the touching windows whose
   p99 is above the baseline p99 at all.
5. Significance, one family for everything tested (a scan statistic, Kulldorff 1997):
   count, in every judged window, the values above the p99 of all judged windows pooled,
   and score each of them by its rank among them (Savage scores, `tail_scores`), averaged
   within blocks of nearly equal scores (`block_scores`: from the largest down, a block takes
   every score within SCORE_BLOCK_SPREAD of its largest, so no score moves by more than that;
   the largest ranks, whose score gaps 1/rank exceed it, stay alone; the mean stays 1).
   When nothing happened (every value drawn from one law) those counts are a
   multivariate hypergeometric draw and the block scores a random permutation over them,
   whatever the latency distribution. The null is drawn exactly (`scan_null_max`,
   `_block_sums`): the values of the small blocks take a random subset of the slots and are
   shuffled over it, as every value was before; then each large block in turn takes a random
   subset of the slots still free, drawn as how many of its values land in each window (a
   multivariate hypergeometric over the windows' free slots), whose cost grows with the
   windows, not with the block (54 blocks at K = 140,000). The blocks exist for that;
   the statistic stays a fixed function of the ranks, so the test stays exact.
   The statistic of a stretch of consecutive judged windows is the likelihood ratio of a
   heavier tail, peaks over the threshold: "its share above the threshold is higher than
   outside" plus "the values above it are larger"
   (`tail_ratio`: a few much slower requests count, not only how many rose above the
   threshold, which matters when a window's tail holds a handful of values, as under
   sampling); its p-value is the rank of that ratio among the
   largest ratio over *all* stretches (up to half the judged windows) in SCAN_DRAWS
   simulated draws. So the core, the core with its shoulders, and every other stretch
   share one error budget: under no incident, P(any stretch has p <= ALPHA) <= ALPHA,
   and none of the data-driven choices (the pruned baseline, the shoulders) can spend it
   again, since they do not enter the test.
6. A significant run's shoulders leave the baseline, which is pooled again (a spike's ramp
   must not raise its own baseline). Each run is then judged on its requests pooled (the
   core; if that falls short, the core with its shoulders; if both do, the stretch between
   them holding the core with the largest scan statistic, since a shoulder with few values
   above the threshold can dilute the grown run): its p99 must still rise by MIN_RISE, its
   p50 stay within P50_TOLERANCE, and its scan p-value be at most ALPHA. All three are
   stretches of the scan, so trying them spends no more of the error budget.
   Never a t-test on a percentile.

Sampled traces (`weights`, each request's adjusted count): every percentile above is the
weighted quantile, a window is judged on its effective count (Kish), and the scan counts and ranks the
kept values above the weighted pooled p99 (under no incident, and sampling that does not change
from window to window, the kept values are as exchangeable as the full ones). With no weights,
or every weight 1, the computation is the unweighted one, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from analysis.engine.percentiles import MIN_TAIL, effective_count, quantiles_unsorted, weighted_quantile_sorted

#: Relative rise of p99 over the baseline p99 below which nothing is a spike.
MIN_RISE: Final = 0.2
#: Largest relative move of a window's p50 against the baseline p50 for a tail spike.
P50_TOLERANCE: Final = 0.1
#: Family-wise significance level over every stretch of windows tested.
ALPHA: Final = 0.01
#: Simulated draws of the scan statistic's null law; ALPHA * (SCAN_DRAWS + 1) is a whole number, so
#: P(p <= ALPHA) <= ALPHA holds exactly, and p-values resolve down to 1 / (SCAN_DRAWS + 1).
SCAN_DRAWS: Final = 999
#: Longest stretch scanned, as a share of the judged windows (a spike longer than that has no baseline).
MAX_SCAN_SHARE: Final = 0.5
#: Widest spread of the tail scores averaged into one block (`block_scores`): the scores have mean and sd about 1,
#: so no score moves by more than a fifth of an sd; the four largest (score gaps 1/rank > 0.2) stay alone. Chosen
#: for the null's cost (benchmarks.bench_detect: 0.1 gave ~100 blocks at K = 140,000 and 0.38 against 0.23 CPU-s of
#: detection on 1.44 M values), not on any scenario's outcome.
SCORE_BLOCK_SPREAD: Final = 0.2
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
    #: requests the spike's kept requests stand for, and their effective count (both = requests unsampled)
    requests_weighted: float = math.nan
    n_effective: float = math.nan

    @property
    def excess_ns(self) -> float:
        """Spike p99 minus baseline p99."""
        return self.p99_ns - self.baseline_p99_ns


@dataclass
class Detection:
    """What detection saw: the per-window table, the baseline, the scan, and the spikes (largest excess first).

    `p_value[i]` is window i's own scan p-value (family-wise: compared with the largest
    ratio over all stretches), `exceed[i]` its values above `threshold_ns`, the p99 of all
    judged windows pooled; `scan_p_value` is the p-value of the most anomalous stretch,
    before any effect-size rule (the test's own false-alarm rate is ALPHA at most).
    """

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
    threshold_ns: float = math.nan
    exceed: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    scan_p_value: float = 1.0
    #: per window: the requests the kept ones stand for, and their effective count (equal to n when unsampled)
    n_weighted: F64 = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    n_effective: F64 = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    #: whether the values carried weights other than 1
    weighted: bool = False
    #: the scan and the values it read, kept for judging another stretch of the same windows (`judge_stretch`)
    scan: _Scan | None = field(default=None, repr=False, compare=False)
    source: WindowValues | None = field(default=None, repr=False, compare=False)


@dataclass
class Pool:
    """The values of a set of windows pooled: p50, p99, how many, what they stand for, their effective count."""

    p50_ns: float
    p99_ns: float
    n: int
    n_weighted: float
    n_effective: float


class WindowValues(Protocol):
    """Where detection reads values beyond the per-window table: pooled over windows, and counted above a level.

    `detect` holds them in memory (`SortedValues`); a remote engine answers on its server
    (analysis.clickhouse.report), so only per-window rows come back.
    """

    def pool(self, windows: npt.NDArray[np.bool_]) -> Pool:
        """The values of the windows flagged (a mask over the detection's windows) pooled."""
        ...

    def exceedances(self, threshold: float, judged: npt.NDArray[np.bool_]) -> Exceedances:
        """The values above `threshold` as the scan reads them (`Exceedances`): counts per window and the tail scores
        of the `judged` windows' ones, a function of their ranks only, so a remote engine sends back counts (per
        window, per block of scores, and the blocks' first ranks with the groups of tied values at their edges), not
        the values (`verified_blocks`, `summed_by_block`; `tied_scores` from every group of ties)."""
        ...


@dataclass
class Exceedances:
    """The values above the scan's threshold: per window their count (`exceed`), the tail scores of the judged windows'
    ones ascending (`block_scores` of `tail_scores`), and per window the sum of its judged ones' scores, added in
    ascending order (`score_sum`)."""

    exceed: I64
    scores: F64
    score_sum: F64


def exceedances_of(at: I64, vals: F64, judged: npt.NDArray[np.bool_]) -> Exceedances:
    """`Exceedances` of the values above the threshold (`vals`) and their windows' positions (`at`)."""
    exceed = np.bincount(at, minlength=judged.size).astype(np.int64)
    mine = judged[at]
    order = np.argsort(vals[mine], kind="stable")
    scores = block_scores(tail_scores(vals[mine][order]))
    sums = np.bincount(at[mine][order], weights=scores, minlength=judged.size).astype(np.float64)
    return Exceedances(exceed, scores, sums)


def tied_scores(total_k: int, tie_first: I64, tie_size: I64) -> tuple[F64, I64]:
    """`block_scores(tail_scores(v))` of any ascending v of total_k values whose groups of two or more equal values
    start at the ranks `tie_first` (0-based: how many values are smaller) and hold `tie_size` values, and the first
    rank of each of their blocks (`block_firsts`): the scores depend on the ranks and ties only, so a remote engine
    need only count them."""
    cover = np.zeros(total_k + 1, dtype=np.int64)
    np.add.at(cover, np.asarray(tie_first, dtype=np.int64) + 1, 1)
    np.add.at(cover, np.asarray(tie_first, dtype=np.int64) + np.asarray(tie_size, dtype=np.int64), -1)
    stand_in = np.cumsum(np.cumsum(cover)[:total_k] == 0).astype(np.float64)  # a new value where no tie continues
    scores = tail_scores(stand_in)
    return block_scores(scores), block_firsts(scores)


def verified_blocks(total_k: int, firsts: I64, group_lo: I64, group_size: I64) -> tuple[F64, I64] | None:
    """`tied_scores` from less than every group of ties: the blocks' first ranks as a remote engine found them
    (ascending, from 0) and the groups of equal values (first rank, size; a value alone is a group of one) holding
    each rank the rule reads: the largest, each block's first rank and the rank before it. The block scores and
    firsts when `block_firsts` over the tail scores finds exactly those firsts, else None (the engine's floats chose
    otherwise: ask for every group then).

    Exact: the tail scores rise from one value to the next (a tie's mean lies among its own Savage scores, up to a
    rounding far below their gaps of 1/total_k or more), so from a block's top the rule's search lands on f exactly
    when score(f) >= top - SCORE_BLOCK_SPREAD > score(f - 1), and each check reads only the listed groups' scores
    (`group_means`, the same floats as `tail_scores`). So at most 2 B + 1 groups are read, B the blocks, and B is
    small: the blocks' tops lie more than the spread apart within (0, H_K], so B <= H_K / SCORE_BLOCK_SPREAD + 1
    (72 at K = 10^6), whatever the ties."""
    firsts, lo, size = (np.asarray(x, dtype=np.int64) for x in (firsts, group_lo, group_size))
    if total_k == 0:
        return (np.zeros(0), firsts) if firsts.size == 0 else None
    if (firsts.size == 0 or firsts[0] != 0 or np.any(np.diff(firsts) <= 0) or firsts[-1] >= total_k
            or np.any(size < 1) or np.any(lo[1:] < lo[:-1] + size[:-1]) or lo.size == 0 or lo[0] < 0
            or lo[-1] + size[-1] > total_k):
        return None
    means = group_means(savage_scores(total_k), lo, size)

    def score(rank: int) -> float | None:
        i = int(np.searchsorted(lo, rank, side="right")) - 1
        return float(means[i]) if i >= 0 and rank < lo[i] + size[i] else None

    hi = total_k
    for f in firsts[::-1].tolist():
        top, at, below = score(hi - 1), score(f), (None if f == 0 else score(f - 1))
        if top is None or at is None or (f > 0 and below is None):
            return None
        floor = top - SCORE_BLOCK_SPREAD
        if not (at >= floor and (below is None or below < floor)):
            return None
        hi = f
    return _blocked(total_k, firsts), firsts


def summed_by_block(at: I64, block: I64, count: I64, scores: F64, firsts: I64, windows: int) -> F64:
    """Per window (`windows` of them), the sum of its judged values' scores from `count` of them in (window position
    `at`, block of scores `block`): the same additions, in the same order, as `exceedances_of` makes (each window's
    scores ascending), so the same floats."""
    order = np.lexsort((at, block))
    reps = np.asarray(count, dtype=np.int64)[order]
    return np.bincount(np.repeat(np.asarray(at, dtype=np.int64)[order], reps),
                       weights=np.repeat(scores[np.asarray(firsts)[np.asarray(block, dtype=np.int64)[order]]], reps),
                       minlength=windows).astype(np.float64)


@dataclass
class SortedValues:
    """Values in memory, sorted within windows: `first` / `counts` locate each window's run, `w_sorted` its weights."""

    v_sorted: F64
    first: I64
    counts: I64
    w_sorted: F64 | None = None

    def pool(self, windows: npt.NDArray[np.bool_]) -> Pool:
        """The flagged windows' values pooled: unweighted, only the order statistics the two quantiles read are put in
        place (a partition, not a sort; the same numbers); weighted, sorted once."""
        if self.w_sorted is None:
            vals = self._values_of(windows)
            p50, p99 = quantiles_unsorted(vals, (0.5, 0.99))
            return Pool(p50, p99, vals.size, float(vals.size), float(vals.size))
        vals, ws = _pooled(self.v_sorted, self.w_sorted, np.repeat(windows, self.counts))
        return Pool(weighted_quantile_sorted(vals, ws, 0.5), weighted_quantile_sorted(vals, ws, 0.99), int(vals.size),
                    float(vals.size) if ws is None else float(ws.sum()), effective_count(ws, vals.size))

    def _values_of(self, windows: npt.NDArray[np.bool_]) -> F64:
        """A copy of the flagged windows' values, in window order: their runs joined (`v_sorted[np.repeat(windows,
        counts)]` without a mask over every value)."""
        flagged = np.flatnonzero(windows)
        if flagged.size == 0:
            return np.zeros(0)
        return np.concatenate([self.v_sorted[a:a + c] for a, c in zip(self.first[flagged].tolist(),
                                                                      self.counts[flagged].tolist(), strict=True)])

    def exceedances(self, threshold: float, judged: npt.NDArray[np.bool_]) -> Exceedances:
        """The values above `threshold` (in window order, with their windows' positions) as the scan reads them."""
        rows = np.flatnonzero(self.v_sorted > threshold)
        at = np.searchsorted(self.first, rows, side="right") - 1
        return exceedances_of(at.astype(np.int64), self.v_sorted[rows], judged)


def quantile_sorted(sorted_values: F64, q: float) -> float:
    """`quantile_cont` of sorted values (rank (n - 1) q, linear interpolation); nan when empty."""
    return weighted_quantile_sorted(sorted_values, None, q)


def median(values: F64) -> float:
    """`np.median` of a few values, the same number (the middle one, or the mean of the two middle ones; nan with a
    nan), without np.median's import of numpy.ma (0.05-0.06 s of the report's start)."""
    s = np.sort(np.asarray(values, dtype=np.float64))
    n = s.size
    if n == 0 or np.isnan(s[-1]):
        return math.nan
    h = n // 2
    return float(s[h]) if n % 2 else float((s[h - 1] + s[h]) / 2)


def _xlogx_table(top: int) -> F64:
    """x ln x for every whole x in 0..top (0 at 0): the scan ratio is a sum of such terms."""
    x = np.arange(top + 1, dtype=np.float64)
    x[0] = 1.0
    return x * np.log(x)


def scan_ratio(k: npt.ArrayLike, n: npt.ArrayLike, total_k: int, total_n: int,
               table: F64 | None = None) -> F64:
    """Log likelihood ratio of Kulldorff's scan (Poisson model, given the total): k of the total_k values
    above the threshold fall in a stretch holding n of the total_n values, e = total_k n / total_n expected;
    k ln(k / e) + (K - k) ln((K - k) / (K - e)) when k > e, else 0."""
    return tail_ratio(k, n, None, total_k, total_n, table)


def tail_scores(above_sorted: F64) -> F64:
    """Savage (exponential) scores of the values above the threshold, sorted ascending: the i-th smallest of K
    scores E[i-th smallest of K standard exponentials] = H_K - H_(K-i); tied values share their mean score.
    They sum to K (mean 1) and depend only on ranks, so the scan stays free of the latency's law."""
    k = above_sorted.size
    if k == 0:
        return np.zeros(0)
    scores = savage_scores(k)
    _, first, size = np.unique(above_sorted, return_index=True, return_counts=True)
    if first.size < k:  # ties: each group of equal values gets the mean of its scores
        scores = np.repeat(group_means(scores, first.astype(np.int64), size.astype(np.int64)), size)
    return scores


def savage_scores(k: int) -> F64:
    """The Savage scores of k distinct values, ascending: H_k - H_(k-i) for the i-th smallest (`tail_scores`)."""
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, k + 1))])
    return np.asarray(harmonic[k] - harmonic[k - np.arange(1, k + 1)], dtype=np.float64)


def group_means(scores: F64, lo: I64, size: I64) -> F64:
    """The mean of `scores[lo:lo + size]` for each group (ascending, not overlapping): one `np.add.reduceat` segment a
    group whatever other groups are asked with it, so the same floats for a group asked alone or among all."""
    cuts = np.unique(np.concatenate([lo, lo + size]))
    cuts = cuts[cuts < scores.size]
    return np.asarray(np.add.reduceat(scores, cuts)[np.searchsorted(cuts, lo)] / size, dtype=np.float64)


def size_ratio(k: npt.ArrayLike, s: npt.ArrayLike, total_k: int, table: F64 | None = None) -> F64:
    """Log likelihood ratio that the k exceedances of a stretch, whose tail scores sum to s, are larger than the
    rest (exponential law of the scores, mean s/k inside and (K - s)/(K - k) outside against 1 pooled):
    -k ln(s/k) - (K - k) ln((K - s)/(K - k)) when s/k > 1 (so 0 < k < K), else 0."""
    return tail_ratio(k, None, s, total_k, 1, table)


def tail_ratio(k: npt.ArrayLike, n: npt.ArrayLike | None, s: npt.ArrayLike | None, total_k: int, total_n: int,
               table: F64 | None = None) -> F64:
    """The scan's statistic of a stretch, the likelihood ratio of a peaks-over-threshold tail: more values above
    the threshold than its share n of the values (`scan_ratio`; left out when n is None) plus, when their tail
    scores s are given, larger ones (`size_ratio`). The two parts share their k ln k terms."""
    g = _xlogx_table(total_k) if table is None else table
    k = np.asarray(k, dtype=np.int64)
    gk = g[k] + g[total_k - k]
    out = np.zeros(k.shape)
    if n is not None:
        e = np.asarray(n, dtype=np.float64) * (total_k / total_n)
        inside = (e > 0) & (e < total_k)
        log_rest = np.log(np.where(inside, total_k - e, 1.0))
        slope = np.log(np.where(inside, e, 1.0)) - log_rest  # per stretch, shared by every draw
        np.add(out, gk - k * slope - total_k * log_rest, out=out, where=inside & (k > e))
    if s is not None:
        s = np.asarray(s, dtype=np.float64)
        larger = (s > k) & (k < total_k)  # the scores outside (K - s) are positive whenever k < K
        log_in = np.log(s, out=np.zeros(s.shape), where=larger)
        log_out = np.log(total_k - s, out=np.zeros(s.shape), where=larger)
        np.add(out, gk - k * log_in - (total_k - k) * log_out, out=out, where=larger)
    return out


#: Stand-in for a score sum whose logarithm `stretch_max` takes where the size term is not added (any finite log does).
_TINY: Final = float(np.finfo(np.float64).tiny)


def stretch_max(ck: I64, cn: I64, cs: F64 | None, total_k: int, total_n: int, max_len: int, table: F64) -> F64:
    """Per row of `ck` (one row per draw: the cumulative counts above the threshold at the windows' bounds) and of `cs`
    (the cumulative tail scores; None: counts only), the largest `tail_ratio` (at least 0) over every stretch of
    1..max_len consecutive windows of sizes `cn` (cumulative): the very floats `tail_ratio` gives, and faster.

    Each element goes through the same operations in the same order as in `tail_ratio`, so the same floats; only how
    they are laid out differs (this is the detection's costliest loop). The windows run along the first axis, so every
    stretch length reads contiguous rows and the maximum over stretches is an elementwise one; no ufunc is masked
    (numpy's masked loops cost about ten times an unmasked pass): a term not added is multiplied by 0 (x * 1 is x and
    every term is finite), and a score sum whose logarithm is not used is replaced by a stand-in (`_TINY`). The few
    stretches where a used logarithm is of 0 or less (not from real scores) take `tail_ratio` itself."""
    draws, bounds = ck.shape
    best = np.zeros(draws)
    if bounds < 2:
        return best
    pair = table + table[::-1]  # x ln x + (K - x) ln (K - x), as tail_ratio adds them
    k_cum = np.ascontiguousarray(ck.T, dtype=np.float64)  # bounds x draws, exact (counts below 2^53)
    s_cum = None if cs is None else np.ascontiguousarray(cs.T, dtype=np.float64)
    size = draws * (bounds - 1)
    kf_buf, a_buf, s_buf, u_buf = (np.empty(size) for _ in range(4))
    k_buf = np.empty(size, dtype=np.intp)
    m_buf, m2_buf = np.empty(size, dtype=bool), np.empty(size, dtype=bool)
    for length in range(1, min(max_len, bounds - 1) + 1):
        shape = (bounds - length, draws)
        kf, a, s, u = (b[:shape[0] * draws].reshape(shape) for b in (kf_buf, a_buf, s_buf, u_buf))
        k = k_buf[:shape[0] * draws].reshape(shape)
        mask, mask2 = m_buf[:shape[0] * draws].reshape(shape), m2_buf[:shape[0] * draws].reshape(shape)
        e = (cn[length:] - cn[:-length]).astype(np.float64) * (total_k / total_n)  # as in tail_ratio, per stretch
        inside = (e > 0) & (e < total_k)
        log_rest = np.log(np.where(inside, total_k - e, 1.0))
        slope = (np.log(np.where(inside, e, 1.0)) - log_rest)[:, None]
        np.subtract(k_cum[length:], k_cum[:-length], out=kf)
        np.copyto(k, kf, casting="unsafe")
        gk = pair[k]
        np.multiply(kf, slope, out=a)  # the count term: gk - k slope - K log_rest where inside and k > e
        np.subtract(gk, a, out=a)
        np.subtract(a, (total_k * log_rest)[:, None], out=a)
        np.greater(kf, np.where(inside, e, np.inf)[:, None], out=mask)
        np.multiply(a, mask, out=a)
        if s_cum is not None:  # the size term: gk - k ln s - (K - k) ln (K - s) where s > k and k < K
            np.subtract(s_cum[length:], s_cum[:-length], out=s)
            np.greater(s, kf, out=mask)
            np.less(kf, total_k, out=mask2)
            np.logical_and(mask, mask2, out=mask)
            np.subtract(total_k, s, out=u)
            np.less(u, _TINY, out=mask2)
            np.logical_and(mask, mask2, out=mask2)
            if mask2.any():  # ln (K - s) of 0 or less is used: tail_ratio's own infinities and nans
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = tail_ratio(kf.astype(np.int64), (cn[length:] - cn[:-length])[:, None], s.copy(),
                                       total_k, total_n, table)
                np.maximum(best, ratio.max(axis=0), out=best)
                continue
            np.maximum(s, _TINY, out=s)  # s > k >= 0 where used, so s >= _TINY or its term is 0 ln s
            np.maximum(u, _TINY, out=u)
            np.log(s, out=s)
            np.multiply(kf, s, out=s)
            np.subtract(gk, s, out=gk)
            np.log(u, out=u)
            np.subtract(total_k, kf, out=kf)
            np.multiply(kf, u, out=u)
            np.subtract(gk, u, out=gk)
            np.multiply(gk, mask, out=gk)
            np.add(a, gk, out=a)
        np.maximum(best, a.max(axis=0), out=best)
    return best + 0.0  # tail_ratio's sums are never -0


def block_scores(scores_sorted: F64) -> F64:
    """The tail scores (`tail_scores`, ascending) averaged within blocks: from the largest down, a block takes every
    score within SCORE_BLOCK_SPREAD of its largest (tied scores always share a block). The mean stays 1, every score
    moves by less than the spread, and the null law needs one draw per block, not per value (`scan_null_max`).
    A block's mean is that of the Savage scores of its ranks (`savage_scores`; the same number as its tail scores'
    mean, since a tie's mean keeps their sum), so it depends on the ties only through where the blocks start: a
    remote engine need not send every group of ties (`verified_blocks`)."""
    return _blocked(scores_sorted.size, block_firsts(scores_sorted))


def _blocked(k: int, first: I64) -> F64:
    """The Savage scores of k ranks averaged within the blocks starting at `first` (ascending, from 0)."""
    if k == 0:
        return np.zeros(0)
    size = np.diff(np.append(first, k))
    return np.repeat(np.add.reduceat(savage_scores(k), first) / size, size)


def block_firsts(scores_sorted: F64) -> I64:
    """The first position of each block of `block_scores` (ascending scores; empty for none)."""
    starts = []
    hi = scores_sorted.size
    while hi > 0:
        hi = int(np.searchsorted(scores_sorted, scores_sorted[hi - 1] - SCORE_BLOCK_SPREAD, side="left"))
        starts.append(hi)
    return np.array(starts[::-1], dtype=np.int64)


def scan_null_max(n: I64, total_k: int, max_len: int, draws: int, rng: np.random.Generator,
                  scores: F64 | None = None, method: str = "auto") -> F64:
    """`draws` values of the largest scan ratio over every stretch of 1..max_len consecutive windows,
    with the total_k values above the threshold spread over windows of sizes n at random (no incident);
    with `scores` (the tail scores of those values), which value lands where is drawn at random too.

    Both ways of drawing have the same law, the exact one: "permute" shuffles all total_k scores per draw; "auto"
    does so only for the values of small groups of equal scores and draws, for each large group, how many of its
    values land in each window (`_block_sums`): the cost of a large group does not grow with its size. When every
    group is small the two are the same draws."""
    if method not in ("auto", "permute"):
        raise ValueError(f"scan_null_max: method must be 'auto' or 'permute', not {method!r}")
    n = np.asarray(n, dtype=np.int64)
    total_n = int(n.sum())
    if total_k <= 0 or n.size == 0:
        return np.zeros(draws)
    g = _xlogx_table(total_k)
    cs = None
    if scores is not None:
        ck, cs = _block_sums(np.asarray(scores, dtype=np.float64), n, draws, rng, by_value_only=method == "permute")
    else:
        alloc = rng.multivariate_hypergeometric(n, total_k, size=draws, method="marginals")
        ck = np.concatenate([np.zeros((draws, 1), dtype=np.int64), np.cumsum(alloc, axis=1)], axis=1)
    cn = np.concatenate([[0], np.cumsum(n)])
    return stretch_max(ck, cn, cs, total_k, total_n, max_len, g)


#: CPU of the null's two steps per simulated draw, relative (measured in the prototype of benchmarks.bench_detect on
#: the 2-core machine, 27-33 ns against 200-240 ns): shuffling one score, and one hypergeometric draw.
_COST_SHUFFLE, _COST_HYPERGEOMETRIC = 30, 200


def _value_by_value(m: int, windows: int) -> bool:
    """Whether a group of m equal scores is placed by shuffling its values (cheaper than a hypergeometric a window)."""
    return m * _COST_SHUFFLE < (windows - 1) * _COST_HYPERGEOMETRIC


def _block_sums(scores: F64, n: I64, draws: int, rng: np.random.Generator,
                by_value_only: bool = False) -> tuple[I64, F64]:
    """Per draw, the cumulative counts and score sums at the windows' bounds when the values above the threshold
    (with `scores`) take slots among the n[j] of each window uniformly at random.

    Exact, in two steps. The values of the small groups of equal scores (`_value_by_value`; all of them with
    `by_value_only`) take a uniformly random subset of all slots: its count per window is a multivariate
    hypergeometric draw over the window sizes, and the values are shuffled over the slots drawn (`_permuted_sums`).
    Then each large group in turn takes a uniformly random subset of the slots still free, a multivariate
    hypergeometric draw over the windows' free slots, one univariate hypergeometric per window (the marginal
    method); its cost grows with the windows, not with the group. The slots left are the values below the threshold.
    """
    w = n.size
    values, size = np.unique(scores, return_counts=True)
    small = np.array([by_value_only or _value_by_value(int(m), w) for m in size.tolist()], dtype=bool)
    few = np.repeat(values[small], size[small])
    zero_k = np.zeros((draws, 1), dtype=np.int64)
    alloc = rng.multivariate_hypergeometric(n, few.size, size=draws, method="marginals")
    ck = np.concatenate([zero_k, np.cumsum(alloc, axis=1)], axis=1)
    cs = _permuted_sums(few, ck, rng) if few.size else np.zeros((draws, w + 1))
    if small.all():
        return ck, cs
    free = (n[:, None] - alloc.T).copy()  # windows x draws: a window's row is contiguous
    k = alloc.T.copy()
    s = np.diff(cs, axis=1).T.copy()
    total = free.sum(axis=0)
    for value, m in zip(values[~small].tolist(), size[~small].tolist(), strict=True):
        left, rest = np.full(draws, m, dtype=np.int64), total.copy()
        for j in range(w - 1):
            rest -= free[j]
            x = rng.hypergeometric(free[j], rest, left)
            free[j] -= x
            k[j] += x
            s[j] += value * x
            left -= x
        free[w - 1] -= left
        k[w - 1] += left
        s[w - 1] += value * left
        total -= m
    return (np.concatenate([zero_k, np.cumsum(k.T, axis=1)], axis=1),
            np.concatenate([np.zeros((draws, 1)), np.cumsum(s.T, axis=1)], axis=1))


def _permuted_sums(scores: F64, ck: I64, rng: np.random.Generator) -> F64:
    """Per draw, the cumulative score sums at the windows' bounds `ck` after a random permutation of the scores
    (blocks of draws, so the draws x K matrix stays small)."""
    draws, k = ck.shape[0], scores.size
    out = np.empty(ck.shape, dtype=np.float64)
    block = max(1, 2_000_000 // max(k, 1))
    buf = np.zeros((min(block, draws), k + 1))  # a leading 0, then the scores; permuted and summed in place
    for a in range(0, draws, block):
        b = min(draws, a + block)
        rows = buf[:b - a]
        rows[:, 0] = 0.0
        rows[:, 1:] = scores
        rng.permuted(rows[:, 1:], axis=1, out=rows[:, 1:])
        np.cumsum(rows, axis=1, out=rows)
        out[a:b] = np.take_along_axis(rows, ck[a:b], axis=1)
    return out


def scan_p_value(ratio: float, null_max: F64) -> float:
    """Monte Carlo p-value of a scan ratio against the simulated maxima: (1 + #{max >= ratio}) / (draws + 1)."""
    return float((1 + np.count_nonzero(null_max >= ratio * (1 - 1e-12))) / (null_max.size + 1))


def _window_quantiles(sorted_by_win_values: F64, starts: I64, counts: I64, q: float,
                      w_sorted: F64 | None = None) -> F64:
    if w_sorted is not None:
        return np.array([weighted_quantile_sorted(sorted_by_win_values[a:a + c], w_sorted[a:a + c], q)
                         for a, c in zip(starts.tolist(), counts.tolist(), strict=True)], dtype=np.float64)
    h = (counts - 1) * q
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    a = sorted_by_win_values[starts + lo]
    b = sorted_by_win_values[starts + hi]
    return a + (h - lo) * (b - a)


def _pooled(v_sorted: F64, w_sorted: F64 | None, rows: npt.NDArray[np.bool_]) -> tuple[F64, F64 | None]:
    """The values (sorted) and weights of the rows where `rows` holds."""
    if w_sorted is None:
        return np.sort(v_sorted[rows]), None
    vals, ws = v_sorted[rows], w_sorted[rows]
    order = np.argsort(vals, kind="stable")
    return vals[order], ws[order]


@dataclass
class _Scan:
    """The scan over judged windows: cumulative counts in judged order and the simulated null maxima."""

    position: I64  # window index -> position among the judged windows (-1: not judged)
    ck: I64
    cn: I64
    cs: F64
    total_k: int
    total_n: int
    max_len: int
    null_max: F64
    table: F64

    def ratio(self, run: list[int]) -> float:
        """The scan statistic of the judged windows of `run` (consecutive judged windows); -1 when none is judged
        or the run is longer than the scan's longest stretch (it is then not among the stretches tested)."""
        pos = self.position[run]
        pos = pos[pos >= 0]
        if pos.size == 0 or pos.size > self.max_len:
            return -1.0
        a, b = int(pos[0]), int(pos[-1]) + 1
        return float(tail_ratio(self.ck[b] - self.ck[a], self.cn[b] - self.cn[a], self.cs[b] - self.cs[a],
                                self.total_k, self.total_n, self.table))

    def p_value(self, run: list[int]) -> float:
        """Family-wise p-value of the judged windows of `run` (consecutive judged windows), 1 when too long."""
        ratio = self.ratio(run)
        return 1.0 if ratio < 0 else scan_p_value(ratio, self.null_max)

    def likeliest(self, core: list[int], grown: list[int]) -> list[int]:
        """The stretch of `grown` holding all of `core` whose scan statistic is the largest (the first such, from
        the left, the shortest): the most anomalous way to cut the shoulders. Its p-value, like every stretch's, is
        compared with the largest ratio over all stretches, so choosing it spends no more of the error budget."""
        best, arg = -1.0, core
        for a in range(grown[0], core[0] + 1):
            for b in range(core[-1], grown[-1] + 1):
                ratio = self.ratio(list(range(a, b + 1)))
                if ratio > best:
                    best, arg = ratio, list(range(a, b + 1))
        return arg


def _scan(det: Detection, source: WindowValues, seed: int) -> _Scan:
    """Threshold (pooled p99 of the judged windows), exceedances per window and their tail scores, the null law of
    the largest ratio."""
    judged = np.flatnonzero(det.judged)
    det.threshold_ns = source.pool(det.judged).p99_ns
    # each judged exceedance's score by its rank among all judged exceedances; summed per window
    got = source.exceedances(det.threshold_ns, det.judged)
    det.exceed, scores, score_sum = got.exceed, got.scores, got.score_sum
    counts = det.n
    k, n = det.exceed[judged], counts[judged]
    s = score_sum[judged]
    total_k, total_n = int(k.sum()), int(n.sum())
    max_len = max(1, int(MAX_SCAN_SHARE * judged.size))
    null_max = scan_null_max(n, total_k, max_len, SCAN_DRAWS, np.random.default_rng(seed), scores)
    position = np.full(det.n.size, -1, dtype=np.int64)
    position[judged] = np.arange(judged.size)
    ck = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    cn = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    cs = np.concatenate([[0.0], np.cumsum(s)])
    table = _xlogx_table(total_k)
    scan = _Scan(position, ck, cn, cs, total_k, total_n, max_len, null_max, table)
    best = 0.0  # the most anomalous stretch of the data itself
    for length in range(1, min(max_len, judged.size) + 1):
        best = max(best, float(tail_ratio(ck[length:] - ck[:-length], cn[length:] - cn[:-length],
                                          cs[length:] - cs[:-length], total_k, total_n, table).max()))
    det.scan_p_value = scan_p_value(best, null_max)
    for i in judged:
        det.p_value[i] = scan.p_value([int(i)])
    return scan


def detect(start_ns: I64, values: F64, window_ns: int, *, seed: int = 0, weights: F64 | None = None) -> Detection:
    """Find p99 spikes with a flat p50 in (start_ns, value) pairs cut into windows of window_ns.

    `seed` seeds the simulated null draws of the scan: the same input and seed give the same answer.
    `weights` (each value's adjusted count under sampling) weigh every percentile; None or all 1
    is the unweighted computation.
    """
    start_ns = np.asarray(start_ns, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(values)
    start_ns, values = start_ns[keep], values[keep]
    w_all = None if weights is None else np.asarray(weights, dtype=np.float64)[keep]
    if w_all is not None and bool(np.all(w_all == 1.0)):
        w_all = None
    win_all = start_ns // window_ns
    w_sorted: F64 | None = None
    if w_all is not None:
        order = np.lexsort((values, win_all))
        v_sorted, w_sorted = values[order], w_all[order]
        wins, first, counts = np.unique(win_all[order], return_index=True, return_counts=True)
    elif win_all.size and np.all(win_all[1:] >= win_all[:-1]):  # rows in time order: sort within windows
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
    if w_sorted is None:
        n_weighted = counts.astype(np.float64)
        n_effective = counts.astype(np.float64)
    else:
        n_weighted = np.array([float(w_sorted[a:a + c].sum()) for a, c in zip(first.tolist(), counts.tolist(),
                                                                              strict=True)])
        n_effective = np.array([effective_count(w_sorted[a:a + c]) for a, c in zip(first.tolist(),
                                                                                 counts.tolist(), strict=True)])
    p50 = _window_quantiles(v_sorted, first, counts, 0.5, w_sorted) if wins.size else np.zeros(0)
    p99 = _window_quantiles(v_sorted, first, counts, 0.99, w_sorted) if wins.size else np.zeros(0)
    return detect_windows(window_ns, wins.astype(np.int64), counts, p50, p99, n_weighted, n_effective,
                          SortedValues(v_sorted, first, counts, w_sorted), weighted=w_sorted is not None, seed=seed)


def detect_windows(window_ns: int, wins: I64, counts: I64, p50_ns: F64, p99_ns: F64, n_weighted: F64,
                   n_effective: F64, source: WindowValues, *, weighted: bool, seed: int = 0) -> Detection:
    """`detect` from the per-window table (window numbers start // window_ns, ascending; counts, p50, p99, weighted
    and effective counts) and a `source` answering the pooled questions: what a remote engine computes on its
    server. `weighted`: the values carry weights other than 1 (windows are then judged on their effective count).
    """
    m = wins.size
    empty_f = np.zeros(m, dtype=np.float64)
    det = Detection(window_ns=window_ns, window_start_ns=(wins * window_ns).astype(np.int64), n=counts,
                    p50_ns=empty_f.copy(), p99_ns=empty_f.copy(), judged=np.zeros(m, bool),
                    baseline=np.zeros(m, bool), candidate=np.zeros(m, bool), significant=np.zeros(m, bool),
                    p_value=np.ones(m), baseline_p50_ns=math.nan, baseline_p99_ns=math.nan,
                    exceed=np.zeros(m, dtype=np.int64))
    det.weighted = weighted
    det.n_weighted, det.n_effective = n_weighted, n_effective
    if m == 0:
        det.note = "no requests"
        return det
    det.p50_ns, det.p99_ns = p50_ns, p99_ns
    det.judged = (counts if not weighted else det.n_effective) * (1 - 0.99) >= MIN_TAIL
    if det.judged.sum() < MIN_BASELINE_WINDOWS + 1:
        det.note = (f"too few windows with enough requests to judge a p99 ({int(det.judged.sum())} windows "
                    f"with >= {int(MIN_TAIL / 0.01)} requests)")
        return det
    med = median(det.p99_ns[det.judged])
    elevated = det.p99_ns > (1 + MIN_RISE) * med
    det.baseline = det.judged & ~elevated
    if det.baseline.sum() < MIN_BASELINE_WINDOWS:
        det.note = "too few baseline windows (the p99 is high nearly everywhere)"
        return det
    scan = _scan(det, source, seed)
    det.scan, det.source = scan, source
    _pool(det, source)
    det.candidate = det.judged & (det.p99_ns >= (1 + MIN_RISE) * det.baseline_p99_ns)
    # shoulders: a run grows into the touching windows whose p99 is above the baseline p99 at all; the core and
    # the grown run are both scan stretches (one error budget). Only a significant run's shoulders leave the
    # baseline: a spike's ramp must not raise its own baseline, and a chance rise must not lower it.
    # Each run is tested as its core, as the grown run, then as the likeliest stretch between them (`_Scan.likeliest`:
    # a shoulder with few values above the threshold can dilute the grown run below the level its core with the
    # other shoulder reaches); all three are scan stretches, under the one error budget.
    grown = _merge_touching(det, [(core, _grow(det, core)) for core in _runs(det)])
    tested = []
    for core, ext in grown:
        best = scan.likeliest(core, ext)
        tested.append((core, ext, [(run, scan.p_value(run)) for run in _distinct([core, ext, best])]))
    shoulders = np.zeros(m, dtype=bool)
    for _, ext, runs in tested:
        if min(p for _, p in runs) <= ALPHA:
            shoulders[ext] = True
    if (det.baseline & ~shoulders).sum() >= MIN_BASELINE_WINDOWS and (det.baseline & shoulders).any():
        det.baseline &= ~shoulders
        _pool(det, source)
        det.candidate = det.judged & (det.p99_ns >= (1 + MIN_RISE) * det.baseline_p99_ns)
    for _, _, runs in tested:
        for run, p_value in runs:
            # the shoulders only when the core falls short; the likeliest stretch only when both do
            spike = _judge(det, run, source, p_value)
            if spike is not None:
                det.significant[run] = True
                det.spikes.append(spike)
                break
    det.spikes.sort(key=lambda sp: (-sp.excess_ns, sp.start_ns))
    return det


def _pool(det: Detection, source: WindowValues) -> None:
    """Set the baseline p50 / p99 from the baseline windows' values pooled."""
    pooled = source.pool(det.baseline)
    det.baseline_p50_ns, det.baseline_p99_ns = pooled.p50_ns, pooled.p99_ns


def judge_stretch(det: Detection, run: list[int], alpha: float = ALPHA) -> Spike | None:
    """The consecutive windows `run` (indices) as a spike by the detection's own rules (`_judge`: the p99 rise, the
    p50 held, its scan p-value, family-wise as every stretch's, at most `alpha`), against the detection's baseline;
    None when they fail or nothing was scanned. `alpha` = 1 leaves the significance to an overlapping stretch already
    found significant (the spike's detected windows, before its bounds moved to its culprit's)."""
    if det.scan is None or det.source is None:
        return None
    return _judge(det, run, det.source, det.scan.p_value(run), alpha)


def _judge(det: Detection, run: list[int], source: WindowValues, p_value: float, alpha: float = ALPHA
           ) -> Spike | None:
    """The run as a spike if its pooled p99 rose enough, its p50 held and its scan p-value is at most `alpha`."""
    if p_value > alpha:
        return None
    windows = np.zeros(det.n.size, dtype=bool)
    windows[run] = True
    pooled = source.pool(windows)
    p50, p99 = pooled.p50_ns, pooled.p99_ns
    if p99 < (1 + MIN_RISE) * det.baseline_p99_ns:
        return None
    if abs(p50 - det.baseline_p50_ns) > P50_TOLERANCE * abs(det.baseline_p50_ns):
        return None
    return Spike(start_ns=int(det.window_start_ns[run[0]]), end_ns=int(det.window_start_ns[run[-1]] + det.window_ns),
                 requests=pooled.n, p50_ns=p50, p99_ns=p99, baseline_p50_ns=det.baseline_p50_ns,
                 baseline_p99_ns=det.baseline_p99_ns, p_value=p_value, windows=len(run),
                 requests_weighted=pooled.n_weighted, n_effective=pooled.n_effective)


def _distinct(runs: list[list[int]]) -> list[list[int]]:
    """The runs in order, each once."""
    out: list[list[int]] = []
    for run in runs:
        if run not in out:
            out.append(run)
    return out


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
