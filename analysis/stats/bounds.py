"""A spike's bounds from its culprit: the windows, around the detected ones, whose slow requests the culprit is
over-represented among.

Detection finds a stretch of windows whose tail rose (`spikes.detect`); the explanation names the culprit (the
first dimension value). The detected stretch's ends are where the p99 crossed a level, which a chance rise of
the fleet next to it can move either way: an incident whose tail fades below the 20 % rise is cut short, and a
rise of someone else's requests in the next window joins the spike. The culprit says which windows are the
incident's: a window belongs to the spike when, among its requests slower than the baseline p99, the culprit's
share is significantly higher than among the baseline's (one-sided Fisher exact test at the explanation's level,
`explain.ALPHA`). The detected stretch's end windows that fail are trimmed (never past its first window that
passes), then the touching windows that pass are added, one at a time outwards, stopping at the first that fails.
Per side, a window where the culprit is not over-represented joins with probability at most ALPHA (it must be the
first such window tested, and pass). The counts are of kept requests (the evidence there is), as in the scan.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def over_represented_p(k: int, m: int, k_base: int, m_base: int) -> float:
    """One-sided Fisher exact p-value that a share k/m is higher than k_base/m_base: P(X >= k) for X the culprit's
    count in m draws without replacement from the m + m_base requests pooled, k + k_base of them the culprit's."""
    if not (0 <= k <= m and 0 <= k_base <= m_base):
        raise ValueError(f"counts out of range: {k}/{m} against {k_base}/{m_base}")
    n, c = m + m_base, k + k_base
    lo, hi = max(k, m - (n - c)), min(m, c)
    if k <= max(0, m - (n - c)):  # every possible draw holds at least k
        return 1.0
    terms = [_log_comb(c, j) + _log_comb(n - c, m - j) for j in range(lo, hi + 1)]
    top = max(terms)
    log_p = top + math.log(math.fsum(math.exp(t - top) for t in terms)) - _log_comb(n, m)
    return min(1.0, math.exp(log_p))


def culprit_stretch(first: int, last: int, k: I64, m: I64, k_base: int, m_base: int, in_base: npt.NDArray[np.bool_],
                    open_: npt.NDArray[np.bool_], wins: I64, alpha: float) -> tuple[int, int]:
    """The spike's windows [first, last] (indices) moved to the culprit's: trim the end windows where the culprit is
    not over-represented, then add the touching `open_` windows where it is (module docstring).

    `k`, `m`: per window, the culprit's requests among its slow ones and the slow ones; `k_base`, `m_base`: the
    same over the baseline windows; `in_base`: the windows counted in the baseline (a window is tested against the
    baseline without itself); `open_`: the windows the stretch may grow into (judged, not another spike's); `wins`:
    each window's number (start // length), so it grows only into the next window in time. Returns (first, last)
    unchanged when no window of the stretch passes."""

    def passes(i: int) -> bool:
        own_k, own_m = (int(k[i]), int(m[i])) if in_base[i] else (0, 0)
        return over_represented_p(int(k[i]), int(m[i]), k_base - own_k, m_base - own_m) <= alpha

    inside = [i for i in range(first, last + 1) if passes(i)]
    if not inside:
        return first, last
    lo, hi = inside[0], inside[-1]
    while lo - 1 >= 0 and wins[lo] - wins[lo - 1] == 1 and open_[lo - 1] and passes(lo - 1):
        lo -= 1
    while hi + 1 < k.size and wins[hi + 1] - wins[hi] == 1 and open_[hi + 1] and passes(hi + 1):
        hi += 1
    return lo, hi
