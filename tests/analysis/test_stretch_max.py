"""The scan's null maxima (`spikes.stretch_max`, laid out for speed) are the very floats of the plain formula:
`tail_ratio`'s terms written out stretch by stretch, draw by draw, checked for equality (not closeness) on the
null draws of seeds 1-5 with tied scores, empty windows, stretches holding every value above the threshold and
counts only; on score sums no real scores give (the logarithm of 0 or less); and through `detect` on values with
ties and NaN."""

from __future__ import annotations

import numpy as np
import pytest

import analysis.stats.spikes as S

WINDOW_NS = 60_000_000_000


def _xlogx(top: int) -> np.ndarray:
    """x ln x for x = 0..top, 0 at 0."""
    x = np.arange(top + 1, dtype=np.float64)
    x[0] = 1.0
    return x * np.log(x)


def plain_stretch_max(ck: np.ndarray, cn: np.ndarray, cs: np.ndarray | None, total_k: int, total_n: int,
                      max_len: int) -> np.ndarray:
    """Per draw (row), the largest ratio over every stretch of 1..max_len windows, one stretch at a time: the count
    term k ln(k/e) + (K-k) ln((K-k)/(K-e)) when 0 < e < K and k > e, plus the size term -k ln(s/k) - (K-k)
    ln((K-s)/(K-k)) when s > k and k < K, each written as tail_ratio orders its operations (so the same floats);
    every ratio counts from 0."""
    g = _xlogx(total_k)
    draws, bounds = ck.shape
    best = np.zeros(draws)
    with np.errstate(divide="ignore", invalid="ignore"):
        for a in range(bounds - 1):
            for b in range(a + 1, min(a + max_len, bounds - 1) + 1):
                k = ck[:, b] - ck[:, a]
                gk = g[k] + g[total_k - k]
                e = float(cn[b] - cn[a]) * (total_k / total_n)
                ratio = np.zeros(draws)
                if 0 < e < total_k:
                    log_rest = np.log(np.float64(total_k - e))
                    term = gk - k * (np.log(np.float64(e)) - log_rest) - total_k * log_rest
                    ratio = np.where(k > e, 0.0 + term, ratio)
                if cs is not None:
                    s = cs[:, b] - cs[:, a]
                    larger = (s > k) & (k < total_k)
                    term = gk - k * np.log(np.where(larger, s, 1.0)) - (total_k - k) * np.log(
                        np.where(larger, total_k - s, 1.0))
                    ratio = np.where(larger, ratio + term, ratio)
                best = np.where((ratio > best) | np.isnan(ratio), ratio, best)
    return best


def _scores(rng: np.random.Generator, total_k: int) -> np.ndarray:
    """The block-averaged tail scores of total_k values above the threshold, with ties among them."""
    tied = rng.integers(0, 1 + total_k // 4, total_k).astype(np.float64)
    values = np.sort(tied if rng.random() < 0.5 else np.round(rng.normal(size=total_k), 1))
    return S.block_scores(S.tail_scores(values))


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_null_maxima_are_the_plain_formulas_floats(seed: int) -> None:
    rng = np.random.default_rng(seed)
    draws = 120
    for case in range(6):
        windows = int(rng.integers(2, 40))
        n = rng.integers(0, 400, windows)  # some windows empty (e = 0: no count term)
        n[rng.integers(0, windows)] = 0
        total_k = int(rng.integers(1, max(2, n.sum() // 10)))
        if case == 0:
            total_k = min(3, int(n.sum()))  # a stretch often holds every value above the threshold (k = K)
        max_len = max(1, int(rng.integers(1, windows + 1)))
        cn = np.concatenate([[0], np.cumsum(n)])
        scores = _scores(rng, total_k)
        ck, cs = S._block_sums(scores, n, draws, np.random.default_rng(seed * 100 + case))
        want = plain_stretch_max(ck, cn, cs, total_k, int(n.sum()), max_len)
        got = S.scan_null_max(n, total_k, max_len, draws, np.random.default_rng(seed * 100 + case), scores)
        assert got.tobytes() == want.tobytes(), (case, np.flatnonzero(got != want)[:5])
        # counts only
        alloc = np.random.default_rng(seed).multivariate_hypergeometric(n, total_k, size=draws, method="marginals")
        ck = np.concatenate([np.zeros((draws, 1), dtype=np.int64), np.cumsum(alloc, axis=1)], axis=1)
        want = plain_stretch_max(ck, cn, None, total_k, int(n.sum()), max_len)
        got = S.scan_null_max(n, total_k, max_len, draws, np.random.default_rng(seed))
        assert got.tobytes() == want.tobytes(), (case, "counts only")


def test_score_sums_no_real_scores_give_come_out_as_the_formulas_do() -> None:
    # s >= K with k < K (the logarithm of 0 or less: inf and nan), s = 0, s = k exactly, negative sums
    rng = np.random.default_rng(9)
    total_k, draws, windows = 12, 40, 7
    n = np.full(windows, 100)
    alloc = rng.multivariate_hypergeometric(n, total_k, size=draws)
    ck = np.concatenate([np.zeros((draws, 1), dtype=np.int64), np.cumsum(alloc, axis=1)], axis=1)
    per = np.where(rng.random((draws, windows)) < 0.5, alloc.astype(np.float64), rng.choice([0.0, 3.0, -1.0, 13.0],
                                                                                             (draws, windows)))
    cs = np.concatenate([np.zeros((draws, 1)), np.cumsum(per, axis=1)], axis=1)
    cn = np.concatenate([[0], np.cumsum(n)])
    got = S.stretch_max(ck, cn, cs, total_k, int(n.sum()), 4, _xlogx(total_k))
    want = plain_stretch_max(ck, cn, cs, total_k, int(n.sum()), 4)
    assert np.isnan(want).any() or np.isinf(want).any()  # the fallback is exercised
    assert np.array_equal(got, want, equal_nan=True)


def test_detect_answers_the_same_with_the_plain_maxima(monkeypatch: pytest.MonkeyPatch) -> None:
    # values with many ties and a few NaN, one window slower in its tail; every judged figure compared for equality
    rng = np.random.default_rng(4)
    windows, per = 16, 600
    starts = np.repeat(np.arange(windows, dtype=np.int64) * WINDOW_NS, per) + np.tile(np.arange(per), windows)
    values = (np.round(np.exp(rng.normal(0.0, 1.0, starts.size)), 1) * 1e9).astype(np.float64)
    slow = values[7 * per:8 * per]  # a view: its 12 slowest values four times slower
    slow[np.argsort(slow)[-12:]] *= 4
    values[rng.integers(0, values.size, 20)] = np.nan
    fast = S.detect(starts, values, WINDOW_NS, seed=3)

    def plain(ck: np.ndarray, cn: np.ndarray, cs: np.ndarray | None, total_k: int, total_n: int, max_len: int,
              table: np.ndarray) -> np.ndarray:
        return plain_stretch_max(ck, cn, cs, total_k, total_n, max_len)

    monkeypatch.setattr(S, "stretch_max", plain)
    plain_det = S.detect(starts, values, WINDOW_NS, seed=3)
    assert fast.scan is not None and plain_det.scan is not None  # the scan ran on both
    assert fast.scan.null_max.tobytes() == plain_det.scan.null_max.tobytes()
    assert fast.p_value.tobytes() == plain_det.p_value.tobytes()
    assert (fast.scan_p_value, fast.spikes) == (plain_det.scan_p_value, plain_det.spikes)
    assert fast.spikes and fast.scan_p_value <= S.ALPHA  # the slow tail is found: the comparison is not of nothing
